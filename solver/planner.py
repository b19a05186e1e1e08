"""Planner: graph + cluster + budget -> verified plan.

::

    Graph ──> cost tables (memo: KeyValueStore) ──> numeric Problem
                                                     │  nodes = ops, choices = N-D signatures
                                                     │  edges = boxing matrices
                                                     │  memory rows = model states + live activations
                                                     v
            Plan <── independent evaluator <── solve (reductions, heuristic, CP-SAT)

Memory is a hard constraint, added lazily: the problem is first solved with
no memory rows (a relaxation); if that optimum fits the budget it is optimal
for the constrained problem too.  Otherwise rows for the liveness points of the
peak are added and the problem re-solved, until the evaluator's peak fits or
the budget is proven infeasible.

Every returned plan has been re-checked by :func:`autopar.evaluate.evaluate`:
its step time equals the solver's objective and its memory fits the budget;
a mismatch raises :class:`~autopar.errors.VerificationError`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np

from autopar import __version__ as autopar_version
from autopar.cluster import Cluster, Mesh, candidate_mesh_shapes
from autopar.collector import collector_paused
from autopar.cost_tables import CostTables, build_cost_tables
from autopar.costs import COST_MODEL_VERSION
from autopar.errors import ConfigError, InfeasibleError, TimeLimitError, VerificationError
from autopar.evaluate import attach_evaluation, evaluate
from autopar.graph import DTYPE_BYTES, Graph
from autopar.memory import (
    activation_intervals,
    boxed_copy_bytes,
    graph_state_bytes,
    variable_state_bytes,
    zero3_gather_buffer_bytes,
)
from autopar.plan import Plan
from autopar.progress import Deadline, Progress, ProgressFn
from autopar.sbp import B, NdSbp, SbpValue, Signature
from autopar.store import KeyValueStore
from autopar.wire import MemoryReport, Predicted, SolverReport
from autopar_solver.options import SolverOptions
from autopar_solver.problem import MemoryRow, Problem, Solution, trivial_bound
from autopar_solver.problem import evaluate as evaluate_problem
from autopar_solver.solve_memo import MemoEntry, memo_keys, remember

__all__ = ["PlanRequest", "Progress", "ProgressFn", "build_problem", "memory_floors", "plan", "solve_on_mesh"]

log = logging.getLogger("autopar.planner")

MAX_MEMORY_ROUNDS = 6
TIE_ROUNDS = 1
"""Weisfeiler-Lehman refinements for layer tying (more rounds split layers near the ends apart)."""
TIE_THRESHOLD_OPS = 8000
"""Graphs with more ops are solved with identical layers tied (see :mod:`autopar_solver.tying`)."""
VERIFY_RTOL = 1e-6


EVALUATE_RESERVE_S = 1.0
"""Seconds kept free before the deadline, at least, for the evaluator's re-check of the
plan (measured on mt5-base, 4.2k ops, 2-core machine: 0.6-0.9 s wall from the solver's
answer to the verified plan)."""
EVALUATE_S_PER_OP = 1.5e-4
"""Seconds per op kept free before the deadline for building the plan from the solver's
answer and re-checking it, when that is more than :data:`EVALUATE_RESERVE_S` (measured on
the 50k-op graph, 2-core machine, 2026-12-02: 1.7 s to build the plan, 5.3 s to evaluate
it; with 1 s per 10k ops kept free, a 30 s limit ended at 33.7 s)."""
EVALUATE_PER_BUILD = 5.0
"""Evaluator seconds per second of :func:`build_problem` kept free before the deadline."""
TIED_SHARE = 0.5
"""Share of a round's time the tied solve may take (the untied solve gets the rest)."""
UNTIED_S_PER_NODE = 4.5e-4
"""Seconds per node below which the untied solve is not started (its reductions and
heuristic alone took 11.7 s on 50k nodes on the loaded 2-core machine; 14-21 s on the idle
one on 2026-12-02, when a 30 s limit that started it with 16.5 s left ended at 34-35 s)."""
UNTIED_BOUND_S_PER_NODE = 1.2e-4
"""Seconds per node below which no TRW-S bound of the untied problem is swept when its solve
was skipped (measured on the 50k-op graph, idle 2-core machine, 2026-12-02: 2.9 s to lay
the problem out, 0.17 s per sweep; 40 sweeps bring the bound to 0.01 % of the tied plan)."""
VALIDATE_S_PER_OP = 1e-5
"""Seconds per op below which checking the graph is not started (measured: 100k ops
validate in 1.5-3.6 s on the 2-core machine, idle to loaded)."""
SEED_ROW_FRACTION = 0.8
"""With a budget, the position of the largest memory floor is constrained from the first
round when its floor is at least this fraction of the budget (it is usually the peak)."""
ROUND_SHARE = 0.5
"""With a budget, each memory round but the last may use this share of the time left (a
plan that overflows leads to another round, which needs time too)."""
ROUND_SHARE_FLOOR = 0.5
"""Rounds share the time only when the largest memory floor is at least this fraction of
the budget; below it the first round's plan almost always fits and gets all the time."""
MIN_SOLVE_S = 0.2
"""Fewest seconds a solve is given; with less left the best verified plan so far is returned."""


class _Relay:
    """Forwards reports to the caller's callback, stamped with the command's one clock
    (elapsed, time left) and the mesh shape; the solves' own ``done`` becomes ``solved``:
    only :func:`plan` says ``done``, once, with the chosen plan's objective."""

    def __init__(
        self, progress: ProgressFn | None, deadline: Deadline, shape: tuple[int, ...] | None
    ) -> None:
        self.progress = progress
        self.deadline = deadline
        self.shape = shape

    def __call__(self, p: Progress) -> None:
        if self.progress is None:
            return
        left = self.deadline.left()
        self.progress(
            replace(
                p,
                phase="solved" if p.phase == "done" else p.phase,
                elapsed_s=self.deadline.elapsed(),
                time_left_s=None if math.isinf(left) else left,
                shape=self.shape,
            )
        )

    def report(self, phase: str, **fields: Any) -> None:
        if self.progress is not None:
            self(Progress(phase, **fields))


