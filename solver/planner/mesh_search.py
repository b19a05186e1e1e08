"""Mesh search: every candidate logical mesh shape, bounded first, the most promising solved
first, the fastest verified plan wins.

::

    first stage (FIRST_STAGE_SHARE of the limit; deterministic runs: every shape, the whole
    limit) over the shapes of up to two axes:
      bound phase (at most BOUND_SHARE of the stage): per shape, its cost tables and a proven
      lower bound on its iteration time (:mod:`.shape_bounds`); shapes proven infeasible drop out
          │  order by bound, least first
          v
      solve phase: per shape in that order, skipped as "proved worse" when its bound is >=
      the best verified plan's iteration time, else solved: the first with all the stage
      left (it stops at its gap target), the others with an equal share of the stage left
      among the shapes still worth solving (bound within PROMISING_RATIO of the least; a
      shape that finishes early leaves its rest to the next)
        │
        v
    the first stage's best plan, when its gap misses the target and the likeliest best
    three-axis shape does not refine its shape: its shape's solve goes on from where it
    stopped (its memo entry), with the time left, stopping at its gap target
        │
        v
    second stage: the three-axis shapes (and any without a bound), ranked by promise (the
    least bound of the shapes each refines by merging two axes):
      the first (likeliest best): solved at once, SECOND_FIRST_SHARE of the time left;
      its row has its solve's proven bound
          │  then the others, the least promising first, one at a time:
          v
      bound first (tables, TRW-S swept until the bound reaches the best plan's iteration time,
      :data:`.shape_bounds.TARGET_SWEEPS` at most), within the time left less what the
      shapes after it need to reach their first sweep (:func:`_bound_share`): "proved
      worse" when it does, else solved with an equal share of what is left; those the
      time does not reach have "no plan" (with their bound, when they have one)

Three-axis shapes are left out of the first stage's bound phase: on mt5-base 4x8 their cost
tables alone take 2-6 s each (six shapes) and their TRW-S layout 3-5 s more, so bounding
them all left none of them a plan within 30 s; bounded after the best three-axis plan, most
are proved worse within a few sweeps (mt5-base 4x8 at 60 s, load 1.3: all five in 57 s).

Every shape is listed in ``plan.diagnostics["mesh_search"]`` with its bound and outcome
(solved, proved worse, no plan); ``plan.solver["stats"]["mesh_search"]`` lists the shapes
solved (with their iteration time), the shapes pruned and those without a plan, with their bounds.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any

from autopar.cost.tables import CostTables
from autopar.errors import InfeasibleError, TimeLimitError
from autopar.hardware.mesh import Mesh, candidate_mesh_shapes
from autopar.infra.progress import Deadline, Progress, ProgressFn
from autopar.infra.store import KeyValueStore, MemoryStore
from autopar.ir.plan import Plan
from autopar_solver.planner.context import MIN_SOLVE_S, PlanContext
from autopar_solver.planner.on_mesh import solve_mesh
from autopar_solver.planner.request import PlanRequest
from autopar_solver.planner.shape_bounds import ShapeBound, shape_bound, shape_tables

__all__ = [
    "BOUND_SHARE",
    "CONTINUE_SHARE",
    "FIRST_SOLVE_FLOOR",
    "FIRST_STAGE_SHARE",
    "PROMISING_RATIO",
    "SECOND_FIRST_SHARE",
    "mesh_search",
]

BOUND_SHARE = 0.5
"""Most of the time limit the bound phase takes (most of it builds the cost tables, which
the solves then use; the TRW-S sweeps are capped at :data:`.shape_bounds.BOUND_SWEEPS`)."""
FIRST_STAGE_SHARE = 0.5
"""Share of the limit for bounding and solving the shapes of up to two axes, before the
three-axis ones (off the deterministic path; :func:`_second_stage`): mt5-base on 4x8 (load 5,
2026-12-04) takes 3.7-7.0 s per three-axis shape for its cost tables alone (120-136M edge
entries), 1.3-1.7 s per two-axis shape, and a three-axis solve needs most of a 30 s limit
to come near its optimum."""
SECOND_FIRST_SHARE = 1.0
"""Share of the time left for the first shape of the second stage (:func:`_second_stage`):
the likeliest best three-axis shape, whose plan is the target the others' bounds are swept
to.  All of it: its solve stops at its gap target and leaves the rest to the others' bounds.
mt5-base on 4x8: ``[4, 2, 4]`` reaches 19.86 ms (0.18 % gap) after 36-42 s of a 60 s limit;
at 75 % of the time left, under load 8, it had 20.5 ms at 60 s and 33.2 ms at 30 s."""
FIRST_SOLVE_FLOOR = 0.5
"""Least share of the time left for the first shape solved (:func:`_solve_bounded`), when the
bound phase overran its part of the stage (tables and sweeps of large graphs on a loaded
machine: gpt 40 x 6144 on 32x8 left ``[32, 8]`` 4.5 s of a 90 s limit)."""
CONTINUE_SHARE = 1.0
"""Share of the time left with which the first stage's best shape goes on solving when its
gap misses the target (:func:`_continue_best`): all of it, as the first three-axis shape
gets (:data:`SECOND_FIRST_SHARE`); its solve stops at its gap target and leaves the rest."""
PROMISING_RATIO = 1.1
"""Bounded shapes share the time with the ones whose bound is within this factor of the
least (:func:`_worth_solving`)."""
PROVED_WORSE = "proved worse"


def mesh_search(request: PlanRequest, ctx: PlanContext) -> Plan:
    """The fastest verified plan of ``request`` over :func:`candidate_mesh_shapes`."""
    t0 = time.perf_counter()
    deadline = ctx.deadline
    shapes = candidate_mesh_shapes(request.cluster)
    deadline.report(ctx.progress, "mesh_search", detail={"shapes": [list(s) for s in shapes]})
    # the tables are built once per shape: kept here between the two phases when there is no
    # memo; so are the solves' memo entries, from which a shape's solve can go on (_continue_best)
    store: KeyValueStore = ctx.store if ctx.store is not None else MemoryStore()
    ctx = replace(ctx, store=store)
    first, later = _stages(request, shapes)
    stage = Deadline(min(FIRST_STAGE_SHARE * deadline.left(), deadline.left())) if later else deadline
    bounds, bound_limit_s = _bound_phase(request, first, store, ctx, stage)
    rows: dict[tuple[int, ...], dict[str, Any]] = {b.shape: _error_row(b) for b in bounds if b.error}
    best = _solve_bounded(request, bounds, rows, stage, store, ctx, bool(later))
    rest = [b for b in bounds if b.error is None and b.bound_s is None] + [ShapeBound(s) for s in later]
    best = _continue_best(request, rows, rest, store, ctx, best)
    # under what the slowest bounded shape took (its tables and bound) a later one has no
    # chance: its tables alone take longer
    floor = max([MIN_SOLVE_S, *(b.wall_s for b in bounds)])
    _second_stage(request, rest, rows, floor, store, ctx, best)
    results = [rows[s] for s in shapes]
    chosen = _fastest(results, deadline)
    if chosen.solver is not None:
        chosen.solver["mesh_search_wall_s"] = time.perf_counter() - t0
        chosen.solver.setdefault("stats", {})["mesh_search"] = _search_stats(
            results, bounds, bound_limit_s, deadline
        )
    return chosen


def _second_stage(
    request: PlanRequest,
    rest: list[ShapeBound],
    rows: dict[tuple[int, ...], dict[str, Any]],
    floor: float,
    store: KeyValueStore,
    ctx: PlanContext,
    best: float,
) -> None:
    """The shapes without a bound after the first stage (the three-axis ones), the most
    promising first (:func:`_promise`), into ``rows``:

    - the first is solved at once, within :data:`SECOND_FIRST_SHARE` of the time left (all
      of it when it is alone): it is the likeliest best, and a bound first would cost its
      TRW-S layout and sweeps twice (and on mt5-base 4x8 never reaches the two-axis plans'
      26.7 ms); its row has its solve's proven bound;
    - the others, the least promising first (the soonest proved worse), are each bounded
      first (:func:`shape_bound`, sweeping until the bound reaches the best plan's iteration time,
      at most :data:`.shape_bounds.TARGET_SWEEPS` sweeps), within :func:`_bound_share` of
      the time left: "proved worse" when the bound reaches the best iteration time, else solved
      within an equal share of what is left among the shapes not done yet;
    - a shape reached with less than ``floor`` seconds left has "no plan"."""
    deadline = ctx.deadline
    ranked = sorted(rest, key=lambda u: _promise(u.shape, rows))
    # after the likeliest best, the least promising first: proved worse in the fewest sweeps
    order = ranked[:1] + ranked[:0:-1]
    setups: list[float] = []  # the later shapes' seconds to their first sweep
    for i, b in enumerate(order):
        n = len(order) - i
        if deadline.left() < floor:
            rows[b.shape] = _no_time_row(b, deadline)
            continue
        if i == 0:
            share = deadline.left() * (SECOND_FIRST_SHARE if n > 1 else 1.0)
            best = _solve_into(rows, request, b, Deadline(share), 1, store, ctx, best)
            continue
        relay = _ShapeRelay(ctx.progress, deadline, b.shape) if ctx.progress else None
        bounding = Deadline(_bound_share(deadline.left(), n, setups))
        b = shape_bound(request, b.shape, store, ctx.for_shape(b.shape, bounding, relay), target=best)
        setups += [b.setup_s] if b.setup_s is not None else []
        ctx.relay().report("mesh_search:bound", detail={"shape": list(b.shape), "bound_s": b.bound_s})
        if b.error is not None:
            rows[b.shape] = _error_row(b)
        elif b.bound_s is not None and b.bound_s >= best:
            rows[b.shape] = _proved_worse_row(b)
            b.tables = None
        elif deadline.left() < MIN_SOLVE_S:
            rows[b.shape] = _no_time_row(b, deadline)  # its bound, not a plan
        else:
            best = _solve_into(rows, request, b, Deadline(deadline.left() / n), n, store, ctx, best)


def _bound_share(left: float, n: int, setups: list[float]) -> float:
    """Seconds for the bound of one of the ``n`` shapes still to bound in the second stage:
    the time ``left`` less what the ``n - 1`` after it need to reach their first sweep (the
    slowest of the ``setups`` so far: tables and TRW-S layout, 5-10 s each on mt5-base 4x8),
    but at least twice that (its own setup and sweeps), and all of it before any setup is
    known.  So one shape's slow sweeps (``[4, 4, 2]`` on 4x8 needs about 30) do not take the
    time the others need to be proved worse in a few (``[2, 4, 4]``, ``[8, 2, 2]``: 5);
    an equal share left each only the trivial bound (its tables and layout did not fit)."""
    if not setups:
        return left
    setup = max(setups)
    return min(left, max(left - (n - 1) * setup, 2 * setup))


def _stages(
    request: PlanRequest, shapes: list[tuple[int, ...]]
) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """The shapes bounded and solved first (up to two axes), and the ones left for after
    them, by promise (three axes); deterministic runs bound every shape first."""
    if request.options.deterministic:
        return shapes, []
    return [s for s in shapes if len(s) <= 2], [s for s in shapes if len(s) > 2]


def _solve_bounded(
    request: PlanRequest,
    bounds: list[ShapeBound],
    rows: dict[tuple[int, ...], dict[str, Any]],
    stage: Deadline,
    store: KeyValueStore,
    ctx: PlanContext,
    more: bool,
) -> float:
    """Solve the shapes with a bound, least bound first, into ``rows``; a shape whose bound
    is at least the best plan's iteration time is "proved worse".  The first gets all that is
    left of ``stage`` (its solve stops at its gap target); each after it an equal share of
    what is left among the shapes still worth solving (one share more when ``more`` shapes
    come after).  An equal share from the start starved the likeliest best shape when
    bounds tie: gpt 40 x 6144 on 32x8 at K = 8, whose no-memory bounds of ``[32, 8]``,
    ``[64, 4]`` and ``[128, 2]`` are within 0.4 %, gave each 8-11 s of a 90 s limit and three
    plans at a 41 % gap (``[32, 8]`` alone needs 30 s for 0.9 %).  The best iteration time."""
    # a shape with only the trivial bound (no TRW-S sweep: its share ran out first, on a
    # loaded machine) says little about its plan: those come after the swept ones
    bounded = sorted(
        (b for b in bounds if b.error is None and b.bound_s is not None),
        key=lambda b: (b.setup_s is None, b.bound_s if b.bound_s is not None else math.inf),
    )
    best = math.inf
    for i, b in enumerate(bounded):
        assert b.bound_s is not None
        if b.bound_s >= best:
            rows[b.shape] = _proved_worse_row(b)
            continue
        if i == 0:
            # the likeliest best first, with all of the stage (at least FIRST_SOLVE_FLOOR of
            # the time left, when the bound phase overran): its solve stops at its gap target
            # and leaves the rest; its plan is what the others' bounds are held against
            share = Deadline(
                min(max(stage.left(), FIRST_SOLVE_FLOOR * ctx.deadline.left()), ctx.deadline.left())
            )
            best = _solve_into(rows, request, b, share, 1, store, ctx, best)
            continue
        worth = _worth_solving(bounded[i:], best) + (1 if more else 0)
        share = Deadline(min(stage.left() / worth, ctx.deadline.left()))
        best = _solve_into(rows, request, b, share, worth, store, ctx, best)
    return best


def _continue_best(
    request: PlanRequest,
    rows: dict[tuple[int, ...], dict[str, Any]],
    rest: list[ShapeBound],
    store: KeyValueStore,
    ctx: PlanContext,
    best: float,
) -> float:
    """When the best plan of the first stage misses its gap target (its share ran out) and
    the likeliest best of the shapes ``rest`` after it (:func:`_promise`) does not refine its
    shape, its shape's solve goes on from where it stopped (the solve memo in ``store``: its
    plan, its memory rows, its bound), with :data:`CONTINUE_SHARE` of the time left, before
    them; it stops at its gap target and leaves the rest to them.  The best iteration time.

    A shape that refines the leader's (``[16, 2, 4]`` refines ``[16, 8]``) holds every plan of
    it: solving it is the leader's solve on a larger space (GPT-3 6.7B on 16x8, K = 8, 90 s:
    ``[16, 2, 4]`` 2,825 ms at a 0.5 % gap, where ``[16, 8]`` continued stays at 3,302 ms,
    5.2 %).  One that refines only shapes the first stage left without a plan is ranked by
    their bounds alone, and its problem is larger than theirs: gpt 40 x 6144 on 32x8 (K = 8,
    90 s) gave ``[32, 8]`` 38 s (10,073 ms, gap 6.5 %), then ``[64, 2, 2]`` (refining the
    unsolved ``[64, 4]`` and ``[128, 2]``) 43 s and ``[8, 2, 16]`` 11 s without a plan, where
    ``[32, 8]`` alone reaches 9,850 ms (2.1 %).  Continued from its memo entry for 45 s it
    reaches the same 9,850 ms; for 27 s it stays at 10,073 ms (the memory-priced dual needs
    the time)."""
    solved = [r for r in rows.values() if "plan" in r]
    if request.options.deterministic or not solved:
        return best
    row = min(solved, key=lambda r: r["plan"].iteration_time_s)
    leader: Plan = row["plan"]
    gap = (leader.solver or {}).get("gap")
    if not isinstance(gap, (int, float)) or gap <= request.options.relative_gap:
        return best
    shape = tuple(row["shape"])
    if ctx.deadline.left() < MIN_SOLVE_S or _next_refines(shape, rest, rows):
        return best
    again = _solve_row(request, ShapeBound(shape), Deadline(CONTINUE_SHARE * ctx.deadline.left()), store, ctx)
    if "plan" in again and again["plan"].iteration_time_s <= leader.iteration_time_s:
        row.update(plan=again["plan"], bound_s=_proven_bound(row["bound_s"], again["plan"]))
    row["wall_s"] += again["wall_s"]
    row["share_s"] = row.get("share_s", 0.0) + again["share_s"]
    row["continued"] = True
    return min(best, row["plan"].iteration_time_s)


def _next_refines(
    shape: tuple[int, ...], rest: list[ShapeBound], rows: dict[tuple[int, ...], dict[str, Any]]
) -> bool:
    """Does the likeliest best of ``rest`` (:func:`_promise`) refine ``shape``: merging two
    of its neighbouring axes gives ``shape``?"""
    if not rest:
        return False
    first = min(rest, key=lambda u: _promise(u.shape, rows)).shape
    return shape in _merged(first)


def _merged(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The shapes ``shape`` refines: two neighbouring axes merged into one."""
    return [(*shape[:i], shape[i] * shape[i + 1], *shape[i + 2 :]) for i in range(len(shape) - 1)]


