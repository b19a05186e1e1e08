"""Solve memo: a repeated problem is answered from what an earlier solve proved, re-checked;
an entry that does not verify is not trusted; a bound is only ever raised."""

import json
import zlib

import pytest

from autopar.cost.evaluate import evaluate
from autopar.hardware.cluster import Cluster
from autopar.infra.store import MemoryStore
from autopar.ir.plan import Plan
from autopar.models import build
from autopar_solver.options import SolverOptions
from autopar_solver.planner import PlanRequest, plan
from autopar_solver.solve_memo import MEMO_VERSION, REMEMBER_ATTEMPTS, MemoEntry, remember

CLUSTER = Cluster.parse("1x4", "a100-40g")
SHAPE = (4,)
RUNTIME = "oneflow-0.9-shard-min-1"
"""The mechanics tested here need solves that prove their optimum quickly: with OneFlow's
default ZeRO threshold tiny-gpt's small variables stay unsharded and its [2, 2] problem is
one the dual bound does not close (2 % short of the optimum; CP-SAT needs ~40 s to prove
it), see ``tests/solver/test_planner.py``.  On ``SHAPE`` [4] the unbudgeted solve proves
its optimum in about 1 s and a budget at 90 % of its peak in about 20 s (idle, 2 cores;
[2, 2] took 18 s and 48 s, and under CI's load a [2, 2] budget ran out of its 60 s)."""
OPTIONS = SolverOptions(runtime=RUNTIME, time_limit_s=60, workers=2)
"""Generous: each solve stops at its gap in seconds when the machine is idle; a loaded
machine that stops one short of its gap makes the recall solve again (and find better)."""


@pytest.fixture(scope="module")
def graph():
    return build("tiny-gpt")


def _memo(p) -> dict:
    return p.solver["stats"]["memo"]


def _entry(store: MemoryStore, key: str) -> MemoEntry:
    found = MemoEntry.from_bytes(store.get_many([key])[key])
    assert found is not None
    return found


@pytest.fixture(scope="module")
def once(graph) -> tuple[dict[str, bytes], PlanRequest, Plan]:
    """One solve of tiny-gpt on [4] into an empty store (solved once for the module):
    what the store then holds, the request, the plan."""
    store = MemoryStore()
    request = PlanRequest(graph, CLUSTER, SHAPE, None, 2, OPTIONS)
    first = plan(request, store=store)
    return dict(store._data), request, first


def _solved_once(once) -> tuple[MemoryStore, PlanRequest, Plan, str, MemoEntry]:
    """A store of its own that holds the module's one solve of tiny-gpt on [4] (``once``):
    store, request, plan, key, entry."""
    held, request, first = once
    store = MemoryStore()
    store.put_many(held)
    key = _memo(first)["key"]
    return store, request, first, key, _entry(store, key)


def test_a_repeated_problem_is_recalled_and_re_checked(graph, once):
    store, _, first, _, _ = _solved_once(once)  # solved into an empty store
    memo = _memo(first)
    assert memo["found"] is False and memo["stored"] is True
    entry = _entry(store, memo["key"])
    assert entry.objective == first.solver["objective"] and entry.bound == first.solver["bound"]
    # another time limit is the same problem: the plan and bound come back, re-checked
    again = plan(
        PlanRequest(
            graph, CLUSTER, SHAPE, None, 2, SolverOptions(runtime=RUNTIME, time_limit_s=7, workers=2)
        ),
        store=store,
    )
    assert _memo(again)["key"] == memo["key"]
    assert _memo(again)["verified"] is True
    if first.solver["gap"] <= OPTIONS.relative_gap:  # proved: answered by the stored plan
        assert _memo(again)["solved_again"] is False and _memo(again)["plan"] == "recalled"
        assert again.signatures == first.signatures
        assert again.solver["bound"] == first.solver["bound"]
    else:  # a loaded machine stopped the first solve short: it starts from it, bound kept
        assert _memo(again)["solved_again"] is True
        assert again.solver["objective"] <= first.solver["objective"] + 1e-15
        assert again.solver["bound"] >= first.solver["bound"] - 1e-15
    ev = evaluate(graph, again)
    assert ev.valid and ev.per_edge_iteration_time_s == pytest.approx(again.solver["objective"], rel=1e-9)
    # another ZeRO stage is another problem
    other = plan(PlanRequest(graph, CLUSTER, SHAPE, None, 3, OPTIONS), store=store)
    assert _memo(other)["key"] != memo["key"] and _memo(other)["found"] is False


