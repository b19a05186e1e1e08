"""Synthetic problems shaped like training-step graphs, for tests and benchmarks.

Each node is an op with ``choices`` signatures.  A signature has an input layout
and an output layout drawn from ``layouts`` abstract N-D SBPs, each with a shard
factor (1, 2, 4 or 8 devices share the tensor).  Costs follow the real model's
shape, with made-up constants:

* node cost   = flops / (shard factor of the output) / 100 TFLOP/s  (seconds)
* edge cost   = boxing[out layout of u, in layout of v] * bytes of u / 20 GB/s, where
  ``boxing`` is 0 on the diagonal, 0 for some "slice" moves to a finer layout,
  and 0.5-2 otherwise (seconds)
* memory      = activation bytes / shard factor, for forward ops (saved for backward);
  "weight" ops add ``weight bytes / weight shard`` where a finer weight shard
  costs extra time (a gather), so memory and time pull in opposite directions.

Shapes: ``"chain"`` (a forward chain with occasional skip edges), ``"ladder"``
(forward chain, mirrored backward chain, and an edge from each forward op to
its backward op: the saved activation).  The memory row is one device's peak.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar_solver.problem import MemoryRow, Problem

__all__ = ["synthetic_problem"]


def synthetic_problem(
    n_nodes: int,
    choices: int = 30,
    *,
    seed: int = 0,
    shape: str = "ladder",
    layouts: int = 12,
    skip_prob: float = 0.1,
    weight_fraction: float = 0.3,
    budget_fraction: float | None = 0.5,
    forbidden_prob: float = 0.02,
) -> Problem:
    """A random problem; ``budget_fraction`` places the budget between the least
    and the most memory any assignment could use (None: no memory rows)."""
    if shape not in ("chain", "ladder"):
        raise ValueError(f"shape must be 'chain' or 'ladder', got {shape!r}")
    # one generator, drawn from in this order: layouts, nodes, edges
    rng = np.random.default_rng(seed)
    shard, boxing = _layouts(rng, layouts)
    forward = n_nodes if shape == "chain" else (n_nodes + 1) // 2
    nodes = _nodes(rng, n_nodes, forward, choices, layouts, shard, weight_fraction, forbidden_prob)
    edges = []
    for u, v in _pairs(rng, n_nodes, forward, shape, skip_prob):
        boxes = boxing[np.ix_(nodes.out_layout[u], nodes.in_layout[v])]
        edges.append((u, v, boxes * nodes.act_bytes[u] / 20e9))
    rows, budget = _memory_row(nodes, shard, forward, budget_fraction)
    return Problem(
        node_names=[f"op{i}" for i in range(n_nodes)],
        node_costs=nodes.costs,
        edges=edges,
        memory_rows=rows,
        budget_bytes=budget,
        labels=[
            [f"L{a}->L{b}" for a, b in zip(nodes.in_layout[i], nodes.out_layout[i], strict=True)]
            for i in range(n_nodes)
        ],
    )


def _layouts(rng: np.random.Generator, layouts: int) -> tuple[np.ndarray, np.ndarray]:
    """Each abstract layout's shard factor, and the boxing cost factor between two layouts
    (free towards a finer layout half the time, and to itself)."""
    shard = rng.choice([1, 2, 4, 8], size=layouts)
    boxing = rng.uniform(0.5, 2.0, size=(layouts, layouts))
    finer = shard[None, :] > shard[:, None]
    boxing[finer & (rng.random((layouts, layouts)) < 0.5)] = 0.0
    np.fill_diagonal(boxing, 0.0)
    return shard, boxing


@dataclass
class _Nodes:
    in_layout: list[np.ndarray]
    out_layout: list[np.ndarray]
    act_bytes: np.ndarray
    costs: list[np.ndarray]
    weight_terms: dict[int, np.ndarray]
    """Forward node -> bytes of its weight per choice."""


def _nodes(
    rng: np.random.Generator,
    n: int,
    forward: int,
    choices: int,
    layouts: int,
    shard: np.ndarray,
    weight_fraction: float,
    forbidden_prob: float,
) -> _Nodes:
    """Each node's choices (input and output layouts), activation bytes and costs."""
    k = [int(rng.integers(max(1, choices // 2), choices + 1)) for _ in range(n)]
    out_layout = [rng.integers(0, layouts, size=ki) for ki in k]
    in_layout = [
        np.where(rng.random(ki) < 0.6, out_layout[i], rng.integers(0, layouts, size=ki))
        for i, ki in enumerate(k)
    ]
    act_bytes = np.exp(rng.uniform(np.log(1e6), np.log(1e8), size=n))
    flops = act_bytes * rng.uniform(50, 2000, size=n)
    node_costs = []
    weight_terms: dict[int, np.ndarray] = {}
    for i in range(n):
        cost = flops[i] / shard[out_layout[i]] / 100e12
        cost = cost * rng.uniform(0.9, 1.1, size=k[i])
        if i < forward and rng.random() < weight_fraction:
            weight_shard = rng.choice([1, 2, 4, 8], size=k[i])
            weight_bytes = act_bytes[i] * rng.uniform(1, 20)
            weight_terms[i] = weight_bytes / weight_shard
            cost = cost + (weight_shard - 1) * weight_bytes / 8 / 20e9
        cost[rng.random(k[i]) < forbidden_prob] = np.inf
        if not np.isfinite(cost).any():
            cost[0] = flops[i] / 100e12
        node_costs.append(cost)
    return _Nodes(in_layout, out_layout, act_bytes, node_costs, weight_terms)


def _pairs(
    rng: np.random.Generator, n: int, forward: int, shape: str, skip_prob: float
) -> list[tuple[int, int]]:
    """Edges: a forward chain with skips; a ladder adds the backward chain, each backward
    op fed by its forward mirror."""
    pairs: list[tuple[int, int]] = [(i, i + 1) for i in range(forward - 1)]
    for i in range(forward - 3):
        if rng.random() < skip_prob:
            pairs.append((i, i + int(rng.integers(2, 4))))
    if shape == "ladder":
        backward = list(range(forward, n))
        # Backward op j mirrors forward op forward - 1 - (j - forward).
        for b, j in enumerate(backward):
            mirror = forward - 1 - b
            if b > 0:
                pairs.append((j - 1, j))
            elif forward - 1 >= 0:
                pairs.append((forward - 1, j))
            if 0 <= mirror < forward:
                pairs.append((mirror, j))
    return pairs


def _memory_row(
    nodes: _Nodes, shard: np.ndarray, forward: int, budget_fraction: float | None
) -> tuple[list[MemoryRow], float | None]:
    """One row, the forward activations and weights, and its budget (None: no row)."""
    if budget_fraction is None:
        return [], None
    terms: dict[int, np.ndarray] = {}
    for i in range(forward):
        t = nodes.act_bytes[i] / shard[nodes.out_layout[i]]
        if i in nodes.weight_terms:
            t = t + nodes.weight_terms[i]
        terms[i] = np.floor(t)
    constant = float(np.floor(nodes.act_bytes.sum() * 0.05))
    low = constant + sum(float(t.min()) for t in terms.values())
    high = constant + sum(float(t.max()) for t in terms.values())
    budget = low + budget_fraction * (high - low)
    return [MemoryRow("peak", constant, terms)], budget
