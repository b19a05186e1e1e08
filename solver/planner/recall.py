"""Stage 4: the solve memo's recall (a recalled plan is re-checked here) and its write.

What earlier solves of this very problem proved (:mod:`autopar_solver.solve_memo`) is
read before the memory rounds; its plan is rebuilt on the problem, its objective
recomputed, and the evaluator re-checks it as it does a solver's plan
(:func:`~autopar_solver.planner.verify.verify`).  A plan that passes is the answer when
its gap is within the requested one, else where the rounds start.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from autopar.cost.evaluate import evaluate
from autopar.cost.tables import CostTables
from autopar.errors import VerificationError
from autopar.hardware.mesh import Mesh
from autopar.infra.store import KeyValueStore
from autopar.ir.graph import Graph
from autopar.ir.plan import Plan
from autopar_solver.options import SolverOptions
from autopar_solver.planner.memory_rows import assignment, build_problem, chosen_training
from autopar_solver.planner.recompute import recompute_choices
from autopar_solver.planner.verify import VERIFY_RTOL, SolvedObjective, verify
from autopar_solver.problem import Solution
from autopar_solver.problem import evaluate as evaluate_problem
from autopar_solver.solve_memo import MemoEntry, memo_keys, remember

__all__ = ["MemoRecall", "Verified"]

Verified = tuple[Plan, Any, Solution]
"""A plan, its evaluation, and the solution it came from, re-checked."""


@dataclass
class MemoRecall:
    """The solve memo (:mod:`autopar_solver.solve_memo`) for one mesh's solve.

    Without an entry for this budget, the problem's entry without a budget serves when its
    plan fits: its bound is one of a relaxation (no memory rows), so it holds under any
    budget.  What is stored is merged with the entries as read, or as another solve stored
    them since (:func:`~autopar_solver.solve_memo.remember`), so only a better plan or a
    greater bound replaces what is there; an entry whose plan does not verify is replaced.
    """

    key: str | None = None
    free_key: str | None = None
    stored: MemoEntry | None = None
    """The entry for this budget as read (None: absent, or it did not verify)."""
    stored_free: MemoEntry | None = None
    """The entry without a budget as read (when this call has a budget; None when absent or
    when it has memory rows, which no entry of the problem without a budget has)."""
    raw: bytes | None = None
    """The stored bytes of :attr:`stored` as read (what a write replaces)."""
    raw_free: bytes | None = None
    """The stored bytes of :attr:`stored_free` as read."""
    rejected: bool = False
    """The entry for this budget did not verify: a write replaces it instead of merging."""
    rejected_free: bool = False
    """The entry without a budget has memory rows: a write replaces it instead of merging."""
    entry: MemoEntry | None = None
    """The entry this solve answers from or starts from."""
    plan: Verified | None = None
    """Its plan, evaluation and solution, re-checked."""
    stats: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(
        cls, store: KeyValueStore | None, options: SolverOptions, tables: CostTables, budget: int | None
    ) -> MemoRecall:
        """The entries of this problem (none in deterministic runs: the memo would make the
        answer depend on earlier runs)."""
        out = cls()
        if store is not None and not options.deterministic:
            how = {
                "seed": options.seed,
                "use_hint": options.use_hint,
                "reductions": options.reductions,
                "max_model_vars": options.max_model_vars,
                # the iteration priced: absent at K = 1 without checkpointing (keys unchanged)
                **({} if options.training.is_default else {"training": options.training.to_dict()}),
            }
            out.key, out.free_key = memo_keys(tables, budget, how)
            found = store.get_many([out.key, out.free_key])
            out.raw = found.get(out.key)
            out.stored = MemoEntry.from_bytes(out.raw) if out.raw is not None else None
            if out.free_key != out.key:
                out.raw_free = found.get(out.free_key)
                out.stored_free = MemoEntry.from_bytes(out.raw_free) if out.raw_free is not None else None
                if out.stored_free is not None and out.stored_free.positions:
                    out.stored_free, out.rejected_free = None, True
        out.stats = {"key": out.key, "found": out.stored is not None, "verified": False}
        return out

    @property
    def found(self) -> bool:
        return self.stored is not None or self.stored_free is not None

    def recall(
        self, graph: Graph, mesh: Mesh, zero_stage: int, tables: CostTables, budget: int | None
    ) -> None:
        """Re-check the entry for this budget, else the one without a budget."""
        if self.stored is not None:
            self.plan = recalled(graph, mesh, zero_stage, tables, self.stored, budget)
            if self.plan is None:
                self.stored, self.rejected = None, True  # replaced by this solve's result
            self.entry = self.stored
        if self.plan is None and self.stored_free is not None:
            self.plan = recalled(graph, mesh, zero_stage, tables, self.stored_free, budget)
            if self.plan is not None:
                self.entry = self.stored_free
                self.stats["found"] = "without a budget"
        self.stats["verified"] = self.plan is not None

    def write(
        self, store: KeyValueStore, graph: Graph, solution: Solution, positions: list[int], without_rows: bool
    ) -> None:
        """Keep the verified ``solution`` (solved with memory rows at ``positions``); also as the
        problem's without a budget when no memory row was ever added (``without_rows``)."""
        if self.key is None:
            return
        names = [op.name for op in graph.topological_order]
        found = MemoEntry(dict(zip(names, solution.choices)), positions, solution.objective, solution.bound)
        self.stats["stored"] = remember(store, self.key, found, self.raw, rejected=self.rejected)
        if self.free_key is not None and self.free_key != self.key and without_rows:
            remember(store, self.free_key, found, self.raw_free, rejected=self.rejected_free)