def test_an_entry_that_does_not_verify_is_solved_again_and_replaced(graph, once):
    store, request, first, key, true = _solved_once(once)
    # a stored objective the plan does not have (and a bound that would prove it)
    lie = MemoEntry(true.choices, true.positions, true.objective / 2, true.objective / 2)
    store.put_many({key: lie.to_bytes()})
    again = plan(request, store=store)
    assert _memo(again)["found"] is True and _memo(again)["verified"] is False
    # solved again, not the stored lie: each solve's plan is at least the other's proven
    # bound (the two solves may stop at different plans within their gaps under load)
    assert again.solver["objective"] > lie.objective * 1.01
    assert again.solver["objective"] >= first.solver["bound"] * (1 - 1e-9)
    assert first.solver["objective"] >= again.solver["bound"] * (1 - 1e-9)
    assert again.solver["bound"] <= again.solver["objective"] + 1e-15
    assert _entry(store, key).objective == pytest.approx(again.solver["objective"], rel=1e-12)
    # a choice out of an op's table: not trusted either
    name = next(iter(true.choices))
    bad = MemoEntry({**true.choices, name: 10**6}, true.positions, true.objective, true.bound)
    store.put_many({key: bad.to_bytes()})
    assert _memo(plan(request, store=store))["verified"] is False


def test_an_entry_above_the_gap_is_where_the_solve_starts_and_bounds_only_grow(graph, once):
    store, request, _, key, true = _solved_once(once)
    # the same plan with only the trivial bound (step times are >= 0): gap 100 %
    store.put_many({key: MemoEntry(true.choices, true.positions, true.objective, 0.0).to_bytes()})
    again = plan(request, store=store)
    memo = _memo(again)
    assert memo["verified"] is True and memo["solved_again"] is True
    assert again.solver["objective"] <= true.objective + 1e-15
    # the solve proved a bound above the stored trivial one (how close it gets to the options'
    # gap depends on the CPU it had: 1.75 % after 60 s beside an 8-rank OneFlow build)
    assert again.solver["bound"] > 0.0 and again.solver["gap"] < 1.0
    stored = _entry(store, key)
    assert stored.bound == pytest.approx(again.solver["bound"], rel=1e-12)
    assert stored.objective <= true.objective + 1e-15


@pytest.mark.slow  # 22 s idle: two solves under a budget
def test_under_a_budget_the_memory_rows_come_back_with_the_plan(graph):
    store = MemoryStore()
    free = plan(PlanRequest(graph, CLUSTER, SHAPE, None, 2, OPTIONS)).memory_per_device_bytes
    request = PlanRequest(graph, CLUSTER, SHAPE, int(free * 0.9), 2, OPTIONS)
    first = plan(request, store=store)
    assert first.solver["memory_rows"] >= 1
    entry = _entry(store, _memo(first)["key"])
    assert entry.positions
    again = plan(request, store=store)
    memo = _memo(again)
    assert memo["found"] is True and memo["verified"] is True
    # the stored rows start the second solve: it needs no memory round to find them again
    assert again.solver["memory_rows"] >= len(entry.positions)
    assert again.solver["objective"] <= first.solver["objective"] + 1e-15
    if not memo["solved_again"]:  # the first solve proved its gap: the answer is the stored plan
        assert memo["plan"] == "recalled"
    # else a loaded machine stopped the first solve short of its gap: solved again from the
    # recalled plan, it keeps that plan or a better one (both verified above)
    assert evaluate(graph, again).memory.total <= int(free * 0.9)
    # another budget is another problem
    looser = plan(PlanRequest(graph, CLUSTER, SHAPE, int(free * 0.95), 2, OPTIONS), store=store)
    assert _memo(looser)["found"] is False


def test_deterministic_runs_neither_read_nor_write_the_memo(graph):
    store = MemoryStore()
    options = SolverOptions(runtime=RUNTIME, time_limit_s=20, deterministic=True, workers=2)
    p = plan(PlanRequest(graph, CLUSTER, SHAPE, None, 2, options), store=store)
    assert _memo(p)["key"] is None
    # nothing was written: a run that reads the memo finds no entry
    assert _memo(plan(PlanRequest(graph, CLUSTER, SHAPE, None, 2, OPTIONS), store=store))["found"] is False


def _raw(data: object) -> bytes:
    return zlib.compress(json.dumps(data).encode())


GOOD = {"version": MEMO_VERSION, "choices": {"a": 0}, "positions": [3], "objective": 2.0, "bound": 1.0}


