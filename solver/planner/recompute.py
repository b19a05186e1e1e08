"""Checkpointing ``auto``: recompute or keep, per transformer block, chosen with the layout.

Under ``--checkpointing auto`` each forward op of a block that can be recomputed
(:func:`autopar.cost.iteration.candidate_blocks`, the blocks ``full`` recomputes) has its
choices doubled::

    choice c      (c < n):  signature c, its block keeps its activations
    choice n + c:           signature c, its block recomputes its forward in backward

(``n``: the op's signatures).  Every other op keeps its ``n`` choices.  In the problem:

* node costs: the ``keep`` half is the op's iteration cost with no block recomputed, the
  ``recompute`` half with its block recomputed (its forward compute twice per micro-batch,
  :func:`autopar.cost.weighted_tables.recompute_table_costs`);
* edge costs depend on both ends' flags: the boxing of an edge runs twice per micro-batch
  when its producer and its consumer both recompute
  (:func:`autopar.cost.iteration.boxed_again_in_recompute`, from OneFlow's
  ``checkpointing_pass.cpp``: a recomputed op reads what it takes from outside the
  recomputed ops through the forward's boxing); an edge between two ops of one block whose
  flags differ costs ``inf`` (:func:`expand_edge`, the one place that decides it), so a
  block recomputes as a whole.
  Ops of a block that no edge inside the block joins get an agreement edge (0 or ``inf``);
* memory: a tensor's live spans depend on its home block's flag and on the flags of the
  other blocks that read it in forward (:func:`autopar.cost.activation_spans.tensor_spans`).  With at
  most one such reader the row term is exact: a node term of the producer, or an edge term
  on the edge into the reader when the reader's flag matters.  With two or more readers the
  term takes them all as recomputing: an upper bound (live spans only grow with the readers
  that hold a tensor), which the evaluator's re-check then prices exactly.

Without memory rows (the first round, or no budget) the problem is not doubled: every block
keeps, which is exact (recomputing never saves time: each cost with a block recomputed is at
least the cost with it kept, so the optimum over all flags has every block kept, and its
bound bounds the doubled problem, a later round's relaxation as before).

The objective is exact for every choice, so the solver's objective equals the evaluator's
iteration time of the plan with the chosen blocks (:func:`~.verify.verify`), and its bound
holds over every layout and every set of recomputed blocks (memory rows aside, which are
exact or conservative as said).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autopar.cost.activation_spans import block_readers, tensor_spans
from autopar.cost.fusion import fused_kernels
from autopar.cost.iteration import boxed_again_in_recompute, candidate_blocks, checkpoint_units
from autopar.cost.tables import CostTables
from autopar.cost.weighted_tables import recompute_table_costs, training_of
from autopar.ir.blocks import layer_of
from autopar.ir.graph import Graph, Role
from autopar.ir.training import TrainingConfig

__all__ = [
    "LiveTerm",
    "RecomputeChoices",
    "doubled_costs",
    "expand_edge",
    "least_spans",
    "live_terms",
    "recompute_choices",
    "tile",
]


@dataclass(frozen=True)
class RecomputeChoices:
    """Which nodes of the problem have their choices doubled, and for which block."""

    blocks: tuple[str, ...]
    """Blocks that can be recomputed, sorted."""
    block_of: dict[int, str]
    """Node (topological index) -> its block, for each node whose choices are doubled."""
    signatures: list[int]
    """Signatures of each node (``n``)."""

    def doubled(self, node: int) -> bool:
        return node in self.block_of

    def recomputes(self, node: int, choice: int) -> bool:
        """Does ``choice`` of ``node`` recompute its block?"""
        return node in self.block_of and choice >= self.signatures[node]

    def choice(self, node: int, signature: int, recompute: bool) -> int:
        """The choice of ``node`` with signature index ``signature`` and flag ``recompute``."""
        return signature + (self.signatures[node] if recompute and node in self.block_of else 0)

    def all_recomputing(self, choices: Sequence[int]) -> list[int]:
        """``choices`` (of this problem, or of one without doubled choices) with each
        signature kept and every block recomputing."""
        return [
            c if c < 0 or i not in self.block_of else self.choice(i, c % self.signatures[i], True)
            for i, c in enumerate(choices)
        ]

    def recomputed(self, choices: Sequence[int]) -> tuple[str, ...]:
        """The blocks ``choices`` recompute, sorted."""
        return tuple(sorted({b for i, b in self.block_of.items() if self.recomputes(i, choices[i])}))


def recompute_choices(tables: CostTables) -> RecomputeChoices | None:
    """The doubled nodes of ``tables``' problem under ``auto``; None under ``off``/``full``."""
    if training_of(tables).checkpointing != "auto":
        return None
    graph = tables.graph
    blocks = candidate_blocks(graph)
    order = graph.topological_order
    block_of = {
        i: layer_of(op.name)
        for i, op in enumerate(order)
        if op.role is Role.FORWARD and layer_of(op.name) in blocks
    }
    return RecomputeChoices(
        tuple(sorted(blocks)), block_of, [len(tables.ops[op.name].signatures) for op in order]
    )


