"""Cost model and cost tables.

Per op and N-D signature (pure functions, seconds):

* ``CostKind.MATMUL``: ``flops / work_share / (peak_flops * matmul_efficiency)``;
* ``CostKind.MEMORY``: ``(local input bytes + local output bytes) /
  (memory_bandwidth * memory_efficiency)`` (roofline for memory-bound ops);
* ``CostKind.FREE``: 0 (views, variables, ticks);
* optimizer ops (role ``optimizer``) additionally pay ZeRO's parameter
  all-gathers: boxing of the parameter (in its own dtype) from the gradient's
  SBP to the parameter's, once after the update under ZeRO-1/2, twice (before
  forward and before backward) under ZeRO-3; 0 when the layouts are equal.

``work_share`` is the product of the sizes of the mesh axes on which some port
is split (an axis where every port is ``B`` or ``P`` repeats the work).

Per edge (producer output port -> consumer input port): boxing time from the
producer's output N-D SBP to the consumer's input N-D SBP as the runtime
profile lowers it (:mod:`autopar.runtime`, :mod:`autopar.boxing`).  An edge
into an optimizer's gradient port is a gradient reduction: frameworks bucket
those, so its per-step latency is scaled by ``min(1, bytes / bucket)``
(:func:`bucketed_time`).

:class:`CostTables` holds, for one graph on one mesh, each op's signature list
and compute times, and each edge's boxing matrix.  Entries are keyed by content
(op type, attrs that matter, shapes, dtypes, mesh and cluster, ZeRO stage for
optimizer ops, the runtime profile, and :func:`model_digest` -- a hash of
every source file that can change a cost), so identical layers share them and
an upgraded model never reads stale entries;
missing entries are computed in a process pool and stored in a
:class:`~autopar.store.KeyValueStore` for later graphs and runs.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from autopar.boxing import BoxingPlan, BoxingStep, Collective, boxing_plan, boxing_search
from autopar.cluster import Mesh
from autopar.graph import DTYPE_BYTES, Graph, Op, Role, TensorSpec
from autopar.optimizer import (
    IN_PLACE_PORTS,
    grad_port_index,
    model_port_index,
    state_count,
    weight_gradient_path,
)
from autopar.rules.registry import (
    CostKind,
    Rule,
    RuleContext,
    RuleSet,
    base_name,
    default_rules,
    fallback_signatures,
    nd_signatures,
    work_share,
)
from autopar.runtime import RuntimeProfile, runtime_profile
from autopar.sbp import NdSbp, Signature, local_shape, parse_signature
from autopar.store import KeyValueStore, MemoryStore

__all__ = [
    "COST_MODEL_VERSION",
    "CostTables",
    "EdgeKind",
    "EdgeTable",
    "OpTable",
    "bucketed_time",
    "build_cost_tables",
    "edge_kind",
    "model_digest",
    "op_compute_time",
    "op_signatures",
]

COST_MODEL_VERSION = "2"

_MODEL_SOURCES = (
    "boxing.py", "cluster.py", "costs.py", "graph.py", "memory.py", "optimizer.py",
    "runtime.py", "sbp.py", "rules",
)  # fmt: skip
"""Files and folders of :mod:`autopar` whose code can change a cost table entry."""


def model_digest(root: str | None = None) -> str:
    """SHA-256 (hex, 16 chars) of every source file that can change a cost.

    Part of every cost-table key, so a changed rule, boxing or cost formula
    misses entries written by older code instead of serving them.
    """
    base = root or os.path.dirname(os.path.abspath(__file__))
    if root is None and _DIGEST_CACHE:
        return _DIGEST_CACHE[0]
    h = hashlib.sha256()
    for name in _MODEL_SOURCES:
        path = os.path.join(base, name)
        files = (
            sorted(os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs if f.endswith(".py"))
            if os.path.isdir(path)
            else [path]
        )
        for f in files:
            h.update(os.path.relpath(f, base).encode())
            with open(f, "rb") as fh:
                h.update(fh.read())
    digest = h.hexdigest()[:16]
    if root is None:
        _DIGEST_CACHE.append(digest)
    return digest


_DIGEST_CACHE: list[str] = []

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


def optimizer_update_bytes(param_itemsize: int, grad_itemsize: int, states: int) -> int:
    """Memory traffic of an elementwise optimizer update per local element, bytes.

    Reads the parameter, the gradient and each state, writes the parameter and
    each state: ``2 * param + grad + 2 * states * param``.  Adam on float32:
    ``8 + 4 + 16 = 28``.  Source: the update kernels read and write every
    operand once (OneFlow ``adam_update`` kernel).
    """
    return 2 * param_itemsize + grad_itemsize + 2 * states * param_itemsize


# ------------------------------------------------------------------ per op


def rule_context(graph: Graph, op: Op, mesh_shape: Sequence[int], zero_stage: int) -> RuleContext:
    return RuleContext(
        op=op,
        inputs=tuple(graph.tensors[t] for t in op.inputs.values()),
        outputs=tuple(graph.tensors[t] for t in op.outputs.values()),
        mesh_shape=tuple(mesh_shape),
        zero_stage=zero_stage,
    )


def op_signatures(rules: RuleSet, ctx: RuleContext) -> tuple[list[Signature], bool]:
    """Valid N-D signatures of the op and whether the all-``B`` fallback was used."""
    rule = rules.get(ctx.op.type)
    if rule is None:
        return fallback_signatures(ctx), True
    sigs = nd_signatures(rule, ctx)
    if not sigs:
        # the rule offers nothing that fits these shapes: replicate rather than fail
        return fallback_signatures(ctx), True
    return sigs, False


def _local_bytes(specs: Sequence[TensorSpec], sbps: Sequence[NdSbp], mesh_shape: Sequence[int]) -> float:
    total = 0.0
    for spec, sbp in zip(specs, sbps):
        local = local_shape(spec.shape, sbp, mesh_shape)
        numel = math.prod(local) if local is not None else spec.numel
        total += numel * DTYPE_BYTES[spec.dtype]
    return total


def op_compute_time(
    rule: Rule | None, ctx: RuleContext, sig: Signature, mesh: Mesh, lowering: str = "ideal"
) -> float:
    """Seconds of compute for ``ctx.op`` under ``sig`` (formulas in the module docstring)."""
    dev = mesh.cluster.device
    if ctx.op.role is Role.OPTIMIZER and ctx.op.type not in ("variable", "input", "output"):
        t = 0.0
        if ctx.inputs:
            # the gradient port decides the local slice each device updates
            grad_index = grad_port_index(ctx.op)
            spec = ctx.inputs[grad_index]
            local = local_shape(spec.shape, sig.inputs[grad_index], mesh.shape)
            numel = math.prod(local) if local is not None else spec.numel
            model_index = model_port_index(ctx.op)
            param = ctx.inputs[model_index] if model_index is not None else spec
            per_element = optimizer_update_bytes(
                DTYPE_BYTES[param.dtype], DTYPE_BYTES[spec.dtype], state_count(ctx.op.type, ctx.op.attrs)
            )
            t += float(numel * per_element) / (dev.memory_bandwidth * dev.memory_efficiency)
        return t + optimizer_gather_time(ctx, sig, mesh, lowering)
    kind = rule.cost if rule is not None else CostKind.MEMORY
    if kind is CostKind.FREE:
        return 0.0
    if kind is CostKind.MATMUL and rule is not None and rule.flops is not None:
        flops = rule.flops(ctx)
        return flops / work_share(sig, mesh.shape) / (dev.peak_flops * dev.matmul_efficiency)
    moved = _local_bytes(ctx.inputs, sig.inputs, mesh.shape) + _local_bytes(
        ctx.outputs, sig.outputs, mesh.shape
    )
    return moved / (dev.memory_bandwidth * dev.memory_efficiency)


def zero_gathers_per_step(zero_stage: int) -> int:
    """Parameter all-gathers per step under ZeRO: 1 after the update (stages 1-2); 2 under
    ZeRO-3, which keeps parameters sharded and gathers them before forward and again
    before backward.  Source: ZeRO paper section 7.2 (ZeRO-3 moves 3 Psi vs 2 Psi)."""
    return 2 if zero_stage >= 3 else 1


def optimizer_gather_plan(
    ctx: RuleContext, sig: Signature, mesh: Mesh, lowering: str = "ideal"
) -> BoxingPlan | None:
    """One ZeRO all-gather of the parameter, or None when there is none.

    Boxing of the parameter, in its own dtype, from the gradient's layout
    (sharded over the data-parallel axes under ZeRO >= 1) back to the
    parameter's layout.  None when both layouts agree (ZeRO stage 0).  It runs
    :func:`zero_gathers_per_step` times per step.
    Source: ZeRO paper section 7 (ZeRO-2 traffic = reduce-scatter + all-gather).
    """
    model_index = model_port_index(ctx.op)
    if model_index is None:
        return None
    grad_index = grad_port_index(ctx.op)
    src, dst = sig.inputs[grad_index], sig.inputs[model_index]
    if src == dst:
        return None
    param = ctx.inputs[model_index]
    return boxing_plan(param.shape, DTYPE_BYTES[param.dtype], src, dst, mesh, lowering)


def optimizer_gather_time(ctx: RuleContext, sig: Signature, mesh: Mesh, lowering: str = "ideal") -> float:
    """Seconds per step of :func:`optimizer_gather_plan` (0 when there is no gather)."""
    plan = optimizer_gather_plan(ctx, sig, mesh, lowering)
    return 0.0 if plan is None else plan.time_s * zero_gathers_per_step(ctx.zero_stage)


def step_latency(step: BoxingStep, mesh: Mesh) -> float:
    """The latency part of a boxing step, seconds: its time less its bytes over the axis's
    bandwidth for that collective (``alpha``-terms of the alpha-beta model)."""
    if step.collective is Collective.LOCAL or step.bytes_per_device <= 0:
        return max(0.0, step.time_s)
    _, beta = mesh.axes[step.axis].alpha_beta(step.collective.value)
    return max(0.0, step.time_s - step.bytes_per_device / beta)


def bucketed_time(plan: BoxingPlan, tensor_bytes: float, bucket_bytes: int, mesh: Mesh) -> float:
    """Seconds of a gradient reduction when gradients are reduced in buckets.

    ``time - latency * (1 - min(1, tensor_bytes / bucket_bytes))``: a tensor
    that fills a fraction ``f`` of a bucket pays ``f`` of the bucket's
    collective latency, so the sum over gradients is one latency per bucket.
    ``bucket_bytes = 0``: no bucketing.  Source: PyTorch DDP (``bucket_cap_mb``),
    DeepSpeed ``reduce_bucket_size``.
    """
    if bucket_bytes <= 0 or not plan.steps:
        return plan.time_s
    share = min(1.0, tensor_bytes / bucket_bytes)
    latency = sum(step_latency(s, mesh) for s in plan.steps)
    return plan.time_s - latency * (1.0 - share)


# ------------------------------------------------------------------ edges


class EdgeKind(str, Enum):
    """How an edge into an op's input port is costed."""

    BOXING = "boxing"
    """Data flows: boxing time from the producer's SBP to the consumer's."""
    SHAPE_ONLY = "shape_only"
    """The port only lends its shape (``like`` of ``reduce_sum_like``, ``ones_like`` ...): free."""
    IN_PLACE = "in_place"
    """The op updates the tensor in place (optimizer ``model``): the layouts must be equal,
    any other pair is forbidden (``inf``)."""
    GRADIENT = "gradient"
    """A weight gradient on its way to the optimizer: boxing with bucketed latency
    (:func:`bucketed_time`), overlappable with the backward pass."""


