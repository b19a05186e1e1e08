"""``autopar plan --request req.toml``: a plan request written once, in the fields of the HTTP
body of ``POST /v1/plans`` (docs/service.md), as a TOML file::

    graph = "tiny-gpt"            # a graph JSON file (relative to the request file) or a bundled model
    cluster = "1x8"
    preset = "a100-40g"
    mesh_shape = [4, 2]
    memory = "40GiB"              # or memory_budget_bytes = 42949672960
    zero_stage = 2

    [options]
    time_limit_s = 30
    micro_batches = 8
    checkpointing = "auto"
    stages = 1                    # or "auto"

Options given on the command line override the file's (``--zero 1`` beats ``zero_stage = 2``);
``--out`` stays on the command line.  An unknown key, or a value of the wrong type, is one
``[bad_request_file]`` line naming the key and the keys allowed.  Python 3.11 reads TOML with
``tomllib``; 3.10 needs ``tomli``.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autopar.errors import ConfigError
from autopar.hardware.cluster import PRESETS
from autopar.ir.training import CHECKPOINTING_MODES
from autopar.runtimes.registry import RUNTIMES

__all__ = [
    "OPTION_KEYS",
    "REQUEST_KEYS",
    "add_request_argument",
    "apply_request_file",
    "read_request_file",
    "request_solver_options",
]

EXPLICIT = "_explicit_options"
"""The namespace attribute holding the options given on the command line."""
SOLVER_EXTRAS = "_request_solver_options"
"""The namespace attribute holding the file's solver options that have no flag."""


def _text(key: str, value: Any, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise _bad(path, f"{key} must be a string, got {value!r}")
    return value


def _integer(low: int, high: int | None = None) -> Callable[[str, Any, str], int]:
    def check(key: str, value: Any, path: str) -> int:
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or value < low
            or (high is not None and value > high)
        ):
            bound = f"from {low} to {high}" if high is not None else f"of at least {low}"
            raise _bad(path, f"{key} must be an integer {bound}, got {value!r}")
        return value

    return check


