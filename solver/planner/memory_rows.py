"""Stage 2: the numeric problem of the cost tables, and where its memory rows come from.

One node per op (choices: its N-D signatures, costs: their compute seconds), one edge
per producer->consumer port pair (its boxing matrix), and one memory row per
constrained topological position ``p``::

    row[p] = ZeRO-3 gather buffer                     (constant, replicated upper bound)
           + sum_v states_v(choice of v's op)         (every variable's model states)
           + sum_(t live at p) bytes_t(choice of t's producer)   (live activations)
           + sum_(e into the op at p) copy_e(choices of e's ends) (its boxed inputs)

in bytes per device, each term a pure function of :mod:`autopar.cost.memory`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from autopar.cost.activation_spans import activation_spans, variable_memory_bytes
from autopar.cost.fusion import fused_kernels
from autopar.cost.memory import boxed_copy_bytes, graph_state_bytes, zero3_gather_buffer_bytes
from autopar.cost.tables import CostTables
from autopar.cost.weighted_tables import table_costs, training_of
from autopar.ir.graph import DTYPE_BYTES
from autopar.ir.sbp import B, NdSbp, Signature
from autopar.ir.training import TrainingConfig
from autopar_solver.planner.recompute import (
    LiveTerm,
    RecomputeChoices,
    doubled_costs,
    live_terms,
    recompute_choices,
    tile,
)
from autopar_solver.planner.siblings import agreement_matrix, sibling_ties
from autopar_solver.problem import MemoryRow, Problem

__all__ = [
    "BuiltProblem",
    "assignment",
    "build_problem",
    "chosen_training",
    "fit_choices",
    "state_terms",
    "zero3_buffer_bytes",
]


@dataclass
class BuiltProblem:
    """A numeric problem and how its nodes map back to the graph."""

    problem: Problem
    tables: CostTables
    op_names: list[str]
    recompute: RecomputeChoices | None = None
    """Under checkpointing ``auto``: the nodes whose choices are doubled (recompute or keep
    their block, :mod:`.recompute`); None otherwise."""


def build_problem(
    tables: CostTables,
    budget_bytes: float | None,
    positions: list[int] | None = None,
) -> BuiltProblem:
    """Numeric problem of ``tables``: one node per op, one edge per producer->consumer port pair.

    ``positions`` are topological positions whose live memory becomes a hard row
    (model states of every variable + activations live there).  Under checkpointing
    ``auto`` with rows and a budget, the forward ops of the blocks have their choices
    doubled (:mod:`.recompute`); without rows every block keeps its activations, which is
    exact: recomputing never saves time, only memory.
    """
    order = tables.graph.topological_order
    index = {op.name: i for i, op in enumerate(order)}
    training = training_of(tables)
    # checkpointing auto: recompute or keep per block, a choice (module .recompute); without
    # memory rows every block keeps (exact: recomputing only saves memory)
    rc = recompute_choices(tables) if positions and budget_bytes is not None else None
    if rc is None:
        # the iteration: K x per-micro-batch + once per step (the tables' own arrays at K = 1, off)
        kept = TrainingConfig(training.micro_batches) if training.checkpointing == "auto" else training
        node_costs, edges = table_costs(tables, kept)
        rows = _memory_rows(tables, index, positions) if positions else []
    else:
        node_costs, edges = doubled_costs(tables, rc)
        rows = _auto_memory_rows(tables, rc, index, positions or [])
    edges = _tie_siblings(tables, rc, index, edges)
    problem = Problem(
        node_names=[op.name for op in order],
        node_costs=node_costs,
        edges=edges,
        memory_rows=rows,
        budget_bytes=budget_bytes if rows else None,
        labels=_labels(tables, rc),
    )
    return BuiltProblem(problem, tables, [op.name for op in order], rc)


def _tie_siblings(
    tables: CostTables,
    rc: RecomputeChoices | None,
    index: dict[str, int],
    edges: list[tuple[int, int, np.ndarray]],
) -> list[tuple[int, int, np.ndarray]]:
    """``edges`` with each sibling linear's edge after its group's first free and an
    agreement edge from that first one (:mod:`.siblings`); the tables' edges keep their
    indices."""
    ties = sibling_ties(tables)
    if not ties:
        return edges
    out = list(edges)
    for tie in ties:
        u, v, matrix = out[tie.member]
        out[tie.member] = (u, v, np.zeros_like(matrix))
        lead = index[tables.edges[tie.leader].consumer]
        agree = agreement_matrix(tables, tie)
        out.append((lead, v, agree if rc is None else tile(rc, lead, v, agree)))
    return out


def _labels(tables: CostTables, rc: RecomputeChoices | None) -> list[list[str]]:
    """Each node's choices as printed signatures (identical layers share op tables: each
    table is printed once); a block's node's choices under a recompute policy marked
    ``[policy]``."""
    label_memo: dict[int, list[str]] = {}
    labels = []
    for i, op in enumerate(tables.graph.topological_order):
        table = tables.ops[op.name]
        lab = label_memo.get(id(table))
        if lab is None:
            lab = label_memo[id(table)] = [str(s) for s in table.signatures]
        labels.append(
            [f"{x} [{p.name}]" if p.recomputes else x for p in rc.policies for x in lab]
            if rc is not None and rc.doubled(i)
            else lab
        )
    return labels


def _memory_rows(tables: CostTables, index: dict[str, int], positions: list[int]) -> list[MemoryRow]:
    """The memory row of each of ``positions`` (see the module docstring)."""
    graph = tables.graph
    order = graph.topological_order
    states = state_terms(tables, index)
    # checkpointing: a recomputed tensor is live twice (autopar.cost.activation_spans.activation_spans)
    # a fused kernel's internal tensors are never in memory (autopar.cost.fusion)
    spans = activation_spans(
        graph, training_of(tables), unmaterialized=fused_kernels(graph, tables.runtime).internal
    )
    by_consumer: dict[int, list[int]] = {}
    for e_index, e in enumerate(tables.edges):
        by_consumer.setdefault(index[e.consumer], []).append(e_index)
    # gathered parameters at their largest (replicated) size: an upper bound that does not
    # depend on the choices (the evaluator uses the chosen layouts)
    zero3 = zero3_buffer_bytes(tables) if tables.zero_stage >= 3 else 0.0
    rows = []
    for pos in positions:
        terms = {i: t.copy() for i, t in states.items()}
        # the boxed copy a consumer receives is live while it runs
        edge_terms = {e_index: _boxed_copy_terms(tables, e_index) for e_index in by_consumer.get(pos, [])}
        for tname, start, end in spans:
            if start <= pos <= end:
                _add_activation(tables, index, tname, terms)
        rows.append(MemoryRow(f"live@{pos}:{order[pos].name}", zero3, terms, edge_terms))
    return rows


def _auto_memory_rows(
    tables: CostTables, rc: RecomputeChoices, index: dict[str, int], positions: list[int]
) -> list[MemoryRow]:
    """The memory rows under checkpointing ``auto``: the terms of :func:`_memory_rows` over
    the doubled choices, each live activation by its producer's flag and, where it matters,
    by its one reader block's flag (an edge term; see :mod:`.recompute`)."""
    graph = tables.graph
    order = graph.topological_order
    states = state_terms(tables, index)
    by_consumer: dict[int, list[int]] = {}
    for e_index, e in enumerate(tables.edges):
        by_consumer.setdefault(index[e.consumer], []).append(e_index)
    zero3 = zero3_buffer_bytes(tables) if tables.zero_stage >= 3 else 0.0
    rows = []
    for pos, live in zip(positions, live_terms(tables, rc, positions)):
        terms = {i: tile(rc, i, None, t) for i, t in states.items()}
        edge_terms: dict[int, np.ndarray] = {}
        for e_index in by_consumer.get(pos, []):
            e = tables.edges[e_index]
            copies = _boxed_copy_terms(tables, e_index)
            edge_terms[e_index] = tile(rc, index[e.producer], index[e.consumer], copies)
        for term in live:
            _add_live_term(tables, rc, index, term, terms, edge_terms)
        rows.append(MemoryRow(f"live@{pos}:{order[pos].name}", zero3, terms, edge_terms))
    return rows


