"""Cost tables: the cost model of :mod:`autopar.cost.compute` evaluated for one graph on one mesh.

:class:`CostTables` holds, for one graph on one mesh, each op's signature list
and compute times, and each edge's boxing matrix.  Entries are keyed by content
(op type, attrs that matter, shapes, dtypes, mesh and cluster, ZeRO stage for
optimizer ops, the runtime profile, :data:`~autopar.cost.model_version.COST_MODEL_VERSION` and
:func:`~autopar.cost.model_version.model_digest` -- a hash of every source file that can
change a cost, so an upgraded model never reads stale entries), so identical
layers share them; missing entries are computed in a process pool and stored in a
:class:`~autopar.infra.store.KeyValueStore` for later graphs and runs.
"""

from __future__ import annotations

import json
import math
import os
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from autopar.cost.edges import EdgeKind, edge_kind
from autopar.cost.fusion import NO_KERNELS, Kernels, fused_kernels, priced_op
from autopar.cost.remote_tables import RemoteTableBuilder, _run_remote
from autopar.cost.table_keys import _edge_key, op_key
from autopar.cost.tables import (
    CostTables,
    EdgeTable,
    OpTable,
    _chunks,
    _compute_edge_batch,
    _compute_op_batch,
    _PortSbps,
    _read_op_table,
)
from autopar.cost.zero_gathers import zero_gather_dtype
from autopar.errors import TimeLimitError
from autopar.hardware.mesh import Mesh
from autopar.infra.batch_pool import BatchPool, PoolTimeout
from autopar.infra.progress import Deadline, ProgressFn
from autopar.infra.store import KeyValueStore, MemoryStore
from autopar.ir.graph import Graph, Op, TensorSpec
from autopar.ir.optimizer import weight_gradient_path
from autopar.ir.sbp import NdSbp
from autopar.runtimes.profile import RuntimeProfile
from autopar.runtimes.registry import runtime_profile

__all__ = ["build_cost_tables"]


def build_cost_tables(
    graph: Graph,
    mesh: Mesh,
    zero_stage: int = 0,
    *,
    store: KeyValueStore | None = None,
    workers: int | None = None,
    progress: ProgressFn | None = None,
    parallel_threshold: int = 64,
    deadline: Deadline | None = None,
    runtime: RuntimeProfile | str | None = None,
    remote: RemoteTableBuilder | None = None,
) -> CostTables:
    """Build (or fetch from ``store``) every op and edge table of ``graph`` on ``mesh``.

    Unique keys missing from ``store`` are computed in a process pool of
    ``workers`` processes (default: CPU count) when there are at least
    ``parallel_threshold`` of them, else in this process.  With ``remote`` (the
    service's RQ workers, :class:`RemoteTableBuilder`) and at least
    ``parallel_threshold`` missing, they are sent there in batches first, and
    whatever is still missing when it returns is computed here.  ``progress`` gets
    :class:`~autopar.infra.progress.Progress` reports with phase ``cost_tables:ops`` /
    ``cost_tables:edges`` and ``done`` / ``total`` entries.  Past ``deadline``
    raises :class:`~autopar.errors.TimeLimitError` saying how far it got (entries
    computed so far are already in ``store``).  ``runtime`` (default
    :data:`autopar.ir.wire.DEFAULT_RUNTIME`) prices boxing.
    """
    t0 = time.perf_counter()
    run = _Build(
        graph,
        mesh,
        zero_stage,
        runtime_profile(runtime),
        store if store is not None else MemoryStore(),
        workers or os.cpu_count() or 1,
        progress,
        parallel_threshold,
        deadline if deadline is not None else Deadline(),
        remote,
        fused_kernels(graph, runtime_profile(runtime)),
    )
    keys, tables, op_stats = _op_tables(run)
    t_ops = time.perf_counter() - t0
    t1 = time.perf_counter()
    edges, edge_stats = _edge_tables(run, tables)
    stats = {
        "ops": len(graph.ops),
        **op_stats,
        "edges": len(edges),
        **edge_stats,
        "fallback_ops": sorted(op.name for op in graph.ops if tables[op.name].fallback),
        "time_ops_s": t_ops,
        "time_edges_s": time.perf_counter() - t1,
        "time_s": time.perf_counter() - t0,
    }
    return CostTables(graph, mesh, zero_stage, tables, edges, stats, keys, run.profile)


@dataclass(frozen=True)
class _Build:
    """What one :func:`build_cost_tables` call works with."""

    graph: Graph
    mesh: Mesh
    zero_stage: int
    profile: RuntimeProfile
    store: KeyValueStore
    workers: int
    progress: ProgressFn | None
    threshold: int
    deadline: Deadline
    remote: RemoteTableBuilder | None = None
    kernels: Kernels = NO_KERNELS
    """The runtime's fused kernels in the graph (:mod:`autopar.cost.fusion`)."""

    def run(
        self, fn: Callable[[list[Any]], list[bytes]], keys: list[str], jobs: list[Any], phase: str
    ) -> dict[str, bytes]:
        done: dict[str, bytes] = {}
        if self.remote is not None and len(keys) >= self.threshold:
            done = _run_remote(self.remote, keys, jobs, phase, self.store, self.progress, self.deadline)
        left = [i for i, k in enumerate(keys) if k not in done]
        return {
            **done,
            **_run_batches(
                fn,
                [keys[i] for i in left],
                [jobs[i] for i in left],
                self.workers,
                self.threshold,
                self.progress,
                phase,
                self.store,
                self.deadline,
            ),
        }


