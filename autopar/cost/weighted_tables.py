"""Cost tables weighted by how often each op runs in one iteration: K times per step for the
micro-batch's ops, once for the optimizer, twice for a recomputed forward
(:func:`table_costs`, :func:`recompute_table_costs`), and the training configuration a table
was priced for (:func:`with_training`, :func:`training_of`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from autopar.cost.compute import rule_context
from autopar.cost.edges import EdgeKind, edge_kind
from autopar.cost.iteration import RunCounts, run_counts
from autopar.cost.tables import CostTables
from autopar.cost.zero_gathers import optimizer_gather_time
from autopar.ir.optimizer import model_port_index, weight_gradient_path
from autopar.ir.training import TrainingConfig

__all__ = ["recompute_table_costs", "table_costs", "training_of", "weighted_costs", "with_training"]


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
    ZeRO gathers taken apart with :func:`autopar.cost.zero_gathers.optimizer_gather_time` per choice.
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
