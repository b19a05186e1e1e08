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

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from autopar.cost_tables import CostTables
from autopar.costs import EdgeKind, edge_kind, optimizer_gather_time, rule_context
from autopar.errors import ConfigError
from autopar.graph import Graph, Role
from autopar.memory import StateBytes, activation_intervals, variable_state_bytes
from autopar.optimizer import model_port_index, weight_gradient_path
from autopar.runtime import Lowering, RuntimeProfile
from autopar.sbp import NdSbp

__all__ = [
    "ACCUMULATION",
    "BASELINE_CHECKPOINTING",
    "CHECKPOINTING_MODES",
    "NOT_RECOMPUTED_TYPES",
    "TOP_LEVEL",
    "Accumulation",
    "RunCounts",
    "TrainingConfig",
    "accumulation_buffer_bytes",
    "activation_spans",
    "baseline_training",
    "block_readers",
    "boxed_again_in_recompute",
    "candidate_blocks",
    "checkpoint_blocks",
    "copied_ops",
    "layer_of",
    "micro_batches_text",
    "once_per_step_ops",
    "recompute_table_costs",
    "run_counts",
    "table_costs",
    "tensor_spans",
    "training_of",
    "variable_memory_bytes",
    "weighted_costs",
    "with_training",
]

CHECKPOINTING_MODES = ("off", "full", "auto")
"""``off``: keep every activation; ``full``: recompute every transformer block (Megatron's
and LiBai's ``actrue``); ``auto``: the solver chooses per block, jointly with the layout
(the plan records the blocks it recomputes: :attr:`TrainingConfig.recomputed`)."""

TOP_LEVEL = "(top level)"
"""Layer of ops whose name has no dot (graph inputs such as ``input_ids``)."""


@dataclass(frozen=True)
class TrainingConfig:
    """The job's training configuration: micro-batches per optimizer step and checkpointing.

    Raises :class:`ConfigError` (a ``ValueError``; codes ``bad_micro_batches``,
    ``bad_checkpointing``) naming the value."""

    micro_batches: int = 1
    checkpointing: str = "off"
    recomputed: tuple[str, ...] = ()
    """Under ``auto``: the layer scopes (:func:`layer_of`) the plan recomputes, sorted (the
    solver's choice; empty in a request).  Empty under ``off`` and ``full``."""

    def __post_init__(self) -> None:
        k = self.micro_batches
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(
                "bad_micro_batches",
                f"micro-batches per optimizer step must be an integer >= 1, got {k!r}",
            )
        if self.checkpointing not in CHECKPOINTING_MODES:
            raise ConfigError(
                "bad_checkpointing",
                f"checkpointing must be one of {', '.join(CHECKPOINTING_MODES)}, got {self.checkpointing!r}",
            )
        blocks = self.recomputed
        if isinstance(blocks, str) or not all(isinstance(b, str) for b in blocks):
            raise ConfigError("bad_checkpointing", f"recomputed blocks must be names, got {blocks!r}")
        if blocks and self.checkpointing != "auto":
            raise ConfigError(
                "bad_checkpointing",
                f"recomputed blocks are chosen under checkpointing 'auto' only, not {self.checkpointing!r}",
            )
        object.__setattr__(self, "recomputed", tuple(sorted(set(blocks))))

    @property
    def is_default(self) -> bool:
        """One micro-batch per step, nothing recomputed: the step priced before iterations."""
        return self.micro_batches == 1 and self.checkpointing == "off"

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"micro_batches": self.micro_batches, "checkpointing": self.checkpointing}
        if self.checkpointing == "auto":
            out["recomputed_blocks"] = list(self.recomputed)
        return out

    def repriced(self, micro_batches: int | None, checkpointing: str | None) -> TrainingConfig:
        """This plan's configuration at another K or checkpointing (None: keep this one's).
        ``auto`` keeps the blocks this configuration records (a plan solved with ``auto``
        recomputes what the solver chose; any other plan records none)."""
        mode = self.checkpointing if checkpointing is None else checkpointing
        k = self.micro_batches if micro_batches is None else micro_batches
        blocks = self.recomputed if mode == "auto" else ()
        return TrainingConfig(k, mode, blocks)

    def with_recomputed(self, blocks: Iterable[str]) -> TrainingConfig:
        """This configuration with ``blocks`` recomputed (the solver's choice under ``auto``)."""
        return dataclasses.replace(self, recomputed=tuple(sorted(set(blocks))))