@dataclass(frozen=True)
class PlanRequest:
    """Everything that determines a plan."""

    graph: Graph
    cluster: Cluster
    mesh_shape: tuple[int, ...] | None = None
    memory_budget_bytes: int | None = None
    zero_stage: int = 2
    options: SolverOptions = field(default_factory=SolverOptions)
    tie_layers: bool | None = None
    """Give structurally identical ops (the same op of identical layers) one shared choice;
    None: only for graphs of more than :data:`TIE_THRESHOLD_OPS` ops."""

    def __post_init__(self) -> None:
        if self.zero_stage not in (0, 1, 2, 3):
            raise ConfigError("bad_zero_stage", f"ZeRO stage must be 0, 1, 2 or 3, got {self.zero_stage}")
        if self.memory_budget_bytes is not None and self.memory_budget_bytes <= 0:
            raise ConfigError(
                "bad_memory", f"memory budget must be > 0 bytes, got {self.memory_budget_bytes}"
            )
        if self.mesh_shape is not None:
            Mesh(self.cluster, tuple(self.mesh_shape))  # validates

    def to_key_dict(self) -> dict[str, Any]:
        """Canonical, JSON-able description (graph by content hash) for cache keys."""
        from importlib.metadata import PackageNotFoundError, version

        try:
            ortools_version = version("ortools")
        except PackageNotFoundError:  # pragma: no cover - the solver needs ortools anyway
            ortools_version = "none"
        opts = self.options
        return {
            "graph": self.graph.content_hash(),
            "cluster": self.cluster.to_dict(),
            "mesh_shape": list(self.mesh_shape) if self.mesh_shape else None,
            "memory_budget_bytes": self.memory_budget_bytes,
            "zero_stage": self.zero_stage,
            "tie_layers": self.tie_layers,
            "options": {
                "time_limit_s": opts.time_limit_s,
                "relative_gap": opts.relative_gap,
                "seed": opts.seed,
                "deterministic": opts.deterministic,
                "workers": opts.workers if opts.deterministic else None,
            },
            "versions": {
                "autopar": autopar_version,
                "cost_model": COST_MODEL_VERSION,
                "ortools": ortools_version,
            },
        }

    def key(self) -> str:
        return hashlib.sha256(json.dumps(self.to_key_dict(), sort_keys=True).encode()).hexdigest()


# ------------------------------------------------------------------ problem


@dataclass
class BuiltProblem:
    """A numeric problem and how its nodes map back to the graph."""

    problem: Problem
    tables: CostTables
    op_names: list[str]


def _output_bytes(tables: CostTables, op_name: str, port_index: int, nbytes: float) -> np.ndarray:
    mesh_shape = tables.mesh.shape
    sigs = tables.ops[op_name].signatures
    return np.array([nbytes / s.outputs[port_index].split_factor(mesh_shape) for s in sigs], dtype=np.float64)


def build_problem(
    tables: CostTables,
    budget_bytes: float | None,
    positions: list[int] | None = None,
) -> BuiltProblem:
    """Numeric problem of ``tables``: one node per op, one edge per producer->consumer port pair.

    ``positions`` are topological positions whose live memory becomes a hard row
    (model states of every variable + activations live there).
    """
    graph = tables.graph
    order = graph.topological_order
    index = {op.name: i for i, op in enumerate(order)}
    node_costs = [tables.ops[op.name].compute_s for op in order]
    # identical layers share op tables: label each table once
    label_memo: dict[int, list[str]] = {}
    labels = []
    for op in order:
        table = tables.ops[op.name]
        lab = label_memo.get(id(table))
        if lab is None:
            lab = label_memo[id(table)] = [str(s) for s in table.signatures]
        labels.append(lab)
    edges = [(index[e.producer], index[e.consumer], e.matrix) for e in tables.edges]
    rows: list[MemoryRow] = []
    if positions:
        state_terms = _state_terms(tables, index)
        intervals = activation_intervals(graph)
        by_consumer: dict[int, list[int]] = {}
        for e_index, e in enumerate(tables.edges):
            by_consumer.setdefault(index[e.consumer], []).append(e_index)
        zero3 = 0.0
        if tables.zero_stage >= 3:
            # gathered parameters at their largest (replicated) size: an upper bound that
            # does not depend on the choices (the evaluator uses the chosen layouts)
            replicated = NdSbp(tuple(B for _ in tables.mesh.shape))
            zero3 = zero3_gather_buffer_bytes(
                graph, {v.op: replicated for v in graph.variables}, tables.mesh.shape
            )
        for pos in positions:
            terms = {i: t.copy() for i, t in state_terms.items()}
            edge_terms: dict[int, np.ndarray] = {}
            for e_index in by_consumer.get(pos, []):
                # the boxed copy a consumer receives is live while it runs
                e = tables.edges[e_index]
                cop = graph.op_by_name[e.consumer]
                pop = graph.op_by_name[e.producer]
                ii, oi = list(cop.inputs).index(e.in_port), list(pop.outputs).index(e.out_port)
                spec = graph.tensors[e.tensor]
                src = [s.outputs[oi] for s in tables.ops[e.producer].signatures]
                dst = [s.inputs[ii] for s in tables.ops[e.consumer].signatures]
                edge_terms[e_index] = np.array(
                    [
                        [
                            0.0 if a == b else boxed_copy_bytes(spec.numel, spec.dtype, b, tables.mesh.shape)
                            for b in dst
                        ]
                        for a in src
                    ],
                    dtype=np.float64,
                )
            for tname, (start, end) in intervals.items():
                if start <= pos <= end:
                    pname, out_port = graph.producer[tname]
                    pop = graph.op_by_name[pname]
                    k = list(pop.outputs).index(out_port)
                    spec = graph.tensors[tname]
                    vec = _output_bytes(tables, pname, k, spec.numel * DTYPE_BYTES[spec.dtype])
                    i = index[pname]
                    terms[i] = terms[i] + vec if i in terms else vec
            rows.append(MemoryRow(f"live@{pos}:{order[pos].name}", zero3, terms, edge_terms))
    problem = Problem(
        node_names=[op.name for op in order],
        node_costs=node_costs,
        edges=edges,
        memory_rows=rows,
        budget_bytes=budget_bytes if rows else None,
        labels=labels,
    )
    return BuiltProblem(problem, tables, [op.name for op in order])


