"""The configuration each reference system's users run, and the best of them.

A baseline is a claim about another system: it is priced as that system runs, at the
configuration its users would choose, never on the mesh autopar happened to choose
(a ``[4, 64]`` mesh gives Megatron 64-way tensor parallelism across 8 nodes, which no
Megatron-LM user runs)::

    candidate_configs(kind, cluster, ...)      each configuration that system's users pick
          │  price(config) -> Plan             the caller builds and evaluates it (cached)
          v
    best_config(...)                           the fastest that fits the budget

* ``megatron`` -- Megatron-LM's "PTD-P" rules (Narayanan et al. 2021, section 3.3 and
  Takeaway #1): tensor-parallel degree ``t`` inside a node (``t`` divides the devices per
  node), pipeline-parallel degree ``p`` across nodes (``p`` divides the nodes and the
  number of blocks: Megatron-LM gives every stage the same number of layers), data-parallel
  ``d = N / (t p)`` for the rest, dividing the batch;
  every block recomputed (``--recompute-activations``); gradients reduced and parameters
  gathered once per optimizer step, by DDP (ZeRO-0) or the distributed optimizer
  (``--use-distributed-optimizer``, ZeRO-1); priced under the ``megatron-lm`` runtime
  (:mod:`autopar.runtimes.profile`).  The mesh is ``[d, t]`` (``[N]`` when ``t = 1``).
* ``data-parallel`` -- ZeRO over every device: the 1-D mesh ``[N]``, the request's ZeRO
  stage and runtime.
* ``inferred`` -- LiBai's ``dp x mp`` with OneFlow 0.9's SBP inference: ``[N / t, t]`` for
  ``t`` in 2..devices per node and ``[N]``, the request's ZeRO stage and runtime (LiBai runs
  on OneFlow), every block recomputed (the seed's ``actrue``).
* ``single-device`` -- one configuration: every op replicated, on the request's mesh.

A user names the configuration they run with :func:`parse_config` (``tp=8,dp=32``).
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
    "parse_config",
]

MEGATRON_RUNTIME = "megatron-lm"
"""Runtime profile the ``megatron`` baseline is priced with (Megatron-LM as it runs)."""
MEGATRON_OPTIMIZERS = {0: "DDP", 1: "distributed optimizer"}
"""ZeRO stage -> Megatron-LM's name for it: plain DDP, or ``--use-distributed-optimizer``
(optimizer states sharded over the data-parallel group, ZeRO-1)."""
_OPTIMIZER_NAMES = {"ddp": 0, "distributed": 1, "distributed-optimizer": 1}


@dataclass(frozen=True)
class BaselineConfig:
    """One configuration of a reference system: its mesh, ZeRO stage and runtime profile."""

    kind: str
    mesh_shape: tuple[int, ...]
    zero_stage: int
    runtime: str
    pipeline: int = 1
    """Pipeline stages (Megatron-LM's ``--pipeline-model-parallel-size``); ``mesh_shape`` is
    then one stage's mesh."""

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
        """The configuration in its users' words: ``tp=8, dp=32, pp=1, DDP`` for Megatron-LM."""
        if self.kind == "megatron":
            optimizer = MEGATRON_OPTIMIZERS.get(self.zero_stage, f"ZeRO-{self.zero_stage}")
            return f"tp={self.tensor_parallel}, dp={self.data_parallel}, pp={self.pipeline}, {optimizer}"
        return f"mesh {list(self.mesh_shape)}, ZeRO-{self.zero_stage}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "mesh_shape": list(self.mesh_shape),
            "zero_stage": self.zero_stage,
            "runtime": self.runtime,
            "tensor_parallel": self.tensor_parallel,
            "data_parallel": self.data_parallel,
            "pipeline_parallel": self.pipeline,
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
    batch: int | None = None,
    blocks: int = 0,
) -> list[BaselineConfig]:
    """Every configuration of ``kind`` its users would pick on ``cluster`` (module docstring);
    ``zero_stage`` and ``runtime`` are the request's (used where the system runs the request's).
    ``batch``: the micro-batch's batch size, which the data-parallel degree must divide
    (None: not checked); ``blocks``: the graph's blocks, which megatron's pipeline degree
    must divide (0: no pipeline)."""
    n, per_node = cluster.world_size, cluster.devices_per_node

    def splits_batch(dp: int) -> bool:
        return batch is None or batch % dp == 0

    if kind == "megatron":
        stages = [p for p in _divisors(cluster.nodes) if p == 1 or (blocks and blocks % p == 0)]
        shapes = [(pp, tp) for pp in stages for tp in _divisors(per_node)]
        # none that splits the batch evenly: every pipeline-1 one (priced with uneven splits)
        even = [(pp, tp) for pp, tp in shapes if splits_batch(n // (pp * tp))]
        return [
            BaselineConfig(kind, _dp_tp_shape(n // pp, tp), zero, MEGATRON_RUNTIME, pp)
            for pp, tp in (even or [(1, tp) for tp in _divisors(per_node)])
            for zero in sorted(MEGATRON_OPTIMIZERS)
        ]
    if kind == "data-parallel":
        return [BaselineConfig(kind, (n,), zero_stage, runtime)]
    if kind == "inferred":
        return [BaselineConfig(kind, _dp_tp_shape(n, tp), zero_stage, runtime) for tp in _divisors(per_node)]
    raise ConfigError("unknown_baseline", f"no configurations are searched for baseline {kind!r}")


def parse_config(kind: str, text: str, cluster: Cluster) -> BaselineConfig:
    """The configuration a user runs, in its users' words: for ``megatron``,
    ``tp=T,dp=D[,pp=P][,optimizer=ddp|distributed]`` (default: ``pp=1``, ``ddp``).

    Raises :class:`ConfigError` (code ``bad_baseline_config``) naming what is wrong."""
    if kind != "megatron":
        raise ConfigError(
            "bad_baseline_config", f"a configuration can be named for megatron only, not {kind!r}"
        )
    fields: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep or not key or key in fields:
            raise ConfigError(
                "bad_baseline_config",
                f"bad megatron configuration {text!r}: write tp=T,dp=D[,pp=P][,optimizer=ddp|distributed]",
            )
        fields[key.strip().lower()] = value.strip().lower()
    unknown = sorted(set(fields) - {"tp", "dp", "pp", "optimizer"})
    if unknown or not {"tp", "dp"} <= set(fields):
        raise ConfigError(
            "bad_baseline_config",
            f"bad megatron configuration {text!r}: it needs tp and dp (and knows pp, optimizer)"
            + (f"; unknown: {', '.join(unknown)}" if unknown else ""),
        )
    tp, dp, pp = (_positive(fields, key, text) for key in ("tp", "dp", "pp"))
    if tp * dp * pp != cluster.world_size:
        raise ConfigError(
            "bad_baseline_config",
            f"tp({tp}) * dp({dp}) * pp({pp}) != devices({cluster.world_size}) of cluster {cluster}",
        )
    if pp > 1 and cluster.nodes % pp:
        raise ConfigError(
            "bad_baseline_config",
            f"pp({pp}) must divide the {cluster.nodes} nodes (Megatron-LM pipelines across nodes)",
        )
    if cluster.devices_per_node % tp:
        raise ConfigError(
            "bad_baseline_config",
            f"tp({tp}) must divide the {cluster.devices_per_node} devices of a node (Megatron-LM keeps "
            "tensor parallelism inside a node)",
        )
    optimizer = fields.get("optimizer", "ddp")
    if optimizer not in _OPTIMIZER_NAMES:
        raise ConfigError(
            "bad_baseline_config", f"unknown optimizer {optimizer!r} in {text!r}; use ddp or distributed"
        )
    return BaselineConfig(
        kind, _dp_tp_shape(cluster.world_size // pp, tp), _OPTIMIZER_NAMES[optimizer], MEGATRON_RUNTIME, pp
    )


def _positive(fields: dict[str, str], key: str, text: str) -> int:
    value = fields.get(key, "1")
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(
            "bad_baseline_config", f"{key} must be a positive integer in {text!r}, got {value!r}"
        )
    return int(value)


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
    """The fastest of ``configs`` (by iteration time) whose plan fits ``budget`` bytes per
    device, and every configuration priced; when none fits, the one needing least memory.
    ``price`` builds and evaluates one configuration's plan; an :class:`AutoparError`
    (e.g. a tensor-parallel degree the model's shapes cannot split) leaves that
    configuration out, with its message."""
    priced: list[PricedConfig] = []
    for config in configs:
        try:
            priced.append(PricedConfig(config, price(config)))
        except AutoparError as exc:
            priced.append(PricedConfig(config, error=exc.message))
    built = [p for p in priced if p.plan is not None and math.isfinite(p.plan.iteration_time_s)]
    if not built:
        reasons = "; ".join(f"{p.config.describe()}: {p.error}" for p in priced)
        raise ConfigError(
            "no_baseline_config", f"no configuration of {configs[0].kind} could be priced: {reasons}"
        )
    fitting = [p for p in built if p.fits(budget)]
    if fitting:
        return min(fitting, key=lambda p: p.plan.iteration_time_s if p.plan else math.inf), priced
    return min(built, key=lambda p: p.plan.memory_per_device_bytes if p.plan else math.inf), priced
