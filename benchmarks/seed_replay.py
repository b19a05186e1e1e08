"""The LiBai MT5 report, replayed: fit the report's cluster on Megatron, predict OneFlow's inference.

The seed report (``../shared/seed/mt5-throughput-issue.txt``) measured, on two
nodes of four GPUs, MT5 (12+12 layers, hidden 768) with 16 samples per
data-parallel rank per micro-batch, ``dp4 x mp2`` (mesh ``[4, 2]``), ZeRO-2,
fp16, 8 micro-batches per 512-sample step:

* Megatron-DeepSpeed: 357 ms per micro-batch (nsys: forward encoder 78 +
  decoder 24 + loss 9 + backward decoder 88 + encoder 150), of which
  all-reduce kernels 49.8 %;
* LiBai (OneFlow's SBP inference): 1000 ms per micro-batch, send/recv kernels
  46.4 % (NCCL runs all-to-all as grouped send/recv, so an nsys trace shows
  both as send/recv), all-reduce 17.9 %, all-gather 12.9 %;
* one GPU, 4 samples per micro-batch: OneFlow 88 ms.

Its machines are not the ``a100-40g`` preset's (Megatron spends 178 ms of a
357 ms micro-batch in tensor-parallel all-reduces that NVLink would finish in
a few ms), so the ratio the report measured cannot be read off a model priced
on a DGX A100.  This module fits the two numbers of the cluster that the
report itself determines, **from Megatron's and the single GPU's figures
only**, and then predicts LiBai's plan, which the fit never saw:

1. compute speed: ``matmul_efficiency`` and ``memory_efficiency`` of the
   preset scaled by one factor so that the single-device plan's micro-batch
   compute (:func:`autopar.breakdown.micro_batch_time`, 4 samples) is 88 ms
   (compute time is inversely proportional to both, ``autopar.costs``);
2. intra-node bus bandwidth, so that the ``megatron`` baseline's
   tensor-parallel all-reduces of one micro-batch (64 samples, mesh ``[4, 2]``
   on 2x4, the axis inside a node) take 49.8 % of 357 ms.  All-reduce time is
   ``L + X / beta`` (:mod:`autopar.boxing`); two evaluations give ``L`` and
   ``X``, then ``beta = X / (0.178 s - L)``.

The inter-node bandwidth is not determined by any micro-batch figure of the
report (Megatron's data-parallel traffic runs once per step); it is set to the
fitted intra-node value.  Predicted: the micro-batch time of ``megatron`` and of
``inferred`` (OneFlow's inference from LiBai's layout), their ratio, and
``inferred``'s send/recv share, against 357 ms, 1000 ms, 2.8x and 46.4 %.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from autopar.baselines import baseline_plan
from autopar.breakdown import MicroBatchTime, micro_batch_time
from autopar.cluster import PRESETS, Cluster, DeviceSpec, Mesh
from autopar.evaluate import Evaluation, evaluate
from autopar.graph import Graph
from autopar.iteration import TrainingConfig
from autopar.models import build


@dataclass(frozen=True)
class SeedReport:
    """The report's figures (seconds and shares); see the module docstring."""

    samples_per_rank: int = 16
    mesh: tuple[int, ...] = (4, 2)
    nodes: int = 2
    devices_per_node: int = 4
    zero_stage: int = 2
    megatron_s: float = 0.357
    megatron_all_reduce_share: float = 0.498
    libai_s: float = 1.000
    libai_send_recv_share: float = 0.464
    single_device_samples: int = 4
    single_device_s: float = 0.088
    micro_batches: int = 8
    """512 samples per step / (16 per rank x 4 data-parallel ranks): ``mb16_gb512``."""
    checkpointing: str = "full"
    """``actrue``: every transformer block recomputed in backward."""

    @property
    def training(self) -> TrainingConfig:
        return TrainingConfig(self.micro_batches, self.checkpointing)


SEED = SeedReport()
SEND_RECV_IN_NSYS = ("send-recv", "all-to-all")
"""Collectives an nsys trace shows as NCCL send/recv kernels (NCCL's all-to-all is grouped send/recv)."""


def _micro_batch(
    graph: Graph, kind: str, mesh: Mesh, zero_stage: int, runtime: str, seed: SeedReport = SEED
) -> MicroBatchTime:
    """One micro-batch's span of ``kind``'s plan.  The report's Megatron figures come from
    Megatron-DeepSpeed, whose ZeRO-2 gathers parameters once per step, after the update
    (not inside a micro-batch as OneFlow 0.9 does after its repeat op,
    :data:`autopar.iteration.ACCUMULATION`): its gathers are left out of its span."""
    return micro_batch_time(graph, _evaluated(graph, kind, mesh, zero_stage, runtime, seed))


def _evaluated(
    graph: Graph, kind: str, mesh: Mesh, zero_stage: int, runtime: str, seed: SeedReport
) -> Evaluation:
    """``kind``'s plan evaluated at the seed's iteration (K micro-batches, checkpointing)."""
    plan = baseline_plan(kind, graph, mesh, zero_stage, runtime=runtime)
    ev = evaluate(graph, plan, training=seed.training)
    if kind == "megatron":
        ev.edges = [
            dataclasses.replace(e, per_micro_batch=0, per_step=1) if e.zero_gather else e for e in ev.edges
        ]
    return ev


