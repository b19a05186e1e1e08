"""The search of a baseline's configuration space: the fastest configuration that fits.

For each layout its users would run (Megatron-LM: :func:`~autopar.baselines.megatron.configs.
megatron_structures`; LiBai and data-parallel: :func:`~autopar.baselines.configs.candidate_configs`)
the least recomputation that fits the budget, since recomputing more only adds time::

    every layout, recomputing nothing               priced first: each one's time is a lower
          │                                         bound of its recomputing variants
          v
    a layout over the budget, faster than the best fitting one so far:
          selective:layernorm, selective (the attention core), selective:core_attn+layernorm
                     (Megatron-LM's --recompute-modules, in every layer)
          full       (every layer)
          full:N     (Megatron-LM's block method: the least N that fits, from the memory of
                      none and full, then checked)
          v
    pick_best: the fastest that fits, else the one needing least memory

Every configuration priced is kept (``tried``), with its time and memory or why it failed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path

from autopar.baselines.configs import BaselineConfig, PricedConfig, candidate_configs, pick_best
from autopar.baselines.megatron.configs import (
    MegatronChoice,
    megatron_structures,
    parse_megatron_config,
    selective_groups,
)
from autopar.baselines.pricing import price_baseline_config
from autopar.baselines.walks import WalkMemo
from autopar.errors import AutoparError, ConfigError
from autopar.hardware.cluster import Cluster
from autopar.ir.graph import Graph
from autopar.ir.plan import Plan
from autopar.ir.structure import batch_size
from autopar.ir.training import TrainingConfig
from autopar.pipeline.plan import PipelinePlan
from autopar.pipeline.split import ordered_blocks

__all__ = ["baseline_structures", "configured_plan", "search_baseline"]

LADDERS = {
    "megatron": ("none", "selective:layernorm", "selective", "selective:core_attn+layernorm", "full"),
    "inferred": ("none", "full"),
}
"""Recomputation each system's users choose from, least first (``full:N`` for Megatron-LM
between ``none`` and ``full``, :func:`_block_count`)."""


def baseline_structures(
    kind: str,
    graph: Graph,
    cluster: Cluster,
    training: TrainingConfig,
    *,
    zero_stage: int,
    runtime: str,
    named: str | None = None,
) -> list[BaselineConfig]:
    """Every layout of ``kind`` to price on ``cluster`` (recomputation unset unless named).
    ``named``: Megatron-LM's ``--megatron-config`` (any subset of its keys; the rest searched)."""
    if kind == "megatron":
        choice = parse_megatron_config(named, cluster) if named else MegatronChoice()
        blocks = len(ordered_blocks(graph))
        found = megatron_structures(cluster, batch_size(graph), blocks, training.micro_batches, choice)
        if not found:
            raise ConfigError(
                "no_baseline_config",
                f"no Megatron-LM configuration{' matching ' + repr(named) if named else ''} runs on "
                f"{cluster}: tp must divide the {cluster.devices_per_node} devices of a node, pp the "
                f"{cluster.nodes} nodes and the {blocks} layers, dp the batch of {batch_size(graph)}",
            )
        return found
    if named:
        raise ConfigError(
            "bad_baseline_config", f"a configuration can be named for megatron only, not {kind!r}"
        )
    return candidate_configs(kind, cluster, zero_stage, runtime)


def search_baseline(
    kind: str,
    graph: Graph,
    cluster: Cluster,
    training: TrainingConfig,
    budget: float | None,
    *,
    zero_stage: int,
    runtime: str,
    named: str | None = None,
    cache: Path | None = None,
    report: Callable[[str], None] | None = None,
) -> tuple[PricedConfig, list[PricedConfig]]:
    """The fastest configuration of ``kind`` that fits ``budget`` bytes per device (by the
    iteration as its runtime runs it), and every configuration priced (module docstring)."""
    walks = WalkMemo()
    priced: list[PricedConfig] = []

    def price(config: BaselineConfig) -> PricedConfig:
        if report is not None:
            report(f"{kind}: {config.describe()}")
        try:
            plan = price_baseline_config(graph, cluster, config, training, cache, walks)
            found = PricedConfig(config, plan)
        except AutoparError as exc:
            found = PricedConfig(config, error=exc.message)
        priced.append(found)
        return found

    structures = baseline_structures(
        kind, graph, cluster, training, zero_stage=zero_stage, runtime=runtime, named=named
    )
    ladder = LADDERS.get(kind)
    if ladder is None:
        for s in structures:
            price(s)
        return pick_best(priced, budget, kind)
    first = [price(_with(s, s.recompute or ladder[0])) for s in structures]
    # fastest first, so that a fitting configuration found early proves the slower ones out
    order = sorted(zip(structures, first), key=lambda pair: _time(pair[1]))
    for s, least in order:
        if s.recompute or least.plan is None or least.fits(budget):
            continue
        if least.plan.achieved_iteration_time_s >= _best_time(priced, budget):
            continue  # recomputing more only adds time: proved no faster than the best
        _climb(s, least, ladder, budget, price, len(ordered_blocks(graph)))
    return pick_best(priced, budget, kind)