def tile(rc: RecomputeChoices, u: int, v: int | None, values: np.ndarray) -> np.ndarray:
    """``values`` per choice of ``u`` (and of ``v``: a matrix) repeated over the doubled
    choices: a term that does not depend on the flags."""
    if v is None:
        return np.tile(values, 2 if rc.doubled(u) else 1)
    return np.tile(values, (2 if rc.doubled(u) else 1, 2 if rc.doubled(v) else 1))


def expand_edge(rc: RecomputeChoices, u: int, v: int, keep: np.ndarray, recompute: np.ndarray) -> np.ndarray:
    """Edge ``u -> v``'s cost over the doubled choices (flags ``f_u``, ``f_v``): ``recompute``
    (the edge priced with every block recomputed) where
    :func:`autopar.cost.iteration.boxed_again_in_recompute` ``(f_u, f_v)``, else ``keep``.  A
    node that is not doubled has its flag off for ``u`` and, for ``v``, its ``recompute``
    price equals ``keep`` (it is no recomputed op); ``inf`` where ``u`` and ``v`` share a
    block and their flags differ (the one place that forbids half a block recomputed)."""
    flags_u = (False, True) if rc.doubled(u) else (False,)
    flags_v = (False, True) if rc.doubled(v) else (False,)
    out = np.block(
        [[recompute if boxed_again_in_recompute(fu, fv) else keep for fv in flags_v] for fu in flags_u]
    )
    if rc.doubled(u) and rc.doubled(v) and rc.block_of[u] == rc.block_of[v]:
        nu, nv = rc.signatures[u], rc.signatures[v]
        out = out.copy()
        out[:nu, nv:] = np.inf
        out[nu:, :nv] = np.inf
    return out


def doubled_costs(
    tables: CostTables, rc: RecomputeChoices
) -> tuple[list[np.ndarray], list[tuple[int, int, np.ndarray]]]:
    """Node costs and edges of the doubled problem: the tables' edges in their order, then
    the agreement edges that join each block's ops into one flag."""
    (keep_nodes, keep_edges), (rec_nodes, rec_edges) = recompute_table_costs(tables, training_of(tables))
    nodes = [
        np.concatenate([k, r]) if rc.doubled(i) else k for i, (k, r) in enumerate(zip(keep_nodes, rec_nodes))
    ]
    edges = [(u, v, expand_edge(rc, u, v, mk, mr)) for (u, v, mk), (_, _, mr) in zip(keep_edges, rec_edges)]
    return nodes, edges + _agreement_edges(rc, [(u, v) for u, v, _ in keep_edges])


def _agreement_edges(rc: RecomputeChoices, pairs: list[tuple[int, int]]) -> list[tuple[int, int, np.ndarray]]:
    """Zero-cost edges (``inf`` where the flags differ) joining the parts of each block that
    no edge inside the block joins (union-find over the block's own edges)."""
    parent = {i: i for i in rc.block_of}

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for u, v in pairs:
        if rc.doubled(u) and rc.doubled(v) and rc.block_of[u] == rc.block_of[v]:
            parent[root(u)] = root(v)
    first: dict[str, int] = {}
    out = []
    for i in sorted(rc.block_of):
        r = root(i)
        if r != i:
            continue
        block = rc.block_of[i]
        if block not in first:
            first[block] = i
            continue
        a = first[block]
        zeros = np.zeros((rc.signatures[a], rc.signatures[i]))
        out.append((a, i, expand_edge(rc, a, i, zeros, zeros)))
    return out