def _state_terms(tables: CostTables, index: dict[str, int]) -> dict[int, np.ndarray]:
    """Node -> bytes of its variable's model states (params, grads, optimizer) per choice
    (each node gets its own array; identical layers' variables are priced once)."""
    graph = tables.graph
    terms: dict[int, np.ndarray] = {}
    priced: dict[tuple[Any, ...], np.ndarray] = {}
    for v in graph.variables:
        spec = graph.tensors[v.tensor]
        table = tables.ops[v.op]
        out_index = list(graph.op_by_name[v.op].outputs.values()).index(v.tensor)
        per_element = graph_state_bytes(graph, v)
        key = (id(table), out_index, tuple(spec.shape), per_element)
        found = priced.get(key)
        if found is None:
            found = priced[key] = np.array(
                [
                    sum(
                        variable_state_bytes(
                            spec.shape,
                            s.outputs[out_index],
                            tables.mesh.shape,
                            tables.zero_stage,
                            per_element,
                            tables.runtime.zero_sharding.value,
                        )
                    )
                    for s in table.signatures
                ],
                dtype=np.float64,
            )
        terms[index[v.op]] = found.copy()
    return terms


def _assignment(built: BuiltProblem, choices: list[int]) -> dict[str, Signature]:
    return {name: built.tables.ops[name].signatures[c] for name, c in zip(built.op_names, choices)}


# ------------------------------------------------------------------ solve


def solve_on_mesh(
    graph: Graph,
    mesh: Mesh,
    memory_budget_bytes: int | None,
    zero_stage: int,
    options: SolverOptions,
    *,
    store: KeyValueStore | None = None,
    progress: ProgressFn | None = None,
    hint: Plan | None = None,
    tables: CostTables | None = None,
    tie_layers: bool | None = None,
    deadline: Deadline | None = None,
    shape_label: tuple[int, ...] | None = None,
    resolve: bool = False,
) -> Plan:
    """Best plan of ``graph`` on one mesh within the budget; verified by the evaluator.

    ``deadline`` (default: ``options.time_limit_s`` from now) bounds everything:
    cost tables, every memory round's solve, the evaluator's re-checks.  When it
    runs out the best verified plan so far is returned with its gap; without one,
    :class:`TimeLimitError` says how far the solve got.
    """
    deadline = deadline if deadline is not None else Deadline(_wall_limit(options))
    t0 = time.perf_counter()
    relay = _Relay(progress, deadline, shape_label)
    if tables is None:
        tables = build_cost_tables(
            graph,
            mesh,
            zero_stage,
            store=store,
            workers=options.workers,
            runtime=options.runtime,
            progress=relay if progress else None,
            deadline=deadline,
        )
    t_tables = time.perf_counter() - t0
    reserve = max(EVALUATE_RESERVE_S, EVALUATE_S_PER_OP * len(graph.ops))
    if tie_layers is None:
        tie_layers = len(graph.ops) > TIE_THRESHOLD_OPS
    positions: list[int] = []
    memory_binds = False
    """True when memory floors come near the budget: then rounds share the time."""
    if memory_budget_bytes is not None:
        # every memory row is at least its terms at their smallest: a row whose floor is
        # over the budget proves that nothing fits, without a solve
        floors = memory_floors(tables, deadline)
        worst = int(np.argmax(floors)) if len(floors) else 0
        if len(floors) and floors[worst] > memory_budget_bytes:
            _raise_infeasible(tables, memory_budget_bytes, positions, mesh, deadline, floors)
        if len(floors) and floors[worst] >= SEED_ROW_FRACTION * memory_budget_bytes:
            positions.append(worst)  # the likely peak: constrained from the first round
        memory_binds = bool(len(floors)) and floors[worst] >= ROUND_SHARE_FLOOR * memory_budget_bytes
    rounds: list[dict[str, Any]] = []
    hint_choices = _hint_choices(hint, tables) if hint is not None else None
    # what earlier solves of this very problem proved: re-checked, the answer or the start
    memo = _MemoRecall.read(store, options, tables, memory_budget_bytes)
    if memo.found and deadline.left() >= reserve:  # else no time to re-check a recalled plan
        memo.recall(graph, mesh, zero_stage, tables, memory_budget_bytes)
    elif memo.found:
        memo.stats["found"] = "no time to re-check it"
    solution: Solution | None = None
    plan_obj: Plan | None = None
    plan_ev: Any = None
    plan_solution: Solution | None = None
    ev: Any = None
    stopped_by_deadline = False
    best_bound = -math.inf
    """Greatest lower bound of any round: each round only adds memory rows to the one
    before, so an earlier round's problem is a relaxation and its bound holds for later ones."""
    plan_positions: list[int] = []
    solve_again = True
    if memo.entry is not None and memo.plan is not None:
        best_bound = memo.entry.bound  # proven on this problem (a relaxation of it, at least)
        hint_choices = memo.plan[2].choices
        positions += [p for p in memo.entry.positions if p not in positions and p < len(graph.ops)]
        solve_again = resolve or memo.plan[2].gap > options.relative_gap
        memo.stats.update(recalled_gap=memo.plan[2].gap, solved_again=solve_again)
    polishing = False
    tied_first = False
    """With tied layers, once a plan has overflowed the budget, rounds solve the tied problem
    only (seconds) until its plan fits; only then is the untied problem solved, from that
    plan, as a polish: an untied solve of a plan that overflows is time spent on a plan the
    next round discards.  The first round solves both (its untied bound holds for every
    later round)."""
    for round_no in range(MAX_MEMORY_ROUNDS + 1 if solve_again else 0):
        left = deadline.left() - reserve
        if left < MIN_SOLVE_S:
            stopped_by_deadline = True
            break
        started = time.perf_counter()
        built = build_problem(tables, memory_budget_bytes, positions)
        # the evaluator's re-check walks the whole graph in Python as building the problem
        # does, a few times over (measured on mt5-base: 3-6x): keep that much free
        reserve = max(reserve, EVALUATE_PER_BUILD * (time.perf_counter() - started))
        left = deadline.left() - reserve
        if left < MIN_SOLVE_S:
            stopped_by_deadline = True
            break
        relay.report("solve", detail={"memory_round": round_no, "polish": polishing})
        if memory_binds and not polishing and round_no < MAX_MEMORY_ROUNDS - 1:
            # a round whose plan overflows leads to another round: keep time for it
            left *= ROUND_SHARE
        # deterministic runs keep their limit (in CP-SAT's deterministic units): the
        # wall clock must not change their answer
        round_options = (
            options
            if options.deterministic
            else replace(options, time_limit_s=min(options.time_limit_s, max(left, MIN_SOLVE_S)))
        )
        solution = _solve_built(
            built,
            round_options,
            relay if progress else None,
            hint_choices,
            tie_layers and not polishing,
            untie_after=not tied_first,
            # sweeping the untied bound takes the rest of the round: only when no later
            # memory round needs that time
            sweep_untied=not memory_binds,
        )
        rounds.append(
            {
                "memory_rows": len(positions),
                "status": solution.status,
                "wall_s": solution.wall_s,
                "polish": polishing,
                "tied": bool(tie_layers) and not polishing,
            }
        )
        if polishing:
            # the verified plan of the round before stays unless this one is better
            if solution.ok:
                best_bound = max(best_bound, solution.bound)
            if not solution.ok or plan_solution is None or solution.objective >= plan_solution.objective:
                break
        if solution.status == "infeasible":
            break
        if not solution.ok:
            stopped_by_deadline = True
            break
        best_bound = max(best_bound, solution.bound)
        candidate = Plan.from_assignment(
            graph,
            mesh,
            zero_stage,
            _assignment(built, solution.choices),
            memory_budget_bytes=memory_budget_bytes,
            runtime=tables.runtime.name,
        )
        relay.report("evaluate", objective=solution.objective, bound=solution.bound)
        ev = evaluate(graph, candidate)
        if memory_budget_bytes is None or ev.memory.total <= memory_budget_bytes:
            plan_obj, plan_ev, plan_solution = candidate, ev, solution
            plan_positions = list(positions)
            if tied_first:
                # the tied plan fits: now the untied problem, from it, with the same rows and
                # the time left (kept only if it fits and is better, as a polish)
                tied_first = False
                polishing = True
                hint_choices = solution.choices
                continue
            cut = memory_binds and round_no < MAX_MEMORY_ROUNDS - 1
            if (
                not cut
                or polishing
                or not _worth_polishing(solution, best_bound, options, deadline, reserve, built)
            ):
                break
            # the round's time was cut for rounds that did not come: spend what is left on
            # the same rows, from this plan
            polishing = True
            hint_choices = solution.choices
            continue
        if polishing or round_no >= MAX_MEMORY_ROUNDS - 1:
            break  # over the budget elsewhere: keep the verified plan of the round before
        tied_first = bool(tie_layers)
        peak = ev.activation_peak_position
        if peak in positions:
            raise VerificationError(
                "memory_mismatch",
                f"plan uses {ev.memory.total:.0f} bytes at position {peak} although that row was constrained",
            )
        positions.append(peak)
        hint_choices = solution.choices
        relay.report("memory", detail={"memory_rows": len(positions), "peak_bytes": ev.memory.total})
    if (
        memo.plan is not None
        and memo.entry is not None
        and (plan_solution is None or memo.plan[2].objective < plan_solution.objective)
    ):
        plan_obj, plan_ev, plan_solution = memo.plan
        plan_positions = list(memo.entry.positions)
        memo.stats["plan"] = "recalled"
    if plan_obj is None or plan_solution is None:
        if solution is not None and solution.status == "infeasible" and not stopped_by_deadline:
            _raise_infeasible(tables, memory_budget_bytes, positions, mesh, deadline)
        raise TimeLimitError(
            "time_limit",
            f"the time limit ({round(deadline.limit_s, 2):g} s) ran out before a plan on mesh "
            f"{list(mesh.shape)} "
            f"fitting the budget was verified: cost tables took {t_tables:.1f} s, "
            f"{len(rounds)} memory round(s) solved ({len(positions)} memory rows added); "
            "raise the time limit",
            phase="solve",
            memory_rounds=len(rounds),
            time_cost_tables_s=t_tables,
        )
    ev, solution = plan_ev, plan_solution
    if best_bound > solution.bound:
        bound = min(best_bound, solution.objective)
        gap = 0.0 if solution.objective <= 0 else max(0.0, (solution.objective - bound) / solution.objective)
        solution = replace(solution, bound=bound, gap=gap, stats={**solution.stats, "bound": "earlier round"})
    _verify(ev, solution, memory_budget_bytes)
    attach_evaluation(plan_obj, ev)
    if store is not None:
        memo.write(store, graph, solution, plan_positions, without_rows=not positions)
    stats = dict(solution.stats)
    stats["rounds"] = rounds
    stats["memo"] = memo.stats
    stats["time_cost_tables_s"] = t_tables
    stats["cost_tables"] = {k: v for k, v in tables.stats.items() if k != "fallback_ops"}
    plan_obj.solver = {
        "objective": solution.objective,
        "bound": solution.bound,
        "gap": solution.gap,
        "status": solution.status,
        "wall_s": time.perf_counter() - t0,
        "memory_rows": len(positions),
        "tied_layers": any(r["tied"] for r in rounds),
        "stats": _jsonable(stats),
    }
    relay.report("verified", objective=solution.objective, bound=solution.bound)
    return plan_obj