@pytest.mark.parametrize(
    "raw",
    [
        b"not zlib",
        zlib.compress(b"not json"),
        _raw([1, 2]),
        _raw({**GOOD, "version": MEMO_VERSION + 1}),
        _raw({**GOOD, "choices": {"a": -1}}),
        _raw({**GOOD, "choices": {"a": True}}),
        _raw({**GOOD, "choices": ["a"]}),
        _raw({**GOOD, "positions": [-2]}),
        _raw({**GOOD, "objective": "2"}),
        _raw({**GOOD, "bound": 3.0}),  # a bound above the plan's own time
        _raw({**GOOD, "objective": None}),
    ],
)
def test_an_entry_that_is_not_one_reads_as_absent(raw):
    assert MemoEntry.from_bytes(raw) is None


def test_an_entry_reads_back():
    entry = MemoEntry.from_bytes(_raw(GOOD))
    assert entry == MemoEntry({"a": 0}, [3], 2.0, 1.0)
    assert entry.gap == pytest.approx(0.5)
    assert MemoEntry.from_bytes(entry.to_bytes()) == entry


def test_solver_options_that_choose_how_are_keyed_and_resolve_solves_again(graph, once):
    store, request, first, key, _ = _solved_once(once)
    # another way to solve the same problem is asked for: not answered by the default way's plan
    other_way = SolverOptions(runtime=RUNTIME, time_limit_s=20, workers=2, reductions=False)
    assert _memo(plan(PlanRequest(graph, CLUSTER, SHAPE, None, 2, other_way), store=store))["key"] != key
    assert (
        _memo(
            plan(
                PlanRequest(
                    graph,
                    CLUSTER,
                    SHAPE,
                    None,
                    2,
                    SolverOptions(runtime=RUNTIME, time_limit_s=20, workers=2, seed=1),
                ),
                store=store,
            )
        )["key"]
        != key
    )
    # resolve: the entry is where the solve starts, not the answer; the result is no worse
    again = plan(request, store=store, resolve=True)
    memo = _memo(again)
    assert memo["key"] == key and memo["verified"] is True and memo["solved_again"] is True
    assert again.solver["objective"] <= first.solver["objective"] + 1e-15
    assert again.solver["bound"] >= first.solver["bound"] - 1e-15


def test_the_entry_without_a_budget_answers_a_budget_its_plan_fits_and_only_that(graph):
    store = MemoryStore()
    free = plan(PlanRequest(graph, CLUSTER, SHAPE, None, 2, OPTIONS), store=store)
    peak = free.memory_per_device_bytes
    roomy = plan(PlanRequest(graph, CLUSTER, SHAPE, int(peak * 2), 2, OPTIONS), store=store)
    memo = _memo(roomy)
    assert memo["found"] == "without a budget" and memo["plan"] == "recalled"
    assert roomy.signatures == free.signatures and roomy.solver["bound"] == free.solver["bound"]
    assert evaluate(graph, roomy).memory.total <= int(peak * 2)
    # its plan does not fit a budget under its peak: that budget is solved, with memory rows
    tight = plan(PlanRequest(graph, CLUSTER, SHAPE, int(peak * 0.9), 2, OPTIONS), store=store)
    assert _memo(tight)["verified"] is False and tight.solver["memory_rows"] >= 1
    assert evaluate(graph, tight).memory.total <= int(peak * 0.9)
    # ... and the entry without a budget is left as it was (a plan with rows is not one of it)
    again = plan(PlanRequest(graph, CLUSTER, SHAPE, None, 2, OPTIONS), store=store)
    assert _memo(again)["plan"] == "recalled" and again.signatures == free.signatures


def test_without_time_to_re_check_an_entry_it_is_neither_used_nor_replaced(graph, once, monkeypatch):
    import autopar_solver.planner.context as context
    from autopar.errors import TimeLimitError

    store, request, _, key, true = _solved_once(once)
    monkeypatch.setattr(context, "EVALUATE_RESERVE_S", 1e6)  # never time to evaluate a plan
    with pytest.raises(TimeLimitError):
        plan(request, store=store)
    assert _entry(store, key) == true


PLAN_A = MemoEntry({"a": 0, "b": 1}, [], 2.0, 1.0)
PLAN_B = MemoEntry({"a": 1, "b": 1}, [], 1.8, 0.5)