def fit_device(model: str = "mt5-base", preset: str = "a100-40g", seed: SeedReport = SEED) -> DeviceSpec:
    """The preset's device with compute speed and links fitted to the report (module docstring)."""
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
    graph = build(model, batch=seed.samples_per_rank * seed.mesh[0])

    def all_reduce_s(bandwidth: float) -> float:
        d = dataclasses.replace(device, intra_node_bandwidth=bandwidth, inter_node_bandwidth=bandwidth)
        mesh = Mesh(Cluster(seed.nodes, seed.devices_per_node, d), seed.mesh)
        t = _micro_batch(graph, "megatron", mesh, seed.zero_stage, "oneflow-0.9")
        return float(t.comm_s.get(("all-reduce", len(seed.mesh) - 1), 0.0))

    b0, b1 = base.intra_node_bandwidth, base.intra_node_bandwidth / 10
    t0, t1 = all_reduce_s(b0), all_reduce_s(b1)
    moved = (t1 - t0) / (1 / b1 - 1 / b0)
    latency = t0 - moved / b0
    target = seed.megatron_all_reduce_share * seed.megatron_s
    if not 0 <= latency < target or moved <= 0:
        raise ValueError(
            f"cannot fit: all-reduce latency {latency:.4f} s, bytes {moved:.0f}, target {target} s"
        )
    bandwidth = moved / (target - latency)
    return dataclasses.replace(device, intra_node_bandwidth=bandwidth, inter_node_bandwidth=bandwidth)


def replay(model: str = "mt5-base", preset: str = "a100-40g", seed: SeedReport = SEED) -> dict[str, Any]:
    """Fit the cluster, then the micro-batch of ``megatron`` and ``inferred`` on it, per runtime."""
    device = fit_device(model, preset, seed)
    graph = build(model, batch=seed.samples_per_rank * seed.mesh[0])
    mesh = Mesh(Cluster(seed.nodes, seed.devices_per_node, device), seed.mesh)
    out: dict[str, Any] = {
        "model": model,
        "preset": preset,
        "efficiency_factor": device.matmul_efficiency / PRESETS[preset].matmul_efficiency,
        "bandwidth_bytes_per_s": device.intra_node_bandwidth,
        "runtimes": {},
    }
    for runtime in ("oneflow-0.9", "ideal"):
        meg_ev = _evaluated(graph, "megatron", mesh, seed.zero_stage, runtime, seed)
        inf_ev = _evaluated(graph, "inferred", mesh, seed.zero_stage, runtime, seed)
        meg, inf = micro_batch_time(graph, meg_ev), micro_batch_time(graph, inf_ev)
        k = seed.micro_batches
        out["runtimes"][runtime] = {
            "megatron_ms": meg.total_s * 1e3,
            "inferred_ms": inf.total_s * 1e3,
            # the optimizer step: K micro-batches and the once-per-step work
            "megatron_iteration_ms": (k * meg.total_s + meg_ev.once_per_step_time_s) * 1e3,
            "inferred_iteration_ms": inf_ev.iteration_time_s * 1e3,
            "ratio": inf.total_s / meg.total_s,
            "inferred_send_recv_share": inf.share(*SEND_RECV_IN_NSYS),
            "inferred_all_gather_share": inf.share("all-gather"),
            "inferred_all_reduce_share": inf.share("all-reduce"),
            "megatron_all_reduce_share": meg.share("all-reduce"),
        }
    return out


def print_replay(r: dict[str, Any], seed: SeedReport = SEED) -> None:
    print(
        f"\nLiBai MT5 report replayed ({r['model']}, {seed.samples_per_rank} samples/rank, mesh "
        f"{list(seed.mesh)} on {seed.nodes}x{seed.devices_per_node}, ZeRO-{seed.zero_stage}, "
        f"{seed.micro_batches} micro-batches per step, checkpointing {seed.checkpointing})"
    )
    print(
        f"  fitted on Megatron and one GPU: efficiency x{r['efficiency_factor']:.3f} of {r['preset']}, "
        f"link bus bandwidth {r['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s"
    )
    print(
        f"  measured     megatron {seed.megatron_s * 1e3:7.1f} ms  inferred {seed.libai_s * 1e3:7.1f} ms  "
        f"ratio {seed.libai_s / seed.megatron_s:.2f}x  "
        f"inferred send/recv {100 * seed.libai_send_recv_share:.1f} %"
    )
    for runtime, row in r["runtimes"].items():
        print(
            f"  {runtime:<12} megatron {row['megatron_ms']:7.1f} ms  inferred {row['inferred_ms']:7.1f} ms  "
            f"(step of {seed.micro_batches}: {row['megatron_iteration_ms']:.0f} / "
            f"{row['inferred_iteration_ms']:.0f} ms)  "
            f"ratio {row['ratio']:.2f}x  inferred send/recv {100 * row['inferred_send_recv_share']:.1f} %  "
            f"all-gather {100 * row['inferred_all_gather_share']:.1f} %  "
            f"all-reduce {100 * row['inferred_all_reduce_share']:.1f} %"
        )
