"""The training iteration a job runs: K micro-batches per optimizer step, and recomputation.

A graph is the graph of one micro-batch.  A job's optimizer step runs its
forward and backward ``K`` times (gradient accumulation) and the update once;
with activation checkpointing a recomputed transformer block runs its forward
a second time inside its backward.  This module says how many times each op
and each boxing edge runs per optimizer step, so that the evaluator and the
solver's cost tables price the same iteration (formulas and sources:
docs/runtime-profiles.md, "The iteration"):

``iteration = K x micro-batch + once-per-step`` (seconds), where

* once per step: the ops of :func:`once_per_step_ops` (the update, gradient
  clipping, the casts and sums of accumulated gradients) and the edges into
  them; the data-parallel gradient reduction and the ZeRO parameter gather run
  once per step or once per micro-batch as the runtime places them
  (:data:`ACCUMULATION`);
* per micro-batch: everything else, a recomputed block's forward ops twice, and the
  boxing into one of them twice when its producer is recomputed too
  (:func:`boxed_again_in_recompute`: OneFlow's recompute copy reads a tensor from
  outside the recomputed ops through the forward's boxing).

Run counts are ``runs = K x per_micro_batch + per_step``; with ``K = 1`` and no
checkpointing every count is 1, the iteration is today's step.
"""

from __future__ import annotations

from dataclasses import dataclass

from autopar.ir.blocks import layer_of, op_groups, split_unit
from autopar.ir.graph import Graph, Role
from autopar.ir.optimizer import weight_gradient_path
from autopar.ir.training import TrainingConfig
from autopar.runtimes.profile import Lowering, RuntimeProfile

__all__ = [
    "ACCUMULATION",
    "BASELINE_CHECKPOINTING",
    "NOT_RECOMPUTED_TYPES",
    "Accumulation",
    "RunCounts",
    "baseline_training",
    "boxed_again_in_recompute",
    "candidate_blocks",
    "checkpoint_blocks",
    "checkpoint_units",
    "copied_ops",
    "once_per_step_ops",
    "run_counts",
    "unit_members",
]


@dataclass(frozen=True)
class Accumulation:
    """Where a runtime puts the gradient reduction and the ZeRO gather under accumulation.

    ``reduce_per_micro_batch_from``: the least ZeRO stage whose data-parallel gradient
    reduction runs every micro-batch (None: always once per step, after accumulation);
    ``gather_per_micro_batch_from``: the least ZeRO stage whose parameter gather runs
    every micro-batch; ``full_size_buffer``: accumulation keeps the full-size gradient in
    its pre-reduction layout across micro-batches (a buffer beyond the ZeRO stage's
    sharded gradient)."""

    reduce_per_micro_batch_from: int | None
    gather_per_micro_batch_from: int | None
    full_size_buffer: bool


ACCUMULATION: dict[str, Accumulation] = {
    # OneFlow 0.9: a repeat op follows each variable (GradAccTryInsertRepeatAfterVar, lazy
    # op interpreter); ZeRO's node sequence runs through it, so System-ZeRO-ParallelCast
    # (the gather) is after the repeat: once per micro-batch
    # (optimizer_placement_optimization_pass.cpp: GetDataParallelVariableAndNaiveSuccNode,
    # SetNdSbp4Consumers).  The repeat's gradient is an acc op that accumulates the partial
    # gradient locally; it is reduced into model_diff's layout once per step.  Checked on
    # compiled K = 4 jobs: tests/oneflow/test_iteration.py (docs/runtime-profiles.md).
    "oneflow-0.9": Accumulation(None, 1, True),
    # ideal collectives with DeepSpeed's placement: ZeRO-2/3 reduce-scatter every micro-batch
    # into the partitioned gradient (no full-size buffer); ZeRO-3 gathers before every use;
    # ZeRO-0/1 reduce once per step
    "ideal": Accumulation(2, 3, False),
    # Megatron-LM DDP and distributed optimizer: gradients accumulate in the full-size
    # main_grad buffer (kept across micro-batches), one all-reduce / reduce-scatter at the
    # last micro-batch, the parameters all-gathered once after the update
    # (megatron/core/distributed/param_and_grad_buffer.py, distrib_optimizer.py); Megatron-FSDP
    # (ZeRO-3, optim_grads_params) gathers the parameters for every micro-batch and
    # reduce-scatters each micro-batch's gradient into its shard
    # (megatron/core/distributed/fsdp/, the sharded main_grad)
    "megatron-lm": Accumulation(3, 3, True),
}


BASELINE_CHECKPOINTING = {"inferred": "full"}
"""Checkpointing a reference system runs with when its configuration names none: LiBai's
``activation_checkpoint`` as the seed's job turns it on (``actrue``: every block).
Megatron-LM recomputes nothing by default (``--recompute-granularity`` unset); its
configuration search chooses the least recomputation that fits
(:mod:`autopar.baselines.search`)."""


