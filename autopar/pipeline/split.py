"""Pipeline stages of a training graph: contiguous ranges of transformer blocks, each with its
own graph (the stage's ops, what it receives from other stages as graph inputs).

A stage is a contiguous range of the graph's blocks (:func:`ordered_blocks`, in forward
order) with the ops of those blocks: forward, backward and optimizer.  The ops outside
every block follow the blocks they belong with (:func:`assign_stages`):

* a component whose forward runs before the first block (the embedding) goes to the first
  stage; every other op outside the blocks (final norm, head, loss, gradient clipping's
  global norm) to the latest stage of its producers (the head to the last stage, an
  encoder's final norm to the encoder's last stage), or the first stage of its readers
  when it has no producer;
* graph inputs (``input`` ops: token ids, labels, masks) are read where they are needed:
  each stage that reads one gets its own copy (the data loader feeds every stage);
* a parameter a later stage reads too (a tied word embedding, read by the head) is held
  by both stages, with the forward ops between the variable and its readers that read
  nothing else (its cast): Megatron-LM keeps the word embedding on the first and the last
  stage and all-reduces their gradients once per step
  (``megatron/core/distributed/finalize_model_grads.py``, ``_allreduce_word_embedding_grads``);
* a backward op that reads only tensors of later stages (the sum of the gradients the
  readers of a stage's output send back) runs in the latest of them, so that one gradient
  crosses per boundary tensor, as in Megatron-LM's ``send_backward``.

A tensor produced in one stage and read in another is a :class:`Boundary`: the reading
stage's graph gets a ``pipeline_recv`` op ``<tensor>.recv`` producing it, whose time is the
receive of the layout the stage's plan gives it (:func:`autopar.cost.compute.receive_time`); what
crosses once per step is priced by :func:`autopar.pipeline.evaluate.evaluate_pipeline`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from autopar.cost.iteration import candidate_blocks, once_per_step_ops
from autopar.errors import ConfigError
from autopar.ir.blocks import layer_of
from autopar.ir.graph import Graph, Op, Role, Variable
from autopar.ir.optimizer import weight_gradient_path

__all__ = [
    "RECV_SUFFIX",
    "RECV_TYPE",
    "Boundary",
    "StageSlice",
    "assign_stages",
    "balanced_counts",
    "ordered_blocks",
    "split_graph",
]

RECV_TYPE = "pipeline_recv"
"""Op type of a stage's receive: a graph input whose time is the transfer
(:func:`autopar.cost.compute.receive_time`)."""
RECV_SUFFIX = ".recv"
"""Name suffix of the ``input`` op through which a stage receives a tensor of another stage."""


@dataclass(frozen=True)
class Boundary:
    """A tensor produced in stage ``src`` and read in stage ``dst``."""

    tensor: str
    src: int
    dst: int
    per: str
    """``micro-batch``: sent once per micro-batch (activations forward, their gradients
    backward); ``step``: once per optimizer step (gradient clipping's norms; a tied
    parameter's gradient, all-reduced once per step)."""
    tied_gradient: bool = False
    """A weight gradient of a parameter two stages hold (the tied word embedding): priced as
    the once-per-step all-reduce of the two copies' gradients."""


@dataclass(frozen=True)
class StageSlice:
    """One stage: its blocks, its graph, and the tensors it receives and sends."""

    index: int
    blocks: tuple[str, ...]
    graph: Graph
    receives: tuple[Boundary, ...] = ()
    sends: tuple[Boundary, ...] = ()
    tied_copies: tuple[str, ...] = field(default=())
    """Variable ops this stage holds as a copy of an earlier stage's parameter."""


def ordered_blocks(graph: Graph) -> list[str]:
    """The graph's blocks (:func:`autopar.cost.iteration.candidate_blocks`) in the order their
    forward runs."""
    blocks = candidate_blocks(graph)
    first: dict[str, int] = {}
    for i, op in enumerate(graph.topological_order):
        if op.role is Role.FORWARD:
            b = layer_of(op.name)
            if b in blocks:
                first.setdefault(b, i)
    return sorted(first, key=first.__getitem__)


def balanced_counts(blocks: int, stages: int) -> tuple[int, ...]:
    """``blocks`` split into ``stages`` contiguous counts differing by at most one, the larger
    ones last (the first stage also holds the embedding and keeps the most micro-batches in
    flight)."""
    if stages < 1 or stages > blocks:
        raise ConfigError(
            "bad_pipeline", f"cannot split {blocks} blocks into {stages} stages; use 1 to {blocks} stages"
        )
    base, extra = divmod(blocks, stages)
    return tuple(base + (1 if s >= stages - extra else 0) for s in range(stages))


def assign_stages(graph: Graph, counts: Sequence[int]) -> dict[str, int]:
    """Op -> stage for block ``counts`` per stage (the module docstring's rules; inputs and
    tied parameters are assigned to their first reader's stage here, and copied into the
    other readers' stages by :func:`split_graph`)."""
    blocks = ordered_blocks(graph)
    if sum(counts) != len(blocks) or any(c < 1 for c in counts):
        raise ConfigError(
            "bad_pipeline",
            f"block counts {list(counts)} must be positive and add up to the graph's {len(blocks)} blocks",
        )
    block_stage: dict[str, int] = {}
    it = iter(blocks)
    for s, c in enumerate(counts):
        for _ in range(c):
            block_stage[next(it)] = s
    order = graph.topological_order
    first_block_pos = next(i for i, op in enumerate(order) if layer_of(op.name) in block_stage)
    component: dict[str, int] = {}
    for i, op in enumerate(order):
        scope = layer_of(op.name)
        if op.role is Role.FORWARD and scope not in block_stage and op.inputs and i < first_block_pos:
            component.setdefault(scope, 0)
    stage: dict[str, int] = {}
    producer = graph.producer
    for op in order:
        scope = layer_of(op.name)
        if scope in block_stage:
            stage[op.name] = block_stage[scope]
        elif scope in component:
            stage[op.name] = component[scope]
        else:
            # floating until its readers are known when no producer of it has a stage (a
            # graph input, a variable outside the blocks, its cast)
            placed = [stage[p] for t in op.inputs.values() if (p := producer[t][0]) in stage]
            if placed:
                stage[op.name] = max(placed)
    # a backward op that reads only tensors of later stages (the sum of the gradients a
    # boundary tensor's readers send back) runs in the latest of them: one tensor crosses
    for op in order:
        if op.role is Role.BACKWARD and op.inputs:
            srcs = [stage.get(producer[t][0], -1) for t in op.inputs.values()]
            if min(srcs) > stage[op.name]:
                stage[op.name] = max(srcs)
    # floating ops: their first reader's stage (latest first, so a cast finds its readers)
    consumers = graph.consumers
    for op in reversed(order):
        if op.name not in stage:
            readers = [stage[c] for t in op.outputs.values() for c, _ in consumers.get(t, []) if c in stage]
            stage[op.name] = min(readers) if readers else 0
    return stage


def _parameter_chain(graph: Graph) -> set[str]:
    """Variables and the forward ops that read only them (or such ops): a parameter and its
    cast, which a later stage copies instead of receiving it every micro-batch."""
    variables = {v.op for v in graph.variables}
    chain: set[str] = set()
    producer = graph.producer
    for op in graph.topological_order:
        if op.name in variables or (
            op.role is Role.FORWARD and op.inputs and all(producer[t][0] in chain for t in op.inputs.values())
        ):
            chain.add(op.name)
    return chain


def split_graph(graph: Graph, counts: Sequence[int], crosses_nodes: bool = True) -> list[StageSlice]:
    """The stages of ``graph`` with ``counts`` blocks each (:func:`assign_stages`), each with its
    own graph (``graph.name`` + ``.stage<s>``), in order.  ``crosses_nodes``: whether the
    link between stages is the inter-node one (the receive ops' cost,
    :func:`autopar.cost.compute.receive_time`)."""
    stage = assign_stages(graph, counts)
    n = len(counts)
    chain = _parameter_chain(graph)
    producer, consumers = graph.producer, graph.consumers
    once = once_per_step_ops(graph)
    grads = weight_gradient_path(graph)
    members: list[list[Op]] = [[] for _ in range(n)]
    copies: list[set[str]] = [set() for _ in range(n)]
    for op in graph.topological_order:
        members[stage[op.name]].append(op)
    # inputs and parameter chains read by later stages: a copy in each reader's stage
    for op in graph.topological_order:
        if not (op.type == "input" or op.name in chain):
            continue
        for t in op.outputs.values():
            for c, _ in consumers.get(t, []):
                s = stage[c]
                if s != stage[op.name] and c not in chain:
                    _copy_with_sources(graph, op.name, s, chain, copies)
    boundaries: dict[tuple[str, int], Boundary] = {}
    for op in graph.topological_order:
        s = stage[op.name]
        for t in op.inputs.values():
            pname = producer[t][0]
            if stage[pname] == s or pname in copies[s]:
                continue
            readers = [c for c, _ in consumers[t] if stage[c] == s and c not in copies[s]]
            per = "step" if readers and all(r in once for r in readers) else "micro-batch"
            tied = t in grads and op.role is not Role.FORWARD
            boundaries.setdefault(
                (t, s), Boundary(t, stage[pname], s, "step" if tied else per, tied_gradient=tied)
            )
    blocks = ordered_blocks(graph)
    first = [sum(counts[:s]) for s in range(n + 1)]  # stage s holds blocks[first[s]:first[s + 1]]
    variables = {v.op for v in graph.variables}
    slices = []
    for s in range(n):
        receives = tuple(b for b in boundaries.values() if b.dst == s)
        sends = tuple(b for b in boundaries.values() if b.src == s)
        slices.append(
            StageSlice(
                s,
                tuple(blocks[first[s] : first[s + 1]]),
                _stage_graph(graph, s, members[s], copies[s], receives, crosses_nodes),
                receives,
                sends,
                tuple(sorted(c for c in copies[s] if c in variables)),
            )
        )
    return slices


def _copy_with_sources(graph: Graph, name: str, s: int, chain: set[str], copies: list[set[str]]) -> None:
    """Copy op ``name`` into stage ``s`` with the chain ops it reads (a cast with its variable)."""
    if name in copies[s]:
        return
    copies[s].add(name)
    for t in graph.op_by_name[name].inputs.values():
        p = graph.producer[t][0]
        if p in chain:
            _copy_with_sources(graph, p, s, chain, copies)


def _stage_graph(
    graph: Graph,
    s: int,
    members: list[Op],
    copied: set[str],
    receives: Sequence[Boundary],
    crosses_nodes: bool,
) -> Graph:
    """The graph of stage ``s``: its ops, the copies it holds, an ``input`` op per received
    tensor; its variables (a copied parameter frozen here: the stage that owns it updates it)."""
    ops = [op for op in graph.topological_order if op.name in copied] + list(members)
    own = {op.name for op in members}
    recv_ops = [
        Op(
            f"{b.tensor}{RECV_SUFFIX}",
            RECV_TYPE,
            {},
            {"out": b.tensor},
            {"per": b.per, "crosses_nodes": crosses_nodes, **({"tied": True} if b.tied_gradient else {})},
            graph.op_by_name[graph.producer[b.tensor][0]].role,
        )
        for b in receives
    ]
    # each receive just before its first reader: a gradient received from the next stage
    # arrives when the stage's backward reaches it (the topological order keeps list order),
    # not at the start of the step (where it would be live through the forward, and would
    # start its block's backward before the forward ends)
    first_reader: dict[str, int] = {}
    for i, op in enumerate(ops):
        for t in op.inputs.values():
            first_reader.setdefault(t, i)
    before: dict[int, list[Op]] = {}
    for r in recv_ops:
        before.setdefault(first_reader.get(r.outputs["out"], len(ops)), []).append(r)
    all_ops = [x for i, op in enumerate(ops) for x in (*before.get(i, []), op)] + before.get(len(ops), [])
    tensors = {t for op in all_ops for t in (*op.inputs.values(), *op.outputs.values())}
    variables = []
    for v in graph.variables:
        if v.op in own:
            variables.append(v)
        elif v.op in copied:
            variables.append(Variable(v.op, v.tensor))
    return Graph(
        f"{graph.name}.stage{s}",
        [graph.tensors[t] for t in sorted(tensors)],
        all_ops,
        variables,
        {**graph.meta, "pipeline_stage": s},
    ).validate()


def stage_devices(world_size: int, stages: int) -> int:
    """Devices per stage: the world split evenly (``ConfigError`` when it does not divide)."""
    if stages < 1 or world_size % stages:
        raise ConfigError(
            "bad_pipeline", f"{stages} stages do not divide {world_size} devices evenly; use a divisor"
        )
    return world_size // stages
