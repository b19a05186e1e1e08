"""CP-SAT model of a :class:`~autopar_solver.problem.Problem` (OR-Tools >= 9.15, snake_case API).

::

    data      Problem (usually already reduced), options, hint
    vars      x[i, p]  one Bool per finite choice p of node i
              X[i, g]  one literal per group g of identical choices seen by an edge
                       (x itself when the group has one member, else a Bool = sum x)
              z[e, g, h] pair literals, see "edges"
    (C1)      exactly one x[i, p] per node                       (one signature per op)
    edges     M[a, b] is grouped into identical rows g and columns h, then split
              M = row[g] + col[h] + D[g, h]    (row, col folded into x coefficients)
              D == 0 and no inf    -> no variable at all
              "full"   (C2) sum_h z[g, h] = X[g],  sum_g z[g, h] = Y[h]   over finite
                       entries only, so forbidden pairs have no z (Alpa-style marginals,
                       tight LP); needed when the edge carries memory terms
              "sparse" (C3) z <-> X[g] and Y[h] for D[g, h] > 0 only,
                       (C4) not(X[g] and Y[h]) for inf entries
    (C5)      memory rows: sum ceil(bytes / unit) * lit <= floor((budget - constant) / unit)
    objective minimise sum round(scale * cost) * lit

Units and rounding.  Costs are seconds * ``scale`` rounded to integers, with
``scale`` chosen so that every coefficient is at most 1e9 and any objective is
below 2**50; each node and each edge contributes one rounded coefficient to an
assignment, so the integer objective differs from the float one by at most
``rounding_error_s = 0.5 * (nodes + edges) / scale`` seconds.  Memory is counted
in ``unit`` bytes (a power of two, 1 byte unless a row would exceed 2**31 units);
coefficients round up and the right-hand side rounds down, so a plan the model
accepts fits in bytes.  ``stats["memory_exact"]`` is True when nothing was
rounded (whole multiples of ``unit``); then "infeasible" is exact too.
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
from autopar_solver.options import Progress, ProgressFn, SolverOptions
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

COEF_MAX = 1e9
"""Largest objective coefficient after scaling."""
TOTAL_MAX = float(2**50)
"""Largest objective value of any assignment after scaling."""
MEMORY_UNITS_MAX = 2**31
"""Largest memory row total in units."""
_ENCODINGS = ("auto", "full", "sparse")
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


@dataclass
class _EdgePlan:
    u: int
    v: int
    row_group: np.ndarray
    col_group: np.ndarray
    pair: np.ndarray
    """D[g, h] seconds; inf = forbidden."""
    memory: dict[int, np.ndarray]
    """Row index -> bytes per group pair (full encoding only)."""
    encoding: str


class _OutOfTime(Exception):
    """The model's build reached its deadline (:meth:`_Builder.check_clock`)."""


