"""The 1F1B schedule (PipeDream-flush): the iteration of ``p`` stages and ``m`` micro-batches,
warm-up, steady state and cool-down as ``(m + p - 1)`` slots of the slowest stage
(:func:`one_f_one_b_iteration`), and the micro-batches stage ``s`` keeps in flight
(:func:`in_flight_micro_batches`).
"""

from __future__ import annotations

from collections.abc import Sequence

from autopar.errors import ConfigError

__all__ = ["in_flight_micro_batches", "one_f_one_b_iteration"]


def one_f_one_b_iteration(
    stage_micro_batch_s: Sequence[float], stage_once_s: Sequence[float], k: int
) -> float:
    """Seconds of one optimizer step of ``S`` stages under 1F1B with ``k`` micro-batches:

    ``T = sum_s t_s + (k - 1) * max_s t_s + max_s u_s``

    where ``t_s`` is stage ``s``'s time per micro-batch (forward, recompute, backward and its
    point-to-point sends) and ``u_s`` its once-per-step work (reductions, update), which the
    stages run at once after the flush.  The first micro-batch passes every stage forward and
    back (the fill and drain, ``sum_s t_s``); the other ``k - 1`` follow at the pace of the
    slowest stage.  With equal stages it is ``(k + S - 1) * t + u``, Narayanan et al. 2021
    sec. 2.2.1 (bubble fraction ``(S - 1) / k``); with one stage, ``k * t + u``, the
    iteration of :mod:`autopar.cost.iteration`.
    """
    if not stage_micro_batch_s or k < 1:
        raise ConfigError("bad_pipeline", "a pipeline needs at least one stage and one micro-batch")
    return sum(stage_micro_batch_s) + (k - 1) * max(stage_micro_batch_s) + max(stage_once_s, default=0.0)


def in_flight_micro_batches(stage: int, stages: int, k: int) -> int:
    """Micro-batches whose activations stage ``stage`` (0-based) holds at once under 1F1B:
    ``min(S - s, k)``: the first stage runs ``S`` forwards before its first backward, the last
    one (Narayanan et al. 2021 sec. 2.2.1; PipeDream-flush)."""
    return min(stages - stage, k)