def _op_tables(run: _Build) -> tuple[dict[str, str], dict[str, OpTable], dict[str, int]]:
    """Each op's content key and table (fetched, or computed and stored), and counts."""
    graph, mesh, profile = run.graph, run.mesh, run.profile
    keys: dict[str, str] = {}
    first_op_for_key: dict[str, Op] = {}
    key_by_content: dict[tuple[Any, ...], str] = {}
    for n, op in enumerate(graph.ops):
        if n % 1024 == 1023:
            _check(run.deadline, "op keys", n, len(graph.ops))
        op = priced_op(op, run.kernels)
        # identical layers: the same content is hashed once
        content: tuple[Any, ...] = (
            op.type,
            op.role,
            repr(op.attrs),
            tuple((p, graph.tensors[t].shape, graph.tensors[t].dtype) for p, t in op.inputs.items()),
            tuple((p, graph.tensors[t].shape, graph.tensors[t].dtype) for p, t in op.outputs.items()),
            zero_gather_dtype(graph, op),
        )
        k = key_by_content.get(content)
        if k is None:
            k = key_by_content[content] = op_key(graph, op, mesh, run.zero_stage, profile)
        keys[op.name] = k
        first_op_for_key.setdefault(k, op)
    unique_op_keys = list(first_op_for_key)
    found = run.store.get_many(unique_op_keys)
    missing = [k for k in unique_op_keys if k not in found]
    jobs = [
        (
            first_op_for_key[k],
            tuple(graph.tensors[t] for t in first_op_for_key[k].inputs.values()),
            tuple(graph.tensors[t] for t in first_op_for_key[k].outputs.values()),
            mesh,
            run.zero_stage,
            profile.lowering.value,
            profile.zero_sharding.value,
            zero_gather_dtype(graph, first_op_for_key[k]),
        )
        for k in missing
    ]
    raw_by_key = {**found, **run.run(_compute_op_batch, missing, jobs, "ops")}
    decoded = {k: _read_op_table(raw_by_key[k], mesh.ndim) for k in unique_op_keys}
    tables = {op.name: decoded[keys[op.name]] for op in graph.ops}
    return keys, tables, {"unique_op_entries": len(unique_op_keys), "op_entries_computed": len(missing)}


_EdgeSpec = tuple[str, str, str, str, str]
"""(producer, its output port, consumer, its input port, tensor)"""


def _edge_specs(graph: Graph, lowering: str) -> list[_EdgeSpec]:
    """Every edge along which data flows under ``lowering`` (shape-only ports have none)."""
    specs: list[_EdgeSpec] = []
    for op in graph.ops:
        for in_port, tensor in op.inputs.items():
            if edge_kind(op, in_port, lowering=lowering) is EdgeKind.SHAPE_ONLY:
                continue  # no data flows: no boxing, no edge
            prod, out_port = graph.producer[tensor]
            specs.append((prod, out_port, op.name, in_port, tensor))
    return specs


def _edge_tables(run: _Build, tables: dict[str, OpTable]) -> tuple[list[EdgeTable], dict[str, int]]:
    """Each edge's matrix (its distinct entry fetched, or computed and stored), and counts."""
    edge_specs = _edge_specs(run.graph, run.profile.lowering.value)
    distinct, edge_index = _edge_keys(run, tables, edge_specs)
    edge_keys = list(distinct)
    found_e = run.store.get_many(edge_keys)
    missing_e = [k for k in edge_keys if k not in found_e]
    ejobs = [
        (distinct[k][0], distinct[k][1], distinct[k][2], run.mesh, distinct[k][3], run.profile)
        for k in missing_e
    ]
    raw_e = {**found_e, **run.run(_compute_edge_batch, missing_e, ejobs, "edges")}
    small: dict[str, np.ndarray] = {}
    for k in edge_keys:
        _, src_u, dst_u, _ = distinct[k]
        small[k] = np.frombuffer(zlib.decompress(raw_e[k]), dtype=np.float64).reshape(len(src_u), len(dst_u))
    # edges between identical layers share one read-only matrix
    expanded: dict[tuple[str, int, int], np.ndarray] = {}
    edges = []
    for (prod, out_port, cons, in_port, tensor), (k, ri, ci) in zip(edge_specs, edge_index):
        m = expanded.get((k, id(ri), id(ci)))
        if m is None:
            m = small[k][np.ix_(ri, ci)]
            m.setflags(write=False)
            expanded[(k, id(ri), id(ci))] = m
        edges.append(EdgeTable(prod, out_port, cons, in_port, tensor, m))
    return edges, {"unique_edge_entries": len(edge_keys), "edge_entries_computed": len(missing_e)}


