"""The 1F1B schedule (PipeDream-flush): the iteration of ``p`` stages and ``m`` micro-batches,
warm-up, steady state and cool-down as ``(m + p - 1)`` slots of the slowest stage
(:func:`one_f_one_b_iteration`), and the micro-batches stage ``s`` keeps in flight
(:func:`in_flight_micro_batches`); and the interleaved 1F1B schedule of Megatron-LM, each
device holding ``v`` model chunks (:func:`interleaved_iteration`,
:func:`interleaved_in_flight`), which divides the bubble by ``v`` for ``v`` times the sends.
"""

from __future__ import annotations

from collections.abc import Sequence

from autopar.errors import ConfigError

__all__ = [
    "in_flight_micro_batches",
    "interleaved_in_flight",
    "interleaved_iteration",
    "interleaving_refusal",
    "one_f_one_b_iteration",
]


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


def interleaved_iteration(
    stage_micro_batch_s: Sequence[float],
    stage_once_s: Sequence[float],
    stage_send_s: Sequence[float],
    k: int,
    v: int,
) -> float:
    """Seconds of one optimizer step under Megatron-LM's interleaved 1F1B: each of the ``p``
    devices holds ``v`` chunks of ``L / (p v)`` layers, device ``d`` the chunks ``d, d + p, ...``:

    ``T = k * t_max + (p - 1) * t_max / v + max_s u_s``,  ``t_s' = t_s + (v - 1) r_s``

    where ``t_s`` is device ``s``'s time per micro-batch with one chunk (forward, recompute,
    backward and its sends: :func:`one_f_one_b_iteration`), ``r_s`` its point-to-point time
    per micro-batch for one chunk boundary (each of its ``v`` chunks receives an activation
    and sends a gradient: ``v - 1`` boundaries more than one chunk), ``t_max = max_s t_s'``
    and ``u_s`` the once-per-step work.  The bubble, ``(p - 1) t / v``, is the 1F1B bubble
    over ``v`` (Narayanan et al. 2021 sec. 2.2.2: bubble time fraction ``(p - 1) / (v m)``).
    ``v = 1``: :func:`one_f_one_b_iteration` of equal stages."""
    if v < 1:
        raise ConfigError("bad_pipeline", f"virtual stages per device must be >= 1, got {v}")
    if v == 1:
        return one_f_one_b_iteration(stage_micro_batch_s, stage_once_s, k)
    p = len(stage_micro_batch_s)
    busy = max(t + (v - 1) * r for t, r in zip(stage_micro_batch_s, stage_send_s, strict=True))
    return k * busy + (p - 1) * busy / v + max(stage_once_s, default=0.0)


def interleaved_in_flight(stage: int, stages: int, k: int, v: int) -> float:
    """Micro-batches (in units of a device's whole ``L / p`` layers) whose activations device
    ``stage`` holds at once under interleaved 1F1B with ``v`` chunks per device: its warm-up
    of ``2 (p - s - 1) + (v - 1) p`` chunk forwards plus the one in flight, over ``v`` chunks
    per micro-batch, at most all ``k`` (Megatron-Core
    megatron/core/pipeline_parallel/schedules.py, ``get_pp_rank_microbatches``:
    ``num_warmup_microbatches = (p - rank - 1) * 2 + (num_model_chunks - 1) *
    microbatch_group_size_per_vp_stage``, the group size defaulting to ``p``).  For the first
    device ``1 + (p - 1) / (p v)`` times a whole model's layers (Korthikanti et al. 2022
    sec. 4.2.3).  ``v = 1``: :func:`in_flight_micro_batches`."""
    if v == 1:
        return float(in_flight_micro_batches(stage, stages, k))
    warmup = 2 * (stages - stage - 1) + (v - 1) * stages
    return min(warmup + 1, k * v) / v


def interleaving_refusal(stages: int, blocks_per_stage: int, k: int, v: int) -> str | None:
    """Why Megatron-LM refuses ``v`` virtual stages per device, or None: it needs a pipeline
    (``p >= 2``, with ``--overlap-p2p-communication``; megatron/training/arguments.py), whole
    layers per chunk (``L / p`` divisible by ``v``), and micro-batches in groups of ``p``
    (``k >= p`` and ``k mod p`` 0 or at least ``p``; schedules.py raises otherwise)."""
    if v == 1:
        return None
    if stages < 2:
        return f"interleaving (vpp={v}) needs pipeline stages (pp >= 2), not pp={stages}"
    if blocks_per_stage % v:
        return f"vpp={v} does not divide the {blocks_per_stage} layers of a pipeline stage"
    if k < stages or 0 < k % stages < stages:
        return f"interleaving needs micro-batches in groups of pp={stages}, not K={k}"
    return None
