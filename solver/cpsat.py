"""CP-SAT on a :class:`~autopar_solver.problem.Problem`: the whole problem (:func:`solve_cpsat`),
any plan that fits (:func:`find_feasible`) and the least memory of any plan
(:func:`min_feasible_memory`), with the solver's parameters and progress reports.

The model itself (variables, edge encodings, memory rows, units and rounding) is built by
:class:`~autopar_solver.cpsat_model.ModelBuilder` (:mod:`autopar_solver.cpsat_model`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from ortools.sat.python import cp_model

from autopar.errors import AutoparError
from autopar_solver.cpsat_model import ModelBuilder, OutOfTime
from autopar_solver.options import DETERMINISTIC_WALL_FACTOR, Progress, ProgressFn, SolverOptions
from autopar_solver.problem import Problem, evaluate

__all__ = [
    "CpSatResult",
    "Progress",
    "find_feasible",
    "min_feasible_memory",
    "model_size",
    "solve_cpsat",
]

logger = logging.getLogger("autopar_solver.cpsat")

_SMALL_PORTFOLIO = ("max_lp", "default_lp", "quick_restart", "reduced_costs")
_SMALL_PORTFOLIO_MAX = 5


@dataclass
class CpSatResult:
    """Outcome of one CP-SAT run on a problem (choices index that problem)."""

    status: str
    """"optimal" | "feasible" | "infeasible" | "unknown"."""
    choices: list[int] | None
    objective_s: float | None
    """Integer objective mapped back to seconds (no offsets)."""
    bound_s: float
    """Best bound mapped back to seconds (``-inf`` when none, ``inf`` when infeasible)."""
    rounding_error_s: float
    """Largest difference between integer and float objective for any assignment."""
    stats: dict[str, Any] = field(default_factory=dict)


class _Callback(cp_model.CpSolverSolutionCallback):
    """Reports each improving solution as :class:`Progress` (seconds, original problem)."""

    def __init__(self, progress: ProgressFn, scale: float, offset: float, t0: float) -> None:
        super().__init__()
        self.progress = progress
        self.scale = scale
        self.offset = offset
        self.t0 = t0
        self.solutions = 0

    def on_solution_callback(self) -> None:
        self.solutions += 1
        self.progress(
            Progress(
                "solve",
                self.objective_value / self.scale + self.offset,
                self.best_objective_bound / self.scale + self.offset,
                time.perf_counter() - self.t0,
            )
        )


def _configure(solver: cp_model.CpSolver, options: SolverOptions, time_limit_s: float) -> None:
    params = solver.parameters
    params.num_workers = options.workers
    params.random_seed = options.seed
    params.relative_gap_limit = options.relative_gap
    if options.workers <= _SMALL_PORTFOLIO_MAX:
        # With few workers CP-SAT's default portfolio has no LP-heavy worker, and the
        # marginal encoding's LP bound is what closes the gap (measured: 300-node
        # ladder, 2 workers, 15 s: gap 49 % with the default, 0.8 % with max_lp first).
        params.subsolvers.extend(_SMALL_PORTFOLIO[: max(1, options.workers - 1)])
    params.log_search_progress = options.log
    params.log_to_stdout = False
    if options.log:
        solver.log_callback = logger.info
    if options.deterministic:
        params.interleave_search = True
        params.max_deterministic_time = time_limit_s
        params.max_time_in_seconds = DETERMINISTIC_WALL_FACTOR * time_limit_s
    else:
        params.max_time_in_seconds = time_limit_s


def solve_cpsat(
    problem: Problem,
    options: SolverOptions,
    hint: Sequence[int] | None = None,
    progress: ProgressFn | None = None,
    *,
    offset: float = 0.0,
    time_limit_s: float | None = None,
    t0: float | None = None,
    encoding: str = "auto",
    lower_bound_s: float | None = None,
) -> CpSatResult:
    """Minimise ``problem`` with CP-SAT.

    ``offset`` (seconds) is added to progress reports only (so they speak about
    the original problem).  The search stops ``time_limit_s`` (default
    ``options.time_limit_s``) after ``t0`` (default: now), so time already spent
    by the caller and by building the model counts; in deterministic mode the
    whole limit goes to CP-SAT in its deterministic units.  ``encoding`` forces
    the edge encoding ("full", "sparse") for experiments.  ``lower_bound_s`` (a
    proven bound on ``problem``, e.g. from :mod:`autopar_solver.bounds`) becomes a floor
    on the objective's domain (minus the rounding slack), so CP-SAT's gap test
    and bound start from it.
    """
    t0 = time.perf_counter() if t0 is None else t0
    build_start = time.perf_counter()
    if progress is not None:
        progress(Progress("build", None, None, build_start - t0))
    limit = options.time_limit_s if time_limit_s is None else time_limit_s
    # off the deterministic path the limit covers the build: one past it gives "unknown"
    # (gpt 40 x 6144 on [128, 2], K = 8: a 30 s build in a 10.9 s share)
    deadline = None if options.deterministic else t0 + limit
    try:
        builder, hinted = _build_model(problem, options, hint, encoding, lower_bound_s, deadline)
    except OutOfTime:
        built_s = time.perf_counter() - build_start
        out_of_time = {"build_s": built_s, "solve_s": 0.0, "cpsat_status": "build past the time limit"}
        return CpSatResult("unknown", None, None, -math.inf, 0.0, out_of_time)
    proto = builder.model.proto
    rounding = 0.5 * (problem.num_nodes + len(problem.edges)) / builder.scale
    stats: dict[str, Any] = {
        "constant_s": builder.constant_s,
        "variables": len(proto.variables),
        "constraints": len(proto.constraints),
        "objective_terms": len(proto.objective.vars),
        **builder.counts,
        "scale_per_s": builder.scale,
        "memory_unit_bytes": builder.memory_unit,
        "memory_exact": builder.memory_exact,
        "hinted_vars": hinted,
        "build_s": time.perf_counter() - build_start,
    }
    if builder.infeasible:
        stats["solve_s"] = 0.0
        return CpSatResult("infeasible", None, None, math.inf, rounding, stats)
    solver = cp_model.CpSolver()
    if not options.deterministic:
        limit -= time.perf_counter() - t0
        if limit < _MIN_SOLVE_S:  # nothing left after the build: a solve would only overrun
            stats.update(solve_s=0.0, cpsat_status="no time left after the build")
            return CpSatResult("unknown", None, None, -math.inf, rounding, stats)
    _configure(solver, options, max(limit, 0.05))
    callback = _progress_callbacks(solver, builder, progress, offset, t0)
    solve_start = time.perf_counter()
    code = solver.solve(builder.model, callback)
    stats["solve_s"] = time.perf_counter() - solve_start
    stats["cpsat_status"] = solver.status_name(code)
    stats["deterministic_time"] = solver.deterministic_time
    stats["conflicts"] = solver.num_conflicts
    stats["branches"] = solver.num_branches
    return _result(solver, builder, code, rounding, stats)


def _build_model(
    problem: Problem,
    options: SolverOptions,
    hint: Sequence[int] | None,
    encoding: str,
    lower_bound_s: float | None,
    deadline: float | None = None,
) -> tuple[ModelBuilder, int]:
    """The CP-SAT model of ``problem`` (objective floored at ``lower_bound_s``, memory
    limits, the hint); returns its builder and the number of hinted variables.  Raises
    :class:`OutOfTime` when building reaches ``deadline`` (``time.perf_counter()``)."""
    builder = ModelBuilder(problem, encoding, with_objective=True, deadline=deadline)
    builder.make_node_vars()
    with_memory = problem.budget_bytes is not None
    builder.plan_edges(with_memory)
    builder.choose_scale()
    edge_vars, edge_coefs = builder.build_edges()
    node_vars, node_coefs = builder.node_objective()
    builder.set_objective(node_vars + edge_vars, node_coefs + edge_coefs)
    if lower_bound_s is not None and math.isfinite(lower_bound_s):
        slack = 0.5 * (problem.num_nodes + len(problem.edges)) + 1
        scaled = (lower_bound_s - builder.constant_s) * builder.scale - slack
        # a bound past every plan (a Lagrangian bound of a problem nothing fits grows
        # without limit) may overflow once scaled: no floor then
        floor = math.floor(scaled) if math.isfinite(scaled) else 0
        ceiling = sum(abs(c) for c in node_coefs + edge_coefs) + 1
        if floor > 0 and floor < ceiling:
            builder.model.proto.objective.domain.extend([floor, ceiling])
    if with_memory and problem.budget_bytes is not None:
        builder.add_memory_limits(problem.budget_bytes)
    hinted = 0
    if hint is not None and options.use_hint and not builder.infeasible:
        hinted = builder.add_hint(hint)
    return builder, hinted


def _progress_callbacks(
    solver: cp_model.CpSolver, builder: ModelBuilder, progress: ProgressFn | None, offset: float, t0: float
) -> _Callback | None:
    """Report CP-SAT's solutions and bounds to ``progress`` (in the original problem's seconds)."""
    if progress is None:
        return None
    callback = _Callback(progress, builder.scale, offset + builder.constant_s, t0)
    report = progress
    scale = builder.scale
    shift = offset + builder.constant_s

    def on_bound(bound: float) -> None:
        report(Progress("solve", None, bound / scale + shift, time.perf_counter() - t0))

    solver.best_bound_callback = on_bound
    progress(Progress("solve", None, None, time.perf_counter() - t0))
    return callback


def _result(
    solver: cp_model.CpSolver, builder: ModelBuilder, code: Any, rounding: float, stats: dict[str, Any]
) -> CpSatResult:
    """The solve's outcome in seconds: its plan, objective and bound (CP-SAT's integers
    scaled back)."""
    if code == cp_model.MODEL_INVALID:
        raise AutoparError("solver_model_invalid", f"CP-SAT rejected the model: {builder.model.validate()}")
    if code == cp_model.INFEASIBLE:
        return CpSatResult("infeasible", None, None, math.inf, rounding, stats)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        bound = solver.best_objective_bound / builder.scale + builder.constant_s
        return CpSatResult("unknown", None, None, bound, rounding, stats)
    choices = builder.extract(solver)
    objective_int = round(solver.objective_value)
    bound_int = math.ceil(solver.best_objective_bound - 1e-6)
    # CP-SAT also says OPTIMAL when it stops at relative_gap_limit: trust the numbers.
    status = "optimal" if bound_int >= objective_int else "feasible"
    return CpSatResult(
        status,
        choices,
        objective_int / builder.scale + builder.constant_s,
        min(bound_int, objective_int) / builder.scale + builder.constant_s,
        rounding,
        stats,
    )


def model_size(problem: Problem) -> int:
    """Booleans a full model of ``problem`` would have, at most (choices + grouped pairs).

    Cheap (rows hashed by their bytes); used to decide between one CP-SAT model
    and window search.
    """
    total = sum(int(np.isfinite(c).sum()) for c in problem.node_costs)
    for _, _, matrix in problem.edges:
        rows = _distinct_rows(matrix)
        cols = _distinct_rows(matrix.T)
        total += rows * cols + rows + cols
    return total


def _distinct_rows(matrix: np.ndarray) -> int:
    """Distinct rows of a float matrix (by their bytes: -0.0 and 0.0 count apart, an
    overestimate that is fine for a size estimate)."""
    if matrix.shape[0] <= 1:
        return matrix.shape[0]
    m = np.ascontiguousarray(matrix)
    return len({m[i].tobytes() for i in range(m.shape[0])})


def min_feasible_memory(problem: Problem, options: SolverOptions | None = None) -> tuple[float, bool]:
    """Smallest per-device budget (bytes) for which some plan with finite cost fits.

    Minimises the largest memory row, ignoring time.  Returns ``(bytes, proven)``:
    ``bytes`` is the largest row of the best plan found (evaluated exactly, so a
    budget of ``bytes`` always fits), ``proven`` is True when CP-SAT proved it
    minimal without rounding memory.  ``(inf, True)`` when no plan has finite cost.
    """
    options = options or SolverOptions(time_limit_s=10.0)
    builder = ModelBuilder(problem, "sparse", with_objective=False)
    builder.make_node_vars()
    if builder.infeasible:
        return math.inf, True
    builder.plan_edges(with_memory=True)
    builder.build_edges()
    peak = builder.add_memory_peak()
    builder.model.minimize(peak)
    solver = cp_model.CpSolver()
    _configure(solver, options, options.time_limit_s)
    code = solver.solve(builder.model)
    if code == cp_model.INFEASIBLE:
        return math.inf, True
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return math.inf, False
    choices = builder.extract(solver)
    _, memory = evaluate(problem, choices)
    proven = (
        code == cp_model.OPTIMAL
        and builder.memory_exact
        and solver.best_objective_bound >= solver.objective_value - 1e-6
    )
    return max(memory, default=0.0), proven


def find_feasible(
    problem: Problem,
    options: SolverOptions,
    hint: Sequence[int] | None = None,
    time_limit_s: float | None = None,
) -> list[int] | None:
    """Any plan with finite cost that fits every memory row, ignoring time.

    A much smaller model than :func:`solve_cpsat` (no pair variables except on
    edges with forbidden pairs or pairwise memory), for problems too large for
    one full model when the heuristic found nothing that fits.  None when
    CP-SAT proves there is none or runs out of time.  Off the deterministic path the limit
    covers building the model too: a build that reaches it gives None (on gpt 40 layers x
    6144 on ``[32, 8]``, 3.9M Booleans, the unbounded build took 40 s of an 8 s share).
    """
    limit = options.time_limit_s if time_limit_s is None else time_limit_s
    deadline = None if options.deterministic else time.perf_counter() + limit
    builder = ModelBuilder(problem, "sparse", with_objective=False, deadline=deadline)
    try:
        built = _build_feasibility(builder, problem, hint)
    except OutOfTime:
        return None
    if not built:
        return None
    if deadline is not None:
        limit = deadline - time.perf_counter()
        if limit < _MIN_SOLVE_S:
            return None
    solver = cp_model.CpSolver()
    _configure(solver, options, limit)
    solver.parameters.relative_gap_limit = 0.0
    code = solver.solve(builder.model)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    return builder.extract(solver)


_MIN_SOLVE_S = 0.05
"""Least seconds worth handing CP-SAT after a build that had a deadline."""


def _build_feasibility(builder: ModelBuilder, problem: Problem, hint: Sequence[int] | None) -> bool:
    """The feasibility model of :func:`find_feasible` in ``builder``; False when it is
    infeasible as built (:class:`OutOfTime` past the builder's deadline)."""
    builder.make_node_vars()
    if builder.infeasible:
        return False
    builder.plan_edges(with_memory=problem.budget_bytes is not None)
    builder.build_edges()
    if problem.budget_bytes is not None:
        builder.add_memory_limits(problem.budget_bytes)
    if builder.infeasible:
        return False
    if hint is not None:
        builder.add_hint(hint)
    return True
