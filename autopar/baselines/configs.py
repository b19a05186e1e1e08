"""The configuration each reference system's users run, and the best of them.

A baseline is a claim about another system: it is priced as that system runs, at the
configuration its users would choose, never on the mesh autopar happened to choose
(a ``[4, 64]`` mesh gives Megatron 64-way tensor parallelism across 8 nodes, which no
Megatron-LM user runs)::

    candidate configurations                   each configuration that system's users pick
          │  price(config) -> Plan             built and evaluated (:mod:`autopar.baselines.pricing`)
          v
    best_config(...)                           the fastest that fits the budget
                                               (:mod:`autopar.baselines.search` walks the space)

* ``megatron`` -- Megatron-LM (Megatron-Core) as its users run it today:
  :mod:`autopar.baselines.megatron.configs` (``tp``, ``pp``, ``dp``, ``vpp``, ``sp``,
  recomputation, DDP or the distributed optimizer, overlapped reduction and gather), priced
  under the ``megatron-lm`` runtime (:mod:`autopar.runtimes.megatron_lm`).  The mesh is
  ``[d, t]`` (``[N]`` when ``t = 1``), one stage's under a pipeline.
* ``data-parallel`` -- ZeRO over every device: the 1-D mesh ``[N]`` and the same laid over the
  nodes, ``[nodes, devices per node]`` (its collectives hierarchical), the request's ZeRO stage
  and runtime.
* ``inferred`` -- LiBai's ``dp x mp`` with OneFlow 0.9's SBP inference: ``[N / t, t]`` for
  ``t`` in 2..devices per node and ``[N]``, the request's ZeRO stage and runtime (LiBai runs
  on OneFlow), with or without recomputing every block (LiBai's ``activation_checkpoint``,
  the seed's ``actrue``).
* ``single-device`` -- one configuration: every op replicated, on the request's mesh.

Plans and baselines are compared by the iteration as their runtime runs it
(``achieved_iteration_time_s``: less the communication the runtime hides).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from autopar.errors import AutoparError, ConfigError
from autopar.hardware.cluster import Cluster
from autopar.ir.plan import Plan
from autopar.pipeline.plan import PipelinePlan

__all__ = [
    "MEGATRON_OPTIMIZERS",
    "MEGATRON_RUNTIME",
    "BaselineConfig",
    "PricedConfig",
    "best_config",
    "candidate_configs",
    "pick_best",
]

MEGATRON_RUNTIME = "megatron-lm"
"""Runtime profile the ``megatron`` baseline is priced with (Megatron-LM as it runs)."""
MEGATRON_OPTIMIZERS = {0: "DDP", 1: "distributed optimizer", 3: "FSDP"}
"""ZeRO stage -> Megatron-LM's name for it: plain DDP, ``--use-distributed-optimizer``
(optimizer states sharded over the data-parallel group, ZeRO-1), or Megatron-FSDP
(``--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params``: parameters,
gradients and optimizer states sharded, the parameters gathered for each forward and
backward, ZeRO-3; without pipeline stages)."""


@dataclass(frozen=True)
class BaselineConfig:
    """One configuration of a reference system: its mesh, ZeRO stage and runtime profile, and
    for Megatron-LM its pipeline, interleaving, sequence parallelism and recomputation."""

    kind: str
    mesh_shape: tuple[int, ...]
    zero_stage: int
    runtime: str
    pipeline: int = 1
    """Pipeline stages (Megatron-LM's ``--pipeline-model-parallel-size``); ``mesh_shape`` is
    then one stage's mesh."""
    virtual_stages: int = 1
    """Model chunks per device under interleaved 1F1B (``--num-layers-per-virtual-pipeline-stage``
    giving ``L / (pp vpp)`` layers per chunk); 1: plain 1F1B."""
    sequence_parallel: bool = False
    """Megatron-LM's ``--sequence-parallel`` (tensor-parallel degree above 1 only)."""
    recompute: str = ""
    """Activation recomputation as the system's users name it: ``none``, ``selective``
    (``--recompute-activations``), ``full`` (``--recompute-granularity full
    --recompute-method uniform``), ``full:N`` (``--recompute-method block
    --recompute-num-layers N``: the first N layers of each stage's chunk); empty: the
    request's checkpointing."""

    @property
    def tensor_parallel(self) -> int:
        """Devices per tensor-parallel group: the last axis of a mesh of two or more axes."""
        return self.mesh_shape[-1] if len(self.mesh_shape) > 1 else 1

    @property
    def data_parallel(self) -> int:
        return math.prod(self.mesh_shape) // self.tensor_parallel

    @property
    def devices(self) -> int:
        return math.prod(self.mesh_shape) * self.pipeline

    def describe(self) -> str:
        """The configuration in its users' words: ``tp=8, dp=32, pp=1, DDP`` for Megatron-LM, with
        ``vpp``, ``sp`` and the recomputation when they are set."""
        if self.kind == "megatron":
            optimizer = MEGATRON_OPTIMIZERS.get(self.zero_stage, f"ZeRO-{self.zero_stage}")
            parts = [f"tp={self.tensor_parallel}", f"dp={self.data_parallel}", f"pp={self.pipeline}"]
            if self.virtual_stages > 1:
                parts.append(f"vpp={self.virtual_stages}")
            if self.sequence_parallel:
                parts.append("sp")
            if self.recompute:
                parts.append(f"recompute={self.recompute}")
            return ", ".join([*parts, optimizer])
        text = f"mesh {list(self.mesh_shape)}, ZeRO-{self.zero_stage}"
        return f"{text}, recompute={self.recompute}" if self.recompute else text

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "mesh_shape": list(self.mesh_shape),
            "zero_stage": self.zero_stage,
            "runtime": self.runtime,
            "tensor_parallel": self.tensor_parallel,
            "data_parallel": self.data_parallel,
            "pipeline_parallel": self.pipeline,
            "virtual_stages": self.virtual_stages,
            "sequence_parallel": self.sequence_parallel,
            "recompute": self.recompute,
            "describe": self.describe(),
        }