def _worth_solving(rest: list[ShapeBound], best: float) -> int:
    """How many of the bounded shapes ``rest`` (least bound first) share the time left: those
    whose bound is under ``best`` and within :data:`PROMISING_RATIO` of the least bound
    among them (the others are mostly proved worse by the first plans, and an equal share
    with them left the first shapes too little: mt5-base on 4x8 gave ``[8, 4]`` 1.1 s, and
    at 1.25 on 2x4 ``[2, 4]`` shared with ``[4, 2]`` had 2.3 s and no good plan)."""
    least = rest[0].bound_s if rest and rest[0].bound_s is not None else math.inf
    return max(
        1,
        sum(1 for o in rest if o.bound_s is not None and o.bound_s < min(best, PROMISING_RATIO * least)),
    )


def _solve_into(
    rows: dict[tuple[int, ...], dict[str, Any]],
    request: PlanRequest,
    b: ShapeBound,
    share: Deadline,
    shared_by: int,
    store: KeyValueStore,
    ctx: PlanContext,
    best: float,
) -> float:
    """Solve ``b`` within ``share`` into ``rows``; the best iteration time so far."""
    rows[b.shape] = {**_solve_row(request, b, share, store, ctx), "shared_by": shared_by}
    b.tables = None  # solved: its tables are not needed any more
    if "plan" in rows[b.shape]:
        best = min(best, rows[b.shape]["plan"].iteration_time_s)
    return best


