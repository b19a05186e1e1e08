"""The TRW-S dual of :func:`autopar_solver.solve.solve`: its bound, and the plans decoded from it.

:class:`Dual` holds the TRW-S runs (:class:`~autopar_solver.bounds.DiffusionBound`) of a
reduced problem, one without memory prices and, when memory binds, one priced by the
heuristic; it sweeps them and decodes their reparametrised costs into plans (compiled greedy
+ ICM, then the heuristic's descent), moving the memory prices toward the plans' memory.

Off the deterministic path each run sweeps in a thread of its own (:class:`Sweeper`: numba
kernels that release the interpreter lock) while the solving thread runs the heuristic and
decodes snapshots of the runs: on a 2-core machine both cores work.
"""

from __future__ import annotations

import math
import threading
import time
from functools import partial
from typing import Any

import numpy as np

from autopar_solver.bounds import DiffusionBound, LayoutCut, reparametrized
from autopar_solver.heuristic import HeuristicResult, greedy_assignment, solve_heuristic
from autopar_solver.options import SolverOptions
from autopar_solver.problem import Problem, cost_spread, evaluate, memory_fits, trivial_bound

__all__ = ["Dual", "Sweeper", "better", "evaluated", "is_dense", "relative_gap", "starting_prices"]

_DENSE_ENTRIES = 40_000_000
_DENSE_ENTRIES_PER_EDGE = 4096
"""Problems with more edge entries than this, and more than this many per edge on average
(three-axis meshes: mt5-base on [2, 2, 2] has 150.9M entries, 23k per edge; on [4, 2]:
4.3M, 650), skip the reductions: there they copied every matrix for seconds (6-10 s on
the loaded 2-core machine, 2026-12-04) to remove 2 % of the entries, time the TRW-S bound
needs."""
_DETERMINISTIC_SWEEPS = 80
_CHUNK = 10
_MAX_ROUNDS = 120
"""Decodes follow every 10 sweeps, up to 1200 sweeps per solve.  A decode is compiled
(greedy on the reparametrised costs, then ICM on the run's own: about 0.1 s on mt5-base,
as long as 4 sweeps).  Decoded plans improve in jumps (mt5-base on [4, 2]: about 4 %
above the bound up to 90 sweeps, then 0.35 % from 95 on), so decodes come often."""
_DESCENT_EVERY = 4
"""Every 4th decode round also runs the heuristic's descent (tree-block moves, memory
repair; Python, up to :data:`_DECODE_S`) on the round's best decoded plan, as does any
round whose decoded plans all overflow the budget."""
_PRICE_UP = 1.5
_PRICE_DOWN = 1.25
_PRICE_CEILING = 1e200
"""Most seconds per byte a memory row is priced at: where no plan fits (an infeasible
problem the reductions did not see, e.g. a dense one they skip) prices rise each decode,
and past this one memory already outweighs any step time (seconds <= 1e3, bytes <= 1e15)
by 1e180 while priced terms would overflow float64 near 1e308."""
_DECODE_S = 1.0
_MAX_DUAL_ENTRIES = 40_000_000
"""Largest problem (edge matrix entries) TRW-S is set up for: it keeps two copies of
every entry (16 bytes each)."""
_MAX_DENSE_DUAL_ENTRIES = 250_000_000
"""The same for a dense problem (:func:`is_dense`), whose copies are in single precision
(:data:`~autopar_solver.bounds.SINGLE_ENTRIES`; 8 bytes an entry: 2 GB at this size;
mt5-base on [2, 2, 2] has 150.9M entries, whose bound is what proves a three-axis plan's
gap)."""
_SETUP_S_PER_ENTRY = 1.5e-7
"""TRW-S setup seconds per edge entry (measured on mt5-base's reduced problem, 2.9M
entries: 0.2-0.4 s, the compiled layout included)."""
_DENSE_SETUP_S_PER_ENTRY = 6e-8
"""The same for a dense problem (single precision; mt5-base on [2, 2, 2], 150.9M entries,
loaded 2-core machine, 2026-12-04: 2.8-13 s, most of it the first touch of the pages of
the copies)."""
_SETUP_SHARE = 1.0
"""TRW-S is set up only when its estimated setup fits in this share of the time left (a
safety net: the planner already skips the untied solve of a tied graph without time)."""
_SETUP_CUT_SHARE = 0.5
"""A TRW-S layout still running after this share of the time left is abandoned (no time
would be left to sweep it)."""
_DENSE_FINAL_S = 2.0
"""Seconds a dense problem's sweeps stop before its dual phase ends, for the decode of
their last state and the heuristic's descent from the best plan (mt5-base on [2, 2, 2],
loaded 2-core machine: 0.3-0.4 s to decode, 1 s of descent: 43.5 ms -> 40.6 ms)."""
_PRICED_SETUP_FACTOR = 4
"""The priced run is set up only with this many times the first run's setup time left."""


