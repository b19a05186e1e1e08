"""Sibling linears: the matmuls a runtime runs as one GEMM read their input in one layout, boxed once.

A runtime that fuses sibling linears (:attr:`autopar.runtimes.profile.RuntimeProfile.fuses_sibling_linears`:
Megatron-LM's ``query_key_value``, the gated ``dense_h_to_4h``) runs the linears that read one
activation as one GEMM: one input, in one layout, boxed once (an all-gather before the
fused QKV GEMM under sequence parallelism), and likewise the weight-gradient GEMMs that read
that activation in backward.  The evaluator already prices one boxing per tensor and layout
(:func:`autopar.cost.evaluate.evaluate`, ``shared_edges``); the solver, which prices each
edge on its own, sees it through ties (:func:`sibling_ties`):

* per tensor and phase (forward, backward), the matmuls with a weight that read it at their
  activation port form a group; the first in topological order is the leader, whose edge
  carries the boxing;
* each other member's edge costs 0 and an agreement edge from the leader costs ``inf``
  unless both read the tensor in the same layout as the devices hold it
  (:func:`autopar.cost.edges.placed_layout`), so the group is boxed once.

The solver's objective is then the evaluator's iteration with every edge priced on its own
less what the members' edges cost (:func:`sibling_discount`), which
:func:`~.verify.verify` checks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.cost.edges import placed_layout
from autopar.cost.evaluation import Evaluation
from autopar.cost.tables import CostTables
from autopar.ir.graph import Graph, Role
from autopar.ir.structure import MATMUL_OPS, _structure, _weight_input

__all__ = ["SiblingTie", "agreement_matrix", "sibling_discount", "sibling_ties"]


@dataclass(frozen=True)
class SiblingTie:
    """Edge ``member`` (an index of the tables' edges) reads what edge ``leader`` reads, in
    its layout."""

    leader: int
    member: int


def _groups(graph: Graph, edges: list[tuple[str, str, str, str]]) -> list[list[int]]:
    """Indices of ``edges`` (producer, consumer, in port, tensor) into matmuls with a weight
    reading one tensor at their activation port, per tensor and phase, in topological order;
    only groups of two or more."""
    st = _structure(graph)
    position = {op.name: i for i, op in enumerate(graph.topological_order)}
    groups: dict[tuple[str, Role], list[int]] = {}
    for i, (_, consumer, port, tensor) in enumerate(edges):
        op = graph.op_by_name[consumer]
        if op.type not in MATMUL_OPS or op.role is Role.OPTIMIZER:
            continue
        weight = _weight_input(op, st)
        if weight is None or weight == port:
            continue
        groups.setdefault((tensor, op.role), []).append(i)
    ordered = [sorted(members, key=lambda i: position[edges[i][1]]) for members in groups.values()]
    return [members for members in ordered if len(members) > 1]


def sibling_ties(tables: CostTables) -> list[SiblingTie]:
    """The ties of ``tables``' edges (module docstring); none unless its runtime fuses
    sibling linears."""
    if not tables.runtime.fuses_sibling_linears:
        return []
    edges = [(e.producer, e.consumer, e.in_port, e.tensor) for e in tables.edges]
    return [SiblingTie(g[0], m) for g in _groups(tables.graph, edges) for m in g[1:]]


def agreement_matrix(tables: CostTables, tie: SiblingTie) -> np.ndarray:
    """0 where the leader's and the member's signatures read the tensor in the same placed
    layout, ``inf`` elsewhere (leader signatures x member signatures)."""
    shape = tables.mesh.shape

    def layouts(e_index: int) -> list[object]:
        e = tables.edges[e_index]
        op = tables.graph.op_by_name[e.consumer]
        port = list(op.inputs).index(e.in_port)
        return [placed_layout(s.inputs[port], shape) for s in tables.ops[e.consumer].signatures]

    lead, member = layouts(tie.leader), layouts(tie.member)
    return np.array([[0.0 if a == b else np.inf for b in member] for a in lead], dtype=np.float64)


def sibling_discount(graph: Graph, runtime_fuses: bool, ev: Evaluation) -> float:
    """Seconds of the iteration the members' edges cost in evaluation ``ev`` (each record,
    shared or not, weighted as the evaluator weights it): what the solver's objective leaves
    out (module docstring)."""
    if not runtime_fuses:
        return 0.0
    records = [*ev.edges, *ev.shared_edges]
    training = ev.training
    edges = [(r.producer, r.consumer, r.port, r.tensor) for r in records]
    k = training.micro_batches
    total = 0.0
    for group in _groups(graph, edges):
        for i in group[1:]:
            r = records[i]
            total += r.cost_s if training.is_default else r.cost_s * (r.per_micro_batch * k + r.per_step)
    return total