def micro_batches_text(k: int) -> str:
    """``1 micro-batch``, ``8 micro-batches``: ``k`` with the noun in its number."""
    return f"{k} micro-batch" if k == 1 else f"{k} micro-batches"


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
    # (megatron/core/distributed/param_and_grad_buffer.py, distrib_optimizer.py)
    "megatron-lm": Accumulation(None, None, True),
}


BASELINE_CHECKPOINTING = {"megatron": "full", "inferred": "full"}
"""Checkpointing each reference system runs with: Megatron-LM's ``--recompute-activations``
and LiBai's ``activation_checkpoint`` (the seed's ``actrue``) recompute every block."""


def baseline_training(kind: str, training: TrainingConfig) -> TrainingConfig:
    """``training`` for baseline ``kind``: the same K, with the checkpointing the real
    system uses (:data:`BASELINE_CHECKPOINTING`) when ``training`` has it ``off`` or ``auto``."""
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


def layer_of(op_name: str) -> str:
    """The layer (module scope) of an op, from its dotted name.

    Up to the first numeric component when there is one (``decoder.layers.1.mlp.wo``
    -> ``decoder.layers.1``; OneFlow names an op ``<scope>-<type>-<id>``, so
    ``model.h.0-add_n-40``, the residual add of block ``model.h.0``, -> ``model.h.0``); else
    the first component (``encoder.final_norm.weight.cast`` -> ``encoder``,
    ``shared.weight`` -> ``shared``); ``(top level)`` for a name without dots (graph inputs
    such as ``input_ids``).
    """
    parts = op_name.split(".")
    if len(parts) == 1:
        return TOP_LEVEL
    for i, part in enumerate(parts):
        scope = part.split("-", 1)[0]
        if scope.isdigit():
            return ".".join([*parts[:i], scope])
    return parts[0]