def _time(found: PricedConfig) -> float:
    return math.inf if found.plan is None else found.plan.achieved_iteration_time_s


def _with(structure: BaselineConfig, recompute: str) -> BaselineConfig:
    return dataclasses.replace(structure, recompute=recompute)


def _best_time(priced: list[PricedConfig], budget: float | None) -> float:
    times = [p.plan.achieved_iteration_time_s for p in priced if p.plan is not None and p.fits(budget)]
    return min(times, default=math.inf)


def _climb(
    s: BaselineConfig,
    least: PricedConfig,
    ladder: tuple[str, ...],
    budget: float | None,
    price: Callable[[BaselineConfig], PricedConfig],
    blocks: int,
) -> None:
    """Price ``s`` at each recomputation of ``ladder`` above its least, and for Megatron-LM at
    the fewest recomputed layers per chunk that fit (the graph has ``blocks`` layers)."""
    tried: dict[str, PricedConfig] = {}
    for level in ladder[1:]:
        if any(found.fits(budget) and _within(done, level) for done, found in tried.items()):
            continue  # recomputes all that a fitting level does and more: no faster
        tried[level] = price(_with(s, level))
    full = tried.get("full")
    if s.kind != "megatron" or full is None or full.plan is None or least.plan is None or budget is None:
        return
    per_chunk = max(1, blocks // (s.pipeline * s.virtual_stages))
    n = _block_count(least.plan.memory_per_device_bytes, full.plan.memory_per_device_bytes, budget, per_chunk)
    if n is None:
        return
    found = price(_with(s, f"full:{n}"))
    if not found.fits(budget) and n + 1 < per_chunk:
        price(_with(s, f"full:{n + 1}"))
    elif found.fits(budget) and n > 1:
        price(_with(s, f"full:{n - 1}"))


def _within(smaller: str, larger: str) -> bool:
    """Does recomputation ``larger`` recompute every op ``smaller`` does (so it takes at least
    as long on one layout: each recomputed op adds its forward once more)?  ``full``
    recomputes everything; ``selective:M+M`` its modules' groups (``selective``:
    ``core_attn``)."""
    if larger == "full":
        return True
    if smaller == "full" or not (smaller.startswith("selective") and larger.startswith("selective")):
        return False
    return set(selective_groups(smaller)) <= set(selective_groups(larger))


def _block_count(none_bytes: float, full_bytes: float, budget: float, per_chunk: int) -> int | None:
    """The fewest layers per chunk whose recomputation brings the memory under ``budget``, on
    the line from ``none_bytes`` (no layer) to ``full_bytes`` (all ``per_chunk``): each layer
    recomputed frees the same activations; None when there is no layer count between."""
    if per_chunk < 2 or none_bytes <= full_bytes or full_bytes > budget:
        return None
    n = math.ceil(per_chunk * (none_bytes - budget) / (none_bytes - full_bytes))
    return min(max(n, 1), per_chunk - 1)


def configured_plan(
    chosen: PricedConfig, priced: list[PricedConfig], budget: float | None, named: bool
) -> Plan | PipelinePlan:
    """``chosen``'s plan carrying its configuration, whether the user named it, whether it fits
    ``budget`` and every configuration priced, in ``diagnostics["baseline_configuration"]``
    (what ``--compare``, ``autopar baseline`` and the report print)."""
    assert chosen.plan is not None
    chosen.plan.diagnostics["baseline_configuration"] = {
        **chosen.config.to_dict(),
        "named_by_user": named,
        "fits_budget": chosen.fits(budget),
        "tried": [p.to_dict() for p in priced],
    }
    return chosen.plan
