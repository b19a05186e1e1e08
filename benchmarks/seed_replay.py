"""The LiBai MT5 report replayed: fit the report's cluster on two figures, predict the rest.

    python -m benchmarks.seed_replay [--json out.json]

The seed report (``../shared/seed/mt5-throughput-issue.txt``, cited below by
line) measured, on two nodes of four GPUs, MT5 (12+12 layers, hidden 768) with
16 samples per data-parallel rank per micro-batch, ``dp4 x mp2`` (mesh
``[4, 2]``), ZeRO-2, fp16, activation checkpointing on (``actrue``) and 8
micro-batches per 512-sample step (``mb16_gb512``, lines 242-252):

* Megatron-DeepSpeed: 357 ms per micro-batch (line 285; nsys: forward encoder 78
  + decoder 24 + loss 9 + backward decoder 88 + encoder 150); NCCL kernels
  "basically all all-reduce", 66 % of the total (49.8 % + 12.8 % + 3.4 %, line
  286); 164.3 samples/s (line 252);
* LiBai (OneFlow's SBP inference): 1000 ms per micro-batch (line 290); NCCL
  send/recv 46.4 %, all-reduce 17.9 %, all-gather 12.9 % (line 291; NCCL runs
  all-to-all as grouped send/recv, so a trace shows both as send/recv);
  63.75 samples/s (line 249);
* one GPU, 4 samples per micro-batch: OneFlow 88 ms (line 307).

**Fitted on (inputs).**  Two numbers of the cluster, from two figures:

1. compute speed: ``matmul_efficiency`` and ``memory_efficiency`` of the preset
   scaled by one factor so that the single-device plan's micro-batch compute
   (:func:`autopar.cost.breakdown.micro_batch_time`, 4 samples) is 88 ms (compute
   time is inversely proportional to both, ``autopar.cost.compute``);
2. intra-node bus bandwidth, so that the ``megatron`` baseline's
   tensor-parallel all-reduces of one micro-batch (64 samples, mesh ``[4, 2]``
   on 2x4, the axis inside a node) take 49.8 % of 357 ms = 177.8 ms.
   All-reduce time is ``L + X / beta`` (:mod:`autopar.runtimes.ideal`); two evaluations
   give ``L`` and ``X``, then ``beta = X / (0.178 s - L)``.

Two choices the report does not determine: the inter-node bandwidth (no
micro-batch figure of Megatron's crosses nodes: its data-parallel traffic runs
once per step) is set equal to the fitted intra-node value, and 49.8 % is read
as the tensor-parallel all-reduce alone.  :func:`sensitivity` varies both.

**Predicted (not used by the fit).**  Megatron's micro-batch less the fitted
all-reduce (compute and any other communication, against 357 - 177.8 ms);
LiBai's micro-batch and the ratio; per-collective shares of both plans against
the nsys figures, per micro-batch and per step; the 8-micro-batch step times
against the report's throughput (512 samples / samples per second); each plan's
time per nsys range (:func:`phases`; Megatron's include the fitted all-reduce).
:func:`mechanisms` splits each plan's predicted communication by what produces
it, and :func:`what_if` re-prices the two mechanisms where the shares disagree.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from autopar.baselines.plans import baseline_plan
from autopar.cost.breakdown import MicroBatchTime, micro_batch_time
from autopar.cost.evaluate import evaluate
from autopar.cost.evaluation import EdgeCost, Evaluation
from autopar.hardware.cluster import PRESETS, Cluster
from autopar.hardware.collectives import Collective
from autopar.hardware.devices import DeviceSpec
from autopar.hardware.mesh import Mesh
from autopar.ir.graph import DTYPE_BYTES, Graph, Role
from autopar.ir.sbp import Broadcast, NdSbp, Partial, SbpValue, local_shape
from autopar.ir.training import TrainingConfig
from autopar.models import build
from autopar.runtimes.oneflow_09.lowering import ring_steps

SEED_FILE = "../shared/seed/mt5-throughput-issue.txt"


@dataclass(frozen=True)
class SeedReport:
    """The report's figures (seconds, shares, samples/s); lines of :data:`SEED_FILE` in comments."""

    samples_per_rank: int = 16
    mesh: tuple[int, ...] = (4, 2)
    nodes: int = 2
    devices_per_node: int = 4
    zero_stage: int = 2
    megatron_s: float = 0.357  # line 285
    megatron_all_reduce_share: float = 0.498  # line 286, the first of its three NCCL shares
    megatron_nccl_shares: tuple[float, ...] = (0.498, 0.128, 0.034)  # line 286
    libai_s: float = 1.000  # line 290
    libai_send_recv_share: float = 0.464  # line 291
    libai_all_reduce_share: float = 0.179  # line 291
    libai_all_gather_share: float = 0.129  # line 291
    single_device_samples: int = 4  # line 266 (mb4)
    single_device_s: float = 0.088  # line 307
    global_batch: int = 512  # lines 248 and 251 (gb512)
    megatron_samples_per_s: float = 164.3  # line 252
    libai_samples_per_s: float = 63.75  # line 249
    megatron_phases_s: tuple[float, ...] = (0.078, 0.024, 0.009, 0.088, 0.150)  # line 285
    """forward encoder, forward decoder, loss, backward decoder, backward encoder."""
    libai_phases_s: tuple[float, ...] = (0.360, 0.094, math.nan, 0.175, 0.339)  # line 290, no loss range
    micro_batches: int = 8
    """512 samples per step / (16 per rank x 4 data-parallel ranks): ``mb16_gb512``."""
    checkpointing: str = "full"
    """``actrue``: every transformer block recomputed in backward."""

    @property
    def training(self) -> TrainingConfig:
        return TrainingConfig(self.micro_batches, self.checkpointing)

    @property
    def megatron_step_s(self) -> float:
        """Seconds per optimizer step from the throughput: ``global_batch / samples_per_s``."""
        return self.global_batch / self.megatron_samples_per_s

    @property
    def libai_step_s(self) -> float:
        return self.global_batch / self.libai_samples_per_s


