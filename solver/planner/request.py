"""Stage 1: the request, its cache key, and its graph checked within the time limit."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from autopar.cost.model_version import COST_MODEL_VERSION
from autopar.errors import ConfigError, TimeLimitError
from autopar.hardware.cluster import Cluster
from autopar.hardware.mesh import Mesh
from autopar.infra.progress import Deadline
from autopar.ir.graph import Graph
from autopar.version import __version__ as autopar_version
from autopar_solver.options import SolverOptions

__all__ = ["TIE_THRESHOLD_OPS", "VALIDATE_S_PER_OP", "PlanRequest", "checked_graph"]

TIE_THRESHOLD_OPS = 8000
"""Graphs with more ops are solved with identical layers tied (see :mod:`autopar_solver.tying`)."""
VALIDATE_S_PER_OP = 1e-5
"""Seconds per op below which checking the graph is not started (measured: 100k ops
validate in 1.5-3.6 s on the 2-core machine, idle to loaded)."""


@dataclass(frozen=True)
class PlanRequest:
    """Everything that determines a plan."""

    graph: Graph
    cluster: Cluster
    mesh_shape: tuple[int, ...] | None = None
    memory_budget_bytes: int | None = None
    zero_stage: int = 2
    options: SolverOptions = field(default_factory=SolverOptions)
    tie_layers: bool | None = None
    """Give structurally identical ops (the same op of identical layers) one shared choice;
    None: only for graphs of more than :data:`TIE_THRESHOLD_OPS` ops."""

    def __post_init__(self) -> None:
        if self.zero_stage not in (0, 1, 2, 3):
            raise ConfigError("bad_zero_stage", f"ZeRO stage must be 0, 1, 2 or 3, got {self.zero_stage}")
        if self.memory_budget_bytes is not None and self.memory_budget_bytes <= 0:
            raise ConfigError(
                "bad_memory", f"memory budget must be > 0 bytes, got {self.memory_budget_bytes}"
            )
        if self.mesh_shape is not None:
            Mesh(self.cluster, tuple(self.mesh_shape))  # validates

    def to_key_dict(self) -> dict[str, Any]:
        """Canonical, JSON-able description (graph by content hash) for cache keys."""
        from importlib.metadata import PackageNotFoundError, version

        try:
            ortools_version = version("ortools")
        except PackageNotFoundError:  # pragma: no cover - the solver needs ortools anyway
            ortools_version = "none"
        opts = self.options
        return {
            "graph": self.graph.content_hash(),
            "cluster": self.cluster.to_dict(),
            "mesh_shape": list(self.mesh_shape) if self.mesh_shape else None,
            "memory_budget_bytes": self.memory_budget_bytes,
            "zero_stage": self.zero_stage,
            "tie_layers": self.tie_layers,
            "options": {
                "time_limit_s": opts.time_limit_s,
                "relative_gap": opts.relative_gap,
                "seed": opts.seed,
                "deterministic": opts.deterministic,
                "workers": opts.workers if opts.deterministic else None,
                # the iteration priced (autopar.cost.iteration); absent at K = 1 without checkpointing
                **({} if opts.training.is_default else {"training": opts.training.to_dict()}),
                # pipeline stages (planner.stage_search); absent for one stage
                **({} if opts.stages == 1 else {"stages": opts.stages or "auto"}),
            },
            "versions": {
                "autopar": autopar_version,
                "cost_model": COST_MODEL_VERSION,
                "ortools": ortools_version,
            },
        }

    def key(self) -> str:
        return hashlib.sha256(json.dumps(self.to_key_dict(), sort_keys=True).encode()).hexdigest()


def checked_graph(request: PlanRequest, deadline: Deadline) -> Graph:
    """``request.graph``, validated; :class:`TimeLimitError` (phase ``load``) when the time
    left cannot cover checking it (:data:`VALIDATE_S_PER_OP`, the caller spent it loading
    the graph) or ran out while checking it."""
    if deadline.left() < VALIDATE_S_PER_OP * len(request.graph.ops):
        _raise_no_time_to_load(deadline, len(request.graph.ops))
    graph = request.graph.validate()
    if deadline.expired():
        _raise_no_time_to_load(deadline, len(graph.ops))
    return graph


def _raise_no_time_to_load(deadline: Deadline, num_ops: int) -> None:
    raise TimeLimitError(
        "time_limit",
        f"the time limit ({round(deadline.limit_s, 2):g} s) ran out while loading and checking the graph "
        f"({num_ops} ops, {deadline.elapsed():.1f} s); raise the time limit",
        phase="load",
    )