SHAPE_ONLY_PORTS = frozenset({"like"})


def edge_kind(op: Op, port: str, gradient: bool = False) -> EdgeKind:
    """Classify the edge into ``op``'s input ``port`` (the one place that forbids layout changes).

    ``gradient``: the tensor is on a weight gradient's path to its optimizer
    (:func:`autopar.optimizer.weight_gradient_path`); so is the optimizer's
    ``model_diff`` port.
    """
    base = base_name(port)
    if base in SHAPE_ONLY_PORTS:
        return EdgeKind.SHAPE_ONLY
    if op.role is Role.OPTIMIZER and base in IN_PLACE_PORTS:
        return EdgeKind.IN_PLACE
    if gradient or (op.role is Role.OPTIMIZER and base == "model_diff"):
        return EdgeKind.GRADIENT
    return EdgeKind.BOXING


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
    payload = {
        "v": COST_MODEL_VERSION,
        "model": model_digest(),
        "runtime": runtime_profile(runtime).key(),
        "shape": list(spec.shape),
        "dtype": spec.dtype,
        "src": [str(s) for s in src],
        "dst": [str(s) for s in dst],
        "mesh": mesh.key(),
    }
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:32]
    return f"edge:{kind.value}:{digest}"


# ------------------------------------------------------------------ entries


