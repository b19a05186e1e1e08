"""Planner: graph + cluster + budget -> verified plan.

::

    PlanRequest ─ checked graph ─┬─ mesh given:  squeeze (size-1 axes away) ─ solve mesh ─ unsqueeze
    (request.py)                 └─ no mesh:     mesh search: solve mesh, per shape   (mesh_search.py)
                                                   │
    solve mesh (on_mesh.py):                       v
      cost tables (memo: KeyValueStore) ─> memory floors ─> solve memo recall ─> memory rounds ─> verify
                                           (floors.py)      (recall.py)          (rounds.py)     (verify.py)
      each round: numeric Problem with memory rows (memory_rows.py),
                  solved with layers tied, then untied (tied_solve.py)

Where each concept lives:

* :mod:`.request`: :class:`PlanRequest`, its cache key, the graph checked in time;
* :mod:`.context`: :class:`PlanContext`, the one clock and channels every stage gets;
* :mod:`.memory_rows`: :func:`build_problem`, the numeric problem and its memory rows;
* :mod:`.recompute`: checkpointing ``auto``, recompute or keep per block as doubled choices;
* :mod:`.floors`: :func:`memory_floors`, the least memory any plan needs, infeasibility;
* :mod:`.recall`: the solve memo's recall (a recalled plan is re-checked there) and write;
* :mod:`.rounds`: memory rounds (solve, evaluate, constrain the peak, solve again);
* :mod:`.tied_solve`: one round's solve, tied then untied, and the untied bound;
* :mod:`.verify`: the evaluator's re-check of every plan against the solver's claim;
* :mod:`.squeeze`, :mod:`.evaluate_child`: size-1 mesh axes away and back, re-checked
  in a child process stopped at the deadline;
* :mod:`.mesh_search`: every candidate mesh shape in turn;
* :mod:`.on_mesh`: :func:`solve_on_mesh`, the stages of one mesh in order.

Every returned plan has been re-checked by :func:`autopar.cost.evaluate.evaluate`:
its step time equals the solver's objective and its memory fits the budget;
a mismatch raises :class:`~autopar.errors.VerificationError`.
"""

from __future__ import annotations

from autopar.cost.remote_tables import RemoteTableBuilder
from autopar.infra.collector import collector_paused
from autopar.infra.progress import Deadline, Progress, ProgressFn
from autopar.infra.store import KeyValueStore
from autopar.ir.graph import Graph
from autopar.ir.plan import Plan
from autopar_solver.planner.context import PlanContext
from autopar_solver.planner.floors import memory_floors
from autopar_solver.planner.memory_rows import BuiltProblem, build_problem
from autopar_solver.planner.mesh_search import mesh_search
from autopar_solver.planner.on_mesh import solve_on_mesh
from autopar_solver.planner.request import PlanRequest, checked_graph
from autopar_solver.planner.squeeze import solve_squeezed

__all__ = [
    "BuiltProblem",
    "PlanContext",
    "PlanRequest",
    "Progress",
    "ProgressFn",
    "build_problem",
    "memory_floors",
    "plan",
    "solve_on_mesh",
]


def plan(
    request: PlanRequest,
    *,
    store: KeyValueStore | None = None,
    progress: ProgressFn | None = None,
    hint: Plan | None = None,
    deadline: Deadline | None = None,
    resolve: bool = False,
    remote_tables: RemoteTableBuilder | None = None,
) -> Plan:
    """Solve ``request``; search the logical mesh shapes when none is given.

    The time limit (``request.options.time_limit_s``, counted from ``deadline.start``
    when a deadline is given, e.g. by a command that loaded the graph first) bounds
    the whole call.  ``progress`` gets every phase, then ``done`` once with the
    chosen plan's objective.  The cyclic garbage collector is paused meanwhile
    (:func:`~autopar.infra.collector.collector_paused`).

    With a ``store``, what earlier solves of the same problem proved is recalled
    (:mod:`autopar_solver.solve_memo`): re-checked, it is the answer when its gap is
    within ``options.relative_gap`` (unless ``resolve``), else where the solve starts.
    ``remote_tables`` builds missing cost-table entries on other processes (the service's
    workers) into ``store``.
    """
    with collector_paused():
        ctx = PlanContext.start(
            request.options,
            deadline,
            store=store,
            progress=progress,
            hint=hint,
            resolve=resolve,
            remote_tables=remote_tables,
        )
        graph: Graph = checked_graph(request, ctx.deadline)
        if request.mesh_shape is None:
            result = mesh_search(request, ctx)
        else:
            result = solve_squeezed(graph, request, ctx)
        return _done(result, ctx)


def _done(result: Plan, ctx: PlanContext) -> Plan:
    """``result`` with the command's wall time; ``done`` reported once, with its objective."""
    if result.solver is not None:
        result.solver["command_wall_s"] = ctx.deadline.elapsed()
    ctx.deadline.report(
        ctx.progress,
        "done",
        objective=result.solver.get("objective") if result.solver else result.step_time_s,
        bound=result.solver.get("bound") if result.solver else None,
        shape=tuple(result.mesh.shape),
    )
    return result