def _number(key: str, value: Any, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise _bad(path, f"{key} must be a number above 0, got {value!r}")
    return float(value)


def _gap(key: str, value: Any, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise _bad(path, f"{key} must be a number from 0 to below 1, got {value!r}")
    return float(value)


def _switch(key: str, value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise _bad(path, f"{key} must be true or false, got {value!r}")
    return value


def _choice(choices: Any) -> Callable[[str, Any, str], str]:
    def check(key: str, value: Any, path: str) -> str:
        if value not in choices:
            raise _bad(path, f"{key} must be one of {', '.join(sorted(choices))}, got {value!r}")
        return str(value)

    return check


def _mesh(key: str, value: Any, path: str) -> str:
    if not isinstance(value, list) or not value or not all(_is_positive(v) for v in value):
        raise _bad(path, f"{key} must be a list of positive integers such as [4, 2], got {value!r}")
    return ",".join(str(v) for v in value)


def _stages(key: str, value: Any, path: str) -> str:
    if value == "auto" or _is_positive(value):
        return str(value)
    raise _bad(path, f'{key} must be a positive integer or "auto", got {value!r}')


def _budget(key: str, value: Any, path: str) -> str:
    return f"{_integer(1)(key, value, path)}B"


def _is_positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


REQUEST_KEYS: dict[str, tuple[str, Callable[[str, Any, str], Any]]] = {
    "graph": ("graph", _text),
    "cluster": ("cluster", _text),
    "preset": ("preset", _choice(PRESETS)),
    "mesh_shape": ("mesh_shape", _mesh),
    "memory": ("memory", _text),
    "memory_budget_bytes": ("memory", _budget),
    "zero_stage": ("zero", _integer(0, 3)),
}
"""Top-level key -> (the ``autopar plan`` option's namespace name, the check that turns the
file's value into the option's form); ``options`` is the table of :data:`OPTION_KEYS`."""

OPTION_KEYS: dict[str, tuple[str, Callable[[str, Any, str], Any]]] = {
    "time_limit_s": ("time_limit", _number),
    "relative_gap": ("gap", _gap),
    "seed": ("seed", _integer(0, 2**31 - 1)),
    "runtime": ("runtime", _choice(RUNTIMES)),
    "micro_batches": ("micro_batches", _integer(1, 65536)),
    "checkpointing": ("checkpointing", _choice(CHECKPOINTING_MODES)),
    "stages": ("stages", _stages),
    "deterministic": (SOLVER_EXTRAS, _switch),
    "use_hint": (SOLVER_EXTRAS, _switch),
    "reductions": (SOLVER_EXTRAS, _switch),
}
"""``[options]`` key -> as :data:`REQUEST_KEYS`; the last three have no flag and go to
:class:`~autopar_solver.options.SolverOptions` as they are."""


def _bad(path: str, message: str) -> ConfigError:
    return ConfigError("bad_request_file", f"request file {path!r}: {message}")


def _unknown(path: str, key: str, allowed: list[str]) -> ConfigError:
    close = difflib.get_close_matches(key.rpartition(".")[2], [a.rpartition(".")[2] for a in allowed], n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return _bad(path, f"unknown key {key!r}; {hint}the keys are {', '.join(allowed)}")


def _toml_loads() -> Callable[[str], dict[str, Any]]:
    for module in ("tomllib", "tomli"):  # tomllib: Python 3.11; tomli: its backport for 3.10
        try:
            return importlib.import_module(module).loads  # type: ignore[no-any-return]
        except ModuleNotFoundError:
            continue
    raise ConfigError("missing_toml", "reading a request file on Python 3.10 needs tomli: pip install tomli")


def read_request_file(path: str) -> dict[str, Any]:
    """The request file ``path`` as ``autopar plan`` options: namespace name -> value, the
    solver options without a flag under :data:`SOLVER_EXTRAS`.  Raises ``[bad_request_file]``
    (an unknown key, a wrong value, not TOML) or ``[missing_file]``."""
    file = Path(path)
    try:
        text = file.read_text()
    except FileNotFoundError:
        raise ConfigError("missing_file", f"request file {path!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise _bad(path, f"cannot be read: {getattr(exc, 'strerror', None) or exc}") from None
    loads = _toml_loads()
    try:
        data = loads(text)
    except ValueError as exc:  # tomllib.TOMLDecodeError
        raise _bad(path, f"is not TOML: {exc}") from None
    out: dict[str, Any] = {SOLVER_EXTRAS: {}}
    options = data.pop("options", {})
    if not isinstance(options, dict):
        raise _bad(path, f"options must be a table ([options]), got {options!r}")
    for key, value in data.items():
        if key not in REQUEST_KEYS:
            raise _unknown(path, key, [*REQUEST_KEYS, "options"])
        dest, check = REQUEST_KEYS[key]
        if dest in out:
            raise _bad(path, "give memory or memory_budget_bytes, not both")
        out[dest] = check(key, value, path)
    for key, value in options.items():
        if key not in OPTION_KEYS:
            raise _unknown(path, f"options.{key}", [f"options.{k}" for k in OPTION_KEYS])
        dest, check = OPTION_KEYS[key]
        checked = check(f"options.{key}", value, path)
        if dest == SOLVER_EXTRAS:
            out[SOLVER_EXTRAS][key] = checked
        else:
            out[dest] = checked
    graph = out.get("graph")
    if graph is not None and not Path(graph).is_absolute() and (file.parent / graph).exists():
        out["graph"] = str(file.parent / graph)  # a path relative to the request file
    return out


class _Explicit(argparse.Action):
    """Marks an option as given on the command line, then acts as the option's own action."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        namespace.__dict__.setdefault(EXPLICIT, set()).add(self.dest)
        super().__call__(parser, namespace, values, option_string)  # type: ignore[misc]


_EXPLICIT_CLASSES: dict[str, type[argparse.Action]] = {}


def _explicit(cls: type[argparse.Action]) -> type[argparse.Action]:
    """``cls`` with :class:`_Explicit` before it (one class per action class)."""
    key = f"{cls.__module__}.{cls.__qualname__}"
    if key not in _EXPLICIT_CLASSES:
        _EXPLICIT_CLASSES[key] = type(f"Explicit{cls.__name__}", (_Explicit, cls), {})
    return _EXPLICIT_CLASSES[key]


def add_request_argument(p: argparse.ArgumentParser) -> None:
    """``--request FILE``, and every option of ``p`` added so far marked when given (an
    option given overrides the file's value)."""
    p.add_argument(
        "--request",
        default=None,
        metavar="FILE",
        help="a TOML file of the plan request, in the fields of POST /v1/plans' body (graph, cluster, "
        "preset, mesh_shape, memory or memory_budget_bytes, zero_stage, [options] time_limit_s, "
        "relative_gap, seed, runtime, micro_batches, checkpointing, stages, ...); options given here "
        "override the file's",
    )
    for action in p._actions:  # argparse keeps no public list of a parser's actions
        if action.option_strings and action.dest != "help":
            action.__class__ = _explicit(type(action))


def apply_request_file(args: argparse.Namespace) -> None:
    """The request file's values into ``args`` where the command line did not give the option;
    ``[missing_graph]`` when neither names a graph."""
    if args.request:
        given: set[str] = getattr(args, EXPLICIT, set())
        for dest, value in read_request_file(args.request).items():
            if (dest == "graph" and args.graph is not None) or (dest == "preset" and args.cluster_profile):
                continue  # the command line's GRAPH; --cluster-profile instead of a preset
            if dest not in given:
                setattr(args, dest, value)
    if args.graph is None:
        raise ConfigError(
            "missing_graph",
            "autopar plan needs a graph: GRAPH (a graph file or a bundled model), or --request FILE "
            "with graph = ...",
        )


def request_solver_options(args: argparse.Namespace) -> dict[str, Any]:
    """The request file's solver options that have no flag (``deterministic``, ``use_hint``,
    ``reductions``), as :class:`~autopar_solver.options.SolverOptions` keywords."""
    return dict(getattr(args, SOLVER_EXTRAS, {}))
