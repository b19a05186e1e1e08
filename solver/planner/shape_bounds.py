"""Proven lower bounds on a mesh shape's iteration time, before it is solved (mesh search
pruning).  The iteration is the objective every plan is compared by: K micro-batches plus
once per step, with recomputation (:mod:`autopar.cost.iteration`).

For one shape: its cost tables, the numeric problem of :func:`build_problem` without
memory rows, and::

    bound = max(trivial bound, TRW-S bound after at most BOUND_SWEEPS sweeps)    (seconds)

The trivial bound is every node and every edge at its least
(:func:`~autopar_solver.problem.trivial_bound`); the TRW-S bound is the dual of the
local-polytope relaxation (:mod:`autopar_solver.bounds`, Kolmogorov 2006), valid after any
number of sweeps.  Both bound the cost of every assignment, and a plan's iteration time is its
assignment's cost (:mod:`.verify` checks the two agree); memory rows only remove
assignments, and tied layers only restrict them, so every plan the solve can return on
the shape costs at least ``bound``.  A shape whose memory floor is over the budget is
proven infeasible here too (:func:`.floors.memory_seed`), without a solve.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from autopar.cost.build_tables import build_cost_tables
from autopar.cost.tables import CostTables
from autopar.cost.weighted_tables import with_training
from autopar.errors import InfeasibleError, TimeLimitError
from autopar.hardware.mesh import Mesh
from autopar.infra.progress import Deadline
from autopar.infra.store import KeyValueStore
from autopar_solver.bounds import SINGLE_ENTRIES_PER_EDGE, DiffusionBound, LayoutCut
from autopar_solver.planner.context import PlanContext
from autopar_solver.planner.floors import memory_seed
from autopar_solver.planner.memory_rows import build_problem
from autopar_solver.planner.request import PlanRequest
from autopar_solver.problem import trivial_bound

__all__ = [
    "BOUND_SWEEPS",
    "MAX_BOUND_ENTRIES",
    "MAX_DENSE_BOUND_ENTRIES",
    "TARGET_SWEEPS",
    "ShapeBound",
    "shape_bound",
    "shape_tables",
]

BOUND_SWEEPS = 30
"""Most TRW-S sweeps per shape.  On mt5-base [4, 2] (2-core machine) 15 sweeps take 0.4 s
and reach 97 % of the bound 45 sweeps reach; the solve itself runs hundreds."""
TARGET_SWEEPS = 40
"""Most TRW-S sweeps per shape when the bound is to reach a target (the best plan so far):
mt5-base on 4x8 ``[4, 4, 2]`` reaches 20.1 ms after 30 sweeps (6.7 s, load 4.5), just above
the 19.9 ms of ``[4, 2, 4]``'s plan; ``[2, 8, 2]`` passes it within 5 sweeps."""
_TARGET_CHUNK = 3
"""Sweeps between two looks at the bound, when it is to reach a target."""
MAX_BOUND_ENTRIES = 40_000_000
"""Largest problem (edge matrix entries) the TRW-S bound is set up for here (it keeps two
copies of each entry); above it the trivial bound alone is used."""
MAX_DENSE_BOUND_ENTRIES = 250_000_000
"""The same for a dense problem (over :data:`~autopar_solver.bounds.SINGLE_ENTRIES_PER_EDGE`
entries per edge: three-axis shapes), whose copies are in single precision.  A layout that
does not finish within the shape's share of the time leaves the trivial bound too."""


@dataclass
class ShapeBound:
    """What the search knows about one shape before solving it."""

    shape: tuple[int, ...]
    tables: CostTables | None = None
    """Its cost tables (as built, before the iteration is priced), handed to the solve."""
    bound_s: float | None = None
    """Proven lower bound on the iteration time of any plan on the shape (None: not computed)."""
    error: InfeasibleError | TimeLimitError | None = None
    """Proven infeasible (memory floor over the budget), or no time for its tables."""
    wall_s: float = 0.0
    setup_s: float | None = None
    """Seconds from the start of its bound to its first TRW-S sweep (tables, memory floor,
    problem and layout; None: no sweep)."""


def shape_tables(
    request: PlanRequest, shape: tuple[int, ...], store: KeyValueStore, ctx: PlanContext
) -> CostTables:
    """The cost tables of ``request``'s graph on ``shape`` through ``store``, within
    ``ctx.deadline`` (reports to ``ctx``'s progress)."""
    options = request.options
    return build_cost_tables(
        request.graph,
        Mesh(request.cluster, shape),
        request.zero_stage,
        store=store,
        workers=options.workers,
        runtime=options.runtime,
        progress=ctx.relay().callback(),
        deadline=ctx.deadline,
        remote=ctx.remote_tables,
    )


def shape_bound(
    request: PlanRequest,
    shape: tuple[int, ...],
    store: KeyValueStore,
    ctx: PlanContext,
    target: float = math.inf,
) -> ShapeBound:
    """The tables and proven lower bound of ``shape``, within ``ctx.deadline`` (its share
    of the search's bound phase); the error when there is no time or the budget is proven
    out of reach.  With a finite ``target`` (the best verified plan's iteration time, seconds)
    the TRW-S sweeps go on until the bound reaches it (up to :data:`TARGET_SWEEPS`), and
    stop there: the shape is then proved worse."""
    started = time.perf_counter()
    deadline = ctx.deadline
    out = ShapeBound(shape)
    try:
        out.tables = shape_tables(request, shape, store, ctx)
        priced = with_training(out.tables, request.options.training)
        memory_seed(priced, request.memory_budget_bytes, out.tables.mesh, deadline)
        out.bound_s, laid_out = _lower_bound(priced, deadline, request.options.deterministic, target)
        out.setup_s = None if laid_out is None else laid_out - started
    except (InfeasibleError, TimeLimitError) as exc:
        out.error = exc
    out.wall_s = time.perf_counter() - started
    return out


def _lower_bound(
    tables: CostTables, deadline: Deadline, deterministic: bool, target: float
) -> tuple[float, float | None]:
    """max(trivial bound, TRW-S bound) of the tables' problem without memory rows, seconds,
    and when the TRW-S layout was done (``time.perf_counter()``; None: no sweep).
    Deterministic runs sweep :data:`BOUND_SWEEPS` times whatever the clock says; with a
    finite ``target``, up to :data:`TARGET_SWEEPS`, :data:`_TARGET_CHUNK` at a time, until
    the bound is at least ``target`` (or the deadline)."""
    problem = build_problem(tables, None).problem
    bound = trivial_bound(problem)
    entries = sum(m.size for _, _, m in problem.edges)
    dense = entries > SINGLE_ENTRIES_PER_EDGE * len(problem.edges)
    if (
        bound >= target
        or entries > (MAX_DENSE_BOUND_ENTRIES if dense else MAX_BOUND_ENTRIES)
        or (not deterministic and deadline.expired())
    ):
        return bound, None
    until = math.inf if deterministic else deadline.at
    try:
        run = DiffusionBound(problem, deadline=until)
    except LayoutCut:
        return bound, None
    laid_out = time.perf_counter()
    if math.isinf(target):
        return max(bound, run.run(BOUND_SWEEPS, until)), laid_out
    swept = bound
    while run.sweeps < TARGET_SWEEPS and swept < target and not run.converged:
        before = run.sweeps
        swept = max(swept, run.run(_TARGET_CHUNK, until))
        if run.sweeps == before:  # the deadline cut the sweep
            break
    return swept, laid_out
