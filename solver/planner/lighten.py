"""Checkpointing ``auto``: from a layout with every block recomputed, each block's cheapest
recompute policy that keeps the memory rows within the budget, one block at a time.

A memory round under ``auto`` starts from the last plan's layout with every block recomputed
whole (the least activation memory of that layout, :func:`.rounds._constrain_peak`).  That
hint is a plan the solver must beat, and a poor one: a block whose norms alone free enough
recomputes its whole forward.  :func:`lighten` walks the blocks in order and gives each the
policy of least objective whose memory rows stay within the budget (the other blocks as
they are), so the round starts from a plan with far less recomputation.  Greedy, on the
problem's own objective and rows (exact for the rows constrained; the evaluator checks the
rest before the plan is kept).
"""

from __future__ import annotations

from autopar_solver.planner.memory_rows import BuiltProblem
from autopar_solver.problem import evaluate as evaluate_problem

__all__ = ["lighten"]


def lighten(built: BuiltProblem, choices: list[int]) -> list[int]:
    """``choices`` (of ``built``'s multiplied problem) with each block, in turn, under the
    policy of least objective whose memory rows fit ``built``'s budget (module docstring);
    ``choices`` itself when ``built`` has no recompute choices or no budget."""
    rc, problem = built.recompute, built.problem
    budget = problem.budget_bytes
    if rc is None or budget is None or min(choices, default=-1) < 0:
        return list(choices)
    nodes: dict[str, list[int]] = {}
    for i, block in rc.block_of.items():
        nodes.setdefault(block, []).append(i)
    current = list(choices)
    for block in rc.blocks:
        best: tuple[float, list[int]] | None = None
        for policy in range(len(rc.policies)):
            trial = list(current)
            for i in nodes.get(block, []):
                trial[i] = rc.choice(i, current[i] % rc.signatures[i], policy)
            cost, rows = evaluate_problem(problem, trial)
            if all(r <= budget for r in rows) and (best is None or cost < best[0]):
                best = (cost, trial)
        if best is not None:
            current = best[1]
    return current
