"""What each block costs each stage, measured on a planned and evaluated cut: the input of the
cut search (:mod:`.pipeline_cuts`).

A stage's evaluation (:func:`autopar.pipeline.evaluate.evaluate_pipeline`) is split by block
(:func:`autopar.ir.blocks.layer_of` of each op, of each boxed edge's consumer, of each
variable, of each stashed tensor's producer); what no block of the stage owns (the embedding
on the first stage, the final norm, head and loss on the last, the receives, a tied copy) is
the stage's own.  The parts add up to the stage's evaluated figures exactly:

* seconds per micro-batch: ``compute_s x per_micro_batch`` of each op and edge
  (:class:`autopar.cost.evaluation.OpCost`, :class:`~autopar.cost.evaluation.EdgeCost`), the
  rest (receives, a tied parameter's trips) the stage's own;
* seconds once per step: ``x per_step`` likewise, the boundaries' once-per-step work the
  stage's own;
* bytes: each block's model states (:func:`autopar.cost.activation_spans.variable_memory_bytes`,
  as the evaluator counts them) and its stash
  (:func:`autopar.pipeline.evaluate.stash_by_layer`); the stage's own memory is its
  one-micro-batch peak and copies less those and less the whole stash, so that
  ``memory + states + m x stash`` is :func:`autopar.pipeline.evaluate.stage_memory_bytes`.

A block another stage would hold costs there what the blocks of its kind (its scope without
the number: ``layers``, ``decoder.layers``) cost in that stage's plan, on average (the stage's
layout, recomputation and memory pressure); a kind the stage holds none of, what the block
cost where it was planned.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from autopar.cost.activation_spans import variable_memory_bytes
from autopar.cost.memory import graph_state_bytes
from autopar.ir.blocks import layer_of
from autopar.ir.plan import Plan
from autopar.pipeline.evaluate import PipelineEvaluation, StageCost, stash_by_layer
from autopar.pipeline.split import StageSlice
from autopar.runtimes.registry import runtime_profile
from autopar_solver.planner.pipeline_cuts import StageCosts

__all__ = ["block_kind", "stage_costs"]

_Parts = tuple[float, float, float, float]
"""(seconds per micro-batch, seconds once per step, state bytes, stash bytes) of one block."""


def block_kind(block: str) -> str:
    """A block's scope without its number: ``decoder.layers.3`` -> ``decoder.layers``."""
    return block.rsplit(".", 1)[0]


def _states_by_layer(sl: StageSlice, plan: Plan) -> dict[str, float]:
    """Bytes per device of the model states of the stage's own variables, by layer."""
    runtime = runtime_profile(plan.runtime)
    graph = sl.graph
    out: dict[str, float] = defaultdict(float)
    for v in graph.variables:
        if v.op in sl.tied_copies:
            continue
        spec = graph.tensors[v.tensor]
        sbp = plan.output_sbp(*graph.producer[v.tensor])
        states = graph_state_bytes(graph, v)
        parts = variable_memory_bytes(
            spec.shape,
            sbp,
            plan.mesh.shape,
            plan.zero_stage,
            states,
            runtime.zero_sharding.value,
            plan.training,
            runtime,
        )
        out[layer_of(v.op)] += sum(parts)
    return out


def _measured(sl: StageSlice, plan: Plan, cost: StageCost) -> tuple[dict[str, _Parts], StageCosts]:
    """Each block's parts in this stage, and the stage's own parts (its :class:`StageCosts`
    without blocks)."""
    ev = cost.evaluation
    micro: dict[str, float] = defaultdict(float)
    once: dict[str, float] = defaultdict(float)
    for op in ev.ops:
        micro[layer_of(op.name)] += op.compute_s * op.per_micro_batch
        once[layer_of(op.name)] += op.compute_s * op.per_step
    for e in ev.edges:
        micro[layer_of(e.consumer)] += e.time_s * e.per_micro_batch
        once[layer_of(e.consumer)] += e.time_s * e.per_step
    states = _states_by_layer(sl, plan)
    stash = stash_by_layer(sl.graph, plan)
    parts = {b: (micro[b], once[b], states.get(b, 0.0), stash.get(b, 0.0)) for b in sl.blocks}
    total = [math.fsum(p[i] for p in parts.values()) for i in range(4)]
    own = StageCosts(
        (),
        (),
        (),
        (),
        time=cost.micro_batch_time_s - total[0],
        once=cost.once_per_step_s - total[1],
        memory=ev.memory.total + cost.extra_bytes - cost.stash_bytes - total[2],
        stash=cost.stash_bytes - total[3],
        send=cost.receive_time_s,
    )
    return parts, own


def _mean(parts: Sequence[_Parts]) -> _Parts:
    n = len(parts)
    return (
        math.fsum(p[0] for p in parts) / n,
        math.fsum(p[1] for p in parts) / n,
        math.fsum(p[2] for p in parts) / n,
        math.fsum(p[3] for p in parts) / n,
    )


def stage_costs(
    blocks: Sequence[str], slices: Sequence[StageSlice], plans: Sequence[Plan], ev: PipelineEvaluation
) -> list[StageCosts]:
    """Per stage of a planned cut (its ``slices``, stage ``plans`` and valid evaluation ``ev``),
    what every one of the graph's ``blocks`` (in forward order) costs it (module docstring)."""
    measured = [_measured(sl, p, c) for sl, p, c in zip(slices, plans, ev.stages, strict=True)]
    where: dict[str, _Parts] = {b: parts[b] for parts, _ in measured for b in parts}
    out = []
    for parts, own in measured:
        kinds: dict[str, list[_Parts]] = defaultdict(list)
        for b, p in parts.items():
            kinds[block_kind(b)].append(p)
        means = {kind: _mean(ps) for kind, ps in kinds.items()}
        row = [means.get(block_kind(b), where[b]) for b in blocks]
        out.append(
            StageCosts(
                tuple(p[0] for p in row),
                tuple(p[1] for p in row),
                tuple(p[2] for p in row),
                tuple(p[3] for p in row),
                own.time,
                own.once,
                own.memory,
                own.stash,
                own.send,
            )
        )
    return out