def _edge_keys(
    run: _Build, tables: dict[str, OpTable], edge_specs: list[_EdgeSpec]
) -> tuple[
    dict[str, tuple[TensorSpec, list[NdSbp], list[NdSbp], EdgeKind]], list[tuple[str, np.ndarray, np.ndarray]]
]:
    """The distinct edge entries by key (tensor, distinct SBPs on each side, kind), and each
    edge's key and the positions of its ends' signatures among those SBPs."""
    graph = run.graph
    runtime_key = json.dumps(run.profile.key(), sort_keys=True)
    distinct: dict[str, tuple[TensorSpec, list[NdSbp], list[NdSbp], EdgeKind]] = {}
    edge_index: list[tuple[str, np.ndarray, np.ndarray]] = []
    gradients = weight_gradient_path(graph)
    # identical layers share op tables: the per-port SBPs and the keys are computed once
    port_memo: dict[tuple[int, bool, int], _PortSbps] = {}
    key_memo: dict[tuple[Any, ...], str] = {}
    mesh_key = run.mesh.key()

    def port_sbps(table: OpTable, output: bool, index: int) -> _PortSbps:
        memo_key = (id(table), output, index)
        hit = port_memo.get(memo_key)
        if hit is None:
            values = [(s.outputs if output else s.inputs)[index] for s in table.signatures]
            hit = port_memo[memo_key] = _PortSbps.of(values)
        return hit

    for n, (prod, out_port, cons, in_port, tensor) in enumerate(edge_specs):
        if n % 1024 == 1023:
            _check(run.deadline, "edge keys", n, len(edge_specs))
        pop, cop = graph.op_by_name[prod], graph.op_by_name[cons]
        src = port_sbps(tables[prod], True, list(pop.outputs).index(out_port))
        dst = port_sbps(tables[cons], False, list(cop.inputs).index(in_port))
        spec = graph.tensors[tensor]
        fused = run.kernels.same_kernel(prod, cons)
        kind = edge_kind(cop, in_port, tensor in gradients, run.profile.lowering.value, fused)
        edge_content = (spec.shape, spec.dtype, src.strings, dst.strings, kind)
        ekey = key_memo.get(edge_content)
        if ekey is None:
            ekey = key_memo[edge_content] = _edge_key(
                tuple(spec.shape), spec.dtype, src.strings, dst.strings, mesh_key, kind, runtime_key
            )
        distinct.setdefault(ekey, (spec, src.unique, dst.unique, kind))
        edge_index.append((ekey, src.positions, dst.positions))
    return distinct, edge_index


SERIAL_CHUNK = 32
"""Entries computed between two deadline checks (and progress reports) in this process."""


def _run_batches(
    fn: Callable[[list[Any]], list[bytes]],
    keys: list[str],
    jobs: list[Any],
    workers: int,
    threshold: int,
    progress: ProgressFn | None,
    phase: str,
    store: KeyValueStore,
    deadline: Deadline,
) -> dict[str, bytes]:
    """Compute ``fn`` over ``jobs`` in batches, storing each batch's entries under ``keys``
    as it arrives; stop with :class:`TimeLimitError` once ``deadline`` has passed."""
    total = len(jobs)
    name = f"cost_tables:{phase}"
    deadline.report(progress, name, done=0, total=total)
    out: dict[str, bytes] = {}
    if total == 0:
        return out
    parallel = workers > 1 and total >= threshold
    # small batches: a deadline check (and progress report) after each
    batches = _chunks(list(range(total)), max(workers * 16, math.ceil(total / SERIAL_CHUNK)))

    def take(idx: list[int], entries: list[bytes]) -> None:
        new = {keys[i]: e for i, e in zip(idx, entries)}
        store.put_many(new)
        out.update(new)
        deadline.report(progress, name, done=len(out), total=total)
        if len(out) < total and deadline.expired():
            raise _out_of_time(deadline, name, f"{phase} entries", len(out), total)

    if not parallel:
        for idx in batches:
            take(idx, fn([jobs[i] for i in idx]))
        return out
    # own pipes per worker, no task thread: stopping at the deadline cannot hang (batch_pool)
    tagged = [(idx, [jobs[i] for i in idx]) for idx in batches]
    try:
        with BatchPool(fn, workers) as pool:
            for idx, entries in pool.run(tagged, deadline):
                take(idx, entries)
    except PoolTimeout:
        raise _out_of_time(deadline, name, phase, len(out), total) from None
    return out


def _out_of_time(deadline: Deadline, name: str, what: str, done: int, total: int) -> TimeLimitError:
    return TimeLimitError(
        "time_limit",
        f"the time limit ({round(deadline.limit_s, 2):g} s) ran out while building cost tables: "
        f"{done} of {total} {what} done; raise the time limit (the entries computed so far are kept "
        "only where the memo persists: with `autopar plan --memo DIR` or in the service a rerun "
        "starts from them, otherwise it starts over)",
        phase=name,
        done=done,
        total=total,
    )


def _check(deadline: Deadline, what: str, done: int, total: int) -> None:
    if deadline.expired():
        raise _out_of_time(deadline, f"cost_tables:{what}", what, done, total)
