"""Content keys of cost-table entries: an op's entry (:func:`op_key`) and an edge's
(:func:`edge_key`) are named by what changes their costs (op kind, attrs that matter,
shapes, dtypes, mesh, cluster, ZeRO stage, runtime, :func:`~autopar.cost.model_version.model_digest`),
so identical layers, graphs and runs share them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from autopar.cost.edges import EdgeKind
from autopar.cost.model_version import COST_MODEL_VERSION, model_digest
from autopar.cost.zero_gathers import zero_gather_dtype
from autopar.hardware.mesh import Mesh
from autopar.ir.graph import Graph, Op, Role, TensorSpec
from autopar.ir.sbp import NdSbp
from autopar.runtimes.profile import RuntimeProfile
from autopar.runtimes.registry import runtime_profile

__all__ = ["edge_key", "op_key"]

# Attrs that change neither signatures nor costs (random seeds, scalar operands,
# optimizer hyper-parameters): left out of cache keys so identical layers share.
_IRRELEVANT_ATTRS = frozenset(
    {
        "seed",
        "has_seed",
        "rate",
        "scale",
        "float_operand",
        "int_operand",
        "has_float_operand",
        "has_int_operand",
        "epsilon",
        "beta1",
        "beta2",
        "weight_decay",
        "learning_rate_val",
        "bias_correction1_val",
        "bias_correction2_val",
        "do_bias_correction",
        "amsgrad",
        "l1",
        "l2",
        "alpha",
        "tanh_approximate",
    }
)


# ------------------------------------------------------------------ keys


def _attrs_key(attrs: dict[str, Any]) -> Any:
    return {k: v for k, v in sorted(attrs.items()) if k not in _IRRELEVANT_ATTRS}


def op_key(graph: Graph, op: Op, mesh: Mesh, zero_stage: int, runtime: RuntimeProfile | None = None) -> str:
    """Content key of an op's table entry: what changes its signatures or costs."""
    payload = {
        "v": COST_MODEL_VERSION,
        "model": model_digest(),
        "runtime": runtime_profile(runtime).key() if op.role is Role.OPTIMIZER else None,
        "type": op.type,
        "role": op.role.value if op.role is Role.OPTIMIZER else "fwd/bwd",
        "attrs": _attrs_key(op.attrs),
        "in": [(p, list(graph.tensors[t].shape), graph.tensors[t].dtype) for p, t in op.inputs.items()],
        "out": [(p, list(graph.tensors[t].shape), graph.tensors[t].dtype) for p, t in op.outputs.items()],
        "mesh": mesh.key(),
        "zero": zero_stage if op.role is Role.OPTIMIZER else None,
        "gather": zero_gather_dtype(graph, op),
    }
    return "op:" + hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:32]


def edge_key(
    spec: TensorSpec,
    src: Sequence[NdSbp],
    dst: Sequence[NdSbp],
    mesh: Mesh,
    kind: EdgeKind = EdgeKind.BOXING,
    runtime: RuntimeProfile | None = None,
) -> str:
    """Content key of an edge's boxing matrix: tensor, the distinct SBPs on each side, mesh, runtime."""
    return _edge_key(
        tuple(spec.shape),
        spec.dtype,
        tuple(str(s) for s in src),
        tuple(str(s) for s in dst),
        mesh.key(),
        kind,
        json.dumps(runtime_profile(runtime).key(), sort_keys=True),
    )


def _edge_key(
    shape: tuple[int, ...],
    dtype: str,
    src: tuple[str, ...],
    dst: tuple[str, ...],
    mesh_key: str,
    kind: EdgeKind,
    runtime_key: str,
) -> str:
    payload = {
        "v": COST_MODEL_VERSION,
        "model": model_digest(),
        "runtime": runtime_key,
        "shape": list(shape),
        "dtype": dtype,
        "src": list(src),
        "dst": list(dst),
        "mesh": mesh_key,
    }
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:32]
    return f"edge:{kind.value}:{digest}"