def _add_live_term(
    tables: CostTables,
    rc: RecomputeChoices,
    index: dict[str, int],
    term: LiveTerm,
    terms: dict[int, np.ndarray],
    edge_terms: dict[int, np.ndarray],
) -> None:
    """Add live activation ``term.tensor``'s bytes by its producer's choice (and flag), or
    by the pair of choices of the edge into its reader block when that block's flag matters."""
    graph = tables.graph
    pname, out_port = graph.producer[term.tensor]
    i = index[pname]
    k = list(graph.op_by_name[pname].outputs).index(out_port)
    spec = graph.tensors[term.tensor]
    vec = _output_bytes(tables, pname, k, spec.numel * DTYPE_BYTES[spec.dtype])
    policies = range(rc.states(i))
    # bytes per choice of the producer, by the policy of its reader block
    by_reader = [np.concatenate([vec * term.live[h][r] for h in policies]) for r in range(len(rc.policies))]
    if term.edge is None:
        terms[i] = terms[i] + by_reader[0] if i in terms else by_reader[0]
        return
    v = index[tables.edges[term.edge].consumer]
    n_v = rc.signatures[v]
    matrix = np.hstack([np.repeat(by_reader[r][:, None], n_v, axis=1) for r in range(rc.states(v))])
    edge_terms[term.edge] = edge_terms[term.edge] + matrix if term.edge in edge_terms else matrix


