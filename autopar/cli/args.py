"""What every ``autopar`` subcommand shares: the :class:`Command` a package contributes,
argument parsing helpers (memory sizes, the mesh flags, graph and plan arguments) and
the checks run before a command does any work (an ``--out`` that can be written, an
installed extra).

Packages contribute subcommands through the ``autopar.commands`` entry-point group
(``pyproject.toml``); each entry point names a :class:`Command`.  The module an entry
point names must import with the core alone (numpy and pydantic): it imports its
extra's libraries inside :attr:`Command.run`, after :func:`require_extra` has checked
that the extra is installed.  Only the core is imported here.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.metadata
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from autopar.errors import ConfigError
from autopar.hardware.cluster import PRESETS, Cluster, load_cluster_profile
from autopar.hardware.mesh import Mesh, parse_mesh_shape
from autopar.ir.training import CHECKPOINTING_MODES, TrainingConfig
from autopar.ir.wire import DEFAULT_RUNTIME
from autopar.runtimes.registry import RUNTIMES

if TYPE_CHECKING:
    from autopar.ir.graph import Graph
    from autopar.ir.plan import Plan

__all__ = [
    "BASELINE_KINDS",
    "DEFAULT_TIME_LIMIT_S",
    "MEMORY_FORMS",
    "TIME_LIMIT_MEANING",
    "Command",
    "add_memory_arg",
    "add_mesh_args",
    "add_time_limit_arg",
    "check_writable",
    "closest_name",
    "graph_arg_help",
    "graph_from_arg",
    "graph_json_from_arg",
    "mesh_from_args",
    "missing_distributions",
    "model_names",
    "parse_bytes",
    "plan_from_arg",
    "positive_seconds",
    "require_extra",
    "wrote",
    "zero_stage_or_auto",
]

DISTRIBUTION = "autopar"

BASELINE_KINDS = ("megatron", "inferred", "data-parallel", "single-device")
"""``autopar baseline KIND``: see :func:`autopar.baselines.plans.baseline_plan`."""

_UNITS = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
MEMORY_FORMS = (
    "a number and a unit: B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024)"
)


def parse_bytes(text: str) -> int:
    """``"40GiB"`` -> 42949672960.

    The unit is required and exact: ``40`` and ``40G`` are refused (is ``40G`` 40 GB or
    40 GiB? they differ by 7 %), ``40GiB``, ``38.5GB`` and ``1073741824B`` are accepted.
    Units are case-insensitive.
    """
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    if not m:
        raise ConfigError("bad_memory", f"memory size {text!r} is not {MEMORY_FORMS}, e.g. 40GiB")
    unit = m.group(2).lower()
    if unit not in _UNITS:
        what = "has no unit" if not unit else f"has unknown unit {m.group(2)!r}"
        raise ConfigError("bad_memory", f"memory size {text!r} {what}; write {MEMORY_FORMS}, e.g. 40GiB")
    value = float(m.group(1)) * _UNITS[unit]
    if value < 1:
        raise ConfigError("bad_memory", f"memory size must be at least 1 byte, got {text!r}")
    return int(value)


DEFAULT_TIME_LIMIT_S = 30.0
"""The time limit of one plan request, seconds: ``autopar plan``, ``autopar submit``, the
API's ``options.time_limit_s`` (``AUTOPAR_DEFAULT_TIME_LIMIT_S``) and the explorer page."""

TIME_LIMIT_MEANING = (
    "seconds for the whole request: cost tables, reductions, heuristic, CP-SAT, memory rounds "
    "and verification, every mesh shape together"
)
"""What a time limit bounds, the same everywhere (help texts, the API, the page)."""