SEED = SeedReport()
SEND_RECV_IN_NSYS = ("send-recv", "all-to-all")
"""Collectives an nsys trace shows as NCCL send/recv kernels (NCCL's all-to-all is grouped send/recv)."""
NSYS_CLASSES: dict[str, tuple[str, ...]] = {
    "send/recv": SEND_RECV_IN_NSYS,
    "all-reduce": ("all-reduce",),
    "all-gather": ("all-gather",),
    "reduce-scatter": ("reduce-scatter",),
}
"""The NCCL kernel families an nsys trace names, and the model's collectives in each."""
NSYS_CLASS_OF = {c: name for name, cs in NSYS_CLASSES.items() for c in cs}
RUNTIMES = ("oneflow-0.9", "ideal")
SHARE_READINGS = (0.40, 0.498, 0.60, round(sum(SEED.megatron_nccl_shares), 3))
"""Shares of Megatron's 357 ms read as its tensor-parallel all-reduce in :func:`sensitivity`:
the last is all its NCCL time (line 286: "basically all all-reduce", 66 %)."""
INTER_FACTORS = (0.25, 0.5, 1.0, 2.0)
"""Inter-node bandwidth as multiples of the fitted intra-node value in :func:`sensitivity`."""


# ------------------------------------------------------------- evaluation


def _evaluated(
    graph: Graph, kind: str, mesh: Mesh, zero_stage: int, runtime: str, seed: SeedReport = SEED
) -> Evaluation:
    """``kind``'s plan evaluated at the seed's iteration (K micro-batches, checkpointing).
    The report's Megatron figures come from Megatron-DeepSpeed, whose ZeRO-2 gathers
    parameters once per step, after the update (not inside a micro-batch as OneFlow 0.9
    does after its repeat op, :data:`autopar.cost.iteration.ACCUMULATION`): ``megatron``'s
    gathers are moved to once per step."""
    plan = baseline_plan(kind, graph, mesh, zero_stage, runtime=runtime)
    ev = evaluate(graph, plan, training=seed.training)
    if kind == "megatron":
        ev.edges = [_once_per_step(e) if e.zero_gather else e for e in ev.edges]
    return ev


def _once_per_step(edge: EdgeCost) -> EdgeCost:
    return dataclasses.replace(edge, per_micro_batch=0, per_step=1)


def _micro_batch(
    graph: Graph, kind: str, mesh: Mesh, zero_stage: int, runtime: str, seed: SeedReport = SEED
) -> MicroBatchTime:
    """One micro-batch's span of ``kind``'s plan (see :func:`_evaluated`)."""
    return micro_batch_time(graph, _evaluated(graph, kind, mesh, zero_stage, runtime, seed))


@dataclass(frozen=True)
class Span:
    """Seconds of compute and per NCCL kernel family over one scope of an evaluation."""

    compute_s: float
    nsys_s: dict[str, float]

    @property
    def total_s(self) -> float:
        return self.compute_s + sum(self.nsys_s.values())

    def share(self, nsys_class: str) -> float:
        """Fraction of :attr:`total_s` in ``nsys_class`` (``"NCCL"``: every family)."""
        part = sum(self.nsys_s.values()) if nsys_class == "NCCL" else self.nsys_s.get(nsys_class, 0.0)
        return part / self.total_s if self.total_s > 0 else 0.0


def span(ev: Evaluation, scope: str, micro_batches: int) -> Span:
    """``scope`` ``"micro-batch"``: each record x its runs per micro-batch; ``"step"``: x
    ``K x per_micro_batch + per_step`` (the optimizer step of ``micro_batches``).  Seconds."""

    def runs(per_micro_batch: int, per_step: int) -> int:
        return per_micro_batch if scope == "micro-batch" else micro_batches * per_micro_batch + per_step

    compute = sum(o.compute_s * runs(o.per_micro_batch, o.per_step) for o in ev.ops)
    nsys = {name: 0.0 for name in NSYS_CLASSES}
    for e in ev.edges:
        n = runs(e.per_micro_batch, e.per_step)
        for s in e.steps:
            if s.collective.value in NSYS_CLASS_OF:
                nsys[NSYS_CLASS_OF[s.collective.value]] += s.time_s * n
    return Span(compute, nsys)