def is_dense(entries: int, edges: int) -> bool:
    """Over :data:`_DENSE_ENTRIES` edge entries, and over :data:`_DENSE_ENTRIES_PER_EDGE` per
    edge on average (three-axis meshes)."""
    return entries > _DENSE_ENTRIES and entries > _DENSE_ENTRIES_PER_EDGE * edges


class Dual:
    """TRW-S runs (without prices and, if memory binds, with the heuristic's
    prices) whose reparametrised problems are decoded into plans: a greedy pass on
    the reparametrised costs, then the heuristic's descent on the true costs."""

    def __init__(
        self,
        reduced: Problem,
        options: SolverOptions,
        deadline: float | None = None,
    ) -> None:
        self.reduced = reduced
        self.best = HeuristicResult([], math.inf, [], False)
        """Best plan so far (:meth:`use_heuristic` sets the heuristic's)."""
        self.options = options
        self.sweepers: list[Sweeper] = []
        """Runs sweeping in threads of their own (:meth:`start_sweeping`)."""
        self._fresh = threading.Event()
        """Set by a sweeper when it has published a new state."""
        self._retired: set[DiffusionBound] = set()
        """Runs that no thread is to sweep again."""
        self.trivial = trivial_bound(reduced)
        """The bound without any sweep: every node and edge at its least, seconds."""
        self.runs: list[DiffusionBound] = []
        self.setup_s = 0.0
        self.rounds = 0
        self.memory = bool(reduced.memory_rows) and reduced.budget_bytes is not None
        """Memory rows are in play (a decoded plan may not fit)."""
        self.decode_s = 0.0
        """Seconds the last decode took (time kept free for the next one)."""
        self.stats: dict[str, Any] = {"decodes": 0, "improved": 0, "sweeps": []}
        entries = sum(m.size for _, _, m in reduced.edges)
        self.dense = is_dense(entries, len(reduced.edges))
        """A problem this big sweeps slowly (three-axis meshes: about 0.3-0.5 s a sweep on
        the loaded 2-core machine): its sweeps stop :data:`_DENSE_FINAL_S` before the dual
        phase ends, so that their last state is decoded and the best plan descended."""
        if not reduced.num_nodes:
            return  # the reductions solved it
        left = math.inf if deadline is None else deadline - time.perf_counter()
        most, per_entry = (
            (_MAX_DENSE_DUAL_ENTRIES, _DENSE_SETUP_S_PER_ENTRY)
            if self.dense
            else (_MAX_DUAL_ENTRIES, _SETUP_S_PER_ENTRY)
        )
        if entries > most or entries * per_entry > _SETUP_SHARE * left:
            # too big to lay out in the time (or memory) there is: the trivial bound only
            self.stats["skipped"] = f"{entries} edge entries"
            return
        began = time.perf_counter()
        try:
            self.runs = [DiffusionBound(reduced, deadline=began + _SETUP_CUT_SHARE * left)]
        except LayoutCut as cut:  # the estimate was short (a loaded machine): no bound in time
            self.stats["skipped"] = f"{entries} edge entries; {cut}"
            return
        self.setup_s = time.perf_counter() - began
        self.stats["sweeps"] = [0]
        self.stats["single_precision"] = self.runs[0].single

    def use_heuristic(self, best: HeuristicResult, deadline: float | None = None) -> None:
        """Start from the heuristic's plan; when memory binds (the plan has prices) add a
        second run on the priced problem, whose bound counts memory, and stop sweeping
        the first (it keeps its bound): off the deterministic path the priced run then
        sweeps alone, in a thread, with both cores' worth of the time."""
        self.best = best
        price = best.price
        if price is None and self.memory:
            # memory rows are in play because an earlier round's plan overflowed; a plan
            # that fits from the start leaves the heuristic no prices to hand on
            price = starting_prices(self.reduced)
        if (
            self.runs
            and price is not None
            and math.isfinite(self.runs[0].value)
            and (deadline is None or deadline - time.perf_counter() > _PRICED_SETUP_FACTOR * self.setup_s)
        ):
            self.stop_sweeping()
            if not self.options.deterministic:
                self._retired.add(self.runs[0])
            self.runs.append(DiffusionBound(self.reduced, price))
        self.stats["sweeps"] = [r.sweeps for r in self.runs]

    @property
    def lower(self) -> float:
        return max([self.trivial, *(run.value for run in self.runs)])

    def advance(self, deadline: float, target_gap: float) -> None:
        """Sweep and decode until ``deadline`` (deterministic: a fixed sweep count),
        until every run has converged, or until the gap is at most ``target_gap``.

        Decodes follow every :data:`_CHUNK` sweeps; time for one more decode is kept
        before the deadline; after two rounds only the run with the higher bound goes
        on.  Off the deterministic path every run sweeps in a thread of its own
        (:meth:`_advance_in_parallel`)."""
        deterministic = self.options.deterministic
        if not deterministic:
            self.start_sweeping(deadline)
        if self.sweepers:
            self._advance_in_parallel(deadline, target_gap)
            return
        while True:
            live = [r for r in self.runs if not r.converged and r not in self._retired]
            if deterministic:
                live = [r for r in live if r.sweeps < _DETERMINISTIC_SWEEPS]
            if self.rounds >= _MAX_ROUNDS:
                break
            if self.rounds >= 2 and len(live) > 1:
                live = [max(live, key=lambda r: r.value)]
            stop = math.inf if deterministic else deadline - 1.5 * self.decode_s
            now = time.perf_counter()
            if not live or now >= stop:
                break
            for k, run in enumerate(live):
                share = stop if deterministic else now + (stop - now) * (k + 1) / len(live)
                between: list[tuple[np.ndarray, np.ndarray]] = []
                run.run(_CHUNK, share, between=partial(_take_snapshot, run, between))
                self._decode(run, deadline, reverse_state=between[0] if between else None)
            self.rounds += 1
            if self.best.feasible and relative_gap(self.best.cost, self.lower) <= target_gap:
                break
        self.stats["sweeps"] = [r.sweeps for r in self.runs]

    def start_sweeping(self, deadline: float) -> None:
        """Sweep every run that is not converged nor sweeping yet in a thread of its own
        until ``deadline`` (e.g. while the heuristic runs); :meth:`advance` then decodes
        what they reach."""
        until = deadline - _DENSE_FINAL_S if self.dense else deadline
        for run in self.runs:
            if run in self._retired or run.converged:
                continue
            if all(s.run is not run for s in self.sweepers):
                self.sweepers.append(Sweeper(run, until, self._fresh))

    def _advance_in_parallel(self, deadline: float, target_gap: float) -> None:
        """:meth:`advance` while the runs sweep in threads of their own (compiled, without
        the interpreter lock): this one decodes each run's latest state every
        :data:`_CHUNK` sweeps (new memory prices go to the run's thread, which applies
        them between chunks) and runs the heuristic's descent, so both cores of a small
        machine work.  After two decodes only the run with the higher bound goes on."""
        decoded: dict[Sweeper, int] = {}
        try:
            while self.sweepers:
                self._fresh.wait(timeout=max(0.0, deadline - time.perf_counter()))
                self._fresh.clear()
                for sweeper in list(self.sweepers):
                    state, done = sweeper.latest()
                    if state is not None and state[0] != decoded.get(sweeper):
                        if time.perf_counter() >= deadline:
                            break
                        decoded[sweeper] = state[0]
                        self._decode(sweeper.run, deadline, state=state[1], reverse_state=state[2])
                        self.rounds += 1
                    if done:
                        self._stop(sweeper)
                if self.best.feasible and relative_gap(self.best.cost, self.lower) <= target_gap:
                    break
                if self.rounds >= 2 and len(self.sweepers) > 1:
                    lowest = min(self.sweepers, key=lambda s: s.run.value)
                    self._retired.add(lowest.run)
                    self._stop(lowest)
                if time.perf_counter() >= deadline:
                    break
        finally:
            self.stop_sweeping()
        if self.dense:
            self._final_descent(deadline)
        self.stats["sweeps"] = [r.sweeps for r in self.runs]

    def _final_descent(self, deadline: float) -> None:
        """A dense problem: the heuristic's descent from the best plan, for the time its
        sweeps left free (:data:`_DENSE_FINAL_S`)."""
        left = deadline - time.perf_counter()
        if not self.best.feasible or left < 0.1:
            return
        candidate = solve_heuristic(
            self.reduced, start=self.best.choices, time_budget_s=0.8 * left, seed=self.options.seed
        )
        self.stats["final_descent"] = {"from": self.best.cost, "to": candidate.cost}
        if better(candidate, self.best):
            candidate.price = candidate.price if candidate.price is not None else self.best.price
            self.best = candidate

    def stop_sweeping(self) -> None:
        """Stop every sweeping thread after its current pass (each run keeps every sweep it
        made); re-raise what stopped one."""
        while self.sweepers:
            self._stop(self.sweepers[-1])

    def _stop(self, sweeper: Sweeper) -> None:
        self.sweepers.remove(sweeper)
        sweeper.stop()

    def _reprice(self, run: DiffusionBound, price: np.ndarray) -> None:
        """Give ``run`` new memory prices: through its thread when it sweeps in one."""
        for sweeper in self.sweepers:
            if sweeper.run is run:
                sweeper.reprice(price)
                return
        run.reprice(price)

    def _decode(
        self,
        run: DiffusionBound,
        deadline: float,
        *,
        state: tuple[np.ndarray, np.ndarray] | None = None,
        reverse_state: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        """Greedy on the reparametrised costs in the forward pass's order, and in the
        backward pass's (from ``reverse_state``, the snapshot taken between the last
        sweep's passes), each then descended by ICM on
        the run's own costs (:meth:`DiffusionBound.decode`, :meth:`DiffusionBound.descend`,
        compiled; ``state``: a snapshot to decode instead of the run now).  When memory
        binds and no such plan fits, the heuristic's greedy pass, which keeps rows within
        the budget, is tried too.  The best plan then goes through the heuristic's descent
        (tree-block moves, memory repair) when it does not fit, and every
        :data:`_DESCENT_EVERY` rounds; a priced run also moves its prices toward the
        plan's memory (up where it overflows a row, down where it fits).

        The two orders find different plans where the LP is not tight (mt5-base on
        [2, 4] after 40 sweeps: 0.0505 s in node order, 0.0422 s in reverse, bound
        0.0420 s; t5-base the other way round), so both are tried."""
        if not math.isfinite(run.current):
            return
        began = time.perf_counter()
        raws = [run.descend(run.decode(state=state))]
        if reverse_state is not None:
            raws.append(run.descend(run.decode(reverse=True, state=reverse_state)))
        scored = [self._score(raw) for raw in raws]
        if self.memory and all(blocked for blocked, *_ in scored) and state is None:
            scored.append(self._score(greedy_assignment(reparametrized(run))))
        blocked, cost, raw, memory = min(scored, key=lambda t: (t[0], t[1]))
        if run.price.any() and self.reduced.budget_bytes is not None:
            over = np.array(memory) > self.reduced.budget_bytes
            floor = float(run.price.max())
            price = np.where(over, np.maximum(run.price * _PRICE_UP, floor * 1e-3), run.price / _PRICE_DOWN)
            self._reprice(run, np.minimum(price, _PRICE_CEILING))
        # the compiled part: what the deadline keeps free for the next decode
        self.decode_s = time.perf_counter() - began
        if not blocked and self.rounds % _DESCENT_EVERY != _DESCENT_EVERY - 1:
            candidate = HeuristicResult(raw, cost, memory, True)
        else:
            if self.options.deterministic:
                budget = math.inf
            else:
                budget = max(0.05, min(_DECODE_S, 0.5 * (deadline - time.perf_counter())))
            candidate = solve_heuristic(self.reduced, start=raw, time_budget_s=budget, seed=self.options.seed)
        self.stats["decodes"] += 1
        if better(candidate, self.best):
            if candidate.price is None:
                candidate.price = self.best.price
            self.best = candidate
            self.stats["improved"] += 1

    def _score(self, choices: list[int]) -> tuple[bool, float, list[int], list[float]]:
        """(does not fit, seconds, choices, bytes per memory row) on the reduced problem."""
        cost, memory, fits = evaluated(self.reduced, choices)
        return not fits, cost, choices, memory


_State = tuple[int, tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray] | None]
"""Sweeps done, the run's :meth:`~DiffusionBound.snapshot` after the last of them, and the
snapshot between its two passes (the state to decode in the backward pass's order)."""