def baseline_training(kind: str, training: TrainingConfig) -> TrainingConfig:
    """``training`` for baseline ``kind``: the same K, with the checkpointing the real
    system uses (:data:`BASELINE_CHECKPOINTING`) when ``training`` has it ``off`` or ``auto``
    (``auto`` is a solver's choice: a fixed layout runs its system's default)."""
    # a baseline is a fixed layout: ``auto`` (a solver's choice) is the system's own default
    default = BASELINE_CHECKPOINTING.get(kind, "off")
    mode = default if training.checkpointing in ("off", "auto") else training.checkpointing
    return TrainingConfig(training.micro_batches, mode)


def accumulation_of(runtime: RuntimeProfile) -> Accumulation:
    """``runtime``'s :data:`ACCUMULATION` entry; a profile without one follows its lowering's
    (``oneflow-0.9-shard-min-1`` and calibrated OneFlow profiles run OneFlow 0.9's
    accumulation: the repeat / acc ops do not depend on ``shard_min_size``), else ``ideal``'s."""
    found = ACCUMULATION.get(runtime.name)
    if found is not None:
        return found
    return ACCUMULATION["oneflow-0.9" if runtime.lowering is Lowering.ONEFLOW_0_9 else "ideal"]


def once_per_step_ops(graph: Graph) -> frozenset[str]:
    """Ops that run once per optimizer step under gradient accumulation, on the accumulated
    gradients: the optimizer ops, and every backward op whose inputs are all weight
    gradients (:func:`autopar.ir.optimizer.weight_gradient_path`), outputs of such ops, or
    constants (ops without inputs) -- gradient clipping's norms and scaling, the casts and
    sums of a parameter's gradients.  The weight-gradient matmul reads activations: it runs
    once per micro-batch."""
    gradients = weight_gradient_path(graph)
    producer = graph.producer
    once: set[str] = set()
    per_step: set[str] = set()
    for op in graph.topological_order:
        inputs = list(op.inputs.values())
        if op.role is not Role.OPTIMIZER:
            if op.role is not Role.BACKWARD:
                continue
            derived = [t for t in inputs if t in gradients or t in per_step]
            constant = [t for t in inputs if t in producer and not graph.op_by_name[producer[t][0]].inputs]
            if not derived or len(derived) + len(constant) != len(inputs):
                continue
        once.add(op.name)
        per_step.update(op.outputs.values())
    return frozenset(once)


def candidate_blocks(graph: Graph) -> frozenset[str]:
    """Layer scopes (:func:`layer_of`) that can be recomputed: every scope with a numeric
    component (``encoder.layers.3``: a transformer block) that has forward ops OneFlow
    copies (not only :data:`NOT_RECOMPUTED_TYPES`: ``nn.Graph``'s own
    ``_TrainGraph_0_input.0.0_2`` has a numeric component but is no block)."""
    copied = [op for op in graph.ops if op.role is Role.FORWARD and op.type not in NOT_RECOMPUTED_TYPES]
    blocks = {layer_of(op.name) for op in copied}
    return frozenset(b for b in blocks if any(p.isdigit() for p in b.split(".")))


def checkpoint_units(graph: Graph, training: TrainingConfig) -> frozenset[str]:
    """The units (blocks and op groups of blocks, :mod:`autopar.ir.blocks`) whose forward is
    recomputed in backward.

    ``full``: every block of :func:`candidate_blocks`, as Megatron-LM's
    ``--recompute-granularity full --recompute-method uniform`` and LiBai's
    ``activation_checkpoint`` on each block do; ``selective``: the attention core of every
    block (Megatron-LM's ``--recompute-activations``); ``auto``: the units the plan records
    (:attr:`TrainingConfig.recomputed`: the solver's choice, or a baseline's); ``off``: none."""
    if training.checkpointing == "off":
        return frozenset()
    if training.checkpointing == "auto":
        return frozenset(training.recomputed)
    blocks = candidate_blocks(graph)
    if training.checkpointing == "selective":
        groups = op_groups(graph, blocks).values()
        return frozenset(u for u in groups if split_unit(u)[1] == "attention_core")
    return blocks


def checkpoint_blocks(graph: Graph, training: TrainingConfig) -> frozenset[str]:
    """The whole blocks of :func:`checkpoint_units` (OneFlow's checkpointing is per block)."""
    return frozenset(u for u in checkpoint_units(graph, training) if split_unit(u)[1] is None)


def unit_members(graph: Graph, units: frozenset[str]) -> dict[str, str]:
    """Forward op name -> the unit of ``units`` it is recomputed with: its block when the block
    is one of ``units``, else its op group (:func:`autopar.ir.blocks.op_groups`) when that is."""
    blocks = frozenset(split_unit(u)[0] for u in units)
    groups = op_groups(graph, blocks) if any(split_unit(u)[1] for u in units) else {}
    out: dict[str, str] = {}
    for op in graph.ops:
        if op.role is not Role.FORWARD:
            continue
        block = layer_of(op.name)
        if block in units:
            out[op.name] = block
        elif groups.get(op.name) in units:
            out[op.name] = groups[op.name]
    return out