# ------------------------------------------------------------- the fit


@dataclass(frozen=True)
class Fit:
    """The device fitted to the report, and the measured figures it consumed."""

    device: DeviceSpec
    efficiency_factor: float
    all_reduce_latency_s: float
    """``L`` of the megatron micro-batch's tensor-parallel all-reduces (s)."""
    all_reduce_bus_bytes: float
    """``X``: their bytes over the bus bandwidth (bytes; seconds = ``L + X / beta``)."""
    all_reduce_share: float
    inter_over_intra: float | None


def _fitted_compute(model: str, preset: str, seed: SeedReport) -> tuple[DeviceSpec, float]:
    base = PRESETS[preset]
    single = build(model, batch=seed.single_device_samples)
    one = Mesh(Cluster(1, 1, base), (1,))
    factor = _micro_batch(single, "single-device", one, 0, "oneflow-0.9").compute_s / seed.single_device_s
    device = dataclasses.replace(
        base,
        name=f"{preset}-fitted-to-libai-mt5",
        matmul_efficiency=base.matmul_efficiency * factor,
        memory_efficiency=base.memory_efficiency * factor,
    )
    return device, factor


def _with_links(device: DeviceSpec, intra: float, inter_over_intra: float | None) -> DeviceSpec:
    """``inter_over_intra`` None keeps the device's own inter-node bandwidth."""
    inter = device.inter_node_bandwidth if inter_over_intra is None else intra * inter_over_intra
    return dataclasses.replace(device, intra_node_bandwidth=intra, inter_node_bandwidth=inter)


def fit(
    model: str = "mt5-base",
    preset: str = "a100-40g",
    seed: SeedReport = SEED,
    *,
    all_reduce_share: float | None = None,
    inter_over_intra: float | None = 1.0,
) -> Fit:
    """Fit compute speed and intra-node bandwidth (module docstring).  ``all_reduce_share``
    (default the report's 49.8 %): the share of Megatron's micro-batch read as its
    tensor-parallel all-reduce; ``inter_over_intra``: the inter-node bandwidth over the
    fitted intra-node one (None: the preset's own inter-node figure)."""
    share = seed.megatron_all_reduce_share if all_reduce_share is None else all_reduce_share
    device, factor = _fitted_compute(model, preset, seed)
    graph = build(model, batch=seed.samples_per_rank * seed.mesh[0])

    def all_reduce_s(bandwidth: float) -> float:
        d = _with_links(device, bandwidth, 1.0)  # the tensor-parallel axis is inside a node
        mesh = Mesh(Cluster(seed.nodes, seed.devices_per_node, d), seed.mesh)
        t = _micro_batch(graph, "megatron", mesh, seed.zero_stage, "oneflow-0.9", seed)
        return float(t.comm_s.get(("all-reduce", len(seed.mesh) - 1), 0.0))

    b0, b1 = device.intra_node_bandwidth, device.intra_node_bandwidth / 10
    t0, t1 = all_reduce_s(b0), all_reduce_s(b1)
    moved = (t1 - t0) / (1 / b1 - 1 / b0)
    latency = t0 - moved / b0
    target = share * seed.megatron_s
    if not 0 <= latency < target or moved <= 0:
        raise ValueError(
            f"cannot fit: all-reduce latency {latency:.4f} s, bytes {moved:.0f}, target {target} s"
        )
    fitted = _with_links(device, moved / (target - latency), inter_over_intra)
    return Fit(fitted, factor, latency, moved, share, inter_over_intra)


def fit_device(model: str = "mt5-base", preset: str = "a100-40g", seed: SeedReport = SEED) -> DeviceSpec:
    """The preset's device fitted to the report with the default choices (:func:`fit`)."""
    return fit(model, preset, seed).device


def refit_share(f: Fit, share: float, seed: SeedReport = SEED) -> Fit:
    """``f`` with the intra-node bandwidth refitted for another all-reduce ``share``
    (``L`` and ``X`` do not depend on the share: ``beta = X / (share x 357 ms - L)``)."""
    target = share * seed.megatron_s
    if not f.all_reduce_latency_s < target:
        raise ValueError(f"cannot fit share {share}: latency {f.all_reduce_latency_s} s")
    intra = f.all_reduce_bus_bytes / (target - f.all_reduce_latency_s)
    device = _with_links(f.device, intra, f.inter_over_intra)
    return dataclasses.replace(f, device=device, all_reduce_share=share)


def with_inter(f: Fit, inter_over_intra: float | None, preset: str = "a100-40g") -> Fit:
    """``f`` with another inter-node bandwidth (None: the preset's own figure)."""
    intra = f.device.intra_node_bandwidth
    inter = PRESETS[preset].inter_node_bandwidth if inter_over_intra is None else intra * inter_over_intra
    device = dataclasses.replace(f.device, inter_node_bandwidth=inter)
    return dataclasses.replace(f, device=device, inter_over_intra=inter / intra)


# ------------------------------------------------------------- predictions


