"""What OneFlow compiled against what the plan says: the share of ops whose signature follows
the plan and the boxing bytes the compiled job moves against the plan's
(:func:`check_fidelity`, :class:`FidelityReport`).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from autopar.bridges.oneflow.iteration import (
    plan_graph_recomputed,
    predicted_phases,
)
from autopar.bridges.oneflow.jobs import load_job
from autopar.bridges.oneflow.pin import match_plan_ops
from autopar.bridges.oneflow.traffic import PHASES, JobTraffic, count_job_traffic
from autopar.errors import PlanError
from autopar.ir.graph import DTYPE_BYTES, Graph
from autopar.ir.plan import Plan
from autopar.runtimes.registry import boxing_plan

__all__ = ["FidelityReport", "check_fidelity"]


@dataclass
class FidelityReport:
    """How closely a built OneFlow job follows a plan."""

    ops_total: int
    ops_matched: int
    boxing_bytes_total: float
    boxing_bytes_matched: float
    mismatches: list[dict[str, str]]
    """``{"op", "port", "planned", "compiled"}`` for every port that differs"""
    missing: list[str]
    """plan ops with no counterpart in the job"""
    predicted_bytes_per_axis: dict[int, float] = field(default_factory=dict)
    """the plan's ``predicted.comm_bytes_per_axis`` (bytes per device per step)"""
    counted: JobTraffic | None = None
    """bytes the job moves by its own N-D SBP (:func:`autopar.bridges.oneflow.traffic.count_job_traffic`)"""
    predicted_bytes_per_phase: dict[str, dict[int, float]] = field(default_factory=dict)
    """autopar's bytes per axis by phase (:func:`autopar.bridges.oneflow.iteration.predicted_phases`),
    when the plan's graph was given; compare with ``counted.bytes_per_phase``"""
    recomputed: list[str] = field(default_factory=list)
    """the layer scopes the prediction recomputes"""

    def phase_rows(self) -> list[dict[str, Any]]:
        """Per axis and phase (and ``per_step`` = ``K x (per_micro_batch + recompute) +
        once_per_step``): predicted and counted bytes per device."""
        if not self.predicted_bytes_per_phase or self.counted is None:
            return []
        k = self.counted.micro_batches
        rows: list[dict[str, Any]] = []
        for a in sorted(self.counted.bytes_per_axis):
            got = {ph: self.counted.bytes_per_phase.get(ph, {}).get(a, 0.0) for ph in PHASES}
            want = {ph: self.predicted_bytes_per_phase.get(ph, {}).get(a, 0.0) for ph in PHASES}
            for table in (want, got):
                micro = table["per_micro_batch"] + table["recompute"]
                table["per_step"] = k * micro + table["once_per_step"]
            for ph in (*PHASES, "per_step"):
                rows.append({"axis": a, "phase": ph, "predicted": want[ph], "counted": got[ph]})
        return rows

    def phase_table(self) -> str:
        """:meth:`phase_rows` as text, MiB per device."""
        rows = self.phase_rows()
        if not rows or self.counted is None:
            return ""
        zero = self.counted.recompute_zero_cast_bytes
        lines = [
            f"bytes per device by phase, K = {self.counted.micro_batches}, recomputed "
            f"{len(self.recomputed)} block(s) {', '.join(self.recomputed[:4])}"
            f"{' ...' if len(self.recomputed) > 4 else ''}:",
            f"  {'axis':>4}  {'phase':<16}{'predicted MiB':>14}{'counted MiB':>13}{'error':>9}",
        ]
        for r in rows:
            if r["counted"]:
                err = (r["predicted"] - r["counted"]) / r["counted"]
            else:
                err = 0.0 if not r["predicted"] else math.inf
            note = ""
            if r["phase"] == "recompute" and zero.get(r["axis"]):
                note = f"  (counted: {zero[r['axis']] / 2**20:.3f} MiB re-run ZeRO gathers)"
            lines.append(
                f"  {r['axis']:>4}  {r['phase']:<16}{r['predicted'] / 2**20:>14.3f}"
                f"{r['counted'] / 2**20:>13.3f}{100 * err:>+8.1f}%{note}"
            )
        return "\n".join(lines)

    def byte_error(self, axis: int) -> float:
        """(predicted - counted) / counted on ``axis`` (0 when both are 0, inf when only counted is 0)."""
        counted = self.counted.bytes_per_axis.get(axis, 0.0) if self.counted else 0.0
        predicted = self.predicted_bytes_per_axis.get(axis, 0.0)
        if counted == 0:
            return 0.0 if predicted == 0 else math.inf
        return (predicted - counted) / counted

    @property
    def op_share(self) -> float:
        return self.ops_matched / self.ops_total if self.ops_total else 1.0

    @property
    def boxing_share(self) -> float:
        return self.boxing_bytes_matched / self.boxing_bytes_total if self.boxing_bytes_total else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "ops_total": self.ops_total,
            "ops_matched": self.ops_matched,
            "op_share": self.op_share,
            "boxing_bytes_total": self.boxing_bytes_total,
            "boxing_bytes_matched": self.boxing_bytes_matched,
            "boxing_share": self.boxing_share,
            "mismatches": self.mismatches,
            "missing": self.missing,
            "predicted_bytes_per_axis": {str(a): b for a, b in sorted(self.predicted_bytes_per_axis.items())},
            "counted": self.counted.to_dict() if self.counted else None,
            "recomputed": self.recomputed,
            "phases": [{**r, "axis": str(r["axis"])} for r in self.phase_rows()],
        }

    def summary(self, limit: int = 10) -> str:
        lines = [
            f"fidelity: {self.ops_matched}/{self.ops_total} ops follow the plan "
            f"({100 * self.op_share:.1f}%), "
            f"{100 * self.boxing_share:.1f}% of planned boxing bytes "
            f"({self.boxing_bytes_matched / 2**20:.2f} of {self.boxing_bytes_total / 2**20:.2f} MiB)"
        ]
        if self.counted is not None:
            source = "compiled job" if self.counted.compiled else "built job, not compiled: no middle nodes"
            unit = "per step" if self.counted.micro_batches == 1 else "each hop once (per step: below)"
            lines.append(f"bytes per device {unit} (counted from the {source}):")
            for a in sorted(self.counted.bytes_per_axis):
                counted = f"counted {self.counted.bytes_per_axis[a] / 2**20:.3f} MiB"
                if not self.predicted_bytes_per_axis:  # a plan written without its prediction
                    lines.append(f"  axis {a}: {counted} (the plan carries no prediction)")
                    continue
                lines.append(
                    f"  axis {a}: predicted {self.predicted_bytes_per_axis.get(a, 0.0) / 2**20:.3f} MiB, "
                    f"{counted} ({100 * self.byte_error(a):+.1f} %)"
                )
        if self.phase_rows():
            lines.append(self.phase_table())
        for m in self.mismatches[:limit]:
            lines.append(f"  {m['op']} {m['port']}: planned {m['planned']}, compiled {m['compiled']}")
        if len(self.mismatches) > limit:
            lines.append(f"  ... {len(self.mismatches) - limit} more mismatched ports")
        if self.missing:
            lines.append(f"  {len(self.missing)} plan ops not in the job, e.g. {self.missing[:3]}")
        return "\n".join(lines)


