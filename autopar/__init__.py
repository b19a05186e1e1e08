"""autopar: auto-parallel planning of training graphs (N-D SBP under a ZeRO-aware memory budget).

The core (this package) needs only numpy and pydantic; the solver (``solver``) needs OR-Tools
and the service (``service``) FastAPI and Redis.  The names users import are here, loaded on
first use (``import autopar`` stays light for a launcher that only needs the client)::

    autopar.Graph, autopar.Plan, autopar.PipelinePlan     the IR and the plans
    autopar.Cluster, autopar.Mesh                         the hardware
    autopar.evaluate, autopar.build_model                 re-price a plan, build a bundled model
    autopar.PlanClient                                    the planning service's client

Packages, bottom up (each imports only those below it; docs/architecture.md):
``infra`` < ``hardware`` < ``ir`` < ``runtimes`` < ``rules`` < ``cost`` < ``pipeline`` <
``baselines`` < ``bridges`` < ``cli``, with ``models`` above ``ir``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from autopar.version import __version__

if TYPE_CHECKING:
    from autopar.client import PlanClient
    from autopar.cost.evaluate import evaluate
    from autopar.hardware.cluster import Cluster
    from autopar.hardware.mesh import Mesh
    from autopar.ir.graph import Graph
    from autopar.ir.plan import Plan
    from autopar.models import build as build_model
    from autopar.pipeline.plan import PipelinePlan

__all__ = [
    "Cluster",
    "Graph",
    "Mesh",
    "PipelinePlan",
    "Plan",
    "PlanClient",
    "__version__",
    "build_model",
    "evaluate",
]

_PUBLIC = {
    "Cluster": ("autopar.hardware.cluster", "Cluster"),
    "Graph": ("autopar.ir.graph", "Graph"),
    "Mesh": ("autopar.hardware.mesh", "Mesh"),
    "PipelinePlan": ("autopar.pipeline.plan", "PipelinePlan"),
    "Plan": ("autopar.ir.plan", "Plan"),
    "PlanClient": ("autopar.client", "PlanClient"),
    "build_model": ("autopar.models", "build"),
    "evaluate": ("autopar.cost.evaluate", "evaluate"),
}
"""Public name -> (module, attribute), imported on first use."""


def __getattr__(name: str) -> Any:
    found = _PUBLIC.get(name)
    if found is None:
        raise AttributeError(f"module 'autopar' has no attribute {name!r}")
    value = getattr(importlib.import_module(found[0]), found[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