@dataclass
class Predicted:
    """Both plans evaluated on one fitted device with one runtime."""

    runtime: str
    megatron: Evaluation
    inferred: Evaluation
    micro_batches: int

    def spans(self, scope: str) -> tuple[Span, Span]:
        return span(self.megatron, scope, self.micro_batches), span(self.inferred, scope, self.micro_batches)

    @property
    def ratio(self) -> float:
        meg, inf = self.spans("micro-batch")
        return inf.total_s / meg.total_s

    @property
    def step_ratio(self) -> float:
        meg, inf = self.spans("step")
        return inf.total_s / meg.total_s


def predict(f: Fit, runtime: str, model: str = "mt5-base", seed: SeedReport = SEED) -> Predicted:
    graph = build(model, batch=seed.samples_per_rank * seed.mesh[0])
    mesh = Mesh(Cluster(seed.nodes, seed.devices_per_node, f.device), seed.mesh)
    return Predicted(
        runtime,
        _evaluated(graph, "megatron", mesh, seed.zero_stage, runtime, seed),
        _evaluated(graph, "inferred", mesh, seed.zero_stage, runtime, seed),
        seed.micro_batches,
    )


def _shares(s: Span) -> dict[str, float]:
    """Each NCCL family's share, ``"NCCL"`` (all of them) and ``"compute"`` (the rest)."""
    out = {name: s.share(name) for name in (*NSYS_CLASSES, "NCCL")}
    out["compute"] = s.compute_s / s.total_s if s.total_s > 0 else 0.0
    return out


def _row(p: Predicted, f: Fit, seed: SeedReport) -> dict[str, Any]:
    meg, inf = p.spans("micro-batch")
    meg_step, inf_step = p.spans("step")
    fitted_s = f.all_reduce_share * seed.megatron_s
    return {
        "megatron_ms": meg.total_s * 1e3,
        "megatron_beyond_fitted_all_reduce_ms": (meg.total_s - fitted_s) * 1e3,
        "inferred_ms": inf.total_s * 1e3,
        "ratio": p.ratio,
        "megatron_step_ms": meg_step.total_s * 1e3,
        "inferred_step_ms": inf_step.total_s * 1e3,
        "step_ratio": p.step_ratio,
        "micro_batch_ms": {
            plan: {"compute": sp.compute_s * 1e3} | {k: v * 1e3 for k, v in sp.nsys_s.items()}
            for plan, sp in (("megatron", meg), ("inferred", inf))
        },
        "shares": {
            "megatron": {"micro-batch": _shares(meg), "step": _shares(meg_step)},
            "inferred": {"micro-batch": _shares(inf), "step": _shares(inf_step)},
        },
    }


# ------------------------------------------------------------- mechanisms


def _axis_move(src: SbpValue, dst: SbpValue) -> str:
    def letter(v: SbpValue) -> str:
        return "P" if isinstance(v, Partial) else "B" if isinstance(v, Broadcast) else "S"

    return f"{letter(src)}->{letter(dst)}"


def _origins(edge: EdgeCost, roles: dict[str, Role]) -> list[tuple[str, int, int]]:
    """(what produces the edge, runs per micro-batch, runs once per step)."""
    if edge.zero_gather:
        return [("ZeRO parameter gather", edge.per_micro_batch, edge.per_step)]
    if edge.gradient:
        return [("gradient reduction", edge.per_micro_batch, edge.per_step)]
    role = roles.get(edge.consumer, Role.FORWARD)
    if edge.per_micro_batch == 0 or role is Role.OPTIMIZER:
        return [("optimizer-side boxing", edge.per_micro_batch, edge.per_step)]
    if role is Role.BACKWARD:
        return [("backward boxing", edge.per_micro_batch, edge.per_step)]
    out = [("forward boxing", 1, edge.per_step)]
    if edge.per_micro_batch > 1:
        out.append(("forward boxing recomputed in backward", edge.per_micro_batch - 1, 0))
    return out


def mechanisms(graph: Graph, ev: Evaluation, micro_batches: int) -> list[dict[str, Any]]:
    """Seconds of ``ev``'s communication per (NCCL family, origin, collective@axis, axis move),
    per micro-batch and per step (``K x per micro-batch + once per step``), costliest first.
    The origin is the edge's kind (ZeRO gather, gradient reduction) or its consumer's role;
    the axis move is the step's SBP on its axis before and after (``P->S``: partial sums
    scattered, ``S->B``: a gather, ``S->S``: a re-split, ``P->B``: partial sums all-reduced)."""
    roles = {op.name: op.role for op in graph.ops}
    rows: dict[tuple[str, str, str, str], list[float]] = {}
    for e in ev.edges:
        for origin, per_mb, per_step in _origins(e, roles):
            for s in e.steps:
                key = (
                    NSYS_CLASS_OF.get(s.collective.value, s.collective.value),
                    origin,
                    f"{s.collective.value}@{s.axis}",
                    _axis_move(s.src.values[s.axis], s.dst.values[s.axis]),
                )
                acc = rows.setdefault(key, [0.0, 0.0, 0])
                acc[0] += s.time_s * per_mb
                acc[1] += s.time_s * (micro_batches * per_mb + per_step)
                acc[2] += 1
    out = [
        {
            "nsys": k[0],
            "origin": k[1],
            "collective": k[2],
            "move": k[3],
            "micro_batch_s": v[0],
            "step_s": v[1],
            "steps": int(v[2]),
        }
        for k, v in rows.items()
        if v[1] > 0
    ]
    return sorted(out, key=lambda r: (-r["micro_batch_s"], -r["step_s"], r["nsys"], r["origin"]))