# ------------------------------------------------------------------ fidelity


def _job_of(source: Any, inputs: Sequence[Any]) -> Any:
    if hasattr(source, "build_graph") and hasattr(source, "_full_job_proto"):
        if source._full_job_proto is None:
            source.build_graph(*inputs)
        compiled = getattr(source, "_compiled_job_proto", None)
        return compiled if compiled is not None else source._full_job_proto
    return load_job(source)


def _compare_ops(
    plan: Plan, compiled: Plan, job_of: dict[str, str]
) -> tuple[int, list[dict[str, str]], list[str]]:
    """(plan ops whose every port compiled as planned, mismatched ports, plan ops the job lacks).

    ``compiled`` is the job's own plan, ``job_of`` plan op -> job op.
    """
    mismatches: list[dict[str, str]] = []
    missing: list[str] = []
    matched = 0
    for name, sig in plan.signatures.items():
        other = job_of.get(name)
        if other is None:
            missing.append(name)
            continue
        ins, outs = plan.ports[name]
        c_ins, c_outs = compiled.ports[other]
        ok = True
        for ports, planned_sbps, c_ports, c_sbps in (
            (ins, sig.inputs, c_ins, compiled.signatures[other].inputs),
            (outs, sig.outputs, c_outs, compiled.signatures[other].outputs),
        ):
            for port, planned in zip(ports, planned_sbps):
                got = c_sbps[c_ports.index(port)] if port in c_ports else None
                if got != planned:
                    ok = False
                    mismatches.append(
                        {"op": name, "port": port, "planned": str(planned), "compiled": str(got or "-")}
                    )
        matched += ok
    return matched, mismatches, missing