def _promise(shape: tuple[int, ...], rows: dict[tuple[int, ...], dict[str, Any]]) -> tuple[float, float]:
    """Order of the shapes solved after the bounded ones (least first), from the shapes it
    refines by merging two neighbouring axes (``[4, 2, 4]`` refines ``[8, 4]`` and ``[4, 8]``:
    every plan of those is one of it, each merged axis's SBP on both of its axes): the least
    of their proven bounds, then their sum (a shape without a bound counts its plan's step
    time, else infinity).  Not a proof, an order: mt5-base on 4x8 puts ``[4, 2, 4]`` first,
    the best three-axis shape when each is solved alone (19.9 ms at 30 s; ``[2, 2, 8]``
    21.9 ms)."""
    known = []
    for merged in _merged(shape):
        row = rows.get(merged, {})
        if row.get("bound_s") is not None:
            known.append(float(row["bound_s"]))
        elif "plan" in row:
            known.append(float(row["plan"].iteration_time_s))
        else:
            known.append(math.inf)
    return (min(known, default=math.inf), sum(known))


def _proved_worse_row(b: ShapeBound) -> dict[str, Any]:
    """The row of a shape whose proven bound is at least the best plan's iteration time."""
    return {"shape": list(b.shape), "bound_s": b.bound_s, "outcome": PROVED_WORSE, "wall_s": b.wall_s}