# ------------------------------------------------------------- phases

PHASES = (
    "forward encoder",
    "forward decoder",
    "loss",
    "backward decoder",
    "backward encoder",
    "ZeRO gather",
    "other",
)
"""The micro-batch's parts as the report's nsys ranges name them (lines 285, 290), plus the
ZeRO gathers (no consumer of their own) and what belongs to no stack (embeddings shared
by both stacks, inputs, gradient clipping)."""


def _stack(op_name: str) -> str:
    head = op_name.split(".", 1)[0]
    if head in ("encoder", "decoder"):
        return head
    return "loss" if head in ("loss", "lm_head") else "other"


def _phase(role: Role, stack: str) -> str:
    if stack in ("loss", "other"):
        return stack
    return f"{'backward' if role is not Role.FORWARD else 'forward'} {stack}"


def phases(graph: Graph, ev: Evaluation) -> dict[str, float]:
    """Seconds per micro-batch of each of :data:`PHASES`: every record x its runs per
    micro-batch, by its op's (an edge: its consumer's) role and stack (the first component
    of its name); a recomputed forward's second run counts in the backward of its stack,
    where checkpointing runs it.  The values sum to :func:`span` ``"micro-batch"``."""
    roles = {op.name: op.role for op in graph.ops}
    out = dict.fromkeys(PHASES, 0.0)

    def add(name: str, seconds: float, per_micro_batch: int) -> None:
        role, stack = roles.get(name, Role.FORWARD), _stack(name)
        first = min(per_micro_batch, 1)
        out[_phase(role, stack)] += seconds * first
        out[_phase(Role.BACKWARD, stack)] += seconds * (per_micro_batch - first)

    for o in ev.ops:
        add(o.name, o.compute_s, o.per_micro_batch)
    for e in ev.edges:
        if e.zero_gather:
            out["ZeRO gather"] += e.time_s * e.per_micro_batch
        else:
            add(e.consumer, e.time_s, e.per_micro_batch)
    return out


# ------------------------------------------------------------- what-ifs


def _partial_as_all_reduce(e: EdgeCost, mesh: Mesh) -> EdgeCost:
    """``e`` with every send/recv step that sums partial sums (``P`` on its axis) priced as a
    ring all-reduce of the group's tensor on that axis instead: ``2(n-1) alpha + 2(n-1)/n
    T / beta`` (seconds; ``T`` = the tensor's bytes on the group, local shape of the step's
    source), as OneFlow lowers ``(*, P) -> (*, B)``.  LiBai's ``Linear1D`` (which the MT5 of
    ``projects/T5`` uses) casts row-parallel outputs to ``(S(0), B)`` and column-parallel
    inputs and their gradients to ``(S(0), B)`` (``to_global(sbp=...)``,
    ``to_global(grad_sbp=x.sbp)`` in ``libai/layers/linear.py``, read at libai 02ec5e8, not
    the report's e9ca408 / 0002b66), so its partial sums are all-reduced there; the
    ``inferred`` baseline has no casts.  Only the pricing changes: the gathers a cast would
    make unnecessary stay."""
    steps = []
    for s in e.steps:
        if s.collective.value != "send-recv" or not isinstance(s.src.values[s.axis], Partial):
            steps.append(s)
            continue
        shape = local_shape(e.shape, s.src, mesh.shape)
        if shape is None:
            steps.append(s)
            continue
        n = mesh.shape[s.axis]
        group_bytes = math.prod(shape) * DTYPE_BYTES[e.dtype]
        moved = 2 * (n - 1) / n * group_bytes
        alpha, beta = mesh.axes[s.axis].alpha_beta("all-reduce")
        seconds = ring_steps("all-reduce", n) * alpha + moved / beta
        dst = NdSbp(tuple(Broadcast() if a == s.axis else v for a, v in enumerate(s.src.values)))
        steps.append(
            dataclasses.replace(
                s, collective=Collective.ALL_REDUCE, dst=dst, bytes_per_device=moved, time_s=seconds
            )
        )
    return dataclasses.replace(e, steps=tuple(steps), time_s=sum(st.time_s for st in steps))


WHAT_IFS: dict[str, Callable[[EdgeCost, Mesh], EdgeCost]] = {
    "ZeRO gather once per step": lambda e, mesh: _once_per_step(e) if e.zero_gather else e,
    "partial sums all-reduced": _partial_as_all_reduce,
}


def what_if(ev: Evaluation, mesh: Mesh, names: Iterable[str]) -> Evaluation:
    """A copy of ``ev`` with the edges rewritten by each of :data:`WHAT_IFS` ``names``."""
    out = copy.copy(ev)
    edges = list(ev.edges)
    for name in names:
        edges = [WHAT_IFS[name](e, mesh) for e in edges]
    out.edges = edges
    return out