class Sweeper:
    """A thread that sweeps ``run`` :data:`_CHUNK` sweeps at a time until ``deadline``,
    convergence (a priced run: until new prices un-converge it) or :meth:`stop`,
    publishing a :data:`_State` after each chunk (and setting ``fresh``).  Only this
    thread touches the run meanwhile: readers take snapshots, and new prices
    (:meth:`reprice`) wait for the end of a chunk."""

    def __init__(self, run: DiffusionBound, deadline: float, fresh: threading.Event) -> None:
        self.run = run
        self.deadline = deadline
        self._lock = threading.Lock()
        self._fresh = fresh
        self._finished = threading.Event()
        self._stop = threading.Event()
        self._latest: _State | None = None
        self._price: np.ndarray | None = None
        self._priced = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._sweep, name="trws-sweeps", daemon=True)
        self._thread.start()

    def _sweep(self) -> None:
        run = self.run
        try:
            while not self._stop.is_set() and time.perf_counter() < self.deadline:
                self._apply_price()
                if run.converged:
                    if not run.price.any():
                        break  # nothing will move it again
                    # a priced run waits for the prices of the decode of its last state
                    self._priced.wait(timeout=max(0.0, self.deadline - time.perf_counter()))
                    continue
                between: list[tuple[np.ndarray, np.ndarray]] = []
                run.run(_CHUNK, self.deadline, between=partial(_take_snapshot, run, between))
                state = (run.sweeps, run.snapshot(), between[0] if between else None)
                with self._lock:
                    self._latest = state
                self._fresh.set()
        except BaseException as exc:  # re-raised in the solving thread by stop()
            self._failure = exc
        finally:
            self._finished.set()
            self._fresh.set()

    def _apply_price(self) -> None:
        with self._lock:
            price, self._price = self._price, None
            self._priced.clear()
        if price is not None:
            self.run.reprice(price)

    def reprice(self, price: np.ndarray) -> None:
        """New memory prices for the run, applied before its next chunk (or at :meth:`stop`)."""
        with self._lock:
            self._price = price
            self._priced.set()

    def latest(self) -> tuple[_State | None, bool]:
        """The latest state published, and whether the thread has finished."""
        with self._lock:
            return self._latest, self._finished.is_set()

    def stop(self) -> None:
        self._stop.set()
        self._priced.set()
        self._thread.join()
        self._apply_price()
        if self._failure is not None:
            raise self._failure


