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

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from autopar.errors import AutoparError
from autopar_solver.problem import Problem

__all__ = ["COEF_MAX", "MEMORY_UNITS_MAX", "TOTAL_MAX", "ModelBuilder", "OutOfTime"]

COEF_MAX = 1e9
"""Largest objective coefficient after scaling."""
TOTAL_MAX = float(2**50)
"""Largest objective value of any assignment after scaling."""
MEMORY_UNITS_MAX = 2**31
"""Largest memory row total in units."""
_ENCODINGS = ("auto", "full", "sparse")


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


class OutOfTime(Exception):
    """The model's build reached its deadline (:meth:`ModelBuilder.check_clock`)."""


class ModelBuilder:
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
        """``time.perf_counter()`` past which building stops (:class:`OutOfTime`); None: never."""

    def check_clock(self, i: int) -> None:
        """Raise :class:`OutOfTime` past the deadline (looked at every 256th item ``i``)."""
        if self.deadline is not None and i % 256 == 0 and time.perf_counter() >= self.deadline:
            raise OutOfTime

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
