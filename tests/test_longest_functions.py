"""scripts/longest_functions.py: no function over 80 lines and no file over 600 in the four packages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "longest_functions.py"


def _load() -> object:
    import importlib.util

    spec = importlib.util.spec_from_file_location("longest_functions", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_it_measures_functions_from_decorator_to_last_line_nested_and_methods_too(tmp_path):
    source = tmp_path / "m.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(5))
    source.write_text(
        f"import functools\n\n\n@functools.cache\ndef f():\n{body}\n\n    def inner():\n        return 1\n\n"
        f"    return inner\n\n\nclass C:\n    def method(self):\n        return 2\n"
    )
    found = {name: length for name, _, length in _load().functions(source)}  # type: ignore[attr-defined]
    assert found == {"f": 12, "f.inner": 2, "C.method": 2}


def test_no_function_in_the_packages_is_over_80_lines():
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    printed = out.stdout.splitlines()
    for package in ("autopar", "solver", "service", "cache"):
        assert any(line.startswith(f"{package}/: longest function ") for line in printed), printed
        assert any(line.startswith(f"{package}/: longest file ") for line in printed), printed


def test_a_long_function_fails_it(tmp_path, monkeypatch, capsys):
    module = _load()
    package = tmp_path / "solver"
    package.mkdir()
    (package / "long.py").write_text("def long():\n" + "    pass\n" * 81)
    monkeypatch.setattr(module, "ROOT", tmp_path)
    monkeypatch.setattr(module, "PACKAGES", ("solver",))
    assert module.main([]) == 1  # type: ignore[attr-defined]
    assert "over 80: solver/long.py:long (line 1) 82 lines" in capsys.readouterr().out


def test_a_long_file_fails_it(tmp_path, monkeypatch, capsys):
    module = _load()
    package = tmp_path / "cache"
    package.mkdir()
    (package / "big.py").write_text("x = 1\n" * 601)
    monkeypatch.setattr(module, "ROOT", tmp_path)
    monkeypatch.setattr(module, "PACKAGES", ("cache",))
    assert module.main([]) == 1  # type: ignore[attr-defined]
    assert "file over 600: cache/big.py 601 lines" in capsys.readouterr().out