def _no_time_row(b: ShapeBound, deadline: Deadline) -> dict[str, Any]:
    """The row of a shape the time ran out before (with its bound, when it has one)."""
    error = TimeLimitError(
        "time_limit",
        f"the time limit ({round(deadline.limit_s, 2):g} s) ran out before mesh {list(b.shape)} "
        "was solved or proved worse (the three-axis shapes are solved or bounded one at a "
        "time, after the others)",
    )
    return {
        "shape": list(b.shape),
        "bound_s": b.bound_s,
        "error": error.to_dict(),
        "outcome": "no plan",
        "wall_s": b.wall_s,
    }


def _bound_phase(
    request: PlanRequest,
    shapes: list[tuple[int, ...]],
    store: KeyValueStore,
    ctx: PlanContext,
    stage: Deadline,
) -> tuple[list[ShapeBound], float]:
    """Each shape's tables and proven lower bound, each within an equal share of what is
    left of :data:`BOUND_SHARE` of ``stage`` (deterministic runs: of the whole limit); and
    the phase's limit, seconds."""
    deadline = ctx.deadline
    phase = deadline.left() if request.options.deterministic else BOUND_SHARE * stage.left()
    phase_deadline = Deadline(phase)
    out: list[ShapeBound] = []
    for i, shape in enumerate(shapes):
        share = Deadline(min(phase_deadline.left() / (len(shapes) - i), deadline.left()))
        relay = _ShapeRelay(ctx.progress, deadline, shape) if ctx.progress else None
        b = shape_bound(request, shape, store, ctx.for_shape(shape, share, relay))
        if isinstance(b.error, TimeLimitError):
            b.error = None  # no time for its tables or bound here: the solve phase tries again
        out.append(b)
        ctx.relay().report("mesh_search:bound", detail={"shape": list(shape), "bound_s": b.bound_s})
    return out, phase


