"""Layer tying: give structurally identical ops one shared choice.

A training step of an L-layer transformer repeats the same ops L times.
:func:`structural_classes` colours ops by Weisfeiler-Lehman refinement of
their content keys (op kind, attrs, shapes) over the graph's edges: after
``rounds`` refinements two ops share a colour when their ``rounds``-hop
neighbourhoods look the same, which is the case for the same op in two
identical layers away from the stack's ends.

:func:`tie` turns a :class:`~autopar_solver.problem.Problem` into one node per colour:

* node cost = sum of the members' costs (choices are the same signatures);
* an edge between members of colours ``U != V`` adds its matrix to the
  ``(U, V)`` edge; an edge inside one colour adds its diagonal to the node;
* memory terms of members add up.

For any tied assignment the tied objective equals the original objective of
the expanded assignment, so the tied optimum is an upper bound of the original
optimum (a restriction of it).  :func:`untie` expands a tied assignment.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from autopar_solver.problem import MemoryRow, Problem

__all__ = ["structural_classes", "tie", "untie"]


def structural_classes(
    keys: Sequence[str],
    edges: Sequence[tuple[int, int, str]],
    signature_counts: Sequence[int],
    rounds: int = 3,
) -> list[int]:
    """Colour nodes by WL refinement; returns a class index per node.

    ``keys`` are content keys (equal keys -> same choices and costs);
    ``edges`` are ``(u, v, label)`` with a label naming the ports;
    nodes with different numbers of choices never share a class.
    """
    n = len(keys)
    colour = [f"{k}|{c}" for k, c in zip(keys, signature_counts)]
    succ: list[list[tuple[int, str]]] = [[] for _ in range(n)]
    pred: list[list[tuple[int, str]]] = [[] for _ in range(n)]
    for u, v, label in edges:
        succ[u].append((v, label))
        pred[v].append((u, label))
    for _ in range(rounds):
        new = []
        for i in range(n):
            ins = sorted(f"{label}<{colour[u]}" for u, label in pred[i])
            outs = sorted(f"{label}>{colour[v]}" for v, label in succ[i])
            h = hashlib.blake2b(digest_size=12)
            h.update(colour[i].encode())
            for s in ins:
                h.update(s.encode())
            h.update(b"|")
            for s in outs:
                h.update(s.encode())
            new.append(h.hexdigest())
        colour = new
    index: dict[str, int] = {}
    return [index.setdefault(c, len(index)) for c in colour]


def tie(problem: Problem, classes: Sequence[int]) -> Problem:
    """The problem where every class of nodes takes one shared choice."""
    if len(classes) != problem.num_nodes:
        raise ValueError(f"{len(classes)} classes for {problem.num_nodes} nodes")
    k = max(classes) + 1 if classes else 0
    node_costs: list[np.ndarray | None] = [None] * k
    names: list[str] = [""] * k
    labels: list[list[str]] | None = [[] for _ in range(k)] if problem.labels is not None else None
    for i, c in enumerate(classes):
        cost = problem.node_costs[i]
        if node_costs[c] is None:
            node_costs[c] = cost.copy()
            names[c] = problem.node_names[i]
            if labels is not None and problem.labels is not None:
                labels[c] = list(problem.labels[i])
        else:
            existing = node_costs[c]
            assert existing is not None
            if existing.shape != cost.shape:
                raise ValueError(f"class {c} mixes nodes with different numbers of choices")
            node_costs[c] = existing + cost
    edge_sum: dict[tuple[int, int], np.ndarray] = {}
    for u, v, m in problem.edges:
        cu, cv = classes[u], classes[v]
        if cu == cv:
            diag = np.diag(m).copy()
            node_costs[cu] = node_costs[cu] + diag  # type: ignore[operator]
            continue
        key = (cu, cv)
        edge_sum[key] = edge_sum[key] + m if key in edge_sum else m.copy()
    edge_index = {key: j for j, key in enumerate(edge_sum)}
    rows = []
    for row in problem.memory_rows:
        acc: dict[int, np.ndarray] = {}
        for i, t in row.terms.items():
            c = classes[i]
            acc[c] = acc[c] + t if c in acc else t.copy()
        # an edge term (bytes per pair of choices, e.g. a boxed copy at the consumer) goes
        # with its edge: onto the tied edge, or onto the class's diagonal when both ends
        # fall in one class (they take the same choice)
        edge_acc: dict[int, np.ndarray] = {}
        for e, t in row.edge_terms.items():
            u, v, _ = problem.edges[e]
            cu, cv = classes[u], classes[v]
            if cu == cv:
                diag = np.diag(t).copy()
                acc[cu] = acc[cu] + diag if cu in acc else diag
            else:
                j = edge_index[(cu, cv)]
                edge_acc[j] = edge_acc[j] + t if j in edge_acc else t.copy()
        rows.append(MemoryRow(row.name, row.constant, dict(acc), edge_acc))
    return Problem(
        node_names=names,
        node_costs=[c for c in node_costs if c is not None],
        edges=[(u, v, m) for (u, v), m in edge_sum.items()],
        memory_rows=rows,
        budget_bytes=problem.budget_bytes,
        labels=labels,
    )


def untie(classes: Sequence[int], tied_choices: Sequence[int]) -> list[int]:
    """Expand one choice per class into one choice per node."""
    return [int(tied_choices[c]) for c in classes]
