"""Size of a model's planning problem on each mesh shape, counted without pricing it.

    .venv/bin/python -m benchmarks.problem_size [--model mt5-base] [--mesh-shapes 4,2 2,4 2,2,2]

What the solver gets before its reductions: one node per op with one choice per
valid N-D signature (the op rules, :func:`autopar.cost.compute.op_signatures`), one
matrix per edge with |producer signatures| x |consumer signatures| entries
(edges into shape-only ports carry no data and are left out, as the cost tables
leave them out); each entry is a boxing the cost tables price (identical
layers share them).  Nothing is priced here, so this runs in seconds even where
the cost tables would not.
"""

from __future__ import annotations

import argparse
import time

from autopar.cost.compute import op_signatures, rule_context
from autopar.cost.edges import EdgeKind, edge_kind
from autopar.hardware.mesh import parse_mesh_shape
from autopar.ir.graph import Graph
from autopar.models import build
from autopar.rules.registry import default_rules
from autopar.runtimes.registry import runtime_profile


def problem_size(graph: Graph, mesh_shape: tuple[int, ...], zero_stage: int = 2) -> dict[str, int]:
    """Ops, choices (all and the most of one op), edges and edge entries."""
    rules = default_rules()
    profile = runtime_profile(None)  # the default runtime's
    sharding, lowering = profile.zero_sharding.value, profile.lowering.value
    counts: dict[str, int] = {}
    for op in graph.ops:
        sigs, _ = op_signatures(rules, rule_context(graph, op, mesh_shape, zero_stage, sharding))
        counts[op.name] = len(sigs)
    edges = entries = 0
    for op in graph.ops:
        for port, tensor in op.inputs.items():
            if edge_kind(op, port, lowering=lowering) is EdgeKind.SHAPE_ONLY:
                continue
            producer, _ = graph.producer[tensor]
            edges += 1
            entries += counts[producer] * counts[op.name]
    return {
        "ops": len(graph.ops),
        "choices": sum(counts.values()),
        "most_choices": max(counts.values(), default=0),
        "edges": edges,
        "edge_entries": entries,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mt5-base")
    ap.add_argument("--mesh-shapes", nargs="+", default=["8", "4,2", "2,4", "2,2,2"])
    ap.add_argument("--zero", type=int, default=2)
    args = ap.parse_args()
    graph = build(args.model)
    print(f"{args.model}, ZeRO-{args.zero}")
    print(f"{'mesh':>8}{'ops':>7}{'choices':>10}{'most':>6}{'edges':>7}{'edge entries':>14}{'s':>6}")
    for text in args.mesh_shapes:
        shape = parse_mesh_shape(text)
        t0 = time.perf_counter()
        size = problem_size(graph, shape, args.zero)
        print(
            f"{text:>8}{size['ops']:>7}{size['choices']:>10}{size['most_choices']:>6}{size['edges']:>7}"
            f"{size['edge_entries']:>14,}{time.perf_counter() - t0:>6.1f}"
        )


if __name__ == "__main__":
    main()