def _solve_row(
    request: PlanRequest, b: ShapeBound, deadline: Deadline, store: KeyValueStore, ctx: PlanContext
) -> dict[str, Any]:
    """Solve shape ``b`` within ``deadline``: its row, with the plan or the error."""
    started = time.perf_counter()
    shape = b.shape
    relay = _ShapeRelay(ctx.progress, ctx.deadline, shape) if ctx.progress else None
    shape_ctx = ctx.for_shape(shape, deadline, relay)
    row: dict[str, Any] = {"shape": list(shape), "bound_s": b.bound_s}
    try:
        tables = b.tables if b.tables is not None else shape_tables(request, shape, store, shape_ctx)
        p = _solve_shape(request, shape, deadline, shape_ctx, tables)
    except (InfeasibleError, TimeLimitError) as exc:
        row.update(error=exc.to_dict(), outcome="no plan")
    else:
        row.update(plan=p, outcome="solved", bound_s=_proven_bound(b.bound_s, p))
    row["wall_s"] = time.perf_counter() - started + b.wall_s
    row["share_s"] = deadline.limit_s
    return row


def _proven_bound(before: float | None, p: Plan) -> float | None:
    """The greater of the shape's bound before its solve and its solve's own proven bound
    (``plan.solver["bound"]``, seconds): both bound every plan the solve can return."""
    solved = (p.solver or {}).get("bound")
    known = [v for v in (before, solved) if isinstance(v, (int, float)) and math.isfinite(v)]
    return float(max(known)) if known else None