@dataclass
class OpTable:
    """An op's signatures and per-signature compute seconds."""

    signatures: list[Signature]
    compute_s: np.ndarray
    fallback: bool

    def to_bytes(self) -> bytes:
        data = {
            "sigs": [str(s) for s in self.signatures],
            "t": [float(x) for x in self.compute_s],
            "fb": self.fallback,
        }
        return zlib.compress(json.dumps(data).encode(), 1)

    @classmethod
    def from_bytes(cls, raw: bytes, ndim: int) -> OpTable:
        data = json.loads(zlib.decompress(raw))
        sigs = [parse_signature(s, ndim) for s in data["sigs"]]
        return cls(sigs, np.asarray(data["t"], dtype=np.float64), bool(data["fb"]))


@dataclass
class EdgeTable:
    """Boxing seconds from each producer signature to each consumer signature.

    ``matrix[i, j]`` = boxing time from the producer's output SBP under its
    signature ``i`` to the consumer's input SBP under its signature ``j``.
    """

    producer: str
    out_port: str
    consumer: str
    in_port: str
    tensor: str
    matrix: np.ndarray


@dataclass
class CostTables:
    """Cost tables of one graph on one mesh under one ZeRO stage."""

    graph: Graph
    mesh: Mesh
    zero_stage: int
    ops: dict[str, OpTable]
    edges: list[EdgeTable]
    stats: dict[str, Any] = field(default_factory=dict)
    op_keys: dict[str, str] = field(default_factory=dict)
    """op name -> content key (equal keys: same signatures and costs)."""
    runtime: RuntimeProfile = field(default_factory=runtime_profile)

    def port_sbp(self, op_name: str, choice: int, port: str, output: bool) -> NdSbp:
        op = self.graph.op_by_name[op_name]
        table = self.ops[op_name]
        sig = table.signatures[choice]
        ports = list(op.outputs if output else op.inputs)
        seq = sig.outputs if output else sig.inputs
        return seq[ports.index(port)]


