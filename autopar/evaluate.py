"""Independent evaluation of a plan: validity, step time, communication, memory.

Uses only the core's pure cost and memory functions, never the cost tables or
the solver, so a solver result can be re-checked by code that did not produce it:

1. every op's signature must be one its rule offers (all-``B`` for ops with no rule);
2. every edge (producer output port -> consumer input port) must be boxable
   (finite cost);
3. step time = sum of op compute times + sum of boxing times (no overlap);
   communication is broken down per mesh axis and per collective kind;
4. memory per device = model states (ZeRO stage, from each variable's SBP) +
   activation peak along the topological order.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from autopar.boxing import boxing_plan
from autopar.costs import (
    EdgeKind,
    edge_kind,
    op_compute_time,
    op_signatures,
    optimizer_gather_plan,
    rule_context,
)
from autopar.graph import DTYPE_BYTES, Graph
from autopar.memory import (
    MIXED_PRECISION_ADAM,
    MemoryBreakdown,
    StateBytes,
    activation_profile,
    variable_state_bytes,
)
from autopar.plan import Plan
from autopar.rules.registry import RuleSet, default_rules
from autopar.sbp import NdSbp

__all__ = ["Evaluation", "attach_evaluation", "evaluate"]


@dataclass
class Evaluation:
    """What a plan costs, recomputed from scratch."""

    valid: bool
    errors: list[str]
    step_time_s: float
    compute_time_s: float
    comm_time_s: float
    comm_time_s_per_axis: dict[int, float]
    comm_bytes_per_axis: dict[int, float]
    comm_time_s_per_collective: dict[str, float]
    memory: MemoryBreakdown
    fallback_ops: list[str] = field(default_factory=list)
    fallback_op_types: list[str] = field(default_factory=list)
    boxed_edges: int = 0

    @property
    def memory_per_device_bytes(self) -> float:
        return self.memory.total

    def to_dict(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "errors": self.errors[:50],
            "error_count": len(self.errors),
            "step_time_s": self.step_time_s,
            "compute_time_s": self.compute_time_s,
            "comm_time_s": self.comm_time_s,
            "comm_time_s_per_axis": {str(k): v for k, v in sorted(self.comm_time_s_per_axis.items())},
            "comm_bytes_per_axis": {str(k): v for k, v in sorted(self.comm_bytes_per_axis.items())},
            "comm_time_s_per_collective": dict(sorted(self.comm_time_s_per_collective.items())),
            "memory_per_device_bytes": self.memory.total,
            "memory": {
                "params_bytes": self.memory.params,
                "grads_bytes": self.memory.grads,
                "optimizer_bytes": self.memory.optimizer,
                "activation_peak_bytes": self.memory.activations,
            },
            "boxed_edges": self.boxed_edges,
            "fallback_ops": self.fallback_ops,
            "fallback_op_types": self.fallback_op_types,
        }


def evaluate(
    graph: Graph,
    plan: Plan,
    *,
    rules: RuleSet | None = None,
    states: StateBytes = MIXED_PRECISION_ADAM,
    check_signatures: bool = True,
) -> Evaluation:
    """Recompute validity, step time, communication and memory of ``plan`` on ``graph``."""
    rules = rules or default_rules()
    mesh = plan.mesh
    errors: list[str] = []
    compute = 0.0
    comm_axis: dict[int, float] = defaultdict(float)
    bytes_axis: dict[int, float] = defaultdict(float)
    comm_kind: dict[str, float] = defaultdict(float)
    fallback_ops: list[str] = []
    fallback_types: set[str] = set()
    tensor_sbp: dict[str, NdSbp] = {}
    boxed = 0

    for op in graph.ops:
        sig = plan.signatures.get(op.name)
        if sig is None:
            errors.append(f"op {op.name!r}: no signature in the plan")
            continue
        ins, outs = plan.ports.get(op.name, ([], []))
        if ins != list(op.inputs) or outs != list(op.outputs):
            errors.append(
                f"op {op.name!r}: plan ports {ins} -> {outs} differ from the graph's "
                f"{list(op.inputs)} -> {list(op.outputs)}"
            )
            continue
        if any(len(s) != mesh.ndim for s in (*sig.inputs, *sig.outputs)):
            errors.append(f"op {op.name!r}: signature {sig} does not have {mesh.ndim} mesh axes")
            continue
        ctx = rule_context(graph, op, mesh.shape, plan.zero_stage)
        rule = rules.get(op.type)
        if check_signatures:
            valid_sigs, fallback = op_signatures(rules, ctx)
            if fallback:
                fallback_ops.append(op.name)
                fallback_types.add(op.type)
            if sig not in valid_sigs:
                errors.append(f"op {op.name!r} ({op.type}): signature {sig} is not one its rule offers")
        t = op_compute_time(rule, ctx, sig, mesh)
        gather = optimizer_gather_plan(ctx, sig, mesh)
        if gather is not None:
            # the ZeRO parameter all-gather counts as communication on the dp axes
            t -= gather.time_s
            for step in gather.steps:
                comm_axis[step.axis] += step.time_s
                bytes_axis[step.axis] += step.bytes_per_device
                comm_kind[step.collective.value] += step.time_s
        compute += t
        for port, sbp in zip(outs, sig.outputs):
            tensor_sbp[op.outputs[port]] = sbp

    for op in graph.ops:
        sig = plan.signatures.get(op.name)
        if sig is None or op.name not in plan.ports:
            continue
        ins, _ = plan.ports[op.name]
        if ins != list(op.inputs):
            continue
        for port, dst in zip(ins, sig.inputs):
            tensor = op.inputs[port]
            src = tensor_sbp.get(tensor)
            if src is None:
                continue
            if src == dst:
                continue
            kind = edge_kind(op, port)
            if kind is EdgeKind.SHAPE_ONLY:
                continue
            if kind is EdgeKind.IN_PLACE:
                errors.append(
                    f"op {op.name!r} port {port!r} updates {tensor!r} in place: it must take the "
                    f"producer's layout {src}, not {dst}"
                )
                continue
            spec = graph.tensors[tensor]
            bp = boxing_plan(spec.shape, DTYPE_BYTES[spec.dtype], src, dst, mesh)
            if not bp.feasible:
                errors.append(
                    f"edge {graph.producer[tensor][0]!r} -> {op.name!r} port {port!r}: "
                    f"cannot box {src} into {dst} for shape {list(spec.shape)}"
                )
                continue
            boxed += 1
            for step in bp.steps:
                comm_axis[step.axis] += step.time_s
                bytes_axis[step.axis] += step.bytes_per_device
                comm_kind[step.collective.value] += step.time_s

    params = grads = opt = 0.0
    for v in graph.variables:
        var_sbp = tensor_sbp.get(v.tensor)
        if var_sbp is None:
            continue
        p, g, o = variable_state_bytes(
            graph.tensors[v.tensor].shape, var_sbp, mesh.shape, plan.zero_stage, states
        )
        params += p
        grads += g
        opt += o
    activations = 0.0
    if len(tensor_sbp) == len(graph.tensors):
        profile = activation_profile(graph, tensor_sbp, mesh.shape)
        activations = max(profile) if profile else 0.0
    comm = sum(comm_axis.values())
    return Evaluation(
        valid=not errors,
        errors=errors,
        step_time_s=compute + comm,
        compute_time_s=compute,
        comm_time_s=comm,
        comm_time_s_per_axis={a: comm_axis.get(a, 0.0) for a in range(mesh.ndim)},
        comm_bytes_per_axis={a: bytes_axis.get(a, 0.0) for a in range(mesh.ndim)},
        comm_time_s_per_collective=dict(comm_kind),
        memory=MemoryBreakdown(params, grads, opt, activations),
        fallback_ops=fallback_ops,
        fallback_op_types=sorted(fallback_types),
        boxed_edges=boxed,
    )


def attach_evaluation(plan: Plan, ev: Evaluation) -> Plan:
    """Fill ``plan.predicted``, ``plan.memory`` and ``plan.diagnostics`` from ``ev``."""
    d = ev.to_dict()
    plan.predicted = {
        "step_time_s": ev.step_time_s,
        "compute_time_s": ev.compute_time_s,
        "comm_time_s": ev.comm_time_s,
        "comm_time_s_per_axis": d["comm_time_s_per_axis"],
        "comm_bytes_per_axis": d["comm_bytes_per_axis"],
        "comm_time_s_per_collective": d["comm_time_s_per_collective"],
    }
    plan.memory = {
        "per_device_bytes": ev.memory.total,
        **d["memory"],
        "budget_bytes": plan.memory_budget_bytes,
        "fits": plan.memory_budget_bytes is None or ev.memory.total <= plan.memory_budget_bytes,
    }
    plan.diagnostics = {
        **plan.diagnostics,
        "fallback_ops": ev.fallback_ops,
        "fallback_op_types": ev.fallback_op_types,
        "boxed_edges": ev.boxed_edges,
        "valid": ev.valid,
    }
    if not math.isfinite(ev.step_time_s):
        plan.diagnostics["errors"] = ev.errors[:20]
    return plan
