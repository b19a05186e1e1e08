"""The wheel: the outer folders install under import names of their own, with their data files.

``solver/``, ``cache/`` and ``service/`` are the project's folders; installed, they
are ``autopar_solver``, ``autopar_cache`` and ``autopar_service`` (pyproject.toml
``[tool.setuptools] package-dir``), so nothing of autopar's sits in site-packages
under a generic name another distribution may also use (docs/packaging.md).
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parent.parent
FOLDERS = {
    "autopar": "autopar",
    "autopar_solver": "solver",
    "autopar_cache": "cache",
    "autopar_service": "service",
}


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_the_package_list_matches_the_folders() -> None:
    setuptools = _pyproject()["tool"]["setuptools"]
    assert setuptools["package-dir"] == FOLDERS
    expected = set()
    for name, folder in FOLDERS.items():
        for init in (REPO / folder).rglob("__init__.py"):
            if "__pycache__" in init.parts:
                continue
            rel = init.parent.relative_to(REPO / folder).parts
            expected.add(".".join([name, *rel]))
    assert set(setuptools["packages"]) == expected, "update [tool.setuptools] packages in pyproject.toml"


def test_typecheck_links_point_at_the_folders() -> None:
    for name, folder in FOLDERS.items():
        if name == "autopar":
            continue
        link = REPO / ".typecheck" / name
        assert link.is_symlink() and link.resolve() == (REPO / folder).resolve(), link


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(out),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    (path,) = out.glob("autopar-*.whl")
    return zipfile.ZipFile(path)


def test_the_wheel_installs_no_generic_top_level_name(wheel: zipfile.ZipFile) -> None:
    tops = {name.split("/")[0] for name in wheel.namelist() if not name.split("/")[0].endswith(".dist-info")}
    assert tops == set(FOLDERS)


def test_the_wheel_carries_every_data_file(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    for name, folder in FOLDERS.items():
        assert f"{name}/py.typed" in names
        for path in (REPO / folder).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                rel = path.relative_to(REPO / folder).as_posix()
                assert f"{name}/{rel}" in names, f"{folder}/{rel} is missing from the wheel"


def test_the_entry_points_name_the_installed_modules(wheel: zipfile.ZipFile) -> None:
    (entry_points,) = (n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt"))
    text = wheel.read(entry_points).decode()
    assert "autopar_solver.cli:PLAN_COMMAND" in text and "autopar_service.cli:SERVE_COMMAND" in text
    for generic in ("= solver.", "= service.", "= cache."):
        assert generic not in text