def _dp_tp_shape(devices: int, tp: int) -> tuple[int, ...]:
    return (devices,) if tp == 1 else (devices // tp, tp)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidate_configs(
    kind: str,
    cluster: Cluster,
    zero_stage: int,
    runtime: str,
) -> list[BaselineConfig]:
    """The configurations of ``data-parallel`` and ``inferred`` their users would pick on
    ``cluster`` (module docstring); ``zero_stage`` and ``runtime`` are the request's.
    Megatron-LM's space: :func:`autopar.baselines.megatron.configs.megatron_structures`."""
    n, per_node = cluster.world_size, cluster.devices_per_node
    if kind == "data-parallel":  # flat, and laid over the nodes as a user would ([nodes, per node])
        shapes = [(n,)] + ([(cluster.nodes, per_node)] if cluster.nodes > 1 and per_node > 1 else [])
        return [BaselineConfig(kind, shape, zero_stage, runtime) for shape in shapes]
    if kind == "inferred":
        return [BaselineConfig(kind, _dp_tp_shape(n, tp), zero_stage, runtime) for tp in _divisors(per_node)]
    raise ConfigError("unknown_baseline", f"no configurations are searched for baseline {kind!r}")


@dataclass
class PricedConfig:
    """One configuration with its evaluated plan, or why it could not be built."""

    config: BaselineConfig
    plan: Plan | PipelinePlan | None = None
    error: str | None = None

    def fits(self, budget: float | None) -> bool:
        return self.plan is not None and (budget is None or self.plan.memory_per_device_bytes <= budget)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"describe": self.config.describe(), "mesh_shape": list(self.config.mesh_shape)}
        if self.plan is not None:
            out.update(
                iteration_time_s=self.plan.iteration_time_s,
                achieved_iteration_time_s=self.plan.achieved_iteration_time_s,
                memory_per_device_bytes=self.plan.memory_per_device_bytes,
            )
        if self.error is not None:
            out["error"] = self.error
        return out


def best_config(
    configs: Sequence[BaselineConfig],
    price: Callable[[BaselineConfig], Plan | PipelinePlan],
    budget: float | None,
) -> tuple[PricedConfig, list[PricedConfig]]:
    """The fastest of ``configs`` (by the iteration as its runtime runs it) whose plan fits
    ``budget`` bytes per device, and every configuration priced; when none fits, the one needing least memory.
    ``price`` builds and evaluates one configuration's plan; an :class:`AutoparError`
    (e.g. a tensor-parallel degree the model's shapes cannot split) leaves that
    configuration out, with its message."""
    priced: list[PricedConfig] = []
    for config in configs:
        try:
            priced.append(PricedConfig(config, price(config)))
        except AutoparError as exc:
            priced.append(PricedConfig(config, error=exc.message))
    return pick_best(priced, budget, configs[0].kind if configs else "baseline")


def pick_best(
    priced: Sequence[PricedConfig], budget: float | None, kind: str
) -> tuple[PricedConfig, list[PricedConfig]]:
    """The fastest of ``priced`` that fits ``budget`` (by ``achieved_iteration_time_s``), else
    the one needing least memory; :class:`ConfigError` ``no_baseline_config`` when none could
    be priced (each one's reason in the message)."""
    priced = list(priced)
    built = [p for p in priced if p.plan is not None and math.isfinite(p.plan.iteration_time_s)]
    if not built:
        reasons = "; ".join(f"{p.config.describe()}: {p.error}" for p in priced)
        raise ConfigError("no_baseline_config", f"no configuration of {kind} could be priced: {reasons}")
    fitting = [p for p in built if p.fits(budget)]
    if fitting:
        return min(fitting, key=lambda p: p.plan.achieved_iteration_time_s if p.plan else math.inf), priced
    return min(built, key=lambda p: p.plan.memory_per_device_bytes if p.plan else math.inf), priced
