"""What a lowering produces: a boxing as a sequence of 1-D collectives.

:class:`BoxingStep` (one collective on one axis), :class:`BoxingPlan` (the steps from one N-D
SBP to another and their seconds; ``inf`` when impossible), :func:`one_axis_collective` (the
collective that changes one axis's value) and :func:`step_latency` (a step's alpha terms).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autopar.hardware.collectives import Collective
from autopar.hardware.mesh import Mesh
from autopar.ir.sbp import Broadcast, NdSbp, Partial, SbpValue, Split

__all__ = ["INF", "BoxingPlan", "BoxingStep", "step_latency"]

INF = math.inf


def one_axis_collective(src: SbpValue, dst: SbpValue) -> Collective | None:
    """The collective that turns ``src`` into ``dst`` on one axis; None if impossible."""
    if src == dst:
        return Collective.LOCAL
    if isinstance(src, Split):
        if isinstance(dst, Broadcast):
            return Collective.ALL_GATHER
        if isinstance(dst, Split):
            return Collective.ALL_TO_ALL
        return Collective.LOCAL  # S -> P: keep own shard, zero-fill the rest
    if isinstance(src, Partial):
        if isinstance(dst, Broadcast):
            return Collective.ALL_REDUCE
        return Collective.REDUCE_SCATTER  # P -> S
    # src is B
    return Collective.LOCAL  # B -> S slice, B -> P zero-fill on all but one device


# ------------------------------------------------------------- N-D plans


@dataclass(frozen=True, slots=True)
class BoxingStep:
    """One 1-D collective on ``axis`` moving ``bytes_per_device`` bytes."""

    axis: int
    collective: Collective
    src: NdSbp
    dst: NdSbp
    bytes_per_device: float
    time_s: float

    def __str__(self) -> str:
        return f"{self.collective.value} on axis {self.axis}: {self.src} -> {self.dst}"


@dataclass(frozen=True, slots=True)
class BoxingPlan:
    """The cheapest sequence of steps from ``src`` to ``dst`` (empty when equal)."""

    src: NdSbp
    dst: NdSbp
    steps: tuple[BoxingStep, ...]
    time_s: float

    @property
    def feasible(self) -> bool:
        return math.isfinite(self.time_s)


def step_latency(step: BoxingStep, mesh: Mesh) -> float:
    """The latency part of a boxing step, seconds: its time less its bytes over the axis's
    bandwidth for that collective (``alpha``-terms of the alpha-beta model)."""
    if step.collective is Collective.LOCAL or step.bytes_per_device <= 0:
        return max(0.0, step.time_s)
    _, beta = mesh.axes[step.axis].alpha_beta(step.collective.value)
    return max(0.0, step.time_s - step.bytes_per_device / beta)
