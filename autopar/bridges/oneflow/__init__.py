"""The OneFlow bridge: import OneFlow training jobs, read OneFlow's own plans, apply plans.

::

    OneFlow nn.Graph --export_job--> Job bytes --import_job--> autopar Graph --request_plan--> Plan
         ^                                   \\--import_plan--> Plan (OneFlow's own SBP)
         \\--- apply_plan(module, plan, placement), compile_with_plan(make_graph, plan) <--/
    compiled job --check_fidelity--> share of ops / boxing bytes that follow the plan

Everything that needs OneFlow imports it inside the function, so ``import
autopar.bridges.oneflow`` works without OneFlow; the functions that parse or build jobs
need the OneFlow 0.9 venv (``scripts/oneflow-env.sh``).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ApplyReport",
    "CompileReport",
    "FidelityReport",
    "apply_plan",
    "check_fidelity",
    "compile_with_plan",
    "export_job",
    "import_job",
    "import_plan",
    "load_job",
    "make_train_graph",
    "pin_plan",
    "request_plan",
]

_LAZY = {
    "ApplyReport": "autopar.bridges.oneflow.apply",
    "CompileReport": "autopar.bridges.oneflow.compile",
    "FidelityReport": "autopar.bridges.oneflow.fidelity",
    "compile_with_plan": "autopar.bridges.oneflow.compile",
    "pin_plan": "autopar.bridges.oneflow.pin",
    "request_plan": "autopar.bridges.oneflow.planning",
    "apply_plan": "autopar.bridges.oneflow.apply",
    "check_fidelity": "autopar.bridges.oneflow.fidelity",
    "export_job": "autopar.bridges.oneflow.jobs",
    "import_job": "autopar.bridges.oneflow.importer",
    "import_plan": "autopar.bridges.oneflow.plans",
    "load_job": "autopar.bridges.oneflow.jobs",
    "make_train_graph": "autopar.bridges.oneflow.jobs",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'autopar.bridges.oneflow' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(__all__)
