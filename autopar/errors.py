"""Exceptions raised by autopar.  Each carries a stable ``code`` for APIs and scripts.

::

    AutoparError                 base; .code, .message, .details
    ├── ConfigError              a cluster, mesh, budget or option is invalid
    ├── GraphError               a graph is malformed (names the op or tensor)
    ├── PlanError                a plan does not fit its graph or mesh
    ├── InfeasibleError          no plan fits the memory budget (.min_feasible_bytes)
    ├── TimeLimitError           the time limit ran out before any verified plan
    └── VerificationError        a solver result failed the independent re-check
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "MAX_LINE",
    "AutoparError",
    "ConfigError",
    "GraphError",
    "InfeasibleError",
    "PlanError",
    "TimeLimitError",
    "VerificationError",
    "one_line",
]

MAX_LINE = 300
"""Longest error line shown to a person (the command line, a job's message); the whole text goes
to ``--verbose`` and to the JSON."""
SHORTENED = " ..."
"""What ends a line cut at :data:`MAX_LINE`."""


def one_line(text: str, limit: int = MAX_LINE) -> str:
    """``text`` on one line (every run of whitespace, line breaks included, one space), cut to at
    most ``limit`` characters (ending in :data:`SHORTENED`)."""
    line = " ".join(text.split())
    if len(line) <= limit:
        return line
    return line[: limit - len(SHORTENED)].rstrip() + SHORTENED


class AutoparError(Exception):
    """Base class: ``code`` is stable, ``message`` says what was wrong and what to do."""

    default_code = "autopar_error"

    def __init__(self, code: str | None, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code = code or self.default_code
        self.message = message
        self.details = details

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"

    def line(self, limit: int = MAX_LINE) -> str:
        """``[code] message`` on one line of at most ``limit`` characters (:func:`one_line`)."""
        return one_line(str(self), limit)

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, **self.details}


class ConfigError(AutoparError, ValueError):
    """Raised when a cluster, mesh, memory budget or solver option is invalid."""

    default_code = "bad_config"


class GraphError(AutoparError, ValueError):
    """Raised when a graph is malformed: cycle, dangling tensor, bad shape or dtype."""

    default_code = "invalid_graph"


class PlanError(AutoparError, ValueError):
    """Raised when a plan does not match its graph or mesh."""

    default_code = "invalid_plan"


class InfeasibleError(AutoparError):
    """Raised when no plan fits the memory budget.

    ``details["min_feasible_bytes"]`` is the smallest per-device memory for which
    a plan was found (or a proven lower bound, flagged by ``details["proven"]``).
    """

    default_code = "infeasible_budget"


class TimeLimitError(AutoparError):
    """Raised when the time limit ran out before a verified plan existed.

    ``details`` say how far the command got (``phase``, and ``done`` / ``total`` where
    the phase counts entries).
    """

    default_code = "time_limit"


class VerificationError(AutoparError):
    """Raised when a solver result disagrees with the independent evaluator."""

    default_code = "verification_failed"