# ------------------------------------------------------------- the replay


def replay(model: str = "mt5-base", preset: str = "a100-40g", seed: SeedReport = SEED) -> dict[str, Any]:
    """Fit the cluster, then predict both plans per runtime; mechanisms and what-ifs of the
    runtime LiBai ran (``oneflow-0.9``).  JSON-ready."""
    f = fit(model, preset, seed)
    graph = build(model, batch=seed.samples_per_rank * seed.mesh[0])
    mesh = Mesh(Cluster(seed.nodes, seed.devices_per_node, f.device), seed.mesh)
    predicted = {runtime: predict(f, runtime, model, seed) for runtime in RUNTIMES}
    single = build(model, batch=seed.single_device_samples)
    one = Mesh(Cluster(1, 1, f.device), (1,))
    meg_fit = _micro_batch(graph, "megatron", mesh, seed.zero_stage, "oneflow-0.9", seed)
    lib = predicted["oneflow-0.9"]
    combos = {"as modelled": ()} | {name: (name,) for name in WHAT_IFS} | {"both": tuple(WHAT_IFS)}
    return {
        "model": model,
        "preset": preset,
        "efficiency_factor": f.efficiency_factor,
        "bandwidth_bytes_per_s": f.device.intra_node_bandwidth,
        "inter_node_bandwidth_bytes_per_s": f.device.inter_node_bandwidth,
        "inputs": {
            "single_device_compute_ms": _micro_batch(single, "single-device", one, 0, "oneflow-0.9").compute_s
            * 1e3,
            "megatron_tp_all_reduce_ms": meg_fit.comm_s.get(("all-reduce", len(seed.mesh) - 1), 0.0) * 1e3,
        },
        "runtimes": {runtime: _row(p, f, seed) for runtime, p in predicted.items()},
        "phases_ms": {
            plan: {k: v * 1e3 for k, v in phases(graph, getattr(lib, plan)).items()}
            for plan in ("megatron", "inferred")
        },
        "mechanisms": {
            "megatron": mechanisms(graph, lib.megatron, seed.micro_batches),
            "inferred": mechanisms(graph, lib.inferred, seed.micro_batches),
        },
        "what_if": {
            label: {
                scope: _shares(span(what_if(lib.inferred, mesh, names), scope, seed.micro_batches))
                for scope in ("micro-batch", "step")
            }
            | {"inferred_ms": span(what_if(lib.inferred, mesh, names), "micro-batch", 1).total_s * 1e3}
            for label, names in combos.items()
        },
    }


def sensitivity(model: str = "mt5-base", preset: str = "a100-40g", seed: SeedReport = SEED) -> dict[str, Any]:
    """The predicted ratios (runtime ``oneflow-0.9``) as each of the fit's two choices moves:
    the inter-node bandwidth (:data:`INTER_FACTORS` x the fitted intra-node value, the
    preset's own inter/intra proportion, the preset's own inter-node figure) and the share
    of Megatron's micro-batch read as its tensor-parallel all-reduce (:data:`SHARE_READINGS`)."""
    base = fit(model, preset, seed)
    p = PRESETS[preset]
    inter: list[tuple[str, Fit]] = [(f"{x:g}x intra", with_inter(base, x, preset)) for x in INTER_FACTORS]
    inter.append(
        (f"{preset}'s proportion", with_inter(base, p.inter_node_bandwidth / p.intra_node_bandwidth))
    )
    inter.append((f"{preset}'s own figure", with_inter(base, None, preset)))
    shares = [(f"{100 * s:.1f} %", refit_share(base, s, seed)) for s in SHARE_READINGS]

    def rows(choices: list[tuple[str, Fit]]) -> list[dict[str, Any]]:
        out = []
        for label, f in choices:
            pred = predict(f, "oneflow-0.9", model, seed)
            meg, inf = pred.spans("micro-batch")
            out.append(
                {
                    "choice": label,
                    "intra_bytes_per_s": f.device.intra_node_bandwidth,
                    "inter_bytes_per_s": f.device.inter_node_bandwidth,
                    "megatron_ms": meg.total_s * 1e3,
                    "inferred_ms": inf.total_s * 1e3,
                    "ratio": pred.ratio,
                    "step_ratio": pred.step_ratio,
                }
            )
        return out

    return {"inter_node": rows(inter), "all_reduce_share": rows(shares)}


# ------------------------------------------------------------- printing


def _pct(x: float) -> str:
    return f"{100 * x:5.1f} %"


MECHANISM_FLOOR_S = 0.5e-3
"""Mechanism rows under this many seconds per step are left out of the printout (not of the JSON)."""


def print_replay(r: dict[str, Any], seed: SeedReport = SEED, *, detail: bool = True) -> None:
    """The inputs, the predictions and the shares; with ``detail`` the mechanisms and what-ifs."""
    print(
        f"\nLiBai MT5 report replayed ({r['model']}, {seed.samples_per_rank} samples/rank, mesh "
        f"{list(seed.mesh)} on {seed.nodes}x{seed.devices_per_node}, ZeRO-{seed.zero_stage}, "
        f"{seed.micro_batches} micro-batches per step, checkpointing {seed.checkpointing}; "
        f"report lines of {SEED_FILE})"
    )
    _print_inputs(r, seed)
    _print_predicted(r, seed)
    _print_phases(r, seed)
    _print_shares(r, seed)
    if detail:
        _print_mechanisms(r)
        _print_what_if(r, seed)
    else:
        print(
            "  (what produces the communication, what-ifs and sensitivity: python -m benchmarks.seed_replay)"
        )