def _error_row(b: ShapeBound) -> dict[str, Any]:
    assert b.error is not None
    return {
        "shape": list(b.shape),
        "bound_s": None,
        "error": b.error.to_dict(),
        "outcome": "no plan",
        "wall_s": b.wall_s,
    }


def _search_stats(
    results: list[dict[str, Any]], bounds: list[ShapeBound], bound_limit_s: float, deadline: Deadline
) -> dict[str, Any]:
    """``solver.stats.mesh_search``: the shapes solved (with their plan's iteration time), the
    shapes proved worse and those without a plan, with their bounds (seconds), and the
    first stage's bound phase's wall time."""
    return {
        "solved": [
            {
                **{k: r[k] for k in ("shape", "bound_s", "share_s", "shared_by")},
                "iteration_time_s": r["plan"].iteration_time_s,
                "micro_batch_time_s": r["plan"].micro_batch_time_s,
            }
            for r in results
            if r["outcome"] == "solved"
        ],
        "proved_worse": [
            {"shape": r["shape"], "bound_s": r["bound_s"]} for r in results if r["outcome"] == PROVED_WORSE
        ],
        "no_plan": [r["shape"] for r in results if r["outcome"] == "no plan"],
        "no_plan_bounds": [
            {"shape": r["shape"], "bound_s": r["bound_s"]} for r in results if r["outcome"] == "no plan"
        ],
        "bound_phase_s": sum(b.wall_s for b in bounds),
        "bound_phase_limit_s": bound_limit_s,
        "limit_s": deadline.limit_s,
    }