NOT_RECOMPUTED_TYPES = frozenset({"variable", "input", "pipeline_recv", "output"})
"""Op types OneFlow never copies into a recomputed subgraph: not user ops (a variable's
``variable_conf``, an input's ``input_conf``, an output's ``output_conf``), which ``checkpointing_pass.cpp``'s
``CollectAllCheckpointingOpsInForwardPass`` skips (``if (!op_conf.has_user_conf())``).
Under ZeRO a variable is read through ``System-ZeRO-ParallelCast``, a user op that
``optimizer_placement_optimization_pass.cpp`` puts in its reader's scope: inside a recomputed
block it is copied (:func:`copied_ops`)."""


def boxed_again_in_recompute(producer_copied: bool, consumer_copied: bool) -> bool:
    """Does the boxing of an edge ``producer -> consumer`` run again in the recompute?

    Only when both ends are in the recomputed copy (:func:`copied_ops`): OneFlow 0.9's
    ``checkpointing_pass.cpp`` (``CheckpointingPass::Apply``, step 3.2) copies each connected
    subgraph of recomputed forward ops; a copy's input from inside the subgraph is
    re-pointed to the copied producer (a new edge, boxed again), an input from outside keeps
    the forward's blob (``else { source_node_in_fake_subgraph.insert(...) }``: the lbn is
    left as it is), so the copy reads the tensor the forward already boxed.  Two adjacent
    recomputed blocks form one connected subgraph, so the edge between them is boxed again;
    an edge from a kept op or an input into a recomputed block is not.  Checked on compiled
    K = 4 jobs (tests/oneflow/test_iteration.py; docs/runtime-profiles.md)."""
    return producer_copied and consumer_copied


def copied_ops(graph: Graph, units: frozenset[str], zero_stage: int) -> frozenset[str]:
    """The ops of ``units`` (blocks and op groups) in OneFlow's recomputed copy: their forward
    ops less :data:`NOT_RECOMPUTED_TYPES`, and under ZeRO (stage >= 1) the variables of
    recomputed blocks too (the ZeRO cast between a variable and its reader is copied; a
    variable too small to shard has none, so its edges are counted again where OneFlow does
    not: an upper bound)."""
    members = unit_members(graph, units)
    return frozenset(
        op.name
        for op in graph.ops
        if op.name in members
        and (op.type not in NOT_RECOMPUTED_TYPES or (zero_stage >= 1 and op.type == "variable"))
    )


@dataclass(frozen=True)
class RunCounts:
    """How many times per optimizer step each op, edge and gather runs:
    ``K x per_micro_batch + per_step``."""

    micro_batches: int
    once: frozenset[str]
    """Ops run once per step (:func:`once_per_step_ops`)."""
    recomputed: frozenset[str]
    """Forward ops of recomputed blocks in OneFlow's copy (:func:`copied_ops`): their
    compute runs twice per micro-batch (a variable's is 0)."""
    gradient_per_micro_batch: bool
    """The data-parallel gradient reduction runs every micro-batch (else once per step)."""
    gather_per_micro_batch: bool
    """The ZeRO parameter gather runs every micro-batch (else once per step)."""

    def op(self, name: str) -> tuple[int, int]:
        """(per micro-batch, per step) runs of op ``name``'s compute."""
        if name in self.once:
            return 0, 1
        return (2 if name in self.recomputed else 1), 0

    def edge(self, producer: str, consumer: str, gradient: bool) -> tuple[int, int]:
        """(per micro-batch, per step) runs of the boxing ``producer -> consumer``;
        ``gradient``: a data-parallel gradient reduction (:class:`autopar.cost.edges.EdgeKind`
        ``GRADIENT``).  Twice per micro-batch when :func:`boxed_again_in_recompute`."""
        if gradient:
            return (1, 0) if self.gradient_per_micro_batch else (0, 1)
        if consumer in self.once:
            return 0, 1
        again = boxed_again_in_recompute(producer in self.recomputed, consumer in self.recomputed)
        return (2 if again else 1), 0

    def gather(self) -> tuple[int, int]:
        """(per micro-batch, per step) runs of each ZeRO parameter gather."""
        return (1, 0) if self.gather_per_micro_batch else (0, 1)

    def total(self, runs: tuple[int, int]) -> int:
        """Runs per optimizer step: ``K x per_micro_batch + per_step``."""
        return self.micro_batches * runs[0] + runs[1]


def run_counts(graph: Graph, training: TrainingConfig, runtime: RuntimeProfile, zero_stage: int) -> RunCounts:
    """The run counts of ``graph``'s ops and edges under ``training`` on ``runtime``."""
    acc = accumulation_of(runtime)
    recomputed = copied_ops(graph, checkpoint_units(graph, training), zero_stage)
    reduce_from, gather_from = acc.reduce_per_micro_batch_from, acc.gather_per_micro_batch_from
    return RunCounts(
        training.micro_batches,
        once_per_step_ops(graph),
        recomputed,
        reduce_from is not None and zero_stage >= reduce_from,
        gather_from is not None and zero_stage >= gather_from,
    )