def positive_seconds(text: str) -> float:
    """argparse type of ``--time-limit``: a finite number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (0 < value < float("inf")):
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, got {text!r}")
    return value


def add_time_limit_arg(p: argparse.ArgumentParser, extra: str = "") -> None:
    """``--time-limit``: one meaning and one default (:data:`DEFAULT_TIME_LIMIT_S`) for every command."""
    p.add_argument(
        "--time-limit",
        type=positive_seconds,
        default=DEFAULT_TIME_LIMIT_S,
        metavar="SECONDS",
        help=f"{TIME_LIMIT_MEANING}{extra} (default: %(default)s)",
    )


# ------------------------------------------------------------------ commands


@dataclass(frozen=True)
class Command:
    """One ``autopar`` subcommand, as a package contributes it.

    ``extra`` names the optional dependency set (``autopar[extra]``) the command needs;
    :attr:`run` is called only when it is installed, so the module defining the command
    imports that extra's libraries inside ``run``, never at the top.
    """

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    extra: str | None = None
    description: str | None = None
    epilog: str | None = None


def missing_distributions(extra: str, distribution: str = DISTRIBUTION) -> list[str]:
    """The distributions ``distribution[extra]`` requires that are not installed.

    Read from the installed metadata, so ``pyproject.toml`` is the only list.  Versions
    are not compared.  An uninstalled ``distribution`` (a bare checkout on
    ``PYTHONPATH``) has no metadata to read: nothing is reported missing.
    """
    try:
        requirements = importlib.metadata.requires(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    missing = []
    for requirement in requirements:
        spec, _, marker = requirement.partition(";")
        wanted = re.search(r"""extra\s*==\s*["']([^"']+)["']""", marker)
        if wanted is None or wanted.group(1) != extra:
            continue
        name_match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec)
        if name_match is None or name_match.group(1).lower() == distribution:
            continue
        try:
            importlib.metadata.version(name_match.group(1))
        except importlib.metadata.PackageNotFoundError:
            missing.append(name_match.group(1))
    return missing


def require_extra(what: str, extra: str) -> None:
    """Raise ``[missing_extra]`` when ``autopar[extra]`` is not installed."""
    missing = missing_distributions(extra)
    if missing:
        raise ConfigError(
            "missing_extra",
            f"{what!r} needs autopar[{extra}]: pip install 'autopar[{extra}]' "
            f"(not installed: {', '.join(missing)})",
            missing=missing,
        )


# ------------------------------------------------------------------ arguments


MESH_2D_DEFAULT = "2-D (devices/2, 2) on several nodes, else 1-D"
"""What :func:`mesh_from_args` picks without ``--mesh-shape``."""


def zero_stage_or_auto(text: str) -> int | str:
    """``--zero`` of ``autopar plan``: 0, 1, 2, 3, or ``auto`` (the planner tries the stages)."""
    value = text.strip().lower()
    if value == "auto":
        return "auto"
    if value in {"0", "1", "2", "3"}:
        return int(value)
    raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from 0, 1, 2, 3, auto)")


def add_mesh_args(
    p: argparse.ArgumentParser,
    mesh_required: bool = False,
    mesh_default: str = MESH_2D_DEFAULT,
    zero_auto: bool = False,
) -> None:
    """``--cluster``, ``--preset`` or ``--cluster-profile``, ``--mesh-shape``, ``--zero`` (with
    ``zero_auto``, also ``auto``), ``--runtime``."""
    p.add_argument("--cluster", default="2x4", help="NODESxDEVICES (default: %(default)s)")
    devices = p.add_mutually_exclusive_group()
    devices.add_argument("--preset", choices=sorted(PRESETS), help="device preset (default: a100-40g)")
    devices.add_argument(
        "--cluster-profile",
        metavar="FILE",
        help="cluster profile JSON (autopar calibrate) instead of a preset",
    )
    p.add_argument(
        "--mesh-shape",
        required=mesh_required,
        help=f"logical mesh, e.g. 4,2 (last axis tensor-parallel; default: {mesh_default})",
    )
    if zero_auto:
        p.add_argument(
            "--zero",
            type=zero_stage_or_auto,
            default=2,
            metavar="{0,1,2,3,auto}",
            help="ZeRO stage, or auto: the fastest of ZeRO-1 and ZeRO-3, each solved in turn "
            "(default: %(default)s)",
        )
    else:
        p.add_argument(
            "--zero", type=int, default=2, choices=[0, 1, 2, 3], help="ZeRO stage (default: %(default)s)"
        )
    p.add_argument(
        "--runtime",
        default=DEFAULT_RUNTIME,
        choices=sorted(RUNTIMES),
        help="runtime profile that prices boxing (default: %(default)s; docs/runtime-profiles.md)",
    )


def add_training_args(
    p: argparse.ArgumentParser,
    defaults_from: str | tuple[str, str] | None = None,
    checkpointing: str = "off",
) -> None:
    """``--micro-batches K`` and ``--checkpointing``: the iteration priced (:mod:`autopar.cost.iteration`).

    ``defaults_from``: what an omitted option means, one text for both (e.g. "the plan's") or
    one for each (``("1", "off")``); None: K = 1 and ``checkpointing``."""
    texts = defaults_from if isinstance(defaults_from, tuple) else (defaults_from, defaults_from)
    p.add_argument(
        "--micro-batches",
        type=int,
        default=None if defaults_from else 1,
        metavar="K",
        help="micro-batches per optimizer step (gradient accumulation; "
        f"default: {texts[0] or '%(default)s'})",
    )
    p.add_argument(
        "--checkpointing",
        choices=list(CHECKPOINTING_MODES),
        default=None if defaults_from else checkpointing,
        help="activation checkpointing: off, full (every transformer block), selective (every "
        "block's attention core) or auto (what each block recomputes chosen with the layout: "
        f"nothing where everything fits) (default: {texts[1] or '%(default)s'})",
    )


def training_from_args(args: argparse.Namespace, base: TrainingConfig | None = None) -> TrainingConfig:
    """The :class:`TrainingConfig` of ``--micro-batches`` and ``--checkpointing``; an omitted
    one (None) keeps ``base``'s (:meth:`TrainingConfig.repriced`: ``auto`` keeps the blocks
    ``base`` recomputes).  Raises :class:`ConfigError` on a bad value."""
    return (base or TrainingConfig()).repriced(args.micro_batches, args.checkpointing)


def cluster_from_args(args: argparse.Namespace) -> Cluster:
    """The cluster of ``--cluster`` priced by ``--cluster-profile`` or ``--preset``."""
    profile = load_cluster_profile(args.cluster_profile) if args.cluster_profile else None
    return Cluster.parse(args.cluster, args.preset, profile)


def add_memory_arg(p: argparse.ArgumentParser) -> None:
    """``--memory``: the per-device budget, parsed later by :func:`parse_bytes`."""
    p.add_argument(
        "--memory",
        default=None,
        help=f"per-device budget: {MEMORY_FORMS}, e.g. 40GiB (default: the preset's memory)",
    )


def mesh_from_args(args: argparse.Namespace, default_2d: bool = True) -> Mesh:
    """The mesh of ``--cluster``/``--preset``/``--mesh-shape``; without a shape, 2-D (or 1-D on one node)."""
    cluster = cluster_from_args(args)
    if args.mesh_shape:
        shape = parse_mesh_shape(args.mesh_shape)
    elif default_2d and cluster.nodes > 1:
        shape = (cluster.nodes * cluster.devices_per_node // 2, 2)
    else:
        shape = (cluster.world_size,)
    return Mesh(cluster, shape)


def model_names() -> list[str]:
    from autopar.models import MODEL_NAMES

    return list(MODEL_NAMES)


def graph_arg_help() -> str:
    """Help of a ``GRAPH`` argument, listing the bundled models."""
    return f"graph JSON file, or a bundled model: {', '.join(model_names())}"


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except IsADirectoryError:
        raise ConfigError("unreadable_file", f"{what} {str(path)!r} is a directory, not a file") from None
    except OSError as exc:
        raise ConfigError("unreadable_file", f"cannot read {what} {str(path)!r}: {exc.strerror}") from None


_SIZE_WORD = re.compile(r"(tiny|small|base|medium|large|xl|xxl|\d+(\.\d+)?[bm])", re.IGNORECASE)


def _family(name: str) -> str:
    """The model family of a name: its first word that is not a size (``mt5-large`` -> ``mt5``,
    ``tiny-gpt`` -> ``gpt``); the name itself when every word is a size."""
    words = name.lower().split("-")
    return next((w for w in words if not _SIZE_WORD.fullmatch(w)), name.lower())


def closest_name(given: str, names: list[str] | tuple[str, ...]) -> str | None:
    """The name of ``names`` a mistyped ``given`` most likely meant, or None: one of the same
    family first (``mt5-large`` -> ``mt5-base``, not ``bert-large``), words in any order
    (``gpt-tiny`` -> ``tiny-gpt``); else the closest spelling (difflib, cutoff 0.6)."""
    family = _family(given)
    same = [n for n in names if _family(n) == family]

    def words(s: str) -> str:
        return "-".join(sorted(s.lower().split("-")))

    pool = same or list(names)
    by_words = {words(n): n for n in reversed(pool)}
    close = difflib.get_close_matches(words(given), list(by_words), n=1, cutoff=0.0 if same else 0.6)
    return by_words[close[0]] if close else None


def _unknown_graph(spec: str) -> ConfigError:
    names = model_names()
    looks_like_path = spec.endswith(".json") or os.sep in spec or "/" in spec
    if looks_like_path:
        return ConfigError("missing_file", f"graph file {spec!r} does not exist")
    close = closest_name(spec, names)
    hint = f"did you mean {close!r}? " if close else ""
    return ConfigError(
        "bad_graph_arg",
        f"{spec!r} is neither a graph file nor a bundled model; {hint}models: {', '.join(names)}",
    )


def _is_path(path: Path) -> bool:
    """Whether ``path`` exists; a name the system cannot take (too long, a NUL) is no file."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def graph_json_from_arg(spec: str) -> bytes:
    """Raw JSON of the graph file ``spec``, or of the bundled model ``spec`` built now."""
    path = Path(spec)
    if _is_path(path):
        return _read(path, "graph file")
    if spec in model_names():
        from autopar.models import build

        return build(spec).to_json().encode()
    raise _unknown_graph(spec)