def _print_inputs(r: dict[str, Any], seed: SeedReport) -> None:
    i = r["inputs"]
    target = seed.megatron_all_reduce_share * seed.megatron_s * 1e3
    print("  fitted on (inputs: the model reproduces these by construction)")
    print(
        f"    one GPU, {seed.single_device_samples} samples: compute {i['single_device_compute_ms']:.1f} ms "
        f"vs 88 ms (line 307 'OneFlow 88ms')  -> efficiency x{r['efficiency_factor']:.3f} of {r['preset']}"
    )
    print(
        f"    megatron tensor-parallel all-reduce per micro-batch {i['megatron_tp_all_reduce_ms']:.1f} ms vs "
        f"49.8 % of 357 ms = {target:.1f} ms (lines 285-286 '357ms', '49.8%')  "
        f"-> intra-node bus bandwidth {r['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s"
    )
    print(
        f"    choices, not measured: inter-node bandwidth = intra-node "
        f"({r['inter_node_bandwidth_bytes_per_s'] / 1e9:.2f} GB/s); 49.8 % read as tensor-parallel "
        f"all-reduce alone (both varied by python -m benchmarks.seed_replay)"
    )


def _print_predicted(r: dict[str, Any], seed: SeedReport) -> None:
    rest = seed.megatron_s * (1 - seed.megatron_all_reduce_share) * 1e3
    print("  predicted (not used by the fit), per runtime; measured beside it")
    print(
        f"    {'':<12} {'megatron rest':>13} {'megatron':>9} {'inferred':>9} {'ratio':>6}   "
        f"{'step of ' + str(seed.micro_batches) + ' megatron / inferred':>29} {'ratio':>6}"
    )
    print(
        f"    {'measured':<12} {rest:10.1f} ms {seed.megatron_s * 1e3:6.1f} ms {seed.libai_s * 1e3:6.1f} ms "
        f"{seed.libai_s / seed.megatron_s:5.2f}x   {seed.megatron_step_s * 1e3:15.0f} / "
        f"{seed.libai_step_s * 1e3:.0f} ms {seed.libai_step_s / seed.megatron_step_s:5.2f}x"
    )
    for runtime, row in r["runtimes"].items():
        print(
            f"    {runtime:<12} {row['megatron_beyond_fitted_all_reduce_ms']:10.1f} ms "
            f"{row['megatron_ms']:6.1f} ms {row['inferred_ms']:6.1f} ms {row['ratio']:5.2f}x   "
            f"{row['megatron_step_ms']:15.0f} / {row['inferred_step_ms']:.0f} ms {row['step_ratio']:5.2f}x"
        )
    print(
        "    (megatron rest: its micro-batch less the fitted all-reduce, measured 357 - 177.8 ms; "
        "megatron's total is half input. Measured: lines 285 '357ms', 290 '1000ms'; steps = "
        f"{seed.global_batch} samples / 164.3 (line 252) and 63.75 samples/s (line 249))"
    )


def _print_phases(r: dict[str, Any], seed: SeedReport) -> None:
    print("  per phase, ms per micro-batch (oneflow-0.9; nsys ranges of lines 285 and 290 beside)")
    measured = {
        "megatron": dict(zip(PHASES, seed.megatron_phases_s)),
        "inferred": dict(zip(PHASES, seed.libai_phases_s)),
    }
    print(f"    {'phase':<18} {'megatron':>9} {'nsys':>6}   {'inferred':>9} {'nsys':>6}")
    for phase in PHASES:
        cells = []
        for plan in ("megatron", "inferred"):
            m = measured[plan].get(phase, math.nan)
            cells.append(
                f"{r['phases_ms'][plan][phase]:9.1f} {'-' if math.isnan(m) else f'{m * 1e3:.0f}':>6}"
            )
        print(f"    {phase:<18} {cells[0]}   {cells[1]}")


