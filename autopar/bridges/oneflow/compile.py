"""Compiling a OneFlow training graph with a plan applied: K and the recomputed blocks set, the
plan pinned, the job built (nothing runs), and the compiled job checked against the plan
(:func:`compile_with_plan`, :class:`CompileReport`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from autopar.bridges.oneflow.apply import _clear_lazy_grads
from autopar.bridges.oneflow.fidelity import FidelityReport, check_fidelity
from autopar.bridges.oneflow.iteration import (
    checkpoint_modules,
    configure_iteration,
    plan_recomputed_scopes,
)
from autopar.bridges.oneflow.jobs import _require_oneflow
from autopar.bridges.oneflow.pin import _lay_out_graph_outputs, match_plan_ops, pin_plan
from autopar.errors import PlanError
from autopar.ir.graph import Graph
from autopar.ir.plan import Plan

__all__ = ["CompileReport", "compile_with_plan"]


@dataclass
class CompileReport:
    """What :func:`compile_with_plan` did."""

    attempts: int
    pinned_ops: int
    rejected: list[str]
    """``type`` (all its ops) or ``type with P`` (its ops planned with a partial sum) whose
    planned signatures OneFlow refused: left to OneFlow's inference"""
    fidelity: FidelityReport | None = None
    micro_batches: int = 1
    """``K`` the graph was configured with (``set_gradient_accumulation_steps``)"""
    recomputed: dict[str, str] = field(default_factory=dict)
    """recomputed layer scope -> the module path given ``activation_checkpointing``"""

    def summary(self, mismatches: int = 40) -> dict[str, Any]:
        """JSON-able: attempts, ops pinned, refused types and the fidelity's op counts, with
        at most ``mismatches`` of its mismatched ports and of the plan ops the job lacks
        (``missing``, e.g. the ten ops of a ``_ms`` softmax the build made plain; each counts
        as an op not as planned) (``fidelity`` must be set)."""
        if self.fidelity is None:
            raise ValueError("compile_with_plan ran without check: the report has no fidelity")
        return {
            "attempts": self.attempts,
            "pinned_ops": self.pinned_ops,
            "rejected": self.rejected,
            "ops_total": self.fidelity.ops_total,
            "ops_matched": self.fidelity.ops_matched,
            "op_share": self.fidelity.op_share,
            "mismatches": self.fidelity.mismatches[:mismatches],
            "missing": self.fidelity.missing[:mismatches],
        }


def _configure_plan_iteration(
    graph: Any, plan: Plan, graph_attr: str, recompute: Collection[str] | None
) -> dict[str, str]:
    """Configure an unbuilt ``nn.Graph`` for the plan's iteration: its ``K``, and
    checkpointing on the modules of the scopes it recomputes (``recompute`` overrides the
    plan's).  Returns scope -> module path; raises ``checkpoint_scope_unmatched``."""
    if plan.training.is_default and recompute is None:
        return {}  # one micro-batch, nothing recomputed: the graph as it is
    flow = _require_oneflow()
    module = getattr(graph, graph_attr).to(flow.nn.Module)
    scopes = plan_recomputed_scopes(plan, module, graph_attr, recompute)
    paths = checkpoint_modules(module, scopes, graph_attr)
    configure_iteration(graph, plan.training.micro_batches, paths.values(), graph_attr)
    return paths


_REJECTED_RE = re.compile(r"Empty sbp signature after filtering for (\S+)")


def compile_with_plan(
    make_graph: Callable[[], Any],
    plan: Plan | dict[str, Any],
    *inputs: Any,
    max_attempts: int = 8,
    check: bool = True,
    graph_attr: str = "model",
    recompute: Collection[str] | None = None,
    plan_graph: Graph | None = None,
) -> tuple[Any, CompileReport]:
    """Build ``make_graph()`` on ``inputs``, pin ``plan`` into it, compile it; return it compiled.

    OneFlow rejects a pinned signature that is not among its own candidates for
    the op ("Empty sbp signature after filtering for OP"); the graph is then
    rebuilt without pinning the ops of that type planned with a ``P`` (if the
    refused one had one; else all ops of that type), which keep OneFlow's
    inference, and compiled again, up to ``max_attempts`` times.  ``make_graph`` returns a
    fresh, unbuilt ``nn.Graph`` (for example ``lambda: make_train_graph(module,
    optimizer)`` after :func:`apply_plan`).  The tensors its ``build`` returns are laid
    out as the plan's output ops take them (:func:`_lay_out_graph_outputs`: OneFlow fixes
    an output's layout as the job is built, a pin cannot move it).  With ``check`` the
    report carries :func:`check_fidelity` of the compiled job (by phase of the iteration
    when ``plan_graph``, the graph the plan was solved on, is given).

    The iteration: every fresh graph gets the plan's ``K``
    (``config.set_gradient_accumulation_steps``) and activation checkpointing on the
    modules of the layer scopes the plan recomputes (``full``: every block; ``auto``: the
    plan's list; ``recompute``: these scopes instead), found under the module the graph
    holds as ``graph_attr`` (:func:`autopar.bridges.oneflow.iteration.checkpoint_modules`: a scope
    with no module is a :class:`PlanError` ``checkpoint_scope_unmatched``).  ``inputs``
    then hold ``K`` micro-batches each.
    """
    from autopar.bridges.oneflow.importer import import_job

    if isinstance(plan, dict):
        plan = Plan.from_dict(plan)
    whole: list[str] = []
    partial: list[str] = []
    for attempt in range(1, max_attempts + 1):
        graph = make_graph()
        recomputed = _configure_plan_iteration(graph, plan, graph_attr, recompute)
        _lay_out_graph_outputs(graph, plan)
        graph.build_graph(*inputs)
        imported = import_job(graph._full_job_proto, zero_stage=plan.zero_stage)
        types_by_op = {op.name: op.type for op in imported.ops}
        matched = match_plan_ops([op.name for op in imported.ops], plan)
        pinned = pin_plan(graph, plan, skip_types=("constant", *whole), skip_partial_types=partial)
        try:
            graph.finish_complie_and_init_runtime()
        except RuntimeError as exc:
            found = _REJECTED_RE.search(str(exc))
            if found is None or attempt == max_attempts:
                raise
            refused = found.group(1)
            op_type = types_by_op.get(refused)
            if op_type is None or op_type in whole:
                raise
            planned = plan.signatures.get(matched.get(refused, ""))
            with_p = planned is not None and any(s.has_partial for s in (*planned.inputs, *planned.outputs))
            if with_p and op_type not in partial:
                partial.append(op_type)
            else:
                whole.append(op_type)
            _clear_lazy_grads(graph)
            continue
        report = CompileReport(
            attempt,
            pinned,
            [*whole, *(f"{t} with P" for t in partial if t not in whole)],
            micro_batches=plan.training.micro_batches,
            recomputed=recomputed,
        )
        if check:
            report.fidelity = check_fidelity(graph, plan, plan_graph=plan_graph, recompute=recompute)
        return graph, report
    raise PlanError(
        "pin_failed", f"OneFlow refused the plan after {max_attempts} attempts"
    )  # pragma: no cover
