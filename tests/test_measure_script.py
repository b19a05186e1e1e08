"""scripts/measure.sh, the one-run measurement of the documented figures, covers what the
documents measure and refuses what it does not know."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "measure.sh"


def _modules(text: str) -> set[str]:
    return set(re.findall(r"-m (benchmarks\.[a-z_]+)", text))


def test_every_benchmark_the_documents_run_is_in_the_script() -> None:
    documented = _modules((ROOT / "benchmarks" / "README.md").read_text())
    documented |= _modules((ROOT / "README.md").read_text())
    assert {"benchmarks.solver", "benchmarks.service", "benchmarks.cost_tables"} <= documented
    assert documented <= _modules(SCRIPT.read_text())


def test_sections_are_listed_and_an_unknown_one_is_refused(tmp_path: Path) -> None:
    listed = subprocess.run(["bash", str(SCRIPT), "--list"], capture_output=True, text=True, check=True)
    sections = listed.stdout.split()
    assert {"warm", "plan-memo", "service", "solver-10", "promise", "report"} <= set(sections)
    bad = subprocess.run(
        ["bash", str(SCRIPT), "no-such-section"],
        capture_output=True,
        text=True,
        env={"OUT": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert bad.returncode == 2 and "unknown section no-such-section" in bad.stderr
