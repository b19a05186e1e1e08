import os

import pytest

from autopar.errors import ConfigError
from autopar_solver.options import Progress, SolverOptions


def test_defaults():
    options = SolverOptions()
    assert options.time_limit_s == 30
    assert options.workers == min(8, os.cpu_count() or 1)
    assert options.relative_gap == 0.01
    assert options.use_hint and options.reductions and not options.deterministic


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("time_limit_s", 0, "time_limit_s must be > 0"),
        ("time_limit_s", float("inf"), "finite"),
        ("time_limit_s", "10", "finite"),
        ("workers", 0, "workers must be an integer >= 1"),
        ("workers", 2.5, "workers"),
        ("workers", True, "workers"),
        ("seed", -1, "seed"),
        ("relative_gap", 1.0, r"relative_gap must be in \[0, 1\)"),
        ("relative_gap", -0.1, "relative_gap"),
        ("deterministic", 1, "deterministic must be true or false"),
        ("use_hint", "yes", "use_hint"),
    ],
)
def test_invalid_options_name_the_field(field, value, message):
    with pytest.raises(ConfigError, match=message) as info:
        SolverOptions(**{field: value})
    assert info.value.code == "bad_solver_option"


def test_options_are_frozen():
    options = SolverOptions()
    with pytest.raises(AttributeError):
        options.workers = 3  # type: ignore[misc]


def test_progress_is_a_plain_record():
    p = Progress("solve", 1.0, 0.5, 2.0)
    assert (p.phase, p.objective, p.bound, p.elapsed_s) == ("solve", 1.0, 0.5, 2.0)
