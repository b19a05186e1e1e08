"""Cost tables: the cost model of :mod:`autopar.costs` evaluated for one graph on one mesh.

:class:`CostTables` holds, for one graph on one mesh, each op's signature list
and compute times, and each edge's boxing matrix.  Entries are keyed by content
(op type, attrs that matter, shapes, dtypes, mesh and cluster, ZeRO stage for
optimizer ops, the runtime profile, :data:`~autopar.costs.COST_MODEL_VERSION` and
:func:`~autopar.costs.model_digest` -- a hash of every source file that can
change a cost, so an upgraded model never reads stale entries), so identical
layers share them; missing entries are computed in a process pool and stored in a
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
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from autopar.batch_pool import BatchPool, PoolTimeout
from autopar.boxing import OneFlowBoxing, boxing_matrix, boxing_search
from autopar.cluster import Mesh
from autopar.costs import (
    COST_MODEL_VERSION,
    EdgeKind,
    edge_kind,
    edge_time,
    model_digest,
    op_compute_time,
    op_signatures,
    zero_gather_dtype,
)
from autopar.errors import ConfigError, TimeLimitError
from autopar.graph import DTYPE_BYTES, Graph, Op, Role, TensorSpec
from autopar.optimizer import weight_gradient_path
from autopar.progress import Deadline, ProgressFn
from autopar.rules.registry import RuleContext, default_rules, planning_signatures
from autopar.runtime import Lowering, RuntimeProfile, ZeroSharding, runtime_profile
from autopar.sbp import NdSbp, Signature, parse_nd_sbp, parse_signature
from autopar.store import KeyValueStore, MemoryStore

__all__ = [
    "CostTables",
    "EdgeTable",
    "OpTable",
    "RemoteBatch",
    "RemoteTableBuilder",
    "build_cost_tables",
    "clear_process_caches",
    "compute_remote_batch",
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


@dataclass(frozen=True)
class _PortSbps:
    """The SBPs one port takes over an op table's signatures: the distinct ones (in first-seen
    order), their strings, and each signature's position among them."""

    unique: list[NdSbp]
    strings: tuple[str, ...]
    positions: np.ndarray

    @classmethod
    def of(cls, values: list[NdSbp]) -> _PortSbps:
        first: dict[NdSbp, int] = {}
        positions = np.fromiter(
            (first.setdefault(v, len(first)) for v in values), dtype=np.int64, count=len(values)
        )
        unique = list(first)
        return cls(unique, tuple(str(v) for v in unique), positions)


# ------------------------------------------------------------------ entries


_parsed: dict[tuple[str, int], Signature] = {}
_fresh: dict[bytes, OpTable] = {}
"""Op tables computed in this process, by their stored bytes: read back without parsing
(what :meth:`OpTable.from_bytes` would rebuild); taken out when read."""


def clear_process_caches() -> None:
    """Forget this process's memos (parsed signatures, signature lists, boxing searches, hop tables),
    e.g. to time a cold build; the store is not touched."""
    from autopar import boxing, costs
    from autopar.oneflow import hop_table, pricing

    _parsed.clear()
    _fresh.clear()
    costs._signature_memo.clear()
    boxing._searches.clear()
    boxing.send_recv_bytes.cache_clear()
    pricing.clear_caches()
    hop_table.clear_tables()


def _parse_signature(text: str, ndim: int) -> Signature:
    """:func:`~autopar.sbp.parse_signature`, once per distinct text (signatures repeat
    across the ops of identical layers); at most 65536 kept."""
    sig = _parsed.get((text, ndim))
    if sig is None:
        if len(_parsed) >= 65536:
            _parsed.clear()
        sig = _parsed[(text, ndim)] = parse_signature(text, ndim)
    return sig


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
        sigs = [_parse_signature(s, ndim) for s in data["sigs"]]
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
    """The runtime profile the tables are priced for."""

    def port_sbp(self, op_name: str, choice: int, port: str, output: bool) -> NdSbp:
        op = self.graph.op_by_name[op_name]
        table = self.ops[op_name]
        sig = table.signatures[choice]
        ports = list(op.outputs if output else op.inputs)
        seq = sig.outputs if output else sig.inputs
        return seq[ports.index(port)]


def _compute_op_entry(
    op: Op,
    ins: tuple[TensorSpec, ...],
    outs: tuple[TensorSpec, ...],
    mesh: Mesh,
    zero: int,
    lowering: str,
    zero_sharding: str = "all_axes",
    gather_dtype: str | None = None,
) -> bytes:
    rules = default_rules()
    ctx = RuleContext(
        op=op,
        inputs=ins,
        outputs=outs,
        mesh_shape=mesh.shape,
        zero_stage=zero,
        zero_sharding=zero_sharding,
        gather_dtype=gather_dtype,
    )
    sigs, fallback = op_signatures(rules, ctx)
    sigs = planning_signatures(ctx, sigs)
    rule = rules.get(op.type)
    times = np.array([op_compute_time(rule, ctx, s, mesh, lowering) for s in sigs], dtype=np.float64)
    table = OpTable(sigs, times, fallback)
    raw = table.to_bytes()
    if len(_fresh) >= 4096:
        _fresh.clear()
    _fresh[raw] = table
    return raw