def zero3_buffer_bytes(tables: CostTables) -> float:
    """ZeRO-3's gather buffer with every parameter replicated (its largest size, bytes)."""
    graph = tables.graph
    replicated = NdSbp(tuple(B for _ in tables.mesh.shape))
    return zero3_gather_buffer_bytes(graph, {v.op: replicated for v in graph.variables}, tables.mesh.shape)


def _boxed_copy_terms(tables: CostTables, e_index: int) -> np.ndarray:
    """Bytes of the boxed copy edge ``e_index``'s consumer receives, per (producer choice,
    consumer choice): 0 where the layouts agree."""
    graph = tables.graph
    e = tables.edges[e_index]
    cop = graph.op_by_name[e.consumer]
    pop = graph.op_by_name[e.producer]
    ii, oi = list(cop.inputs).index(e.in_port), list(pop.outputs).index(e.out_port)
    spec = graph.tensors[e.tensor]
    src = [s.outputs[oi] for s in tables.ops[e.producer].signatures]
    dst = [s.inputs[ii] for s in tables.ops[e.consumer].signatures]
    return np.array(
        [
            [0.0 if a == b else boxed_copy_bytes(spec.numel, spec.dtype, b, tables.mesh.shape) for b in dst]
            for a in src
        ],
        dtype=np.float64,
    )


def _add_activation(
    tables: CostTables, index: dict[str, int], tname: str, terms: dict[int, np.ndarray]
) -> None:
    """Add live activation ``tname``'s bytes per choice of its producer to ``terms``."""
    graph = tables.graph
    pname, out_port = graph.producer[tname]
    pop = graph.op_by_name[pname]
    k = list(pop.outputs).index(out_port)
    spec = graph.tensors[tname]
    vec = _output_bytes(tables, pname, k, spec.numel * DTYPE_BYTES[spec.dtype])
    i = index[pname]
    terms[i] = terms[i] + vec if i in terms else vec


def _output_bytes(tables: CostTables, op_name: str, port_index: int, nbytes: float) -> np.ndarray:
    mesh_shape = tables.mesh.shape
    sigs = tables.ops[op_name].signatures
    return np.array([nbytes / s.outputs[port_index].split_factor(mesh_shape) for s in sigs], dtype=np.float64)


def state_terms(tables: CostTables, index: dict[str, int]) -> dict[int, np.ndarray]:
    """Node -> bytes of its variable's model states (params, grads, optimizer) per choice
    (each node gets its own array; identical layers' variables are priced once)."""
    graph = tables.graph
    terms: dict[int, np.ndarray] = {}
    priced: dict[tuple[Any, ...], np.ndarray] = {}
    training = training_of(tables)
    for v in graph.variables:
        spec = graph.tensors[v.tensor]
        table = tables.ops[v.op]
        out_index = list(graph.op_by_name[v.op].outputs.values()).index(v.tensor)
        per_element = graph_state_bytes(graph, v)
        key = (id(table), out_index, tuple(spec.shape), per_element)
        found = priced.get(key)
        if found is None:
            found = priced[key] = np.array(
                [
                    sum(
                        variable_memory_bytes(  # model states + accumulation buffer (K > 1)
                            spec.shape,
                            s.outputs[out_index],
                            tables.mesh.shape,
                            tables.zero_stage,
                            per_element,
                            tables.runtime.zero_sharding.value,
                            training,
                            tables.runtime,
                        )
                    )
                    for s in table.signatures
                ],
                dtype=np.float64,
            )
        terms[index[v.op]] = found.copy()
    return terms


def assignment(built: BuiltProblem, choices: list[int]) -> dict[str, Signature]:
    """Op name -> signature of ``choices`` (one per node of ``built``; a doubled node's
    choice ``n + c`` is signature ``c``, recomputed)."""
    out = {}
    for name, c in zip(built.op_names, choices):
        sigs = built.tables.ops[name].signatures
        out[name] = sigs[c % len(sigs)]
    return out


def fit_choices(built: BuiltProblem, choices: list[int]) -> list[int]:
    """``choices`` of a problem of the same tables (with or without doubled choices) as
    choices of ``built``: a recompute choice its node does not have becomes its signature,
    kept."""
    counts = built.problem.num_choices
    return [
        c if c < n else c % len(built.tables.ops[name].signatures)
        for c, n, name in zip(choices, counts, built.op_names)
    ]


def chosen_training(built: BuiltProblem, choices: list[int]) -> TrainingConfig:
    """The training configuration of ``choices``: the tables' own, with the blocks the
    choices recompute under checkpointing ``auto``."""
    training = training_of(built.tables)
    if built.recompute is None:
        return training
    return training.with_recomputed(built.recompute.recomputed(choices))