def recalled(
    graph: Graph,
    mesh: Mesh,
    zero_stage: int,
    tables: CostTables,
    memo: MemoEntry,
    budget: int | None,
) -> Verified | None:
    """The solve memo's plan, re-checked as a solver result is (:func:`verify`): its objective
    recomputed on the problem equal to the stored one, the evaluator's step time equal to it,
    its memory within the budget; None when any of that fails."""
    t0 = time.perf_counter()
    # under checkpointing auto a plan solved with memory rows may recompute blocks: the
    # problem with the memo's rows has those choices
    n = len(graph.ops)
    rows = [p for p in memo.positions if 0 <= p < n] if recompute_choices(tables) is not None else None
    built = build_problem(tables, budget, rows)
    choices = _choices(memo, built.op_names, built.problem.num_choices)
    if choices is None:
        return None
    objective, _ = evaluate_problem(built.problem, choices)
    if not math.isfinite(objective) or not math.isclose(objective, memo.objective, rel_tol=VERIFY_RTOL):
        return None
    candidate = Plan.from_assignment(
        graph,
        mesh,
        zero_stage,
        assignment(built, choices),
        memory_budget_bytes=budget,
        runtime=tables.runtime.name,
        training=chosen_training(built, choices),  # the iteration it was solved for
    )
    ev = evaluate(graph, candidate)
    try:
        verify(ev, SolvedObjective(objective), budget, graph)
    except VerificationError:
        return None
    bound = min(memo.bound, objective)
    gap = 0.0 if objective <= 0 else max(0.0, (objective - bound) / objective)
    solution = Solution(
        choices,
        objective,
        bound,
        gap,
        "optimal" if gap == 0 else "feasible",
        time.perf_counter() - t0,
        {"source": "memo", "phases_s": {"recall": time.perf_counter() - t0}},
    )
    return candidate, ev, solution


def _choices(memo: MemoEntry, op_names: list[str], num_choices: list[int]) -> list[int] | None:
    """The memo's choice of each op in ``op_names``' order; None when an op is missing,
    is extra, or has a choice its node does not have."""
    if len(memo.choices) != len(op_names):
        return None
    choices: list[int] = []
    for name, n in zip(op_names, num_choices):
        c = memo.choices.get(name)
        if c is None or c >= n:
            return None
        choices.append(c)
    return choices
