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
    rng = np.random.default_rng(seed)
    shard = rng.choice([1, 2, 4, 8], size=layouts)
    boxing = rng.uniform(0.5, 2.0, size=(layouts, layouts))
    finer = shard[None, :] > shard[:, None]
    boxing[finer & (rng.random((layouts, layouts)) < 0.5)] = 0.0
    np.fill_diagonal(boxing, 0.0)

    n = n_nodes
    forward = n if shape == "chain" else (n + 1) // 2
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
    edges = []
    for u, v in pairs:
        boxes = boxing[np.ix_(out_layout[u], in_layout[v])]
        edges.append((u, v, boxes * act_bytes[u] / 20e9))

    rows: list[MemoryRow] = []
    if budget_fraction is not None:
        terms = {}
        for i in range(forward):
            t = act_bytes[i] / shard[out_layout[i]]
            if i in weight_terms:
                t = t + weight_terms[i]
            terms[i] = np.floor(t)
        constant = float(np.floor(act_bytes.sum() * 0.05))
        low = constant + sum(float(t.min()) for t in terms.values())
        high = constant + sum(float(t.max()) for t in terms.values())
        budget = low + budget_fraction * (high - low)
        rows.append(MemoryRow("peak", constant, terms))
    else:
        budget = None
    return Problem(
        node_names=[f"op{i}" for i in range(n)],
        node_costs=node_costs,
        edges=edges,
        memory_rows=rows,
        budget_bytes=budget,
        labels=[[f"L{a}->L{b}" for a, b in zip(in_layout[i], out_layout[i], strict=True)] for i in range(n)],
    )
