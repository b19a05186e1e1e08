"""Numeric solver on synthetic problems: what the reductions remove, how solves end.

    .venv/bin/python -m benchmarks.solver_synthetic [--sizes 1000,5000] [--choices 30]
        [--time-limit 30] [--workers 2] [--skip-solve]

Problems come from :func:`autopar_solver.synthetic.synthetic_problem`: ``chain`` (a
forward chain with skip edges) and ``ladder`` (forward chain, mirrored backward
chain, an edge from each forward op to its backward op), without memory rows
and with one peak row whose budget sits halfway between the least and the most
memory any plan could use.

Part 1 prints, per problem, nodes / choices / edges before and after the
reductions and the share of nodes each node reduction removed (leaf, chain,
singleton, isolated) and of choices each choice reduction removed.
Part 2 solves each problem with :func:`autopar_solver.solve.solve` and prints the
strategy (one CP-SAT model or windows), the heuristic's cost, the final
objective, bound and gap, and seconds per phase.
"""

from __future__ import annotations

import argparse
import time

from autopar_solver.options import SolverOptions
from autopar_solver.reductions import reduce_problem
from autopar_solver.solve import solve
from autopar_solver.synthetic import synthetic_problem

CASES = (("chain", None), ("chain", 0.5), ("ladder", None), ("ladder", 0.5))


def _pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:5.1f}%" if whole else "  -  "


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,5000")
    ap.add_argument("--choices", type=int, default=30)
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--skip-solve", action="store_true")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    print("reductions (share of the original nodes / choices removed by each)")
    print(
        f"{'shape':<7}{'memory':<7}{'nodes':>7}{'->':>7}{'choices':>9}{'->':>8}{'edges':>7}{'->':>7}"
        f"{'leaf':>8}{'chain':>8}{'single':>8}{'isol':>8}{'domin':>8}{'inf':>8}{'mem':>8}"
        f"{'time s':>8}"
    )
    problems = []
    for n in sizes:
        for shape, fraction in CASES:
            problem = synthetic_problem(
                n, args.choices, seed=args.seed, shape=shape, budget_fraction=fraction
            )
            problems.append((shape, fraction, problem))
            start = time.perf_counter()
            reduction = reduce_problem(problem)
            elapsed = time.perf_counter() - start
            before, after = reduction.stats["before"], reduction.stats["after"]
            removed = reduction.stats["removed"]
            print(
                f"{shape:<7}{'none' if fraction is None else fraction:<7}"
                f"{before['nodes']:>7}{after['nodes']:>7}{before['choices']:>9}{after['choices']:>8}"
                f"{before['edges']:>7}{after['edges']:>7}"
                f"{_pct(removed.get('nodes_leaf', 0), before['nodes']):>8}"
                f"{_pct(removed.get('nodes_chain', 0), before['nodes']):>8}"
                f"{_pct(removed.get('nodes_singleton', 0), before['nodes']):>8}"
                f"{_pct(removed.get('nodes_isolated', 0), before['nodes']):>8}"
                f"{_pct(removed.get('choices_dominated', 0), before['choices']):>8}"
                f"{_pct(removed.get('choices_infeasible', 0), before['choices']):>8}"
                f"{_pct(removed.get('choices_memory', 0), before['choices']):>8}"
                f"{elapsed:>8.2f}"
            )
            blocked = removed.get("chain_blocked_memory", 0) + removed.get("leaf_blocked_memory", 0)
            if blocked:
                print(f"{'':<14}folds refused for lack of a Pareto-best choice: {blocked}")
    if args.skip_solve:
        return

    print(f"\nsolve (time limit {args.time_limit:.0f} s, {args.workers} workers)")
    print(
        f"{'shape':<7}{'memory':<7}{'nodes':>7}{'strategy':>9}{'size':>9}{'heuristic':>11}"
        f"{'objective':>11}{'bound':>11}{'gap':>8}{'wall s':>8}  phases s"
    )
    options = SolverOptions(time_limit_s=args.time_limit, workers=args.workers)
    for shape, fraction, problem in problems:
        solution = solve(problem, options)
        stats = solution.stats
        phases = " ".join(f"{k}={v:.1f}" for k, v in stats["phases_s"].items())
        print(
            f"{shape:<7}{'none' if fraction is None else fraction:<7}{problem.num_nodes:>7}"
            f"{stats.get('strategy', '-'):>9}{stats.get('model_size', 0):>9}"
            f"{stats['heuristic']['cost']:>11.5g}{solution.objective:>11.5g}"
            f"{solution.bound:>11.5g}{100 * solution.gap:>7.2f}%{solution.wall_s:>8.1f}  {phases}"
        )


if __name__ == "__main__":
    main()