def _read_op_table(raw: bytes, ndim: int) -> OpTable:
    """The op table stored as ``raw``: the one computed in this process when there is one."""
    fresh: OpTable | None = _fresh.pop(raw, None)
    return fresh if fresh is not None else OpTable.from_bytes(raw, ndim)


def _compute_op_batch(
    batch: list[tuple[Op, tuple[TensorSpec, ...], tuple[TensorSpec, ...], Mesh, int, str, str, str | None]],
) -> list[bytes]:
    return [_compute_op_entry(*item) for item in batch]


def _edge_matrix(
    spec: TensorSpec,
    src: list[NdSbp],
    dst: list[NdSbp],
    mesh: Mesh,
    kind: EdgeKind,
    runtime: RuntimeProfile,
) -> np.ndarray:
    """Seconds of an edge for every producer (rows) and consumer (columns) SBP: the
    boxing matrix, except in-place ports (``inf`` off the diagonal) and gradient
    edges (bucketed, :func:`~autopar.costs.edge_time`)."""
    if kind is EdgeKind.IN_PLACE:
        return np.array([[0.0 if s == d else math.inf for d in dst] for s in src], dtype=np.float64).reshape(
            len(src), len(dst)
        )
    if kind is EdgeKind.GRADIENT:
        fast = _gradient_matrix(spec, src, dst, mesh, runtime)
        if fast is not None:
            return fast
        return np.array(
            [[edge_time(spec, s, d, mesh, kind, runtime)[0] for d in dst] for s in src], dtype=np.float64
        ).reshape(len(src), len(dst))
    return boxing_matrix(spec.shape, DTYPE_BYTES[spec.dtype], src, dst, mesh, runtime.lowering.value)


def _gradient_matrix(
    spec: TensorSpec, src: list[NdSbp], dst: list[NdSbp], mesh: Mesh, runtime: RuntimeProfile
) -> np.ndarray | None:
    """:func:`~autopar.costs.edge_time` of a gradient edge for every pair at once, when the
    boxing is priced from a shared :class:`~autopar.oneflow.hop_table.HopTable` (else None):
    :func:`~autopar.costs.bucketed_time` on the boxing's seconds and latency, the same
    operations in the same order."""
    search = boxing_search(spec.shape, DTYPE_BYTES[spec.dtype], mesh, runtime.lowering.value)
    table = search.shared_table() if isinstance(search, OneFlowBoxing) else None
    if table is None or not isinstance(search, OneFlowBoxing):
        return None
    seconds, latency, stepped = search.matrices(src, dst, table)
    if runtime.grad_bucket_bytes <= 0:
        return seconds
    share = min(1.0, spec.numel * DTYPE_BYTES[spec.dtype] / runtime.grad_bucket_bytes)
    bucketed = seconds - latency * (1.0 - share)
    return np.where(stepped & np.isfinite(seconds), bucketed, seconds)


def _compute_edge_batch(
    batch: list[tuple[TensorSpec, list[NdSbp], list[NdSbp], Mesh, EdgeKind, RuntimeProfile]],
) -> list[bytes]:
    return [zlib.compress(_edge_matrix(*item).astype(np.float64).tobytes(), 1) for item in batch]


def _chunks(items: list[Any], n: int) -> list[list[Any]]:
    if not items:
        return []
    size = max(1, math.ceil(len(items) / n))
    return [items[i : i + size] for i in range(0, len(items), size)]


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
    :class:`~autopar.progress.Progress` reports with phase ``cost_tables:ops`` /
    ``cost_tables:edges`` and ``done`` / ``total`` entries.  Past ``deadline``
    raises :class:`~autopar.errors.TimeLimitError` saying how far it got (entries
    computed so far are already in ``store``).  ``runtime`` (default
    :data:`autopar.runtime.DEFAULT_RUNTIME`) prices boxing.
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
        kind = edge_kind(cop, in_port, tensor in gradients, run.profile.lowering.value)
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


# ------------------------------------------------------------------ entries built elsewhere

REMOTE_BATCHES = 8
"""Batches the missing entries of one phase are split into for a :class:`RemoteTableBuilder`
(more than the workers: a fast worker takes more of them, a lost one loses little; each
batch pays a job's overhead and cold process caches: mt5-base [2, 2, 2] cold with one RQ
worker took 33 s in 32 batches per phase, 15 s in 8, on a loaded 2-core machine)."""


@dataclass(frozen=True)
class RemoteBatch:
    """Entries to build elsewhere: their store keys, and what :func:`compute_remote_batch`
    computes them from (JSON: no pickle crosses the queue)."""

    keys: list[str]
    payload: dict[str, Any]


