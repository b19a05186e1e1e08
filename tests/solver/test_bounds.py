import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar_solver.bounds import diffusion_bound
from autopar_solver.problem import Problem
from autopar_solver.reductions import reduce_problem
from autopar_solver.synthetic import synthetic_problem
from tests.solver.helpers import brute_force, problems


def _trivial(problem: Problem) -> float:
    return sum(float(c.min()) for c in problem.node_costs) + sum(float(m.min()) for _, _, m in problem.edges)


@settings(max_examples=60, deadline=None)
@given(problems(), st.lists(st.floats(0, 3), min_size=3, max_size=3))
def test_bound_never_exceeds_the_optimum(problem, prices):
    best, _ = brute_force(problem)
    price = np.array(prices[: len(problem.memory_rows)])
    for p in (None, price):
        bound = diffusion_bound(problem, p)
        if math.isfinite(best):
            assert bound <= best + 1e-9
        elif p is None and math.isinf(bound):
            # inf is only claimed when nothing has a finite cost, whatever the memory
            assert math.isinf(brute_force(replace(problem, memory_rows=[], budget_bytes=None))[0])


@settings(max_examples=30, deadline=None)
@given(problems(memory=False))
def test_bound_improves_on_the_trivial_bound(problem):
    bound = diffusion_bound(problem)
    trivial = _trivial(problem)
    if math.isfinite(trivial):
        assert bound >= trivial - 1e-9


def test_bound_is_tight_on_a_chain():
    rng = np.random.default_rng(0)
    problem = Problem(
        [f"op{i}" for i in range(6)],
        [rng.uniform(0, 1, 4) for _ in range(6)],
        [(i, i + 1, rng.uniform(0, 1, (4, 4))) for i in range(5)],
        [],
        None,
    )
    best, _ = brute_force(problem)
    assert _trivial(problem) < best - 0.1
    assert diffusion_bound(problem, max_sweeps=500) == pytest.approx(best, rel=1e-6)


def test_memory_prices_raise_the_bound_when_memory_binds():
    problem = reduce_problem(synthetic_problem(120, 8, seed=1, shape="chain", budget_fraction=0.2)).reduced
    free = diffusion_bound(problem)
    unit = np.array([1e-10])
    priced = max(diffusion_bound(problem, unit * 10**k) for k in range(0, 4))
    assert priced > free


@settings(max_examples=40, deadline=None)
@given(problems(), st.lists(st.floats(0, 3), min_size=3, max_size=3))
def test_repriced_runs_stay_valid_and_resume(problem, prices):
    from autopar_solver.bounds import DiffusionBound

    best, _ = brute_force(problem)
    run = DiffusionBound(problem, np.ones(len(problem.memory_rows)))
    run.run(5)
    run.reprice(np.array(prices[: len(problem.memory_rows)]))
    run.run(20)
    if math.isfinite(best):
        assert run.value <= best + 1e-9
        assert run.current <= best + 1e-9


@pytest.mark.parametrize("seed", range(5))
def test_bound_is_tight_on_a_tree(seed):
    # the local-polytope LP is exact on a tree, and TRW-S reaches it
    rng = np.random.default_rng(seed)
    n = 9
    parents = [int(rng.integers(0, i)) for i in range(1, n)]
    problem = Problem(
        [f"op{i}" for i in range(n)],
        [rng.uniform(0, 1, 3) for _ in range(n)],
        [(p, i + 1, rng.uniform(0, 1, (3, 3))) for i, p in enumerate(parents)],
        [],
        None,
    )
    best, _ = brute_force(problem)
    assert diffusion_bound(problem, max_sweeps=200) == pytest.approx(best, rel=1e-6)


@settings(max_examples=40, deadline=None)
@given(problems(memory=False), st.integers(0, 30))
def test_a_sweep_cut_anywhere_leaves_a_valid_bound(problem, steps):
    # a sweep stopped at the deadline after any level is still a reparametrisation
    from autopar_solver.bounds import DiffusionBound

    best, _ = brute_force(problem)
    run = DiffusionBound(problem)
    run.run(1)
    levels = list(range(run.num_levels))
    order = [(k, True) for k in levels] + [(k, False) for k in reversed(levels)]
    for k, forward in (order * 3)[:steps]:
        run._step(np.array([k]), forward, False)
    if math.isfinite(best):
        assert run._bound() <= best + 1e-9


@settings(max_examples=60, deadline=None)
@given(problems(memory=False), st.integers(0, 12))
def test_compiled_decode_is_the_greedy_pass_on_the_reparametrised_problem(problem, sweeps):
    # DiffusionBound.decode (compiled) is greedy_assignment on reparametrized(run), in the
    # pass's order, without memory rows: every node takes a choice of least cost given the
    # neighbours assigned before it (sums are taken in another order, so ties may break
    # the other way; the choice must be least within float noise)
    from autopar_solver.bounds import DiffusionBound, reparametrized

    run = DiffusionBound(problem)
    run.run(sweeps)
    seen = reparametrized(run)
    for reverse in (False, True):
        order = [int(i) for i in (run.decode_order[::-1] if reverse else run.decode_order)]
        choices = run.decode(reverse=reverse)
        assigned: set[int] = set()
        for i in order:
            local = seen.node_costs[i].copy()
            for u, v, matrix in seen.edges:
                if u == i and v in assigned:
                    local += matrix[:, choices[v]]
                elif v == i and u in assigned:
                    local += matrix[choices[u], :]
            least = local.min()
            if math.isfinite(least):
                assert local[choices[i]] <= least + 1e-9 * max(1.0, abs(least))
            assigned.add(i)
    # a snapshot decodes as the state it was taken from, whatever happens to the run after
    state = run.snapshot()
    before = run.decode()
    run.run(3)
    assert run.decode(state=state) == before


@settings(max_examples=60, deadline=None)
@given(problems(memory=False), st.data())
def test_compiled_descent_never_worsens_and_ends_in_a_local_optimum(problem, data):
    from autopar_solver.bounds import DiffusionBound
    from autopar_solver.problem import evaluate

    run = DiffusionBound(problem)
    start = [data.draw(st.integers(0, len(c) - 1)) for c in problem.node_costs]
    out = run.descend(start)
    before, after = evaluate(problem, start)[0], evaluate(problem, out)[0]
    assert after <= before or (math.isinf(before) and math.isinf(after))
    if math.isfinite(after):
        # no single node can move to a strictly better choice
        for i, costs in enumerate(problem.node_costs):
            for c in range(len(costs)):
                moved = list(out)
                moved[i] = c
                assert evaluate(problem, moved)[0] >= after - 1e-9 * max(1.0, abs(after))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 7), st.integers(0, 6), st.integers(0, 2**32 - 1))
def test_compiled_dominance_matches_its_definition(k, width, seed):
    from autopar_solver.dominance import dominated_choices

    rng = np.random.default_rng(seed)
    features = rng.integers(0, 3, size=(k, width)).astype(float)
    features[rng.random((k, width)) < 0.1] = np.inf
    if k > 1:
        features[k - 1] = features[0]  # a twin
    expected = np.zeros(k, dtype=bool)
    for a in range(k):
        for b in range(k):
            if a == b or not (features[b] <= features[a]).all():
                continue
            if (features[b] < features[a]).any() or b < a:
                expected[a] = True
    assert dominated_choices(features).tolist() == expected.tolist()
