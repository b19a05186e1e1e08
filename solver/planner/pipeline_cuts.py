"""Where to cut the blocks into stages, and under which schedule: a dynamic program over
contiguous block ranges (the inter-operator stage search of Alpa, Zheng et al. 2022 sec. 5.2,
here on the costs the planned stages measured, with the stages' sub-meshes fixed).

Stage ``s`` holding blocks ``i .. j - 1`` (:class:`StageCosts`, measured on a planned cut by
:mod:`.pipeline_block_costs`) costs, per device::

    t_s = time_s + sum_b time_s[b] + (v - 1) send_s        seconds per micro-batch
    u_s = once_s + sum_b once_s[b]                          seconds once per step
    M_s = memory_s + sum_b states_s[b] + m_s (stash_s + sum_b stash_s[b])     bytes

with ``m_s`` its micro-batches in flight (:func:`autopar.pipeline.schedule.interleaved_in_flight`:
``min(S - s, K)`` under 1F1B) and ``v`` the model chunks per device (1: 1F1B).  The iteration
(:func:`autopar.pipeline.schedule.interleaved_iteration`) is::

    v = 1:  F = sum_s t_s + (K - 1) max_s t_s + max_s u_s          (1F1B)
    v > 1:  F = (K + (S - 1) / v) max_s t_s + max_s u_s            (interleaved 1F1B)

both ``a sum_s t_s + b max_s t_s + max_s u_s``.  :func:`best_cut` minimises it over every cut
(each stage at least ``v`` blocks, a multiple of ``v``) with every ``M_s`` within the budget:
for a cap ``T`` on ``max_s t_s`` the least ``a sum_s t_s + max_s u_s`` of the cuts under it is a
dynamic program over (stage, blocks placed) keeping the Pareto front of (``a sum t``,
``max u``); the best cut's slowest stage is one of the ranges' times, so the caps are those,
from the least that admits a cut upward, until ``b T`` plus what every cut costs besides
reaches the best found.  Pure functions of numbers; units seconds and bytes per device.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

from autopar.pipeline.schedule import interleaved_in_flight, interleaved_iteration, interleaving_refusal
from autopar.runtimes.registry import runtime_profile

__all__ = [
    "VIRTUAL_STAGES",
    "CutPrediction",
    "StageCosts",
    "best_cut",
    "cut_refusal",
    "predict_cut",
    "schedule_weights",
    "virtual_stage_choices",
]

VIRTUAL_STAGES = (2, 4, 8)
"""Model chunks per device the search prices besides 1F1B, where the runtime interleaves (as
Megatron-LM's search: :data:`autopar.baselines.megatron.configs.VIRTUAL_STAGES`)."""


def virtual_stage_choices(runtime: str, stages: int, k: int, blocks: int) -> list[int]:
    """The chunks per device ``v`` some cut of ``blocks`` into ``stages`` may run under: 1, and
    where ``runtime`` runs interleaved 1F1B (:attr:`autopar.runtimes.profile.RuntimeProfile.interleaved_1f1b`:
    Megatron-LM, not OneFlow 0.9) each of :data:`VIRTUAL_STAGES` that Megatron-LM accepts
    for ``K = k`` (:func:`autopar.pipeline.schedule.interleaving_refusal`: micro-batches in
    groups of ``S``) with ``v`` dividing ``blocks`` and at least ``v`` blocks a stage."""
    out = [1]
    if stages < 2 or not runtime_profile(runtime).interleaved_1f1b:
        return out
    for v in VIRTUAL_STAGES:
        if blocks % v == 0 and blocks >= stages * v and interleaving_refusal(stages, v, k, v) is None:
            out.append(v)
    return out


def cut_refusal(counts: Sequence[int], k: int, v: int) -> str | None:
    """Why Megatron-LM refuses ``v`` chunks per device for block ``counts`` (every stage's
    blocks must split into ``v`` whole chunks: :func:`autopar.pipeline.schedule.interleaving_refusal`),
    or None."""
    return next((r for c in sorted(set(counts)) if (r := interleaving_refusal(len(counts), c, k, v))), None)


@dataclass(frozen=True)
class StageCosts:
    """What stage ``s`` costs for the blocks it holds: per block of the whole graph (in forward
    order) what that block adds when this stage holds it, and what the stage costs besides."""

    block_time: tuple[float, ...]
    """Seconds per micro-batch each block adds (forward, recompute, backward, its boxing)."""
    block_once: tuple[float, ...]
    """Seconds once per step each block adds (its gradients' reduction, its update)."""
    block_states: tuple[float, ...]
    """Bytes per device of each block's model states (parameters, gradients, optimizer)."""
    block_stash: tuple[float, ...]
    """Bytes per device each block keeps per micro-batch in flight (its stash)."""
    time: float = 0.0
    """Seconds per micro-batch besides the blocks: the embedding or head, the receives."""
    once: float = 0.0
    """Seconds once per step besides the blocks."""
    memory: float = 0.0
    """Bytes besides the blocks' states and the stash of the micro-batches in flight: other
    states, the transient peak of one micro-batch, a tied copy's states."""
    stash: float = 0.0
    """Bytes per micro-batch in flight besides the blocks'."""
    send: float = 0.0
    """Seconds per micro-batch of one chunk boundary's receives (interleaving adds ``v - 1``)."""

    def terms(self, first: int, end: int, in_flight: float, v: int) -> tuple[float, float, float]:
        """``(t_s, u_s, M_s)`` of this stage holding blocks ``first .. end - 1`` (module docstring)."""
        t = self.time + math.fsum(self.block_time[first:end]) + (v - 1) * self.send
        u = self.once + math.fsum(self.block_once[first:end])
        stash = self.stash + math.fsum(self.block_stash[first:end])
        return t, u, self.memory + math.fsum(self.block_states[first:end]) + in_flight * stash


@dataclass(frozen=True)
class CutPrediction:
    """A cut and schedule as the costs predict it."""

    counts: tuple[int, ...]
    v: int
    iteration_s: float
    micro_batch_s: tuple[float, ...]
    """Each stage's ``t_s`` (with interleaving's extra sends)."""
    memory_bytes: tuple[float, ...]


def schedule_weights(stages: int, k: int, v: int) -> tuple[float, float]:
    """``(a, b)`` of the iteration ``a sum_s t_s + b max_s t_s + max_s u_s``: ``(1, K - 1)``
    under 1F1B, ``(0, K + (S - 1) / v)`` under interleaved 1F1B (module docstring)."""
    return (1.0, k - 1.0) if v == 1 else (0.0, k + (stages - 1) / v)


def predict_cut(costs: Sequence[StageCosts], counts: Sequence[int], k: int, v: int = 1) -> CutPrediction:
    """The iteration and memory ``costs`` predict for block ``counts`` under ``v`` chunks per
    device (:func:`autopar.pipeline.schedule.interleaved_iteration`, with each stage's
    ``t_s`` less the sends the schedule adds itself)."""
    n = len(costs)
    times, onces, memory = [], [], []
    first = 0
    for s, (c, st) in enumerate(zip(counts, costs, strict=True)):
        t, u, m = st.terms(first, first + c, interleaved_in_flight(s, n, k, v), 1)
        times.append(t)
        onces.append(u)
        memory.append(m)
        first += c
    iteration = interleaved_iteration(times, onces, [st.send for st in costs], k, v)
    sent = tuple(t + (v - 1) * st.send for t, st in zip(times, costs))
    return CutPrediction(tuple(counts), v, iteration, sent, tuple(memory))


@dataclass(frozen=True)
class _Range:
    first: int
    end: int
    t: float
    u: float


def _ranges(costs: Sequence[StageCosts], k: int, v: int, budget: float | None) -> list[list[_Range]]:
    """Per stage, every range of blocks it may hold (at least ``v`` blocks, a multiple of ``v``,
    leaving the other stages theirs) that fits ``budget``, by ascending ``t_s``."""
    n, blocks = len(costs), len(costs[0].block_time)
    out = []
    for s, st in enumerate(costs):
        m = interleaved_in_flight(s, n, k, v)
        rows = []
        for first in range(s * v, blocks - (n - s) * v + 1, v):
            ends = [blocks] if s == n - 1 else range(first + v, blocks - (n - s - 1) * v + 1, v)
            for end in ends:
                t, u, mem = st.terms(first, end, m, v)
                if budget is None or mem <= budget:
                    rows.append(_Range(first, end, t, u))
        out.append(sorted(rows, key=lambda r: r.t))
    return out


_Entry = tuple[float, float, int, object]
"""A partial cut: (``a sum t``, ``max u``, the first block of its last stage, its parent)."""


def _front(entries: list[_Entry]) -> list[_Entry]:
    """The entries no other beats on both ``a sum t`` and ``max u``."""
    out: list[_Entry] = []
    for e in sorted(entries, key=lambda e: (e[0], e[1])):
        if not out or e[1] < out[-1][1]:
            out.append(e)
    return out


def _under_cap(
    ranges: list[list[_Range]], blocks: int, cap: float, a: float
) -> tuple[float, list[int]] | None:
    """The least ``a sum_s t_s + max_s u_s`` of the cuts whose every stage has ``t_s <= cap``,
    with its block counts; None when no cut has."""
    fronts: dict[int, list[_Entry]] = {0: [(0.0, 0.0, -1, None)]}
    for rows in ranges:
        grown: dict[int, list[_Entry]] = {}
        for r in rows[: bisect.bisect_right(rows, cap, key=lambda x: x.t)]:
            for e in fronts.get(r.first, ()):
                grown.setdefault(r.end, []).append((e[0] + a * r.t, max(e[1], r.u), r.first, e))
        fronts = {end: _front(es) for end, es in grown.items()}
        if not fronts:
            return None
    if blocks not in fronts:
        return None
    best = min(fronts[blocks], key=lambda e: e[0] + e[1])
    counts, end, e = [], blocks, best
    while e[3] is not None:
        counts.append(end - e[2])
        end = e[2]
        e = e[3]  # type: ignore[assignment]
    return best[0] + best[1], counts[::-1]


def _least_sum(ranges: list[list[_Range]]) -> float:
    """The least ``sum_s t_s`` of every cut (no cap, no ``u``)."""
    least = {0: 0.0}
    for rows in ranges:
        grown: dict[int, float] = {}
        for r in rows:
            if r.first in least:
                grown[r.end] = min(grown.get(r.end, math.inf), least[r.first] + r.t)
        least = grown
    return min(least.values(), default=0.0)


def best_cut(
    costs: Sequence[StageCosts], k: int, v: int = 1, budget: float | None = None
) -> CutPrediction | None:
    """The cut of least predicted iteration under ``v`` chunks per device with every stage
    within ``budget`` (module docstring), or None when no cut fits."""
    n, blocks = len(costs), len(costs[0].block_time)
    if n * v > blocks or blocks % v:
        return None
    ranges = _ranges(costs, k, v, budget)
    if any(not rows for rows in ranges):
        return None
    a, b = schedule_weights(n, k, v)
    caps = sorted({r.t for rows in ranges for r in rows})
    lo, hi = 0, len(caps)  # the least cap that admits a cut (feasibility grows with the cap)
    while lo < hi:
        mid = (lo + hi) // 2
        if _under_cap(ranges, blocks, caps[mid], a) is None:
            lo = mid + 1
        else:
            hi = mid
    # what every cut costs besides b T: at least the least a sum t and the least max u
    floor = a * _least_sum(ranges) + max(min(r.u for r in rows) for rows in ranges)
    found: tuple[float, list[int]] | None = None
    for cap in caps[lo:]:
        if found is not None and b * cap + floor >= found[0]:
            break
        got = _under_cap(ranges, blocks, cap, a)
        if got is not None and (found is None or b * cap + got[0] < found[0]):
            found = (b * cap + got[0], got[1])
    if found is None:
        return None
    return predict_cut(costs, found[1], k, v)