def _compute_op_entry(
    op: Op, ins: tuple[TensorSpec, ...], outs: tuple[TensorSpec, ...], mesh: Mesh, zero: int, lowering: str
) -> bytes:
    rules = default_rules()
    ctx = RuleContext(op=op, inputs=ins, outputs=outs, mesh_shape=mesh.shape, zero_stage=zero)
    sigs, fallback = op_signatures(rules, ctx)
    rule = rules.get(op.type)
    times = np.array([op_compute_time(rule, ctx, s, mesh, lowering) for s in sigs], dtype=np.float64)
    return OpTable(sigs, times, fallback).to_bytes()


def _compute_op_batch(
    batch: list[tuple[Op, tuple[TensorSpec, ...], tuple[TensorSpec, ...], Mesh, int, str]],
) -> list[bytes]:
    return [_compute_op_entry(*item) for item in batch]


def edge_time(
    spec: TensorSpec, src: NdSbp, dst: NdSbp, mesh: Mesh, kind: EdgeKind, runtime: RuntimeProfile
) -> tuple[float, BoxingPlan | None]:
    """Seconds of one edge and the boxing behind it (None when nothing moves).

    The one place an edge is priced: shape-only ports are free, in-place ports
    forbid any change (``inf``), gradient edges are bucketed, the rest is boxing
    as ``runtime`` lowers it.
    """
    if src == dst or kind is EdgeKind.SHAPE_ONLY:
        return 0.0, None
    if kind is EdgeKind.IN_PLACE:
        return math.inf, None
    plan = boxing_plan(spec.shape, DTYPE_BYTES[spec.dtype], src, dst, mesh, runtime.lowering.value)
    if kind is EdgeKind.GRADIENT and plan.feasible:
        return bucketed_time(
            plan, spec.numel * DTYPE_BYTES[spec.dtype], runtime.grad_bucket_bytes, mesh
        ), plan
    return plan.time_s, plan


