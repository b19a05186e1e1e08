"""Efficiency check: autopar's modelled iteration time against Megatron-LM's measured one.

    .venv/bin/python -m benchmarks.efficiency_check [--preset a100-80g] [--rows 1.7b,18b]

A check, never an input: no constant of the cost model is fitted to these numbers (the
compute efficiencies come from kernel measurements, ``autopar/hardware/profiles/*.json`` and
``docs/calibration.md``).

Rows: the four pipeline-1 rows of Narayanan et al. 2021 ("Efficient Large-Scale Language
Model Training on GPU Clusters Using Megatron-LM", SC21), Table 1 (weak scaling, GPT, seq
2048, vocabulary 51200, A100 80GB on Selene: 8 per node, NVLink/NVSwitch inside, 8 HDR
InfiniBand NICs per node), with tensor-parallel size, micro-batch size and global batch
from the paper's own launch script (Megatron-LM ``examples/sc21/run_table_1.sh``: ``MBS``,
``GBS``, ``DDP=torch``, ``--recompute-method uniform``):

| size | heads | hidden | layers | tp | GPUs | global batch | micro-batch | TFLOP/s per GPU |
|---|---|---|---|---|---|---|---|---|
| 1.7B | 24 | 2304 | 24 | 1 | 32 | 512 | 16 | 137 |
| 3.6B | 32 | 3072 | 30 | 2 | 64 | 512 | 16 | 138 |
| 7.5B | 32 | 4096 | 36 | 4 | 128 | 512 | 16 | 142 |
| 18B | 48 | 6144 | 40 | 8 | 256 | 1024 | 8 | 135 |

Measured iteration time = ``96 B s l h^2 (1 + s/6h + V/16lh) / (TFLOP/s x GPUs)`` (the
paper's eq. 3, which counts the recomputed forward).  Modelled: autopar's ``megatron``
baseline at that configuration (``tp=T,dp=D``, DDP: ZeRO-0, pipeline 1, every block
recomputed, the ``megatron-lm`` runtime), one micro-batch graph of ``micro-batch x dp``
sequences (``autopar model gpt-1.3b --layers L --hidden H --heads A --ffn 4H --vocab 51200
--seq 2048 --batch MB*dp``), ``K = global batch / (MB x dp)`` micro-batches per step.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

SEQ = 2048
VOCAB = 51200
DEVICES_PER_NODE = 8


@dataclass(frozen=True)
class Row:
    """One measured configuration of Narayanan et al. 2021, Table 1 (pipeline 1)."""

    name: str
    heads: int
    hidden: int
    layers: int
    tp: int
    gpus: int
    global_batch: int
    micro_batch: int
    measured_tflops: float
    """achieved teraFLOP/s per GPU, as the paper prints it"""

    @property
    def dp(self) -> int:
        return self.gpus // self.tp

    @property
    def micro_batches(self) -> int:
        return self.global_batch // (self.micro_batch * self.dp)

    def step_flops(self) -> float:
        """``96 B s l h^2 (1 + s/6h + V/16lh)``: FLOPs of one step with recomputation (eq. 3)."""
        h, lay = self.hidden, self.layers
        return 96 * self.global_batch * SEQ * lay * h * h * (1 + SEQ / (6 * h) + VOCAB / (16 * lay * h))

    def measured_iteration_s(self) -> float:
        return self.step_flops() / (self.measured_tflops * 1e12 * self.gpus)


ROWS = {
    "1.7b": Row("1.7B", 24, 2304, 24, 1, 32, 512, 16, 137.0),
    "3.6b": Row("3.6B", 32, 3072, 30, 2, 64, 512, 16, 138.0),
    "7.5b": Row("7.5B", 32, 4096, 36, 4, 128, 512, 16, 142.0),
    "18b": Row("18B", 48, 6144, 40, 8, 256, 1024, 8, 135.0),
}


def modelled_iteration_s(row: Row, preset: str) -> tuple[float, float]:
    """(iteration seconds, compute seconds of one micro-batch step) of autopar's megatron baseline."""
    from autopar.baselines.megatron.configs import megatron_config
    from autopar.baselines.plans import baseline_plan
    from autopar.cost.evaluate import attach_evaluation, evaluate
    from autopar.hardware.cluster import Cluster
    from autopar.hardware.mesh import Mesh
    from autopar.ir.training import TrainingConfig
    from autopar.models import build

    graph = build(
        "gpt-1.3b",
        layers=row.layers,
        hidden=row.hidden,
        heads=row.heads,
        ffn=4 * row.hidden,
        vocab=VOCAB,
        seq=SEQ,
        batch=row.micro_batch * row.dp,
    )
    cluster = Cluster.parse(f"{row.gpus // DEVICES_PER_NODE}x{DEVICES_PER_NODE}", preset)
    config = megatron_config(f"tp={row.tp},dp={row.dp},optimizer=ddp", cluster)
    mesh = Mesh(cluster, config.mesh_shape)
    plan = baseline_plan("megatron", graph, mesh, config.zero_stage, runtime=config.runtime)
    plan.training = TrainingConfig(row.micro_batches, "full")
    plan = attach_evaluation(plan, evaluate(graph, plan))
    return plan.iteration_time_s, float(plan.predicted["compute_time_s"])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--preset", default="a100-80g", help="device preset (default a100-80g, as measured)")
    ap.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of {', '.join(ROWS)}")
    args = ap.parse_args(argv)
    print(f"preset {args.preset}; megatron baseline at the measured configuration (DDP, recompute full)")
    print(
        "| model | tp x dp | K | measured TFLOP/s | measured ms | modelled ms | modelled TFLOP/s "
        "| modelled / measured | modelled compute ms per micro-batch |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    ratios = []
    for key in args.rows.split(","):
        row = ROWS[key.strip().lower()]
        t0 = time.perf_counter()
        modelled, compute = modelled_iteration_s(row, args.preset)
        wall = time.perf_counter() - t0
        measured = row.measured_iteration_s()
        ratios.append(modelled / measured)
        tflops = row.step_flops() / (modelled * row.gpus) / 1e12
        print(
            f"| {row.name} | {row.tp} x {row.dp} | {row.micro_batches} | {row.measured_tflops:.0f} "
            f"| {measured * 1e3:.0f} | {modelled * 1e3:.0f} | {tflops:.0f} | {modelled / measured:.2f}x "
            f"| {compute * 1e3:.0f} |  ({wall:.0f} s)",
            flush=True,
        )
    print(f"modelled / measured: {min(ratios):.2f}-{max(ratios):.2f}x")


if __name__ == "__main__":
    main()
