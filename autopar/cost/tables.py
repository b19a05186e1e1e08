"""Cost tables of one graph on one mesh: an op's signatures and compute seconds
(:class:`OpTable`), an edge's boxing matrix (:class:`EdgeTable`), and the whole
(:class:`CostTables`); the computation of one entry, in whichever process builds it.
"""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autopar.cost.compute import op_compute_time, op_signatures
from autopar.cost.edges import EdgeKind, edge_time, same_layout
from autopar.hardware.mesh import Mesh
from autopar.ir.graph import DTYPE_BYTES, Graph, Op, TensorSpec
from autopar.ir.sbp import NdSbp, Signature, parse_signature
from autopar.rules.registry import RuleContext, default_rules, planning_signatures
from autopar.runtimes.oneflow_09.boxing import OneFlowBoxing
from autopar.runtimes.profile import RuntimeProfile
from autopar.runtimes.registry import boxing_matrix, boxing_search, runtime_profile

__all__ = ["CostTables", "EdgeTable", "OpTable", "clear_process_caches"]


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
    from autopar.cost import compute
    from autopar.runtimes import registry
    from autopar.runtimes.oneflow_09 import boxing, hop_table, pricing

    _parsed.clear()
    _fresh.clear()
    compute._signature_memo.clear()
    registry._searches.clear()
    boxing.send_recv_bytes.cache_clear()
    pricing.clear_caches()
    hop_table.clear_tables()


def _parse_signature(text: str, ndim: int) -> Signature:
    """:func:`~autopar.ir.sbp.parse_signature`, once per distinct text (signatures repeat
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
    edges (bucketed, :func:`~autopar.cost.edges.edge_time`)."""
    if kind in (EdgeKind.IN_PLACE, EdgeKind.FUSED):

        def free(s: NdSbp, d: NdSbp) -> bool:
            return s == d if kind is EdgeKind.IN_PLACE else same_layout(s, d, mesh.shape)

        return np.array(
            [[0.0 if free(s, d) else math.inf for d in dst] for s in src], dtype=np.float64
        ).reshape(len(src), len(dst))
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
    """:func:`~autopar.cost.edges.edge_time` of a gradient edge for every pair at once, when the
    boxing is priced from a shared :class:`~autopar.runtimes.oneflow_09.hop_table.HopTable` (else None):
    :func:`~autopar.cost.edges.bucketed_time` on the boxing's seconds and latency, the same
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