def _print_shares(r: dict[str, Any], seed: SeedReport) -> None:
    libai_nccl = seed.libai_send_recv_share + seed.libai_all_reduce_share + seed.libai_all_gather_share
    measured = {
        "megatron": {
            "all-reduce": seed.megatron_all_reduce_share,
            "NCCL": sum(seed.megatron_nccl_shares),
            "compute": 1 - sum(seed.megatron_nccl_shares),
        },
        "inferred": {
            "send/recv": seed.libai_send_recv_share,
            "all-reduce": seed.libai_all_reduce_share,
            "all-gather": seed.libai_all_gather_share,
            "NCCL": libai_nccl,
            "compute": 1 - libai_nccl,
        },
    }
    span_ms = {"megatron": seed.megatron_s * 1e3, "inferred": seed.libai_s * 1e3}
    cite = {"megatron": "line 286 '66% (49.8% + 12.8% + 3.4%)', all-reduce", "inferred": "line 291"}
    print(
        "  per-collective shares of the modelled time (oneflow-0.9 | step of K / ideal | step of K) vs "
        "nsys; ms per micro-batch: oneflow-0.9 vs the nsys share x the measured micro-batch"
    )
    for plan in ("megatron", "inferred"):
        print(f"    {plan} (nsys: {cite[plan]})")
        for name in (*NSYS_CLASSES, "NCCL", "compute"):
            got = [
                r["runtimes"][rt]["shares"][plan][scope][name]
                for rt in RUNTIMES
                for scope in ("micro-batch", "step")
            ]
            model_ms = r["runtimes"]["oneflow-0.9"]["micro_batch_ms"][plan]
            ms = sum(model_ms[n] for n in NSYS_CLASSES) if name == "NCCL" else model_ms[name]
            m = measured[plan].get(name)
            nsys = f"{_pct(m)}  ms {ms:6.1f} vs {m * span_ms[plan]:6.1f}" if m is not None else "   -"
            if plan == "megatron" and name == "all-reduce":
                nsys += "  (the fit's input, read as tensor-parallel)"
            label = "non-NCCL" if name == "compute" else name
            print(
                f"      {label:<15} {_pct(got[0])} | {_pct(got[1])}  / {_pct(got[2])} | {_pct(got[3])}"
                f"   nsys {nsys}"
            )


def _print_mechanisms(r: dict[str, Any]) -> None:
    print(
        "  what produces each plan's communication (oneflow-0.9; ms per micro-batch | per step of K; "
        f"rows under {MECHANISM_FLOOR_S * 1e3:g} ms per step left out)"
    )
    for plan, rows in r["mechanisms"].items():
        print(f"    {plan}")
        for m in (m for m in rows if m["step_s"] >= MECHANISM_FLOOR_S):
            print(
                f"      {m['nsys']:<14} {m['origin']:<38} {m['collective']:<17} {m['move']:<5} "
                f"{m['micro_batch_s'] * 1e3:8.1f} | {m['step_s'] * 1e3:7.0f}  ({m['steps']} boxing steps)"
            )


def _print_what_if(r: dict[str, Any], seed: SeedReport) -> None:
    print(
        "  inferred with the two mechanisms that disagree re-priced (oneflow-0.9; micro-batch | step): "
        "ZeRO gather once per step (where DeepSpeed puts it; OneFlow 0.9 gathers every micro-batch), "
        "partial sums all-reduced (as LiBai's Linear1D casts ask; the baseline has no casts, and the "
        "gathers a cast would make unnecessary are kept)"
    )
    measured = (seed.libai_send_recv_share, seed.libai_all_reduce_share, seed.libai_all_gather_share)
    print(
        f"      {'nsys (line 291)':<28} {'':>10}  send/recv {_pct(measured[0])}  "
        f"all-reduce {_pct(measured[1])}  all-gather {_pct(measured[2])}"
    )
    for label, w in r["what_if"].items():
        mb, st = w["micro-batch"], w["step"]
        cells = "  ".join(
            f"{n} {_pct(mb[n])} | {_pct(st[n])}" for n in ("send/recv", "all-reduce", "all-gather")
        )
        print(f"      {label:<28} {w['inferred_ms']:7.1f} ms  {cells}")


def print_sensitivity(s: dict[str, Any], seed: SeedReport = SEED) -> None:
    print("\nSensitivity of the prediction to the fit's two choices (oneflow-0.9)")
    titles = {
        "inter_node": "inter-node bandwidth (49.8 % read as tensor-parallel all-reduce)",
        "all_reduce_share": (
            "share of Megatron's 357 ms read as its tensor-parallel all-reduce (inter = intra)"
        ),
    }
    for key, rows in s.items():
        print(f"  {titles[key]}")
        print(
            f"    {'choice':<24} {'intra GB/s':>10} {'inter GB/s':>10} {'megatron':>9} {'inferred':>9} "
            f"{'ratio':>6} {'step ratio':>10}"
        )
        for row in rows:
            intra, inter = row["intra_bytes_per_s"] / 1e9, row["inter_bytes_per_s"] / 1e9
            print(
                f"    {row['choice']:<24} {intra:10.2f} {inter:10.2f} {row['megatron_ms']:6.1f} ms "
                f"{row['inferred_ms']:6.1f} ms {row['ratio']:5.2f}x {row['step_ratio']:9.2f}x"
            )
    print(
        f"    measured: ratio {seed.libai_s / seed.megatron_s:.2f}x (1000 / 357 ms, lines 285, 290), "
        f"step ratio {seed.libai_step_s / seed.megatron_step_s:.2f}x "
        "(164.3 / 63.75 samples/s, lines 252, 249)"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", default="mt5-base")
    parser.add_argument("--json", help="write the replay and the sensitivity here")
    args = parser.parse_args(argv)
    r = replay(args.model)
    print_replay(r)
    s = sensitivity(args.model)
    print_sensitivity(s)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"replay": r, "sensitivity": s}, fh, indent=1)


if __name__ == "__main__":
    main()