def _edge_matrix(
    spec: TensorSpec,
    src: Sequence[NdSbp],
    dst: Sequence[NdSbp],
    mesh: Mesh,
    kind: EdgeKind,
    runtime: RuntimeProfile,
) -> np.ndarray:
    m = np.empty((len(src), len(dst)), dtype=np.float64)
    if kind is EdgeKind.IN_PLACE:
        for i, s in enumerate(src):
            for j, d in enumerate(dst):
                m[i, j] = 0.0 if s == d else math.inf
        return m
    search = boxing_search(spec.shape, DTYPE_BYTES[spec.dtype], mesh, runtime.lowering.value)
    nbytes = spec.numel * DTYPE_BYTES[spec.dtype]
    for i, s in enumerate(src):
        for j, d in enumerate(dst):
            if kind is EdgeKind.GRADIENT and s != d:
                plan = search.plan(s, d)
                m[i, j] = (
                    bucketed_time(plan, nbytes, runtime.grad_bucket_bytes, mesh)
                    if plan.feasible
                    else math.inf
                )
            else:
                m[i, j] = search.time(s, d)
    return m


def _compute_edge_batch(
    batch: list[tuple[TensorSpec, list[NdSbp], list[NdSbp], Mesh, EdgeKind, RuntimeProfile]],
) -> list[bytes]:
    return [zlib.compress(_edge_matrix(*item).astype(np.float64).tobytes(), 1) for item in batch]


def _chunks(items: list[Any], n: int) -> list[list[Any]]:
    if not items:
        return []
    size = max(1, math.ceil(len(items) / n))
    return [items[i : i + size] for i in range(0, len(items), size)]


ProgressFn = Callable[[str, int, int], None]