@dataclass(frozen=True)
class LiveTerm:
    """Whether a tensor is live at one position, by flag: ``live[home][reader]`` (``home``:
    its producer's block recomputes; ``reader``: the block of ``edge``'s consumer does).
    ``edge`` is None when the reader's flag does not matter (then ``live[h][0]`` is it)."""

    tensor: str
    live: tuple[tuple[bool, bool], tuple[bool, bool]]
    edge: int | None


@dataclass(frozen=True)
class _Lives:
    """Each tensor's spans with its home block kept or recomputing (first index) and with its
    reader blocks keeping or recomputing (second index), and its exact reader's edge."""

    spans: tuple[tuple[dict[str, list[tuple[int, int]]], ...], ...]
    edge_of: dict[str, int | None]
    """Tensor -> the edge into its one reader block (None: no reader block, or several,
    priced as all recomputing: an upper bound)."""


def _lives(tables: CostTables, rc: RecomputeChoices) -> _Lives:
    graph: Graph = tables.graph
    blocks = frozenset(rc.blocks)
    none: frozenset[str] = frozenset()
    fused = fused_kernels(graph, tables.runtime).internal
    spans = tuple(
        tuple(tensor_spans(graph, dropped, held, unmaterialized=fused) for held in (none, blocks))
        for dropped in (none, blocks)
    )
    readers = block_readers(graph, blocks)
    edge_of: dict[str, int | None] = {t: None for t in readers}
    wanted = {t: next(iter(r)) for t, (_, r) in readers.items() if len(r) == 1}
    for e_index, e in enumerate(tables.edges):
        block = wanted.get(e.tensor)
        consumer = graph.op_by_name[e.consumer]
        if block is not None and edge_of[e.tensor] is None and layer_of(e.consumer) == block:
            edge_of[e.tensor] = e_index if consumer.role is Role.FORWARD else None
    return _Lives(spans, edge_of)


def live_terms(tables: CostTables, rc: RecomputeChoices, positions: Sequence[int]) -> list[list[LiveTerm]]:
    """For each of ``positions``: the tensors live there under some flags, with how."""
    lives = _lives(tables, rc)
    out: list[list[LiveTerm]] = []
    for pos in positions:
        found: list[LiveTerm] = []
        for tname in lives.spans[0][0]:
            live = tuple(
                tuple(any(s <= pos <= e for s, e in lives.spans[h][r][tname]) for r in (0, 1)) for h in (0, 1)
            )
            if not any(any(x) for x in live):
                continue
            edge = lives.edge_of.get(tname)
            if edge is None:  # no reader block, or several: all taken as recomputing (a bound)
                live = ((live[0][1], live[0][1]), (live[1][1], live[1][1]))
            elif live[0][0] == live[0][1] and live[1][0] == live[1][1]:
                edge = None  # the reader's flag does not matter here
            found.append(LiveTerm(tname, live, edge))  # type: ignore[arg-type]
        out.append(found)
    return out


def least_spans(tables: CostTables) -> list[tuple[str, int, int]]:
    """Live spans no plan goes below, for the memory floors: under ``auto`` every block's own
    tensors recomputed and no block holding the tensors it reads (each tensor's least span,
    :func:`autopar.cost.activation_spans.tensor_spans`); else the spans of the configured checkpointing."""
    training: TrainingConfig = training_of(tables)
    graph = tables.graph
    if training.checkpointing == "auto":
        dropped, held = candidate_blocks(graph), frozenset[str]()
    else:
        dropped = held = checkpoint_units(graph, training)
    fused = fused_kernels(graph, tables.runtime).internal
    return [
        (t, s, e)
        for t, spans in tensor_spans(graph, dropped, held, unmaterialized=fused).items()
        for s, e in spans
    ]