def graph_from_arg(spec: str) -> Graph:
    """The validated graph of a graph file or of a bundled model name (every op's rule read it:
    :func:`autopar.rules.check.check_graph_rules`)."""
    from autopar.ir.graph import Graph
    from autopar.rules.check import check_graph_rules

    path = Path(spec)
    if _is_path(path):
        return check_graph_rules(Graph.from_json(_read(path, "graph file")).validate())
    if spec in model_names():
        from autopar.models import build

        return build(spec)
    raise _unknown_graph(spec)


def pipeline_plan_file(spec: str) -> bool:
    """Whether the file ``spec`` holds an ``autopar.pipeline/v1`` plan (a cheap look at its
    format field; a missing or unreadable file is left to :func:`plan_from_arg` to report)."""
    try:
        with open(spec, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return b'"autopar.pipeline/v1"' in head


def plan_from_arg(spec: str) -> Plan:
    """The plan in the file ``spec``."""
    from autopar.ir.plan import Plan

    path = Path(spec)
    if not path.exists():
        raise ConfigError("missing_file", f"plan file {spec!r} does not exist")
    return Plan.from_json(_read(path, "plan file"))


def check_writable(path: str, option: str = "--out") -> None:
    """Raise ``[unwritable_out]`` unless ``path`` can be written (checked before any work).

    Opens the file for appending (creating it if needed, then removing what was created),
    so permissions, read-only file systems and missing folders are all caught.
    """
    target = Path(path)
    if target.is_dir():
        raise ConfigError("unwritable_out", f"{option} {path!r} is a directory; give a file name")
    existed = target.exists()
    try:
        with open(target, "a"):
            pass
    except OSError as exc:
        reason = "its folder does not exist" if isinstance(exc, FileNotFoundError) else exc.strerror
        raise ConfigError("unwritable_out", f"cannot write {option} {path!r}: {reason}") from None
    if not existed:
        target.unlink()


def wrote(what: str, path: str) -> None:
    """The one "written to" line every command prints after writing a file."""
    sys.stdout.write(f"{what} written to {path}\n")
