"""Cost tables: the cost model of :mod:`autopar.costs` evaluated for one graph on one mesh.

:class:`CostTables` holds, for one graph on one mesh, each op's signature list
and compute times, and each edge's boxing matrix.  Entries are keyed by content
(op type, attrs that matter, shapes, dtypes, mesh and cluster, ZeRO stage for
optimizer ops, :data:`~autopar.costs.COST_MODEL_VERSION`), so identical layers
share them; missing entries are computed in a process pool and stored in a
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
from typing import Any

import numpy as np

from autopar.boxing import boxing_matrix
from autopar.cluster import Mesh
from autopar.costs import (
    COST_MODEL_VERSION,
    EdgeKind,
    edge_kind,
    op_compute_time,
    op_signatures,
)
from autopar.graph import DTYPE_BYTES, Graph, Op, Role, TensorSpec
from autopar.rules.registry import RuleContext, default_rules
from autopar.sbp import NdSbp, Signature, parse_signature
from autopar.store import KeyValueStore, MemoryStore

__all__ = [
    "CostTables",
    "EdgeTable",
    "OpTable",
    "build_cost_tables",
    "edge_key",
    "op_key",
]

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


def op_key(graph: Graph, op: Op, mesh: Mesh, zero_stage: int) -> str:
    """Content key of an op's table entry: what changes its signatures or costs."""
    payload = {
        "v": COST_MODEL_VERSION,
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
) -> str:
    payload = {
        "v": COST_MODEL_VERSION,
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

    def port_sbp(self, op_name: str, choice: int, port: str, output: bool) -> NdSbp:
        op = self.graph.op_by_name[op_name]
        table = self.ops[op_name]
        sig = table.signatures[choice]
        ports = list(op.outputs if output else op.inputs)
        seq = sig.outputs if output else sig.inputs
        return seq[ports.index(port)]


def _compute_op_entry(
    op: Op, ins: tuple[TensorSpec, ...], outs: tuple[TensorSpec, ...], mesh: Mesh, zero: int
) -> bytes:
    rules = default_rules()
    ctx = RuleContext(op=op, inputs=ins, outputs=outs, mesh_shape=mesh.shape, zero_stage=zero)
    sigs, fallback = op_signatures(rules, ctx)
    rule = rules.get(op.type)
    times = np.array([op_compute_time(rule, ctx, s, mesh) for s in sigs], dtype=np.float64)
    return OpTable(sigs, times, fallback).to_bytes()


def _compute_op_batch(
    batch: list[tuple[Op, tuple[TensorSpec, ...], tuple[TensorSpec, ...], Mesh, int]],
) -> list[bytes]:
    return [_compute_op_entry(*item) for item in batch]


def _compute_edge_batch(batch: list[tuple[TensorSpec, list[NdSbp], list[NdSbp], Mesh, bool]]) -> list[bytes]:
    out = []
    for spec, src, dst, mesh, in_place in batch:
        if in_place:
            m = np.array([[0.0 if s == d else math.inf for d in dst] for s in src], dtype=np.float64)
        else:
            m = boxing_matrix(spec.shape, DTYPE_BYTES[spec.dtype], src, dst, mesh)
        out.append(zlib.compress(m.astype(np.float64).tobytes(), 1))
    return out


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
) -> CostTables:
    """Build (or fetch from ``store``) every op and edge table of ``graph`` on ``mesh``.

    Unique keys missing from ``store`` are computed in a process pool of
    ``workers`` processes (default: CPU count) when there are at least
    ``parallel_threshold`` of them, else in this process.  ``progress`` is
    called as ``progress(phase, done, total)`` with phase ``"ops"`` / ``"edges"``.
    """
    t0 = time.perf_counter()
    store = store if store is not None else MemoryStore()
    workers = workers or os.cpu_count() or 1
    ndim = mesh.ndim

    # ---- ops
    keys: dict[str, str] = {}
    first_op_for_key: dict[str, Op] = {}
    for op in graph.ops:
        k = op_key(graph, op, mesh, zero_stage)
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
    for op in graph.ops:
        for in_port, tensor in op.inputs.items():
            if edge_kind(op, in_port) is EdgeKind.SHAPE_ONLY:
                continue  # no data flows: no boxing, no edge
            prod, out_port = graph.producer[tensor]
            edge_specs.append((prod, out_port, op.name, in_port, tensor))
    distinct: dict[str, tuple[TensorSpec, list[NdSbp], list[NdSbp]]] = {}
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
        k = edge_key(spec, src_u, dst_u, mesh, edge_kind(cop, in_port))
        distinct.setdefault(k, (spec, src_u, dst_u))
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
    ejobs = [
        (distinct[k][0], distinct[k][1], distinct[k][2], mesh, k.startswith("edge:in_place"))
        for k in missing_e
    ]
    computed_e = _run_batches(_compute_edge_batch, ejobs, workers, parallel_threshold, progress, "edges")
    new_e = dict(zip(missing_e, computed_e))
    if new_e:
        store.put_many(new_e)
    raw_e = {**found_e, **new_e}
    small: dict[str, np.ndarray] = {}
    for k in edge_keys:
        _, src_u, dst_u = distinct[k]
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
    return CostTables(graph, mesh, zero_stage, tables, edges, stats, keys)


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