class RemoteTableBuilder(Protocol):
    """Builds cost-table entries outside this process into the store the build reads
    (the service: RQ workers writing to the shared Redis store, ``autopar_service.table_jobs``).

    :meth:`build` returns once every batch's entries are in the store, or when it gives
    up on some (a lost worker, its own wait limit, ``deadline``); the build computes what
    is still missing itself.  ``progress`` gets the number of entries known to be in."""

    def build(
        self, batches: list[RemoteBatch], deadline: Deadline, progress: Callable[[int], None]
    ) -> None: ...


def _run_remote(
    remote: RemoteTableBuilder,
    keys: list[str],
    jobs: list[Any],
    phase: str,
    store: KeyValueStore,
    progress: ProgressFn | None,
    deadline: Deadline,
) -> dict[str, bytes]:
    """The entries of ``keys`` built by ``remote`` (read back from ``store``); any it did
    not build are left out."""
    name = f"cost_tables:{phase}"
    total = len(keys)
    batches = [
        RemoteBatch([keys[i] for i in idx], _encode_jobs(phase, [jobs[i] for i in idx]))
        for idx in _chunks(list(range(total)), REMOTE_BATCHES)
    ]
    deadline.report(progress, name, done=0, total=total)
    remote.build(batches, deadline, lambda done: deadline.report(progress, name, done=done, total=total))
    return store.get_many(keys)


def _spec_json(spec: TensorSpec) -> list[Any]:
    return [spec.name, list(spec.shape), spec.dtype]


def _spec_of(data: list[Any]) -> TensorSpec:
    return TensorSpec(str(data[0]), tuple(int(d) for d in data[1]), str(data[2]))


def _encode_jobs(phase: str, jobs: list[Any]) -> dict[str, Any]:
    """The JSON payload of a batch of op jobs (:func:`_compute_op_batch`) or edge jobs
    (:func:`_compute_edge_batch`); one mesh, ZeRO stage and runtime per batch."""
    mesh: Mesh = jobs[0][3]
    head = {"phase": phase, "mesh": mesh.to_dict(), "mesh_key": mesh.key()}
    if phase == "ops":
        return {
            **head,
            "zero": jobs[0][4],
            "lowering": jobs[0][5],
            "zero_sharding": jobs[0][6],
            "jobs": [
                {
                    "op": op.to_dict(),
                    "in": [_spec_json(t) for t in ins],
                    "out": [_spec_json(t) for t in outs],
                    "gather": gather,
                }
                for op, ins, outs, *_, gather in jobs
            ],
        }
    runtime: RuntimeProfile = jobs[0][5]
    return {
        **head,
        "runtime": runtime.key(),
        "jobs": [
            {
                "t": _spec_json(spec),
                "src": [str(v) for v in src],
                "dst": [str(v) for v in dst],
                "kind": kind.value,
            }
            for spec, src, dst, _, kind, _ in jobs
        ],
    }


def _runtime_of(data: dict[str, Any]) -> RuntimeProfile:
    profile = RuntimeProfile(
        str(data["name"]),
        Lowering(data["lowering"]),
        int(data["grad_bucket_bytes"]),
        bool(data["overlap_grad_comm"]),
        ZeroSharding(data["zero_sharding"]),
        bool(data["fuses_sibling_linears"]),
    )
    if profile.key() != data:
        raise ConfigError("bad_remote_batch", f"runtime {data['name']!r} does not decode to the profile sent")
    return profile


def compute_remote_batch(payload: dict[str, Any]) -> list[bytes]:
    """The entries of a :class:`RemoteBatch` payload, in the order of its keys: the bytes
    this process's own build would store (same functions, same inputs).  A payload whose
    mesh or runtime does not decode to what was sent raises :class:`ConfigError`."""
    mesh = Mesh.from_dict(payload["mesh"])
    if mesh.key() != payload["mesh_key"]:
        raise ConfigError("bad_remote_batch", "the batch's mesh does not decode to the mesh it was built for")
    if payload["phase"] == "ops":
        zero, lowering, sharding = (
            int(payload["zero"]),
            str(payload["lowering"]),
            str(payload["zero_sharding"]),
        )
        return _compute_op_batch(
            [
                (
                    _op_of(job["op"]),
                    tuple(map(_spec_of, job["in"])),
                    tuple(map(_spec_of, job["out"])),
                    mesh,
                    zero,
                    lowering,
                    sharding,
                    job.get("gather"),
                )
                for job in payload["jobs"]
            ]
        )
    runtime = _runtime_of(payload["runtime"])
    return _compute_edge_batch(
        [
            (
                _spec_of(job["t"]),
                [parse_nd_sbp(v) for v in job["src"]],
                [parse_nd_sbp(v) for v in job["dst"]],
                mesh,
                EdgeKind(job["kind"]),
                runtime,
            )
            for job in payload["jobs"]
        ]
    )


def _op_of(data: dict[str, Any]) -> Op:
    return Op(
        str(data["name"]),
        str(data["type"]),
        dict(data["inputs"]),
        dict(data["outputs"]),
        dict(data.get("attrs", {})),
        Role(data["role"]),
    )
