"""Issue 43, item 8: an error shown to a person is one line of at most 300 characters.

The command line prints ``autopar: error: [code] message`` on one line (a longer or multi-line
message shortened, saying ``autopar -v`` shows it all); ``-v`` adds the whole message and its
details as JSON.  A job's error ``message`` (what the explorer, a sweep's table and ``autopar
submit`` show) is one line too, the whole text kept in ``full_message``.
"""

from __future__ import annotations

import json
import subprocess
import sys

from autopar.cli.main import error_lines
from autopar.client import ServiceError
from autopar.errors import MAX_LINE, ConfigError, TimeLimitError
from autopar_service.tasks import error_of
from tests.service.helpers import REPO

LONG = "the time limit (2 s) ran out while building cost tables: 104 of 113 edges entries done;\n" + (
    "raise the time limit " * 30
)


def _autopar(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "autopar.cli", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_a_long_command_line_error_is_one_line() -> None:
    spec = "tiny-" + "x" * 600  # neither a file (too long a name) nor a model
    quiet = _autopar("submit", spec, "--server", "http://127.0.0.1:9")
    assert quiet.returncode == 2 and "Traceback" not in quiet.stderr
    (line,) = quiet.stderr.splitlines()
    assert len(line) <= MAX_LINE and line.startswith("autopar: error: [bad_graph_arg] ")
    assert line.endswith("(autopar -v: all of it)")
    loud = _autopar("-v", "submit", spec, "--server", "http://127.0.0.1:9")
    lines = loud.stderr.splitlines()
    assert loud.returncode == 2 and len(lines[0]) <= MAX_LINE and lines[0].startswith("autopar: error: ")
    assert any(spec in line for line in lines[1:])  # the whole message
    details = json.loads(loud.stderr.split("autopar: details: ", 1)[1])
    assert details["code"] == "bad_graph_arg" and spec in details["message"]


def test_a_short_error_is_shown_as_it_is() -> None:
    text = error_lines(ConfigError("bad_memory", "memory budget must be > 0 bytes, got -1"), False)
    assert text == "autopar: error: [bad_memory] memory budget must be > 0 bytes, got -1\n"


def test_a_job_error_from_the_service_is_one_line() -> None:
    """What ``autopar submit --wait`` prints of a job that failed with a long, multi-line message."""
    job_error = error_of(TimeLimitError("time_limit", LONG, phase="cost_tables"))
    assert "\n" not in job_error["message"] and len(job_error["message"]) <= MAX_LINE
    assert job_error["full_message"] == LONG and job_error["phase"] == "cost_tables"
    failed = ServiceError(job_error["code"], LONG, status=0, job="ab" * 32, phase="cost_tables")
    quiet = error_lines(failed, verbose=False).splitlines()
    assert (
        len(quiet) == 1 and len(quiet[0]) <= MAX_LINE and quiet[0].startswith("autopar: error: [time_limit] ")
    )
    loud = error_lines(failed, verbose=True)
    assert LONG.replace("\n", " ") not in loud.splitlines()[0] and LONG in loud
    assert json.loads(loud.split("autopar: details: ", 1)[1])["job"] == "ab" * 32


def test_a_job_error_that_fits_keeps_its_message() -> None:
    error = error_of(ConfigError("bad_stages", "options.stages 3 cannot cut 8 devices"))
    assert error["message"] == "options.stages 3 cannot cut 8 devices" and "full_message" not in error