def _planned_boxing_bytes(
    plan: Plan, compiled_graph: Any, compiled: Plan, plan_of: dict[str, str]
) -> tuple[float, float]:
    """(bytes of the boxing the plan schedules, bytes of it whose both ends compiled as planned).

    Edges of the compiled job between plan ops (single-input ops the plan does
    not have, such as hint casts, are looked through); ring bytes per device
    from :mod:`autopar.runtimes.ideal`, the tensor's size where no boxing plan exists.
    """
    total_bytes = 0.0
    matched_bytes = 0.0
    producer = compiled_graph.producer
    for op in compiled_graph.ops:
        consumer_plan = plan_of.get(op.name)
        if consumer_plan is None:
            continue
        for port, tensor in op.inputs.items():
            if port not in plan.ports[consumer_plan][0]:
                continue
            src_op, src_port = producer[tensor]
            while plan_of.get(src_op) is None and len(compiled_graph.op_by_name[src_op].inputs) == 1:
                (upstream,) = compiled_graph.op_by_name[src_op].inputs.values()
                src_op, src_port = producer[upstream]
            producer_plan = plan_of.get(src_op)
            if producer_plan is None or src_port not in plan.ports[producer_plan][1]:
                continue
            src = plan.output_sbp(producer_plan, src_port)
            dst = plan.input_sbp(consumer_plan, port)
            if src == dst:
                continue
            spec = compiled_graph.tensors[tensor]
            steps = boxing_plan(spec.shape, DTYPE_BYTES[spec.dtype], src, dst, plan.mesh)
            moved = sum(s.bytes_per_device for s in steps.steps) if steps.feasible else float(spec.nbytes)
            if not math.isfinite(moved):
                moved = float(spec.nbytes)
            total_bytes += moved
            if compiled.output_sbp(src_op, src_port) == src and compiled.input_sbp(op.name, port) == dst:
                matched_bytes += moved
    return total_bytes, matched_bytes


def check_fidelity(
    graph: Any,
    plan: Plan | dict[str, Any],
    *inputs: Any,
    plan_graph: Graph | None = None,
    recompute: Collection[str] | None = None,
) -> FidelityReport:
    """Compare the N-D SBP OneFlow chose in ``graph``'s job with ``plan``, in ops and in bytes.

    ``graph`` is an ``nn.Graph`` (built here on ``inputs`` if it is not built
    yet; its compiled job once compiled, else its built job), a OneFlow
    ``Job``, its bytes or a ``.pb`` path.  Plan ops are matched
    to job ops by op key; ops and ports the job lacks count as mismatches.
    Boxing bytes are those the plan itself schedules (producer output SBP !=
    consumer input SBP), ring bytes per device from :mod:`autopar.runtimes.ideal`; a
    planned boxing matches when both ends compiled as planned.

    Bytes: ``counted`` is what the job moves by its own N-D SBP on every edge
    (:func:`autopar.bridges.oneflow.traffic.count_job_traffic`: ZeRO casts, optimizer
    inputs and ops the import drops included, each hop priced as OneFlow 0.9
    lowers it), next to the plan's ``predicted.comm_bytes_per_axis``.

    The iteration (``plan_graph``: the graph the plan was solved on): the counted bytes by
    phase (``per_micro_batch``, ``recompute``, ``once_per_step``: when the job runs each hop,
    read from its ``repeat`` / ``acc`` ops and recompute copies) next to autopar's
    (:func:`autopar.bridges.oneflow.iteration.predicted_phases` at the job's ``K``, recomputing
    ``recompute`` scopes or the plan's, :func:`~autopar.bridges.oneflow.iteration.plan_graph_recomputed`).
    """
    from autopar.bridges.oneflow.importer import import_job
    from autopar.bridges.oneflow.plans import import_plan

    if isinstance(plan, dict):
        plan = Plan.from_dict(plan)
    job = _job_of(graph, inputs)
    compiled_graph = import_job(job, zero_stage=plan.zero_stage)
    if tuple(compiled_graph.meta["mesh_shape"]) != tuple(plan.mesh.shape):
        raise PlanError(
            "mesh_mismatch",
            f"the job runs on mesh {compiled_graph.meta['mesh_shape']} "
            f"but the plan is for {list(plan.mesh.shape)}",
        )
    compiled = import_plan(job, graph=compiled_graph, cluster=plan.mesh.cluster, zero_stage=plan.zero_stage)
    plan_of = match_plan_ops([op.name for op in compiled_graph.ops], plan)
    matched, mismatches, missing = _compare_ops(plan, compiled, {p: j for j, p in plan_of.items()})
    total_bytes, matched_bytes = _planned_boxing_bytes(plan, compiled_graph, compiled, plan_of)
    predicted = {int(a): float(b) for a, b in (plan.predicted.get("comm_bytes_per_axis") or {}).items()}
    dropped = {n for names in compiled_graph.meta["oneflow"]["dropped"].values() for n in names}
    report = FidelityReport(
        len(plan.signatures),
        matched,
        total_bytes,
        matched_bytes,
        mismatches,
        missing,
        predicted,
        count_job_traffic(job, dropped=dropped),
    )
    if plan_graph is not None and report.counted is not None:
        scopes = plan_graph_recomputed(plan, plan_graph, recompute)
        report.recomputed = sorted(scopes)
        report.predicted_bytes_per_phase = predicted_phases(
            plan_graph, plan, scopes, report.counted.micro_batches
        )
    return report