def once_per_step_ops(graph: Graph) -> frozenset[str]:
    """Ops that run once per optimizer step under gradient accumulation, on the accumulated
    gradients: the optimizer ops, and every backward op whose inputs are all weight
    gradients (:func:`autopar.optimizer.weight_gradient_path`), outputs of such ops, or
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


def checkpoint_blocks(graph: Graph, training: TrainingConfig) -> frozenset[str]:
    """Layer scopes (:func:`layer_of`) whose forward is recomputed in backward.

    ``full``: every block of :func:`candidate_blocks`, as Megatron-LM's
    ``--recompute-granularity full --recompute-method uniform`` and LiBai's
    ``activation_checkpoint`` on each block do; ``auto``: the blocks the plan records
    (:attr:`TrainingConfig.recomputed`, the solver's choice); ``off``: none."""
    if training.checkpointing == "off":
        return frozenset()
    if training.checkpointing == "auto":
        return frozenset(training.recomputed)
    return candidate_blocks(graph)


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


def copied_ops(graph: Graph, blocks: frozenset[str], zero_stage: int) -> frozenset[str]:
    """The ops of ``blocks`` in OneFlow's recomputed copy: their forward ops less
    :data:`NOT_RECOMPUTED_TYPES`, and under ZeRO (stage >= 1) their variables too (the
    ZeRO cast between a variable and its reader is copied; a variable too small to shard
    has none, so its edges are counted again where OneFlow does not: an upper bound)."""
    return frozenset(
        op.name
        for op in graph.ops
        if op.role is Role.FORWARD
        and layer_of(op.name) in blocks
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
        ``gradient``: a data-parallel gradient reduction (:class:`autopar.costs.EdgeKind`
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
    blocks = checkpoint_blocks(graph, training)
    recomputed = copied_ops(graph, blocks, zero_stage)
    reduce_from, gather_from = acc.reduce_per_micro_batch_from, acc.gather_per_micro_batch_from
    return RunCounts(
        training.micro_batches,
        once_per_step_ops(graph),
        recomputed,
        reduce_from is not None and zero_stage >= reduce_from,
        gather_from is not None and zero_stage >= gather_from,
    )


def accumulation_buffer_bytes(
    shape: Sequence[int],
    sbp: NdSbp,
    mesh_shape: Sequence[int],
    zero_stage: int,
    states: StateBytes,
    zero_sharding: str,
    training: TrainingConfig,
    runtime: RuntimeProfile,
) -> float:
    """Bytes per device of a variable's gradient-accumulation buffer beyond its ZeRO gradient.

    With ``K > 1`` on a runtime that accumulates before reducing into a full-size buffer
    (OneFlow 0.9's acc op, in the partial gradient's layout = the parameter's forward
    layout): ``K_g x Psi - grad_ZeRO`` where ``Psi`` is the variable's elements per device
    after its splits and ``grad_ZeRO`` the gradient bytes its ZeRO stage keeps
    (:func:`autopar.memory.model_state_bytes`): 0 under ZeRO-0/1 (the gradient is
    full-size anyway), ``K_g Psi (1 - 1/Nd)`` under ZeRO-2/3.  0 with ``K = 1`` and on
    ``ideal`` (DeepSpeed ZeRO-2 reduces every micro-batch into its shard).  Units: bytes.
    """
    if training.micro_batches <= 1 or not accumulation_of(runtime).full_size_buffer:
        return 0.0
    local = math.prod(shape) / sbp.split_factor(mesh_shape)
    _, grad, _ = variable_state_bytes(shape, sbp, mesh_shape, zero_stage, states, zero_sharding)
    return max(0.0, states.grad * local - grad)


def variable_memory_bytes(
    shape: Sequence[int],
    sbp: NdSbp,
    mesh_shape: Sequence[int],
    zero_stage: int,
    states: StateBytes,
    zero_sharding: str,
    training: TrainingConfig,
    runtime: RuntimeProfile,
) -> tuple[float, float, float]:
    """(param, grad + accumulation buffer, optimizer) bytes per device of one variable:
    :func:`autopar.memory.variable_state_bytes` plus :func:`accumulation_buffer_bytes`."""
    p, g, o = variable_state_bytes(shape, sbp, mesh_shape, zero_stage, states, zero_sharding)
    acc = accumulation_buffer_bytes(
        shape, sbp, mesh_shape, zero_stage, states, zero_sharding, training, runtime
    )
    return p, g + acc, o


def activation_spans(
    graph: Graph, training: TrainingConfig, working_copy_is_state: bool = False
) -> list[tuple[str, int, int]]:
    """(tensor, first, last) positions of the topological order where each activation is live.

    Without checkpointing: :func:`autopar.memory.activation_intervals`, one span per tensor.
    With it, a tensor produced by a forward op of a recomputed block lives from its
    producer to its last forward use (a use by a later recomputed block's forward keeps it
    until that block's recompute: it is that block's input), and again from the start of
    its block's backward (the recompute) to its last backward use.  A tensor a recomputed
    block reads from outside stays live until that block's backward starts.  Source:
    Chen et al. 2016 (checkpointing), Megatron-LM ``checkpointed_forward``."""
    blocks = checkpoint_blocks(graph, training)
    if not blocks:
        intervals = activation_intervals(graph, working_copy_is_state)
        return [(t, s, e) for t, (s, e) in intervals.items()]
    per_tensor = tensor_spans(graph, blocks, blocks, working_copy_is_state)
    return [(t, s, e) for t, spans in per_tensor.items() for s, e in spans]


def tensor_spans(
    graph: Graph, dropped: frozenset[str], held: frozenset[str], working_copy_is_state: bool = False
) -> dict[str, list[tuple[int, int]]]:
    """Each activation's live spans when the blocks ``dropped`` free their own tensors after
    forward and recompute them in backward, and the blocks ``held`` keep the tensors they
    read from outside until their backward starts (:func:`activation_spans` is both sets
    equal to the recomputed blocks; the solver also prices the sets apart, see
    ``autopar_solver.planner.recompute``)."""
    intervals = activation_intervals(graph, working_copy_is_state)
    order = graph.topological_order
    pos = {op.name: i for i, op in enumerate(order)}
    backward_start: dict[str, int] = {}
    for i, op in enumerate(order):
        if op.role is Role.BACKWARD:
            backward_start.setdefault(layer_of(op.name), i)
    return {
        tname: _spans_of(graph, tname, start, end, (dropped, held), pos, backward_start)
        for tname, (start, end) in intervals.items()
    }


def block_readers(graph: Graph, blocks: frozenset[str]) -> dict[str, tuple[str | None, frozenset[str]]]:
    """Tensor -> (its home block, the other blocks that read it in forward), among ``blocks``:
    the blocks whose recompute flags decide the tensor's live spans (home: None when its
    producer is not a forward op of one of ``blocks``)."""
    out: dict[str, tuple[str | None, frozenset[str]]] = {}
    for tname, (pname, _) in graph.producer.items():
        producer = graph.op_by_name[pname]
        home = layer_of(pname) if producer.role is Role.FORWARD else None
        home = home if home in blocks else None
        readers = {
            layer_of(c) for c, _ in graph.consumers.get(tname, []) if graph.op_by_name[c].role is Role.FORWARD
        }
        out[tname] = (home, frozenset(r for r in readers if r in blocks and r != home))
    return out


def _spans_of(
    graph: Graph,
    tname: str,
    start: int,
    end: int,
    blocks: tuple[frozenset[str], frozenset[str]],
    pos: dict[str, int],
    backward_start: dict[str, int],
) -> list[tuple[int, int]]:
    """The live spans of one activation under checkpointing (see :func:`tensor_spans`;
    ``blocks`` = (dropped, held))."""
    dropped, held = blocks
    pname = graph.producer[tname][0]
    producer = graph.op_by_name[pname]
    home = layer_of(pname) if producer.role is Role.FORWARD else None
    forward_end, backward_uses = start, []
    for cname, _ in graph.consumers.get(tname, []):
        consumer = graph.op_by_name[cname]
        if consumer.role is Role.FORWARD:
            forward_end = max(forward_end, pos[cname])
            scope = layer_of(cname)
            if scope in held and scope != home:  # an input of a recomputed block
                forward_end = max(forward_end, backward_start.get(scope, pos[cname]))
        else:
            backward_uses.append(pos[cname])
    if home not in dropped:
        return [(start, max(end, forward_end))]
    spans = [(start, forward_end)]
    if backward_uses:
        again = min(backward_start.get(home, min(backward_uses)), min(backward_uses))
        if max(again, forward_end + 1) <= max(backward_uses):  # else live throughout the first
            spans.append((max(again, forward_end + 1), max(backward_uses)))
    return spans


def weighted_costs(
    node_costs: Sequence[np.ndarray],
    op_names: Sequence[str],
    gather_s: Sequence[np.ndarray | None],
    edges: Sequence[tuple[int, int, np.ndarray]],
    edge_runs: Sequence[tuple[int, int]],
    counts: RunCounts,
) -> tuple[list[np.ndarray], list[tuple[int, int, np.ndarray]]]:
    """The solver's node and edge costs of one iteration.

    ``node_costs[i]`` are op ``i``'s seconds per choice with its ZeRO gathers
    (``gather_s[i]`` per choice, None when it has none); each op's compute is weighted by
    its runs, its gathers by theirs; each edge matrix by its runs (``edge_runs``, as
    :meth:`RunCounts.edge`).  Formula: ``runs = K x per_micro_batch + per_step``."""
    gather_runs = counts.total(counts.gather())
    nodes: list[np.ndarray] = []
    for name, cost, gather in zip(op_names, node_costs, gather_s):
        runs = counts.total(counts.op(name))
        weighted = cost * runs
        if gather is not None and gather_runs != runs:
            weighted = weighted + gather * (gather_runs - runs)
        nodes.append(weighted)
    out_edges = [(u, v, m * counts.total(r)) for (u, v, m), r in zip(edges, edge_runs)]
    return nodes, out_edges


def table_costs(
    tables: CostTables, training: TrainingConfig
) -> tuple[list[np.ndarray], list[tuple[int, int, np.ndarray]]]:
    """Node costs and edge matrices of ``tables`` (topological op order) for one iteration.

    The tables price one micro-batch per step; with ``training`` at its default they are
    returned as they are (the same arrays), else weighted by :func:`weighted_costs`, the
    ZeRO gathers taken apart with :func:`autopar.costs.optimizer_gather_time` per choice.
    """
    graph = tables.graph
    order = graph.topological_order
    index = {op.name: i for i, op in enumerate(order)}
    nodes = [tables.ops[op.name].compute_s for op in order]
    edges = [(index[e.producer], index[e.consumer], e.matrix) for e in tables.edges]
    if training.is_default:
        return nodes, edges
    counts = run_counts(graph, training, tables.runtime, tables.zero_stage)
    return _weighted_tables(tables, counts, _gather_costs(tables))


def recompute_table_costs(
    tables: CostTables, training: TrainingConfig
) -> tuple[
    tuple[list[np.ndarray], list[tuple[int, int, np.ndarray]]],
    tuple[list[np.ndarray], list[tuple[int, int, np.ndarray]]],
]:
    """:func:`table_costs` with no block recomputed and with every block of
    :func:`candidate_blocks` recomputed, at ``training``'s K: an op's (or the edge into
    it) cost when its block keeps its activations, and when it recomputes them (the two
    differ only on the forward ops of the blocks; the solver's ``auto`` choice)."""
    graph, k = tables.graph, training.micro_batches
    gathers = _gather_costs(tables)
    keep = run_counts(graph, TrainingConfig(k, "off"), tables.runtime, tables.zero_stage)
    recompute = run_counts(graph, TrainingConfig(k, "full"), tables.runtime, tables.zero_stage)
    return _weighted_tables(tables, keep, gathers), _weighted_tables(tables, recompute, gathers)


def _gather_costs(tables: CostTables) -> list[np.ndarray | None]:
    """Each op's ZeRO parameter gather seconds per choice (None without one)."""
    graph, mesh, lowering = tables.graph, tables.mesh, tables.runtime.lowering.value
    gathers: list[np.ndarray | None] = []
    for op in graph.topological_order:
        if model_port_index(op) is None or tables.zero_stage == 0:
            gathers.append(None)
            continue
        ctx = rule_context(graph, op, mesh.shape, tables.zero_stage, tables.runtime.zero_sharding.value)
        sigs = tables.ops[op.name].signatures
        gathers.append(
            np.array([optimizer_gather_time(ctx, s, mesh, lowering) for s in sigs], dtype=np.float64)
        )
    return gathers


def _weighted_tables(
    tables: CostTables, counts: RunCounts, gathers: list[np.ndarray | None]
) -> tuple[list[np.ndarray], list[tuple[int, int, np.ndarray]]]:
    """The tables' costs weighted by ``counts`` (:func:`weighted_costs`)."""
    graph = tables.graph
    order = graph.topological_order
    index = {op.name: i for i, op in enumerate(order)}
    nodes = [tables.ops[op.name].compute_s for op in order]
    edges = [(index[e.producer], index[e.consumer], e.matrix) for e in tables.edges]
    gradients = weight_gradient_path(graph)
    lowering = tables.runtime.lowering.value
    runs = []
    for e in tables.edges:
        kind = edge_kind(graph.op_by_name[e.consumer], e.in_port, e.tensor in gradients, lowering)
        runs.append(counts.edge(e.producer, e.consumer, kind is EdgeKind.GRADIENT))
    return weighted_costs(nodes, [op.name for op in order], gathers, edges, runs, counts)


def with_training(tables: CostTables, training: TrainingConfig) -> CostTables:
    """``tables`` priced for ``training``: the same tables (at the default) or a shallow copy
    that records it (``stats["training"]``; the cost arrays are shared, never changed)."""
    if training.is_default:
        return tables
    return dataclasses.replace(tables, stats={**tables.stats, "training": training.to_dict()})


def training_of(tables: CostTables) -> TrainingConfig:
    """The training configuration :func:`with_training` recorded on ``tables`` (default: none)."""
    found = tables.stats.get("training")
    if not isinstance(found, dict):
        return TrainingConfig()
    blocks = tuple(str(b) for b in found.get("recomputed_blocks", ()))
    return TrainingConfig(int(found["micro_batches"]), str(found["checkpointing"]), blocks)