@dataclass
class _MemoRecall:
    """The solve memo (:mod:`autopar_solver.solve_memo`) for one :func:`solve_on_mesh` call.

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
    plan: tuple[Plan, Any, Solution] | None = None
    """Its plan, evaluation and solution, re-checked."""
    stats: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(
        cls, store: KeyValueStore | None, options: SolverOptions, tables: CostTables, budget: int | None
    ) -> _MemoRecall:
        """The entries of this problem (none in deterministic runs: the memo would make the
        answer depend on earlier runs)."""
        out = cls()
        if store is not None and not options.deterministic:
            how = {
                "seed": options.seed,
                "use_hint": options.use_hint,
                "reductions": options.reductions,
                "max_model_vars": options.max_model_vars,
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
            self.plan = _recalled(graph, mesh, zero_stage, tables, self.stored, budget)
            if self.plan is None:
                self.stored, self.rejected = None, True  # replaced by this solve's result
            self.entry = self.stored
        if self.plan is None and self.stored_free is not None:
            self.plan = _recalled(graph, mesh, zero_stage, tables, self.stored_free, budget)
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


def _recalled(
    graph: Graph,
    mesh: Mesh,
    zero_stage: int,
    tables: CostTables,
    memo: MemoEntry,
    budget: int | None,
) -> tuple[Plan, Any, Solution] | None:
    """The solve memo's plan, re-checked as a solver result is (:func:`_verify`): its objective
    recomputed on the problem equal to the stored one, the evaluator's step time equal to it,
    its memory within the budget; None when any of that fails."""
    t0 = time.perf_counter()
    built = build_problem(tables, budget)
    if len(memo.choices) != len(built.op_names):
        return None
    choices: list[int] = []
    for name in built.op_names:
        c = memo.choices.get(name)
        if c is None or c >= len(tables.ops[name].signatures):
            return None
        choices.append(c)
    objective, _ = evaluate_problem(built.problem, choices)
    if not math.isfinite(objective) or not math.isclose(objective, memo.objective, rel_tol=VERIFY_RTOL):
        return None
    candidate = Plan.from_assignment(
        graph,
        mesh,
        zero_stage,
        _assignment(built, choices),
        memory_budget_bytes=budget,
        runtime=tables.runtime.name,
    )
    ev = evaluate(graph, candidate)
    try:
        _verify(ev, _SolvedObjective(objective), budget)
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


def _worth_polishing(
    solution: Solution,
    best_bound: float,
    options: SolverOptions,
    deadline: Deadline,
    reserve: float,
    built: BuiltProblem,
) -> bool:
    """Solve a fitting round again, from its plan, with the time left?  Only when its gap
    (against the best bound of any round) misses the target and the time left covers an
    untied solve of this size (:data:`UNTIED_S_PER_NODE`)."""
    if options.deterministic or solution.objective <= 0:
        return False
    gap = (solution.objective - max(best_bound, solution.bound)) / solution.objective
    left = deadline.left() - reserve
    return gap > options.relative_gap and left >= max(
        MIN_SOLVE_S, 2 * UNTIED_S_PER_NODE * built.problem.num_nodes
    )


DETERMINISTIC_WALL_FACTOR = 4
"""Deterministic runs measure their limit in CP-SAT's deterministic units; their wall
clock is capped at this many times the limit per solve, so a whole command gets
this factor times the limit for every memory round and mesh shape."""


def _wall_limit(options: SolverOptions) -> float:
    """Wall seconds the command may take."""
    if options.deterministic:
        return DETERMINISTIC_WALL_FACTOR * options.time_limit_s * MAX_MEMORY_ROUNDS * 4
    return options.time_limit_s


def _solve_built(
    built: BuiltProblem,
    options: SolverOptions,
    progress: ProgressFn | None,
    hint: list[int] | None,
    tie_layers: bool,
    untie_after: bool = True,
    sweep_untied: bool = True,
) -> Solution:
    """Solve the problem; with ``tie_layers``, first with identical layers tied (fast, small)
    and then untied from that plan, so the reported bound and gap are the real problem's.
    ``untie_after`` False stops after the tied solve (the tied plan, with the untied
    problem's trivial bound), e.g. to see first whether the tied plan fits the budget.
    When there is no time for the untied solve, the untied problem's bound is swept with
    TRW-S for the rest of the time (:func:`_untied_bound`) if ``sweep_untied``, else it is
    the trivial bound."""
    # the search (OR-Tools, numba) is imported when a problem is solved, not to recall one
    from autopar_solver.heuristic import improve
    from autopar_solver.solve import solve
    from autopar_solver.tying import structural_classes, tie, untie

    if not tie_layers:
        return solve(built.problem, options, progress=progress, hint=hint)
    t0 = time.perf_counter()
    graph = built.tables.graph
    index = {name: i for i, name in enumerate(built.op_names)}
    labelled = [
        (index[e.producer], index[e.consumer], f"{e.out_port}>{e.in_port}") for e in built.tables.edges
    ]
    classes = structural_classes(
        [built.tables.op_keys.get(n, graph.op_by_name[n].type) for n in built.op_names],
        labelled,
        built.problem.num_choices,
        rounds=TIE_ROUNDS,
    )
    tied = tie(built.problem, classes)
    tied_hint = None
    if hint is not None:
        tied_hint = [-1] * tied.num_nodes
        for node, c in enumerate(classes):
            if tied_hint[c] < 0 and hint[node] >= 0:
                tied_hint[c] = hint[node]
        if any(h < 0 for h in tied_hint):
            tied_hint = None
    t_tie = time.perf_counter() - t0
    tied_options = (
        options
        if options.deterministic
        else replace(options, time_limit_s=max(MIN_SOLVE_S, TIED_SHARE * options.time_limit_s - t_tie))
    )
    sol = solve(tied, tied_options, progress=progress, hint=tied_hint)
    if not sol.ok:
        return Solution(
            untie(classes, sol.choices) if sol.choices else [],
            sol.objective,
            sol.bound,
            sol.gap,
            sol.status,
            sol.wall_s,
            {**sol.stats, "tying": {"classes": tied.num_nodes}},
        )
    expanded = untie(classes, sol.choices)
    tied_objective, _ = evaluate_problem(built.problem, expanded)
    # The tied optimum is only a restriction of the real problem: solve the untied
    # problem with it as the hint, for the rest of the time, so the plan can leave
    # the tie where that pays and the bound (and gap) is the untied problem's.
    t1 = time.perf_counter()
    remaining = options.time_limit_s - (t1 - t0)
    if not untie_after or (
        not options.deterministic and remaining < UNTIED_S_PER_NODE * built.problem.num_nodes
    ):
        # no time to solve the untied problem (its reductions and heuristic alone take
        # longer): the tied plan, with the untied problem's trivial bound (every node and
        # edge at its least), which is valid where the tied bound is not
        problem = built.problem
        bound = min(trivial_bound(problem), tied_objective)
        untied_bound: dict[str, Any] | None = None
        if untie_after and sweep_untied and not options.deterministic:
            untied_bound = _untied_bound(problem, t0 + options.time_limit_s - UNTIED_BOUND_MARGIN_S)
            if untied_bound is not None:
                bound = min(max(bound, untied_bound["bound"]), tied_objective)
        gap = 0.0 if tied_objective <= 0 else max(0.0, (tied_objective - bound) / tied_objective)
        stats = {
            **sol.stats,
            "tying": {
                "nodes": problem.num_nodes,
                "classes": tied.num_nodes,
                "tied_objective": tied_objective,
                "tied_gap": sol.gap,
                "untied": "skipped: "
                + ("no time left" if untie_after else "the tied plan's memory is checked first")
                + (" (trivial bound)" if untied_bound is None else " (TRW-S bound of the untied problem)"),
                "untied_bound": untied_bound,
            },
        }
        return Solution(expanded, tied_objective, bound, gap, "feasible", time.perf_counter() - t0, stats)
    untied_options = replace(options, time_limit_s=max(MIN_SOLVE_S, remaining))
    untied = solve(built.problem, untied_options, progress=progress, hint=expanded)
    stats = dict(untied.stats)
    stats["tying"] = {
        "nodes": built.problem.num_nodes,
        "classes": tied.num_nodes,
        "edges_tied": len(tied.edges),
        "tied_objective": tied_objective,
        "tied_bound": sol.bound,
        "tied_gap": sol.gap,
        "tied_status": sol.status,
        "untied_objective": untied.objective,
        "untied_improvement": tied_objective - untied.objective,
        "time_tie_s": t_tie,
        "time_tied_solve_s": t1 - t0 - t_tie,
        "time_untied_solve_s": time.perf_counter() - t1,
    }
    if not untied.ok or untied.objective > tied_objective:
        # keep the tied plan (polished) but report the untied problem's bound
        polished = improve(
            built.problem, expanded, time_budget_s=min(1.0, max(0.0, options.time_limit_s - (t1 - t0)) / 4)
        )
        objective, _ = evaluate_problem(built.problem, polished)
        bound = untied.bound if untied.ok else sol.bound
        gap = 0.0 if objective <= 0 else max(0.0, (objective - bound) / objective)
        return Solution(polished, objective, bound, gap, "feasible", time.perf_counter() - t0, stats)
    return Solution(
        untied.choices,
        untied.objective,
        untied.bound,
        untied.gap,
        untied.status,
        time.perf_counter() - t0,
        stats,
    )


UNTIED_BOUND_MARGIN_S = 0.3
"""Seconds before the solve's end at which the untied problem's sweeps stop."""


def _untied_bound(problem: Problem, deadline: float) -> dict[str, Any] | None:
    """A TRW-S bound of ``problem`` (not reduced; memory rows left out, so a bound of the
    problem with them too) swept until ``deadline``; None when there is not time for it
    (:data:`UNTIED_BOUND_S_PER_NODE`).  The tied plan is a plan of ``problem``, so this is
    what proves how far it can be from the untied optimum."""
    from autopar_solver.bounds import DiffusionBound

    start = time.perf_counter()
    if deadline - start < UNTIED_BOUND_S_PER_NODE * problem.num_nodes:
        return None
    run = DiffusionBound(problem)
    laid_out = time.perf_counter()
    value = run.run(1_000_000, deadline)
    return {
        "bound": value,
        "sweeps": run.sweeps,
        "layout_s": laid_out - start,
        "sweeps_s": time.perf_counter() - laid_out,
    }


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=lambda o: o.item() if hasattr(o, "item") else str(o)))


def _verify(ev: Any, solution: Solution | _SolvedObjective, budget: int | None) -> None:
    if not ev.valid:
        raise VerificationError(
            "invalid_plan",
            f"the evaluator rejected the solver's plan: {ev.errors[:3]}",
            errors=ev.errors[:20],
        )
    if not math.isclose(ev.step_time_s, solution.objective, rel_tol=VERIFY_RTOL, abs_tol=1e-12):
        raise VerificationError(
            "cost_mismatch",
            f"evaluator step time {ev.step_time_s!r} s != solver objective {solution.objective!r} s",
        )
    if budget is not None and ev.memory.total > budget:
        raise VerificationError(
            "memory_mismatch", f"plan needs {ev.memory.total:.0f} bytes per device > budget {budget}"
        )


def _hint_choices(hint: Plan, tables: CostTables) -> list[int] | None:
    """Choices of ``hint`` in topological op order, or None if it does not fit these tables."""
    if tuple(hint.mesh.shape) != tuple(tables.mesh.shape):
        return None
    choices = []
    for op in tables.graph.topological_order:
        sig = hint.signatures.get(op.name)
        sigs = tables.ops[op.name].signatures
        if sig is None or sig not in sigs:
            choices.append(-1)
        else:
            choices.append(sigs.index(sig))
    if all(c < 0 for c in choices):
        return None
    return choices


def _human_bytes(n: float) -> str:
    """``1.50 GiB`` / ``12.3 MiB`` / ``512 B``: sizes in error messages."""
    if not math.isfinite(n):
        return "unknown"
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def memory_floors(tables: CostTables, deadline: Deadline | None = None) -> np.ndarray:
    """Bytes per device that every plan needs at each topological position, at least.

    The memory row of position ``p`` (see :func:`build_problem`) is the ZeRO-3 gather
    buffer, plus every variable's model states, plus each activation live at ``p``, plus
    the boxed copies its op receives.  Each term is at least its smallest value over the
    choices (a boxed copy at least 0), so the row is at least the sum of those minima::

        floor[p] = sum_v min_a states_v(a) + sum_(t live at p) min_a bytes_t(a)

    (bytes).  A floor over the budget proves that no plan fits; the largest floor is the
    least budget worth trying.  Raises :class:`TimeLimitError` when ``deadline`` runs out
    first (a 100k-op graph takes seconds)."""
    graph = tables.graph
    order = graph.topological_order
    index = {op.name: i for i, op in enumerate(order)}
    base = sum(float(t.min()) for t in _state_terms(tables, index).values())
    if tables.zero_stage >= 3:
        replicated = NdSbp(tuple(B for _ in tables.mesh.shape))
        base += zero3_gather_buffer_bytes(
            graph, {v.op: replicated for v in graph.variables}, tables.mesh.shape
        )
    change = np.zeros(len(order) + 1)
    _check_floors(deadline, "model states")
    intervals = activation_intervals(graph)
    # identical layers share op tables: the largest split of an output port, once per table
    most_split: dict[tuple[int, int], int] = {}
    mesh_shape = tables.mesh.shape
    for n, (tname, (start, end)) in enumerate(intervals.items()):
        if n % 4096 == 4095:
            _check_floors(deadline, f"{n} of {len(intervals)} activations")
        pname, out_port = graph.producer[tname]
        k = list(graph.op_by_name[pname].outputs).index(out_port)
        table = tables.ops[pname]
        split = most_split.get((id(table), k))
        if split is None:
            split = most_split[(id(table), k)] = max(
                s.outputs[k].split_factor(mesh_shape) for s in table.signatures
            )
        spec = graph.tensors[tname]
        least = spec.numel * DTYPE_BYTES[spec.dtype] / split
        change[start] += least
        change[end + 1] -= least
    return base + np.cumsum(change[:-1])


def _check_floors(deadline: Deadline | None, done: str) -> None:
    if deadline is not None and deadline.expired():
        raise TimeLimitError(
            "time_limit",
            f"the time limit ({round(deadline.limit_s, 2):g} s) ran out while computing the memory floors "
            f"after the cost tables ({done} done); raise the time limit",
            phase="memory_floors",
        )


def _raise_infeasible(
    tables: CostTables,
    budget: int | None,
    positions: list[int],
    mesh: Mesh,
    deadline: Deadline,
    floors: np.ndarray | None = None,
) -> None:
    """Raise :class:`InfeasibleError` with the least memory needed: the largest memory
    floor when it is over the budget (proven at once), else CP-SAT's least peak over the
    constrained positions, searched for the time left."""
    from autopar_solver.cpsat import min_feasible_memory

    floors = memory_floors(tables) if floors is None else floors
    floor = float(floors.max()) if len(floors) else 0.0
    if budget is not None and floor > budget:
        min_bytes, proven, how = floor, True, "(proven: at least that at one liveness point)"
    else:
        left = deadline.left()
        built = build_problem(tables, budget, positions or [int(np.argmax(floors)) if len(floors) else 0])
        try:
            min_bytes, proven = min_feasible_memory(
                built.problem, SolverOptions(time_limit_s=min(10.0, max(0.2, left)), workers=1)
            )
        except Exception as exc:
            log.warning("could not compute the smallest feasible memory: %s", exc)
            min_bytes, proven = float("nan"), False
        how = "(proven)" if proven else "(lower bound at the constrained liveness points)"
    raise InfeasibleError(
        None,
        f"no plan on mesh {list(mesh.shape)} fits {_human_bytes(budget or 0)} per device; "
        f"the smallest memory found feasible is {_human_bytes(min_bytes)} {how}"
        ": raise the budget, use a higher ZeRO stage, or add devices",
        min_feasible_bytes=math.ceil(min_bytes) if math.isfinite(min_bytes) else None,
        proven=proven,
        mesh_shape=list(mesh.shape),
    )


# ------------------------------------------------------------------ entry point


def plan(
    request: PlanRequest,
    *,
    store: KeyValueStore | None = None,
    progress: ProgressFn | None = None,
    hint: Plan | None = None,
    deadline: Deadline | None = None,
    resolve: bool = False,
) -> Plan:
    """Solve ``request``; search the logical mesh shapes when none is given.

    The time limit (``request.options.time_limit_s``, counted from ``deadline.start``
    when a deadline is given, e.g. by a command that loaded the graph first) bounds
    the whole call.  ``progress`` gets every phase, then ``done`` once with the
    chosen plan's objective.  The cyclic garbage collector is paused meanwhile
    (:func:`~autopar.collector.collector_paused`).

    With a ``store``, what earlier solves of the same problem proved is recalled
    (:mod:`autopar_solver.solve_memo`): re-checked, it is the answer when its gap is
    within ``options.relative_gap`` (unless ``resolve``), else where the solve starts.
    """
    with collector_paused():
        return _plan(request, store=store, progress=progress, hint=hint, deadline=deadline, resolve=resolve)


def _plan(
    request: PlanRequest,
    *,
    store: KeyValueStore | None,
    progress: ProgressFn | None,
    hint: Plan | None,
    deadline: Deadline | None,
    resolve: bool = False,
) -> Plan:
    deadline = deadline if deadline is not None else Deadline(_wall_limit(request.options))
    if deadline.left() < VALIDATE_S_PER_OP * len(request.graph.ops):
        # not even time to check the graph (the caller spent it loading it)
        raise TimeLimitError(
            "time_limit",
            f"the time limit ({round(deadline.limit_s, 2):g} s) ran out while loading and checking the graph "
            f"({len(request.graph.ops)} ops, {deadline.elapsed():.1f} s); raise the time limit",
            phase="load",
        )
    graph = request.graph.validate()
    if deadline.expired():
        raise TimeLimitError(
            "time_limit",
            f"the time limit ({round(deadline.limit_s, 2):g} s) ran out while loading and checking the graph "
            f"({len(graph.ops)} ops, {deadline.elapsed():.1f} s); raise the time limit",
            phase="load",
        )
    if request.mesh_shape is not None:
        mesh = Mesh(request.cluster, tuple(request.mesh_shape))
        squeezed = Mesh(request.cluster, tuple(n for n in mesh.shape if n > 1) or (1,))
        result = solve_on_mesh(
            graph,
            squeezed,
            request.memory_budget_bytes,
            request.zero_stage,
            request.options,
            store=store,
            progress=progress,
            hint=hint,
            tie_layers=request.tie_layers,
            deadline=deadline,
            resolve=resolve,
        )
        if squeezed.shape != mesh.shape:
            result = _unsqueeze(graph, result, mesh, deadline)
    else:
        result = _mesh_search(
            request, store=store, progress=progress, hint=hint, deadline=deadline, resolve=resolve
        )
    if result.solver is not None:
        result.solver["command_wall_s"] = deadline.elapsed()
    deadline.report(
        progress,
        "done",
        objective=result.solver.get("objective") if result.solver else result.step_time_s,
        bound=result.solver.get("bound") if result.solver else None,
        shape=tuple(result.mesh.shape),
    )
    return result


def _unsqueeze(graph: Graph, solved: Plan, mesh: Mesh, deadline: Deadline | None = None) -> Plan:
    """``solved`` (planned on ``mesh`` without its size-1 axes) as a plan on ``mesh``, with ``B``
    on every size-1 axis, re-checked by the evaluator on ``mesh`` when that fits in the time
    left (``deadline``; the re-check runs in a child process that is stopped at the deadline).

    A size-1 axis splits nothing and its collectives are free, so every price (compute
    share, boxing, memory) is the same as on the squeezed mesh, while the N-D signature
    lists (and boxing states) would grow by a factor per size-1 axis for nothing.  When
    the re-check does not finish in time, the plan keeps the squeezed mesh's evaluation
    (already verified against the solver), its per-axis figures moved to the kept axes,
    and ``solver["stats"]["recheck"]`` says so.
    """
    kept = [a for a, n in enumerate(mesh.shape) if n > 1]

    def lift(sbp: NdSbp) -> NdSbp:
        values: list[SbpValue] = [B] * mesh.ndim
        for a, v in zip(kept, sbp.values if kept else ()):
            values[a] = v
        return NdSbp(tuple(values))

    signatures = {
        name: Signature(tuple(lift(x) for x in sig.inputs), tuple(lift(x) for x in sig.outputs))
        for name, sig in solved.signatures.items()
    }
    lifted = Plan.from_assignment(
        graph,
        mesh,
        solved.zero_stage,
        signatures,
        memory_budget_bytes=solved.memory_budget_bytes,
        runtime=solved.runtime,
    )
    solver = SolverReport(**(solved.solver or {}))
    left = math.inf if deadline is None else deadline.left()
    ev = _evaluate_within(graph, lifted, left)
    if ev is not None:
        if "objective" in solver:
            _verify(ev, _SolvedObjective(solver["objective"]), solved.memory_budget_bytes)
        attach_evaluation(lifted, ev)
    else:
        axis = {str(i): str(a) for i, a in enumerate(kept)}

        def moved(per_axis: Any) -> Any:
            if not isinstance(per_axis, dict):
                return per_axis
            out = {str(a): 0.0 for a in range(mesh.ndim)}
            out.update({axis.get(str(k), str(k)): v for k, v in per_axis.items()})
            return out

        lifted.predicted = cast(
            Predicted,
            {k: moved(v) if k.endswith("_per_axis") else v for k, v in (solved.predicted or {}).items()},
        )
        lifted.memory = cast(MemoryReport, dict(solved.memory or {}))
        lifted.diagnostics = {**lifted.diagnostics, **solved.diagnostics}
        stats = dict(solver.get("stats", {}))
        stats["recheck"] = (
            f"evaluated on the squeezed mesh {list(solved.mesh.shape)}; the re-check on "
            f"{list(mesh.shape)} did not finish within the time limit"
        )
        solver["stats"] = stats
    lifted.solver = solver
    lifted.diagnostics["solved_on_mesh"] = list(solved.mesh.shape)
    return lifted


RECHECK_MIN_S = 0.5
"""Fewest seconds worth starting the re-check on the requested mesh with."""


def _evaluate_within(graph: Graph, plan_obj: Plan, seconds: float) -> Any:
    """``evaluate(graph, plan_obj)``, or None when it does not finish within ``seconds``
    (then it runs in a forked child that is killed at the limit)."""
    if math.isinf(seconds):
        return evaluate(graph, plan_obj)
    if seconds < RECHECK_MIN_S:
        return None
    import multiprocessing

    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_evaluate_child, args=(graph, plan_obj, send), daemon=True)
    child.start()
    send.close()
    try:
        if not receive.poll(seconds):
            return None
        try:
            ok, value = receive.recv()
        except EOFError:  # the child was killed (e.g. out of memory): no re-check
            return None
        if not ok:
            raise value
        return value
    finally:
        receive.close()
        if child.is_alive():
            child.kill()
        child.join()


def _evaluate_child(graph: Graph, plan_obj: Plan, send: Any) -> None:
    try:
        send.send((True, evaluate(graph, plan_obj)))
    except Exception as exc:  # the parent raises it
        send.send((False, exc))
    send.close()


@dataclass(frozen=True)
class _SolvedObjective:
    objective: float


def _mesh_search(
    request: PlanRequest,
    *,
    store: KeyValueStore | None,
    progress: ProgressFn | None,
    hint: Plan | None,
    deadline: Deadline,
    resolve: bool = False,
) -> Plan:
    """Every candidate shape in turn, in this process with all the workers, each given an
    equal share of the time still left (a shape that finishes early leaves its rest to
    the next); reports carry the shape."""
    t0 = time.perf_counter()
    shapes = candidate_mesh_shapes(request.cluster)
    deadline.report(progress, "mesh_search", detail={"shapes": [list(s) for s in shapes]})
    results: list[dict[str, Any]] = []
    for i, shape in enumerate(shapes):
        share = deadline.left() / (len(shapes) - i)
        shape_deadline = Deadline(min(share, deadline.left()))
        started = time.perf_counter()

        def relay(p: Progress, shape: tuple[int, ...] = shape) -> None:
            if progress is not None:
                left = deadline.left()
                progress(
                    replace(
                        p,
                        elapsed_s=deadline.elapsed(),
                        time_left_s=None if math.isinf(left) else left,
                        shape=shape,
                    )
                )

        try:
            p = solve_on_mesh(
                request.graph,
                Mesh(request.cluster, shape),
                request.memory_budget_bytes,
                request.zero_stage,
                request.options
                if request.options.deterministic
                else replace(request.options, time_limit_s=max(MIN_SOLVE_S, shape_deadline.limit_s)),
                store=store,
                progress=relay if progress else None,
                hint=hint,
                tie_layers=request.tie_layers,
                deadline=shape_deadline,
                resolve=resolve,
                shape_label=shape,
            )
        except (InfeasibleError, TimeLimitError) as exc:
            results.append(
                {"shape": list(shape), "error": exc.to_dict(), "wall_s": time.perf_counter() - started}
            )
            continue
        results.append({"shape": list(shape), "plan": p, "wall_s": time.perf_counter() - started})
    feasible = [r for r in results if "plan" in r]
    if not feasible:
        if all(r["error"].get("code") == "time_limit" for r in results):
            raise TimeLimitError(
                "time_limit",
                f"the time limit ({round(deadline.limit_s, 2):g} s) ran out before any mesh shape "
                "had a verified plan: "
                + "; ".join(f"{r['shape']}: {r['error']['message']}" for r in results),
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
    chosen: Plan = min(feasible, key=lambda r: r["plan"].step_time_s)["plan"]
    chosen.diagnostics["mesh_search"] = [
        {
            "shape": r["shape"],
            "step_time_s": r["plan"].step_time_s if "plan" in r else None,
            "memory_per_device_bytes": r["plan"].memory_per_device_bytes if "plan" in r else None,
            "gap": r["plan"].solver["gap"] if "plan" in r and r["plan"].solver else None,
            "wall_s": r["wall_s"],
            "error": r.get("error", {}).get("message"),
        }
        for r in results
    ]
    if chosen.solver is not None:
        chosen.solver["mesh_search_wall_s"] = time.perf_counter() - t0

    return chosen