def _solve_shape(
    request: PlanRequest, shape: tuple[int, ...], deadline: Deadline, ctx: PlanContext, tables: CostTables
) -> Plan:
    """The plan of ``request`` on mesh ``shape`` from its ``tables``, within ``deadline``
    (the shape's share)."""
    options = (
        request.options
        if request.options.deterministic
        else replace(request.options, time_limit_s=max(MIN_SOLVE_S, deadline.limit_s))
    )
    return solve_mesh(
        request.graph,
        Mesh(request.cluster, shape),
        request.memory_budget_bytes,
        request.zero_stage,
        options,
        ctx,
        tables=tables,
        tie_layers=request.tie_layers,
    )


class _ShapeRelay:
    """Reports of one shape's solve, stamped with the whole search's clock and the shape."""

    def __init__(self, progress: ProgressFn, deadline: Deadline, shape: tuple[int, ...]) -> None:
        self.progress = progress
        self.deadline = deadline
        self.shape = shape

    def __call__(self, p: Progress) -> None:
        left = self.deadline.left()
        self.progress(
            replace(
                p,
                elapsed_s=self.deadline.elapsed(),
                time_left_s=None if math.isinf(left) else left,
                shape=self.shape,
            )
        )


def _fastest(results: list[dict[str, Any]], deadline: Deadline) -> Plan:
    """The plan of least iteration time as its runtime runs it among ``results``, with every
    shape's row in its diagnostics; when no shape has a plan, the error that says why."""
    feasible = [r for r in results if "plan" in r]
    if not feasible:
        _raise_no_shape(results, deadline)
    # compared as the runtime runs them, as plans and baselines are
    chosen: Plan = min(feasible, key=lambda r: r["plan"].achieved_iteration_time_s)["plan"]
    chosen.diagnostics["mesh_search"] = [
        {
            "shape": r["shape"],
            "iteration_time_s": r["plan"].iteration_time_s if "plan" in r else None,
            "micro_batch_time_s": r["plan"].micro_batch_time_s if "plan" in r else None,
            "step_time_s": r["plan"].step_time_s if "plan" in r else None,  # deprecated alias
            "memory_per_device_bytes": r["plan"].memory_per_device_bytes if "plan" in r else None,
            "gap": r["plan"].solver["gap"] if "plan" in r and r["plan"].solver else None,
            "wall_s": r["wall_s"],
            "error": r.get("error", {}).get("message"),
            "lower_bound_s": r["bound_s"],
            "outcome": r["outcome"],
            "continued": bool(r.get("continued")),
        }
        for r in results
    ]
    return chosen


def _raise_no_shape(results: list[dict[str, Any]], deadline: Deadline) -> None:
    """:class:`TimeLimitError` when every shape ran out of time, else :class:`InfeasibleError`
    with the least memory any shape needs."""
    if all(r["error"].get("code") == "time_limit" for r in results):
        raise TimeLimitError(
            "time_limit",
            f"the time limit ({round(deadline.limit_s, 2):g} s) ran out before any mesh shape "
            "had a verified plan: " + "; ".join(f"{r['shape']}: {r['error']['message']}" for r in results),
        )
    infeasible = [r["error"] for r in results if r["error"].get("code") != "time_limit"]
    best_err = min(infeasible, key=lambda e: e.get("min_feasible_bytes", math.inf) or math.inf)
    raise InfeasibleError(
        None,
        "no mesh shape fits the budget: "
        + "; ".join(f"{r['shape']}: {r['error']['message']}" for r in results),
        min_feasible_bytes=best_err.get("min_feasible_bytes"),
        proven=best_err.get("proven", False),
    )