class _Builder:
    """Builds the model; keeps what extraction and hints need."""

    def __init__(
        self, problem: Problem, encoding: str, with_objective: bool, deadline: float | None = None
    ) -> None:
        if encoding not in _ENCODINGS:
            raise ValueError(f"encoding must be one of {_ENCODINGS}, got {encoding!r}")
        self.problem = problem
        self.encoding = encoding
        self.model = cp_model.CpModel()
        self.infeasible = False
        self.x: list[dict[int, cp_model.IntVar]] = []
        self.groups: dict[tuple[int, bytes], list[cp_model.IntVar | None]] = {}
        self.group_vars: list[tuple[cp_model.IntVar, int, np.ndarray]] = []
        self.node_obj = [c.copy() for c in problem.node_costs]
        self.plans: list[_EdgePlan] = []
        self.counts: dict[str, int] = {
            "edges_none": 0,
            "edges_full": 0,
            "edges_sparse": 0,
            "pair_vars": 0,
            "group_vars": 0,
            "forbidden_pairs": 0,
        }
        self.with_objective = with_objective
        self.scale = 1.0
        self.constant_s = 0.0
        """Seconds taken out of the node coefficients (added back to the objective)."""
        self.memory_unit = 1.0
        self.memory_exact = True
        self.edge_z: dict[int, list[tuple[cp_model.IntVar, int, int]]] = {}
        self.deadline = deadline
        """``time.perf_counter()`` past which building stops (:class:`_OutOfTime`); None: never."""

    def check_clock(self, i: int) -> None:
        """Raise :class:`_OutOfTime` past the deadline (looked at every 256th item ``i``)."""
        if self.deadline is not None and i % 256 == 0 and time.perf_counter() >= self.deadline:
            raise _OutOfTime

    # ------------------------------------------------------------ variables
    def make_node_vars(self) -> None:
        for i, costs in enumerate(self.problem.node_costs):
            finite = np.flatnonzero(np.isfinite(costs))
            if finite.size == 0:
                self.infeasible = True
            lits = {int(p): self.model.new_bool_var(f"x_{i}_{p}") for p in finite}
            self.x.append(lits)
            # (C1) one signature per op.
            self.model.add_exactly_one(list(lits.values()))

    def group_literal(self, node: int, members: np.ndarray) -> cp_model.IntVar | None:
        """Literal true iff ``node`` takes one of ``members`` (None if none is allowed)."""
        live = [self.x[node][int(p)] for p in members if int(p) in self.x[node]]
        if not live:
            return None
        if len(live) == 1:
            return live[0]
        key = (node, np.asarray(members, dtype=np.int64).tobytes())
        cached = self.groups.get(key)
        if cached is not None:
            return cached[0]
        lit = self.model.new_bool_var(f"g_{node}_{len(self.group_vars)}")
        self.model.add(sum(live) == lit)
        self.groups[key] = [lit]
        self.group_vars.append((lit, node, np.asarray(members)))
        self.counts["group_vars"] += 1
        return lit

    # ---------------------------------------------------------------- edges
    def plan_edges(self, with_memory: bool) -> None:
        rows = self.problem.memory_rows if with_memory else []
        edge_mem: dict[int, dict[int, np.ndarray]] = {}
        for r, row in enumerate(rows):
            for e, t in row.edge_terms.items():
                edge_mem.setdefault(e, {})[r] = t
        for e, (u, v, matrix) in enumerate(self.problem.edges):
            self.check_clock(e)
            mems = edge_mem.get(e, {})
            if u == v:
                raise AutoparError(
                    "self_loop",
                    f"edge {e} joins node {u} to itself; run autopar_solver.reductions first "
                    "(it folds self-loops into node costs)",
                )
            self.plans.append(self._plan(u, v, matrix, mems))

    def _plan(self, u: int, v: int, matrix: np.ndarray, mems: dict[int, np.ndarray]) -> _EdgePlan:
        live_u = np.array([p in self.x[u] for p in range(matrix.shape[0])])
        live_v = np.array([q in self.x[v] for q in range(matrix.shape[1])])
        stacked_rows = np.hstack([matrix, *[mems[r] for r in sorted(mems)]])
        stacked_cols = np.hstack([matrix.T, *[mems[r].T for r in sorted(mems)]])
        _, row_group = np.unique(stacked_rows, axis=0, return_inverse=True)
        _, col_group = np.unique(stacked_cols, axis=0, return_inverse=True)
        row_group = row_group.reshape(-1)
        col_group = col_group.reshape(-1)
        n_g, n_h = int(row_group.max()) + 1, int(col_group.max()) + 1
        first_row = np.array([np.flatnonzero(row_group == g)[0] for g in range(n_g)])
        first_col = np.array([np.flatnonzero(col_group == h)[0] for h in range(n_h)])
        pair = matrix[np.ix_(first_row, first_col)].copy()
        live_g = np.array([live_u[row_group == g].any() for g in range(n_g)])
        live_h = np.array([live_v[col_group == h].any() for h in range(n_h)])
        if not self.with_objective:
            pair = np.where(np.isfinite(pair), 0.0, np.inf)  # only forbidden pairs matter
        masked = np.where(live_g[:, None] & live_h[None, :], pair, np.inf)
        # Split off row and column parts (over allowed pairs) into node coefficients.
        row_part = masked.min(axis=1)
        row_part = np.where(np.isfinite(row_part), row_part, 0.0)
        col_part = (masked - row_part[:, None]).min(axis=0)
        col_part = np.where(np.isfinite(col_part), col_part, 0.0)
        pair = pair - row_part[:, None] - col_part[None, :]
        scale = float(np.abs(matrix[np.isfinite(matrix)]).max(initial=0.0))
        pair[np.abs(pair) <= 16 * np.finfo(np.float64).eps * scale] = 0.0
        self.node_obj[u] = self.node_obj[u] + row_part[row_group]
        self.node_obj[v] = self.node_obj[v] + col_part[col_group]
        memory = {r: t[np.ix_(first_row, first_col)] for r, t in mems.items()}
        live = live_g[:, None] & live_h[None, :]
        forbidden = int((np.isinf(pair) & live).sum())
        nonzero = int(((pair != 0) & np.isfinite(pair) & live).sum())
        finite = int((np.isfinite(pair) & live).sum())
        if memory:
            encoding = "full"
        elif nonzero == 0 and forbidden == 0:
            encoding = "none"
        elif self.encoding != "auto":
            encoding = self.encoding
        else:
            # Full marginals have a tight LP but need a z for every allowed pair.
            encoding = "full" if finite <= 3 * (nonzero + forbidden) + 16 else "sparse"
        return _EdgePlan(u, v, row_group, col_group, pair, memory, encoding)

    def choose_scale(self) -> None:
        # Exactly one choice per node: its smallest finite cost is a constant.
        for i, c in enumerate(self.node_obj):
            finite = np.isfinite(c)
            low = float(c[finite].min()) if finite.any() else 0.0
            self.node_obj[i] = c - low
            self.constant_s += low
        coefs = [np.abs(c[np.isfinite(c)]) for c in self.node_obj]
        coefs += [np.abs(p.pair[np.isfinite(p.pair)]) for p in self.plans if p.encoding != "none"]
        max_coef = max((float(c.max()) for c in coefs if c.size), default=0.0)
        total = sum(float(c.max()) for c in coefs if c.size)
        if max_coef == 0.0:
            self.scale = 1.0
        else:
            self.scale = min(COEF_MAX / max_coef, TOTAL_MAX / total)

    def _int(self, seconds: np.ndarray) -> np.ndarray:
        return np.rint(seconds * self.scale).astype(np.int64)

    def build_edges(self) -> tuple[list[cp_model.IntVar], list[int]]:
        """Create pair literals and constraints (C2)-(C4); return objective terms."""
        obj_vars: list[cp_model.IntVar] = []
        obj_coefs: list[int] = []
        for e, plan in enumerate(self.plans):
            self.check_clock(e)
            if plan.encoding == "none":
                self.counts["edges_none"] += 1
                continue
            n_g, n_h = plan.pair.shape
            xs = [self.group_literal(plan.u, np.flatnonzero(plan.row_group == g)) for g in range(n_g)]
            ys = [self.group_literal(plan.v, np.flatnonzero(plan.col_group == h)) for h in range(n_h)]
            coefs = self._int(np.where(np.isfinite(plan.pair), plan.pair, 0.0))
            self.counts[f"edges_{plan.encoding}"] += 1
            zs: list[tuple[cp_model.IntVar, int, int]] = []
            for g in range(n_g):
                for h in range(n_h):
                    xg, yh = xs[g], ys[h]
                    if xg is None or yh is None:
                        continue
                    allowed = math.isfinite(plan.pair[g, h])
                    if plan.encoding == "full":
                        if allowed:
                            zs.append((self.model.new_bool_var(f"z_{e}_{g}_{h}"), g, h))
                    elif not allowed:
                        # (C4) forbidden pair.
                        self.model.add_bool_or([xg.Not(), yh.Not()])
                        self.counts["forbidden_pairs"] += 1
                    elif coefs[g, h] != 0:
                        # (C3) z <-> (xg and yh): exact, so the objective is exact too.
                        z = self.model.new_bool_var(f"z_{e}_{g}_{h}")
                        self.model.add_bool_or([xg.Not(), yh.Not(), z])
                        self.model.add_implication(z, xg)
                        self.model.add_implication(z, yh)
                        zs.append((z, g, h))
            if plan.encoding == "full":
                # (C2) marginals: group g is taken iff exactly one allowed pair of row g is.
                for g in range(n_g):
                    if xs[g] is not None:
                        self.model.add(sum(z for z, zg, _ in zs if zg == g) == xs[g])
                for h in range(n_h):
                    if ys[h] is not None:
                        self.model.add(sum(z for z, _, zh in zs if zh == h) == ys[h])
            self.counts["pair_vars"] += len(zs)
            self.edge_z[e] = zs
            for z, g, h in zs:
                if coefs[g, h] != 0:
                    obj_vars.append(z)
                    obj_coefs.append(int(coefs[g, h]))
        return obj_vars, obj_coefs

    def node_objective(self) -> tuple[list[cp_model.IntVar], list[int]]:
        obj_vars: list[cp_model.IntVar] = []
        obj_coefs: list[int] = []
        for i, lits in enumerate(self.x):
            coefs = self._int(np.where(np.isfinite(self.node_obj[i]), self.node_obj[i], 0.0))
            for p, lit in lits.items():
                if coefs[p] != 0:
                    obj_vars.append(lit)
                    obj_coefs.append(int(coefs[p]))
        return obj_vars, obj_coefs

    def set_objective(self, variables: Sequence[cp_model.IntVar], coefs: Sequence[int]) -> None:
        # Written straight into the proto: model.minimize() on 1e5+ terms costs ~0.4 s.
        objective = self.model.proto.objective
        objective.vars.extend([v.index for v in variables])
        objective.coeffs.extend([int(c) for c in coefs])

    # --------------------------------------------------------------- memory
    def memory_rows(self) -> list[tuple[float, list[cp_model.IntVar], list[float]]]:
        """Per row: (bytes always there, literals, extra bytes of each literal)."""
        rows = []
        for r, row in enumerate(self.problem.memory_rows):
            base = float(row.constant)
            lits: list[cp_model.IntVar] = []
            extra: list[float] = []
            for i, t in row.terms.items():
                live = sorted(self.x[i])
                if not live:
                    continue
                low = float(t[live].min())
                base += low
                for p in live:
                    if t[p] > low:
                        lits.append(self.x[i][p])
                        extra.append(float(t[p]) - low)
            for e, _ in row.edge_terms.items():
                plan = self.plans[e]
                zs = self.edge_z.get(e, [])
                if not zs:
                    continue
                values = [float(plan.memory[r][g, h]) for _, g, h in zs]
                low = min(values)
                base += low
                for (z, _, _), value in zip(zs, values, strict=True):
                    if value > low:
                        lits.append(z)
                        extra.append(value - low)
            rows.append((base, lits, extra))
        return rows

    def choose_memory_unit(
        self, rows: list[tuple[float, list[cp_model.IntVar], list[float]]], with_base: bool
    ) -> None:
        """Smallest power-of-two unit keeping every row's variable part below 2**31 units
        (and the constant part too when it enters the model, ``with_base``)."""
        largest = max((sum(extra) for _, _, extra in rows), default=0.0)
        if with_base:
            largest = max([largest] + [abs(base) for base, _, _ in rows])
        unit = 1.0
        while largest / unit > MEMORY_UNITS_MAX:
            unit *= 2.0
        self.memory_unit = unit
        self.memory_exact = all(float(v / unit).is_integer() for _, _, extra in rows for v in extra) and (
            not with_base or all(float(base / unit).is_integer() for base, _, _ in rows)
        )

    def add_memory_limits(self, budget: float) -> None:
        rows = self.memory_rows()
        self.choose_memory_unit(rows, with_base=False)
        unit = self.memory_unit
        for base, lits, extra in rows:
            # (C5) coefficients round up, the right-hand side rounds down: model-feasible
            # implies byte-feasible.
            rhs = math.floor((budget - base) / unit)
            coefs = [math.ceil(v / unit) for v in extra]
            if rhs < 0:
                self.infeasible = True
            self.model.add(cp_model.LinearExpr.weighted_sum(lits, coefs) <= rhs)

    def add_memory_peak(self) -> cp_model.IntVar:
        """``peak >= every row`` (in units); returns ``peak``."""
        rows = self.memory_rows()
        self.choose_memory_unit(rows, with_base=True)
        unit = self.memory_unit
        upper = max(
            (math.ceil(base / unit) + sum(math.ceil(v / unit) for v in extra) for base, _, extra in rows),
            default=0,
        )
        lower = min((math.floor(base / unit) for base, _, _ in rows), default=0)
        peak = self.model.new_int_var(min(lower, 0), max(upper, 0), "peak")
        for base, lits, extra in rows:
            coefs = [math.ceil(v / unit) for v in extra]
            self.model.add(cp_model.LinearExpr.weighted_sum(lits, coefs) + math.ceil(base / unit) <= peak)
        return peak

    # ----------------------------------------------------------------- hints
    def add_hint(self, choices: Sequence[int]) -> int:
        """Hint every node, group and pair literal from ``choices``; returns #hinted."""
        hint_vars: list[int] = []
        hint_values: list[int] = []
        for i, lits in enumerate(self.x):
            for p, lit in lits.items():
                hint_vars.append(lit.index)
                hint_values.append(int(p == choices[i]))
        for lit, node, members in self.group_vars:
            hint_vars.append(lit.index)
            hint_values.append(int(choices[node] in members))
        for e, zs in self.edge_z.items():
            plan = self.plans[e]
            g0 = plan.row_group[choices[plan.u]]
            h0 = plan.col_group[choices[plan.v]]
            for z, g, h in zs:
                hint_vars.append(z.index)
                hint_values.append(int(g == g0 and h == h0))
        hint = self.model.proto.solution_hint
        hint.vars.extend(hint_vars)
        hint.values.extend(hint_values)
        return len(hint_vars)

    def extract(self, solver: cp_model.CpSolver) -> list[int]:
        choices = []
        for lits in self.x:
            pick = next((p for p, lit in lits.items() if solver.boolean_value(lit)), None)
            if pick is None:
                raise AutoparError(
                    "solver_bad_solution", "CP-SAT returned a solution with no choice for a node"
                )
            choices.append(pick)
        return choices


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
        params.max_time_in_seconds = 4 * time_limit_s
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
    except _OutOfTime:
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
) -> tuple[_Builder, int]:
    """The CP-SAT model of ``problem`` (objective floored at ``lower_bound_s``, memory
    limits, the hint); returns its builder and the number of hinted variables.  Raises
    :class:`_OutOfTime` when building reaches ``deadline`` (``time.perf_counter()``)."""
    builder = _Builder(problem, encoding, with_objective=True, deadline=deadline)
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
    solver: cp_model.CpSolver, builder: _Builder, progress: ProgressFn | None, offset: float, t0: float
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
    solver: cp_model.CpSolver, builder: _Builder, code: Any, rounding: float, stats: dict[str, Any]
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
    builder = _Builder(problem, "sparse", with_objective=False)
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
    builder = _Builder(problem, "sparse", with_objective=False, deadline=deadline)
    try:
        built = _build_feasibility(builder, problem, hint)
    except _OutOfTime:
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


def _build_feasibility(builder: _Builder, problem: Problem, hint: Sequence[int] | None) -> bool:
    """The feasibility model of :func:`find_feasible` in ``builder``; False when it is
    infeasible as built (:class:`_OutOfTime` past the builder's deadline)."""
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