def build_cost_tables(
    graph: Graph,
    mesh: Mesh,
    zero_stage: int = 0,
    *,
    store: KeyValueStore | None = None,
    workers: int | None = None,
    progress: ProgressFn | None = None,
    parallel_threshold: int = 64,
    runtime: RuntimeProfile | str | None = None,
) -> CostTables:
    """Build (or fetch from ``store``) every op and edge table of ``graph`` on ``mesh``.

    Unique keys missing from ``store`` are computed in a process pool of
    ``workers`` processes (default: CPU count) when there are at least
    ``parallel_threshold`` of them, else in this process.  ``progress`` is
    called as ``progress(phase, done, total)`` with phase ``"ops"`` / ``"edges"``.
    ``runtime`` (default :data:`autopar.runtime.DEFAULT_RUNTIME`) prices boxing.
    """
    t0 = time.perf_counter()
    profile = runtime_profile(runtime)
    lowering = profile.lowering.value
    store = store if store is not None else MemoryStore()
    workers = workers or os.cpu_count() or 1
    ndim = mesh.ndim

    # ---- ops
    keys: dict[str, str] = {}
    first_op_for_key: dict[str, Op] = {}
    for op in graph.ops:
        k = op_key(graph, op, mesh, zero_stage, profile)
        keys[op.name] = k
        first_op_for_key.setdefault(k, op)
    unique_op_keys = list(first_op_for_key)
    found = store.get_many(unique_op_keys)
    missing = [k for k in unique_op_keys if k not in found]
    jobs = [
        (
            first_op_for_key[k],
            tuple(graph.tensors[t] for t in first_op_for_key[k].inputs.values()),
            tuple(graph.tensors[t] for t in first_op_for_key[k].outputs.values()),
            mesh,
            zero_stage,
            lowering,
        )
        for k in missing
    ]
    computed = _run_batches(_compute_op_batch, jobs, workers, parallel_threshold, progress, "ops")
    new_entries = dict(zip(missing, computed))
    if new_entries:
        store.put_many(new_entries)
    raw_by_key = {**found, **new_entries}
    decoded = {k: OpTable.from_bytes(raw_by_key[k], ndim) for k in unique_op_keys}
    tables = {op.name: decoded[keys[op.name]] for op in graph.ops}
    t_ops = time.perf_counter() - t0

    # ---- edges
    t1 = time.perf_counter()
    edge_specs: list[tuple[str, str, str, str, str]] = []
    gradients = weight_gradient_path(graph)
    for op in graph.ops:
        for in_port, tensor in op.inputs.items():
            if edge_kind(op, in_port) is EdgeKind.SHAPE_ONLY:
                continue  # no data flows: no boxing, no edge
            prod, out_port = graph.producer[tensor]
            edge_specs.append((prod, out_port, op.name, in_port, tensor))
    distinct: dict[str, tuple[TensorSpec, list[NdSbp], list[NdSbp], EdgeKind]] = {}
    edge_index: list[tuple[str, np.ndarray, np.ndarray]] = []
    for prod, out_port, cons, in_port, tensor in edge_specs:
        ptab, ctab = tables[prod], tables[cons]
        pop, cop = graph.op_by_name[prod], graph.op_by_name[cons]
        oi = list(pop.outputs).index(out_port)
        ii = list(cop.inputs).index(in_port)
        src_all = [s.outputs[oi] for s in ptab.signatures]
        dst_all = [s.inputs[ii] for s in ctab.signatures]
        src_u = list(dict.fromkeys(src_all))
        dst_u = list(dict.fromkeys(dst_all))
        spec = graph.tensors[tensor]
        kind = edge_kind(cop, in_port, tensor in gradients)
        k = edge_key(spec, src_u, dst_u, mesh, kind, profile)
        distinct.setdefault(k, (spec, src_u, dst_u, kind))
        src_pos = {s: i for i, s in enumerate(src_u)}
        dst_pos = {s: i for i, s in enumerate(dst_u)}
        edge_index.append(
            (
                k,
                np.fromiter((src_pos[s] for s in src_all), dtype=np.int64, count=len(src_all)),
                np.fromiter((dst_pos[s] for s in dst_all), dtype=np.int64, count=len(dst_all)),
            )
        )
    edge_keys = list(distinct)
    found_e = store.get_many(edge_keys)
    missing_e = [k for k in edge_keys if k not in found_e]
    ejobs = [(*distinct[k][:3], mesh, distinct[k][3], profile) for k in missing_e]
    computed_e = _run_batches(_compute_edge_batch, ejobs, workers, parallel_threshold, progress, "edges")
    new_e = dict(zip(missing_e, computed_e))
    if new_e:
        store.put_many(new_e)
    raw_e = {**found_e, **new_e}
    small: dict[str, np.ndarray] = {}
    for k in edge_keys:
        _, src_u, dst_u, _ = distinct[k]
        small[k] = np.frombuffer(zlib.decompress(raw_e[k]), dtype=np.float64).reshape(len(src_u), len(dst_u))
    edges = [
        EdgeTable(prod, out_port, cons, in_port, tensor, small[k][np.ix_(ri, ci)])
        for (prod, out_port, cons, in_port, tensor), (k, ri, ci) in zip(edge_specs, edge_index)
    ]
    t_edges = time.perf_counter() - t1
    stats = {
        "ops": len(graph.ops),
        "unique_op_entries": len(unique_op_keys),
        "op_entries_computed": len(missing),
        "edges": len(edges),
        "unique_edge_entries": len(edge_keys),
        "edge_entries_computed": len(missing_e),
        "fallback_ops": sorted(op.name for op in graph.ops if tables[op.name].fallback),
        "time_ops_s": t_ops,
        "time_edges_s": t_edges,
        "time_s": time.perf_counter() - t0,
    }
    return CostTables(graph, mesh, zero_stage, tables, edges, stats, keys, profile)


def _run_batches(
    fn: Callable[[list[Any]], list[bytes]],
    jobs: list[Any],
    workers: int,
    threshold: int,
    progress: ProgressFn | None,
    phase: str,
) -> list[bytes]:
    total = len(jobs)
    if progress:
        progress(phase, 0, total)
    if total == 0:
        return []
    if workers <= 1 or total < threshold:
        out = fn(jobs)
        if progress:
            progress(phase, total, total)
        return out
    batches = _chunks(jobs, workers * 4)
    results: list[bytes] = []
    done = 0
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for batch_out in pool.map(fn, batches):
            results.extend(batch_out)
            done += len(batch_out)
            if progress:
                progress(phase, done, total)
    return results
