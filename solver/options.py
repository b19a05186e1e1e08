"""Solver options (one frozen dataclass, validated on construction); progress reports are
:class:`autopar.infra.progress.Progress` (re-exported here)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from autopar.errors import ConfigError
from autopar.infra.progress import Progress, ProgressFn
from autopar.ir.training import TrainingConfig
from autopar.ir.wire import DEFAULT_RUNTIME
from autopar.runtimes.registry import RUNTIMES

__all__ = ["DETERMINISTIC_WALL_FACTOR", "PHASES", "Progress", "ProgressFn", "SolverOptions"]

DETERMINISTIC_WALL_FACTOR = 10
"""Deterministic runs measure their limit in CP-SAT's deterministic units; their wall clock
is capped at this many times the limit per solve (a guard against a run-away, not a limit
that should bind: a cap that binds changes the answer, and the run is no longer
reproducible).  On the 2-core test machine a unit takes 1.6 s of wall time idle (tiny-gpt
[2, 2], 8 units in 13 s) and about three times that at load 5-8; at 4x the cap stopped such
a solve short of the optimum it proves idle (CI, 2026-12-07)."""

PHASES = ("reduce", "heuristic", "build", "solve", "expand", "done")
"""Values of :attr:`Progress.phase` from :func:`autopar_solver.solve.solve`, in order."""


def _default_workers() -> int:
    return min(8, os.cpu_count() or 1)


@dataclass(frozen=True)
class SolverOptions:
    """How long and how hard to search.

    Raises :class:`ConfigError` (code ``bad_solver_option``) on invalid values.
    """

    time_limit_s: float = 30.0
    """Wall-clock limit, seconds.  For :func:`autopar_solver.planner.plan` it bounds the whole
    command: cost tables, reductions, heuristic, CP-SAT, memory rounds, verification."""
    workers: int = field(default_factory=_default_workers)
    """CP-SAT search workers (threads); default ``min(8, os.cpu_count())``."""
    seed: int = 0
    """CP-SAT random seed."""
    relative_gap: float = 0.01
    """Stop when ``(objective - bound) / objective`` is at most this; 0 proves optimality."""
    deterministic: bool = False
    """Reproducible runs: fixed seed, interleaved search, deterministic time limit
    (``time_limit_s`` is then measured in CP-SAT's deterministic units, and wall time
    is capped at four times that)."""
    log: bool = False
    """Send CP-SAT's search log to the ``autopar_solver.cpsat`` logger (level INFO)."""
    use_hint: bool = True
    """Give CP-SAT the heuristic (or caller's) assignment as a complete hint."""
    reductions: bool = True
    """Apply the exact reductions of :mod:`autopar_solver.reductions` before CP-SAT."""
    runtime: str = DEFAULT_RUNTIME
    """Runtime profile the plan is priced for (:mod:`autopar.runtimes.registry`): ``oneflow-0.9``,
    ``ideal`` or ``megatron-lm``."""
    micro_batches: int = 1
    """Micro-batches per optimizer step: the objective is the iteration (:mod:`autopar.cost.iteration`)."""
    checkpointing: str = "off"
    """Activation checkpointing priced: ``off``, ``full`` (every block) or ``auto`` (the solver
    chooses per block, jointly with the layout: :mod:`autopar_solver.planner.recompute`)."""
    max_model_vars: int = 150_000
    """Largest reduced problem (Booleans: choices + grouped edge pairs) given to CP-SAT
    as one model; above it CP-SAT improves the heuristic plan window by window
    (:mod:`autopar_solver.lns`) and the bound comes from :mod:`autopar_solver.bounds`.  Measured on
    2 workers: one model wins below ~60k Booleans, windows above ~150k; in between, tiny-gpt
    on ``[2, 2]`` with OneFlow's ZeRO threshold (128,719 Booleans): one model 0.77 % in 10 s,
    windows 2.9 % in 20 s (windows improved nothing)."""

    stages: int | None = 1
    """Pipeline stages (:mod:`autopar_solver.planner.stage_search`): 1 plans one stage on the
    whole mesh, ``S > 1`` a pipeline of ``S`` stages, None (``auto``) the best of one and the
    candidate numbers of stages."""

    @property
    def training(self) -> TrainingConfig:
        """The job's training configuration the plan is priced for."""
        return TrainingConfig(self.micro_batches, self.checkpointing)

    def __post_init__(self) -> None:
        TrainingConfig(self.micro_batches, self.checkpointing)  # validates (ConfigError)
        if self.runtime not in RUNTIMES:
            raise _bad(f"runtime must be one of {sorted(RUNTIMES)}, got {self.runtime!r}")
        if not (isinstance(self.time_limit_s, (int, float)) and math.isfinite(self.time_limit_s)):
            raise _bad(f"time_limit_s must be a finite number of seconds, got {self.time_limit_s!r}")
        if self.time_limit_s <= 0:
            raise _bad(f"time_limit_s must be > 0, got {self.time_limit_s}")
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise _bad(f"workers must be an integer >= 1, got {self.workers!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**31:
            raise _bad(f"seed must be an integer in [0, 2**31), got {self.seed!r}")
        if not isinstance(self.relative_gap, (int, float)) or not 0 <= self.relative_gap < 1:
            raise _bad(f"relative_gap must be in [0, 1) (0.01 = stop within 1 %), got {self.relative_gap!r}")
        if (
            isinstance(self.max_model_vars, bool)
            or not isinstance(self.max_model_vars, int)
            or self.max_model_vars < 0
        ):
            raise _bad(f"max_model_vars must be an integer >= 0, got {self.max_model_vars!r}")
        if self.stages is not None and (
            isinstance(self.stages, bool) or not isinstance(self.stages, int) or self.stages < 1
        ):
            raise _bad(f"stages must be an integer >= 1 or auto, got {self.stages!r}")
        for name in ("deterministic", "log", "use_hint", "reductions"):
            if not isinstance(getattr(self, name), bool):
                raise _bad(f"{name} must be true or false, got {getattr(self, name)!r}")


def _bad(message: str) -> ConfigError:
    return ConfigError("bad_solver_option", message)
