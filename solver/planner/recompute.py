"""Checkpointing ``auto``: a recompute policy per transformer block, chosen with the layout.

Under ``--checkpointing auto`` each block that can be recomputed
(:func:`autopar.cost.iteration.candidate_blocks`) takes one of the runtime's block policies
(:func:`autopar.cost.recompute_policies.block_policies`: ``off``, the sets of op groups the
runtime recomputes apart, such as the attention core and the norms, and ``full``), and each
forward op of the block has its choices multiplied by them::

    choice p * n + c:   signature c, its block under policy p   (p = 0: off, last: full)

(``n``: the op's signatures).  Every other op keeps its ``n`` choices.  In the problem:

* node costs: an op the policy recomputes (:func:`autopar.cost.iteration.copied_ops` of the
  policy's units) costs its iteration cost recomputed (its forward compute twice per
  micro-batch, :func:`autopar.cost.weighted_tables.recompute_table_costs`), any other its
  cost kept;
* edge costs depend on both ends' policies: the boxing of an edge runs twice per micro-batch
  when its producer and its consumer are both recomputed
  (:func:`autopar.cost.iteration.boxed_again_in_recompute`, from OneFlow's
  ``checkpointing_pass.cpp``: a recomputed op reads what it takes from outside the
  recomputed ops through the forward's boxing); an edge between two ops of one block whose
  policies differ costs ``inf`` (:func:`expand_edge`, the one place that decides it), so a
  block takes one policy.  Ops of a block that no edge inside the block joins get an
  agreement edge (0 or ``inf``);
* memory: a tensor's live spans depend on its home block's policy and on the policies of
  the other blocks that read it in forward (:func:`autopar.cost.activation_spans.tensor_spans`).
  With at most one such reader the row term is exact: a node term of the producer, or an
  edge term on the edge into the reader when the reader's policy matters.  With two or more
  readers the term takes, for each home policy, the tensor live wherever some reader policy
  keeps it live: an upper bound (live spans only grow with how long the readers hold a
  tensor), which the evaluator's re-check then prices exactly.

Without memory rows (the first round, or no budget) the problem is not multiplied: every
block keeps, which is exact (recomputing never saves time: each cost with an op recomputed
is at least the cost with it kept, so the optimum over all policies has every block kept,
and its bound bounds the multiplied problem, a later round's relaxation as before).

The objective is exact for every choice, so the solver's objective equals the evaluator's
iteration time of the plan with the chosen policies (:func:`~.verify.verify`), and its bound
holds over every layout and every policy of every block (memory rows aside, which are exact
or conservative as said).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from autopar.cost.activation_spans import block_readers, tensor_spans
from autopar.cost.fusion import fused_kernels
from autopar.cost.iteration import boxed_again_in_recompute, candidate_blocks, checkpoint_units, copied_ops
from autopar.cost.recompute_policies import BlockPolicy, block_policies, block_policy_of, policy_units
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
    """Which nodes of the problem have their choices multiplied by the block policies, for
    which block, and which nodes each policy recomputes."""

    blocks: tuple[str, ...]
    """Blocks that can be recomputed, sorted."""
    block_of: dict[int, str]
    """Node (topological index) -> its block, for each node whose choices are multiplied."""
    signatures: list[int]
    """Signatures of each node (``n``)."""
    policies: tuple[BlockPolicy, ...]
    """The block policies (:func:`autopar.cost.recompute_policies.block_policies`): ``off``
    first, ``full`` last."""
    copied: tuple[frozenset[int], ...]
    """Per policy: the nodes it recomputes (in OneFlow's copy, :func:`copied_ops`) when every
    block takes it."""

    @property
    def full(self) -> int:
        """The index of ``full``."""
        return len(self.policies) - 1

    def doubled(self, node: int) -> bool:
        """Are ``node``'s choices multiplied by the policies?"""
        return node in self.block_of

    def states(self, node: int) -> int:
        """Policies ``node`` chooses among (1 when it is in no block)."""
        return len(self.policies) if node in self.block_of else 1

    def policy(self, node: int, choice: int) -> int:
        """The policy index of ``choice`` of ``node`` (0, ``off``, for a node in no block)."""
        return choice // self.signatures[node] if node in self.block_of else 0

    def copies(self, node: int, policy: int) -> bool:
        """Is ``node`` recomputed when its block takes ``policy``?"""
        return node in self.copied[policy]

    def recomputes(self, node: int, choice: int) -> bool:
        """Does ``choice`` of ``node`` recompute it?"""
        return node in self.block_of and self.copies(node, self.policy(node, choice))

    def choice(self, node: int, signature: int, policy: int) -> int:
        """The choice of ``node`` with signature index ``signature`` under ``policy``."""
        return signature + (self.signatures[node] * policy if node in self.block_of else 0)

    def all_recomputing(self, choices: Sequence[int]) -> list[int]:
        """``choices`` (of this problem, or of one without multiplied choices) with each
        signature kept and every block recomputed whole."""
        return [
            c if c < 0 or i not in self.block_of else self.choice(i, c % self.signatures[i], self.full)
            for i, c in enumerate(choices)
        ]

    def block_policies(self, choices: Sequence[int]) -> dict[str, BlockPolicy]:
        """Block -> the policy ``choices`` give it (its first node's)."""
        out: dict[str, BlockPolicy] = {}
        for i, b in sorted(self.block_of.items()):
            if b not in out and choices[i] >= 0:
                out[b] = self.policies[self.policy(i, choices[i])]
        return out

    def recomputed(self, choices: Sequence[int]) -> tuple[str, ...]:
        """The units ``choices`` recompute (blocks and op groups), sorted."""
        return tuple(sorted(policy_units(self.block_policies(choices))))

    def policy_index(self, block: str, units: Iterable[str]) -> int:
        """The index of the policy under which ``block`` recomputes its units among
        ``units`` (a plan's); 0 (``off``) when none of the policies does."""
        found = block_policy_of(block, units, self.policies)
        return 0 if found is None else self.policies.index(found)


def recompute_choices(tables: CostTables) -> RecomputeChoices | None:
    """The multiplied nodes of ``tables``' problem under ``auto``; None under the other modes."""
    if training_of(tables).checkpointing != "auto":
        return None
    graph = tables.graph
    blocks = candidate_blocks(graph)
    order = graph.topological_order
    index = {op.name: i for i, op in enumerate(order)}
    block_of = {
        i: layer_of(op.name)
        for i, op in enumerate(order)
        if op.role is Role.FORWARD and layer_of(op.name) in blocks
    }
    policies = block_policies(tables.runtime)
    copied = tuple(
        frozenset(
            index[name]
            for name in copied_ops(graph, policy_units(dict.fromkeys(blocks, p)), tables.zero_stage)
            if index[name] in block_of
        )
        for p in policies
    )
    return RecomputeChoices(
        tuple(sorted(blocks)),
        block_of,
        [len(tables.ops[op.name].signatures) for op in order],
        policies,
        copied,
    )


def tile(rc: RecomputeChoices, u: int, v: int | None, values: np.ndarray) -> np.ndarray:
    """``values`` per choice of ``u`` (and of ``v``: a matrix) repeated over the policies: a
    term that does not depend on them."""
    if v is None:
        return np.tile(values, rc.states(u))
    return np.tile(values, (rc.states(u), rc.states(v)))


def expand_edge(rc: RecomputeChoices, u: int, v: int, keep: np.ndarray, recompute: np.ndarray) -> np.ndarray:
    """Edge ``u -> v``'s cost over the policies ``(p_u, p_v)``: ``recompute`` (the edge priced
    with both ends recomputed) where :func:`autopar.cost.iteration.boxed_again_in_recompute`
    (``u`` recomputed under ``p_u``, ``v`` under ``p_v``), else ``keep``.  A node in no block
    has the one policy ``off``; ``inf`` where ``u`` and ``v`` share a block and their
    policies differ (the one place that forbids a block two policies)."""
    pu, pv = range(rc.states(u)), range(rc.states(v))
    out = np.block(
        [
            [recompute if boxed_again_in_recompute(rc.copies(u, a), rc.copies(v, b)) else keep for b in pv]
            for a in pu
        ]
    )
    if rc.doubled(u) and rc.doubled(v) and rc.block_of[u] == rc.block_of[v]:
        nu, nv = rc.signatures[u], rc.signatures[v]
        out = out.copy()
        for a in pu:
            for b in pv:
                if a != b:
                    out[a * nu : (a + 1) * nu, b * nv : (b + 1) * nv] = np.inf
    return out


def doubled_costs(
    tables: CostTables, rc: RecomputeChoices
) -> tuple[list[np.ndarray], list[tuple[int, int, np.ndarray]]]:
    """Node costs and edges of the multiplied problem: the tables' edges in their order, then
    the agreement edges that join each block's ops into one policy."""
    (keep_nodes, keep_edges), (rec_nodes, rec_edges) = recompute_table_costs(tables, training_of(tables))
    nodes = [
        np.concatenate([r if rc.copies(i, p) else k for p in range(rc.states(i))]) if rc.doubled(i) else k
        for i, (k, r) in enumerate(zip(keep_nodes, rec_nodes))
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
    """Whether a tensor is live at one position, by policy: ``live[home][reader]`` (``home``:
    the policy of its producer's block; ``reader``: the policy of ``edge``'s consumer's
    block).  ``edge`` is None when the reader's policy does not matter (then ``live[h][0]``
    is it)."""

    tensor: str
    live: tuple[tuple[bool, ...], ...]
    edge: int | None


@dataclass(frozen=True)
class _Lives:
    """Each tensor's spans with every block under policy ``h`` (first index) and every
    reader block under policy ``r`` (second index), and its exact reader's edge."""

    spans: tuple[tuple[dict[str, list[tuple[int, int]]], ...], ...]
    edge_of: dict[str, int | None]
    """Tensor -> the edge into its one reader block (None: no reader block, or several,
    priced as the reader policies that hold it longest: an upper bound)."""


def _policy_units(rc: RecomputeChoices, policy: BlockPolicy) -> frozenset[str]:
    return policy_units(dict.fromkeys(rc.blocks, policy))


def _lives(tables: CostTables, rc: RecomputeChoices) -> _Lives:
    graph: Graph = tables.graph
    fused = fused_kernels(graph, tables.runtime).internal
    units = [_policy_units(rc, p) for p in rc.policies]
    spans = tuple(
        tuple(tensor_spans(graph, dropped, held, unmaterialized=fused) for held in units) for dropped in units
    )
    readers = block_readers(graph, frozenset(rc.blocks))
    edge_of: dict[str, int | None] = {t: None for t in readers}
    wanted = {t: next(iter(r)) for t, (_, r) in readers.items() if len(r) == 1}
    for e_index, e in enumerate(tables.edges):
        block = wanted.get(e.tensor)
        consumer = graph.op_by_name[e.consumer]
        if block is not None and edge_of[e.tensor] is None and layer_of(e.consumer) == block:
            edge_of[e.tensor] = e_index if consumer.role is Role.FORWARD else None
    return _Lives(spans, edge_of)


def live_terms(tables: CostTables, rc: RecomputeChoices, positions: Sequence[int]) -> list[list[LiveTerm]]:
    """For each of ``positions``: the tensors live there under some policies, with how."""
    lives = _lives(tables, rc)
    m = len(rc.policies)
    out: list[list[LiveTerm]] = []
    for pos in positions:
        found: list[LiveTerm] = []
        for tname in lives.spans[0][0]:
            live = tuple(
                tuple(any(s <= pos <= e for s, e in lives.spans[h][r][tname]) for r in range(m))
                for h in range(m)
            )
            if not any(any(x) for x in live):
                continue
            edge = lives.edge_of.get(tname)
            if edge is None:  # no reader block, or several: held as long as any reader policy holds it
                live = tuple((any(row),) * m for row in live)
            elif all(len(set(row)) == 1 for row in live):
                edge = None  # the reader's policy does not matter here
            found.append(LiveTerm(tname, live, edge))
        out.append(found)
    return out


def least_spans(tables: CostTables) -> list[tuple[str, int, int]]:
    """Live spans no plan goes below, for the memory floors: under ``auto`` the positions
    where a tensor is live under every block policy with no block holding the tensors it
    reads (the intersection of each policy's spans,
    :func:`autopar.cost.activation_spans.tensor_spans`); else the spans of the configured
    checkpointing."""
    training: TrainingConfig = training_of(tables)
    graph = tables.graph
    fused = fused_kernels(graph, tables.runtime).internal
    if training.checkpointing != "auto":
        units = checkpoint_units(graph, training)
        return [
            (t, s, e)
            for t, spans in tensor_spans(graph, units, units, unmaterialized=fused).items()
            for s, e in spans
        ]
    blocks = candidate_blocks(graph)
    policies = block_policies(tables.runtime)
    least: dict[str, list[tuple[int, int]]] | None = None
    for policy in policies:
        dropped = policy_units(dict.fromkeys(blocks, policy))
        spans = tensor_spans(graph, dropped, frozenset(), unmaterialized=fused)
        least = spans if least is None else {t: _intersect(least[t], spans[t]) for t in least}
    assert least is not None
    return [(t, s, e) for t, spans in least.items() for s, e in spans]


def _intersect(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The positions in both unions of closed spans ``a`` and ``b``, as spans."""
    out = []
    for s1, e1 in a:
        for s2, e2 in b:
            s, e = max(s1, s2), min(e1, e2)
            if s <= e:
                out.append((s, e))
    return sorted(out)