def test_two_solves_that_finish_together_each_keep_what_they_proved():
    """Both read the same entry; one proves a greater bound, the other finds a better plan:
    the second writer's swap fails, it reads the first's value and merges (nothing lost)."""
    store = MemoryStore()
    store.put_many({"k": PLAN_A.to_bytes()})
    read = store.get_many(["k"])["k"]
    higher_bound = MemoEntry(PLAN_A.choices, [], 2.0, 1.5)
    assert remember(store, "k", higher_bound, read)
    assert remember(store, "k", PLAN_B, read)  # stale read: merged with the first writer's bound
    assert _entry(store, "k") == MemoEntry(PLAN_B.choices, [], 1.8, 1.5)
    # from an empty store too: the second writer's worse plan does not replace the first's
    store = MemoryStore()
    assert remember(store, "k", PLAN_B, None)
    assert remember(store, "k", MemoEntry(PLAN_A.choices, [], 2.0, 1.7), None)
    assert _entry(store, "k") == MemoEntry(PLAN_B.choices, [], 1.8, 1.7)
    # an entry that proves nothing new is not written
    before = store.get_many(["k"])["k"]
    assert not remember(store, "k", PLAN_A, before)
    assert store.get_many(["k"])["k"] == before


def test_a_rejected_entry_is_replaced_but_a_value_written_since_is_merged():
    lie = MemoEntry(PLAN_A.choices, [], 0.1, 0.1)
    store = MemoryStore()
    store.put_many({"k": lie.to_bytes()})
    read = store.get_many(["k"])["k"]
    assert remember(store, "k", PLAN_A, read, rejected=True)
    assert _entry(store, "k") == PLAN_A  # not merged with the lie's objective and bound
    # another solve replaced the rejected value meanwhile: its value is merged in
    store.put_many({"k": lie.to_bytes()})
    read = store.get_many(["k"])["k"]
    store.put_many({"k": PLAN_B.to_bytes()})
    assert remember(store, "k", PLAN_A, read, rejected=True)
    assert _entry(store, "k") == MemoEntry(PLAN_B.choices, [], 1.8, 1.0)
    # damaged bytes read as absent and are replaced
    store.put_many({"k": b"not an entry"})
    assert remember(store, "k", PLAN_A, b"not an entry") and _entry(store, "k") == PLAN_A


class _OverwriteOnly:
    """A store that cannot compare and set."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def get_many(self, keys):
        return {k: self.data[k] for k in keys if k in self.data}

    def put_many(self, items, ttl_s=None):
        self.data.update(items)


class _AlwaysChanging(MemoryStore):
    """Another writer gets in before every swap."""

    def __init__(self) -> None:
        super().__init__()
        self.swaps = 0

    def compare_and_set(self, key, expected, value, ttl_s=None):
        self.swaps += 1
        self.put_many({key: MemoEntry({"a": 0}, [], 5.0, float(self.swaps) / 10).to_bytes()})
        return False


def test_stores_that_cannot_swap_are_overwritten_and_a_busy_key_is_given_up():
    plain = _OverwriteOnly()
    plain.put_many({"k": PLAN_B.to_bytes()})
    assert remember(plain, "k", PLAN_A, PLAN_B.to_bytes())  # merged with what was read
    assert MemoEntry.from_bytes(plain.data["k"]) == MemoEntry(PLAN_B.choices, [], 1.8, 1.0)
    busy = _AlwaysChanging()
    assert remember(busy, "k", PLAN_A, None) is False
    assert busy.swaps == REMEMBER_ATTEMPTS


def test_the_gap_asked_decides_answer_or_improve_and_another_iteration_is_another_problem(graph, once):
    """Issue 34: the time limit and the gap are the effort, not the problem.  An entry that
    proves a gap within the one asked answers; a tighter gap asked improves it, from it."""
    store, _, _, key, true = _solved_once(once)
    # the same plan with a bound 4 % under it
    store.put_many(
        {key: MemoEntry(true.choices, true.positions, true.objective, 0.96 * true.objective).to_bytes()}
    )

    def asked(gap: float, **more: object) -> Plan:
        options = SolverOptions(runtime=RUNTIME, time_limit_s=60, workers=2, relative_gap=gap, **more)  # type: ignore[arg-type]
        return plan(PlanRequest(graph, CLUSTER, SHAPE, None, 2, options), store=store)

    loose = asked(0.05)
    assert _memo(loose)["key"] == key and _memo(loose)["solved_again"] is False
    assert loose.solver["gap"] == pytest.approx(0.04, rel=1e-6)
    tight = asked(0.01)
    assert _memo(tight)["key"] == key and _memo(tight)["solved_again"] is True
    assert tight.solver["gap"] <= 0.01 and tight.solver["objective"] <= true.objective + 1e-15
    # another iteration (K = 4, every block recomputed) is another problem
    other = asked(0.05, micro_batches=4, checkpointing="full")
    assert _memo(other)["key"] != key and _memo(other)["found"] is False
