"""Stage 2: the numeric problem of the cost tables, and where its memory rows come from.

One node per op (choices: its N-D signatures, costs: their compute seconds), one edge
per producer->consumer port pair (its boxing matrix), and one memory row per
constrained topological position ``p``::

    row[p] = ZeRO-3 gather buffer                     (constant, replicated upper bound)
           + sum_v states_v(choice of v's op)         (every variable's model states)
           + sum_(t live at p) bytes_t(choice of t's producer)   (live activations)
           + sum_(e into the op at p) copy_e(choices of e's ends) (its boxed inputs)

in bytes per device, each term a pure function of :mod:`autopar.memory`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from autopar.cost_tables import CostTables
from autopar.graph import DTYPE_BYTES
from autopar.iteration import activation_spans, table_costs, training_of, variable_memory_bytes
from autopar.memory import (
    boxed_copy_bytes,
    graph_state_bytes,
    zero3_gather_buffer_bytes,
)
from autopar.sbp import B, NdSbp, Signature
from autopar_solver.problem import MemoryRow, Problem

__all__ = ["BuiltProblem", "assignment", "build_problem", "state_terms", "zero3_buffer_bytes"]


@dataclass
class BuiltProblem:
    """A numeric problem and how its nodes map back to the graph."""

    problem: Problem
    tables: CostTables
    op_names: list[str]


def build_problem(
    tables: CostTables,
    budget_bytes: float | None,
    positions: list[int] | None = None,
) -> BuiltProblem:
    """Numeric problem of ``tables``: one node per op, one edge per producer->consumer port pair.

    ``positions`` are topological positions whose live memory becomes a hard row
    (model states of every variable + activations live there).
    """
    order = tables.graph.topological_order
    index = {op.name: i for i, op in enumerate(order)}
    # the iteration: K x per-micro-batch + once per step (the tables' own arrays at K = 1, off)
    node_costs, edges = table_costs(tables, training_of(tables))
    rows = _memory_rows(tables, index, positions) if positions else []
    problem = Problem(
        node_names=[op.name for op in order],
        node_costs=node_costs,
        edges=edges,
        memory_rows=rows,
        budget_bytes=budget_bytes if rows else None,
        labels=_labels(tables),
    )
    return BuiltProblem(problem, tables, [op.name for op in order])


def _labels(tables: CostTables) -> list[list[str]]:
    """Each node's choices as printed signatures (identical layers share op tables: each
    table is printed once)."""
    label_memo: dict[int, list[str]] = {}
    labels = []
    for op in tables.graph.topological_order:
        table = tables.ops[op.name]
        lab = label_memo.get(id(table))
        if lab is None:
            lab = label_memo[id(table)] = [str(s) for s in table.signatures]
        labels.append(lab)
    return labels


def _memory_rows(tables: CostTables, index: dict[str, int], positions: list[int]) -> list[MemoryRow]:
    """The memory row of each of ``positions`` (see the module docstring)."""
    graph = tables.graph
    order = graph.topological_order
    states = state_terms(tables, index)
    # checkpointing: a recomputed tensor is live twice (autopar.iteration.activation_spans)
    spans = activation_spans(graph, training_of(tables))
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
    """Op name -> signature of ``choices`` (one per node of ``built``)."""
    return {name: built.tables.ops[name].signatures[c] for name, c in zip(built.op_names, choices)}