def _take_snapshot(run: DiffusionBound, out: list[tuple[np.ndarray, np.ndarray]]) -> None:
    out.append(run.snapshot())


def starting_prices(problem: Problem) -> np.ndarray:
    """Seconds per byte of each memory row at which memory weighs about as much as time:
    the median spread of the node costs over the median spread of the row's per-node
    bytes (the heuristic's first price when it has to price memory); decodes then move
    each price up while plans overflow the row and down while they fit."""
    cost_scale = max(cost_spread(problem.node_costs), 1e-30)
    prices = []
    for row in problem.memory_rows:
        bytes_spread = [float(np.ptp(t)) for t in row.terms.values() if t.size > 1]
        prices.append(cost_scale / max(float(np.median(bytes_spread)) if bytes_spread else 1.0, 1.0))
    return np.array(prices)


def evaluated(problem: Problem, choices: list[int]) -> tuple[float, list[float], bool]:
    """Seconds, bytes per memory row, and whether the plan is finite and fits."""
    cost, memory = evaluate(problem, choices)
    return cost, memory, math.isfinite(cost) and memory_fits(problem.budget_bytes, memory)


def better(a: HeuristicResult, b: HeuristicResult) -> bool:
    if a.feasible != b.feasible:
        return a.feasible
    return a.cost < b.cost


def relative_gap(objective: float, bound: float) -> float:
    """``(objective - bound) / objective``; 0 when the bound meets the objective."""
    if objective <= bound:
        return 0.0
    return (objective - bound) / abs(objective) if objective != 0 else math.inf
