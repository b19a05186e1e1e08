"""Placement plans and their wire format ``autopar.plan/v1`` (see ``docs/plan-format.md``).

A :class:`Plan` assigns one N-D SBP signature to every op of a graph on a mesh.
Its JSON form lists, per op, the N-D SBP of every input and output port (by
the graph's port names, so the plan maps back to the framework), per variable
its layout and data-parallel axes, the predicted step time and memory with
breakdowns, diagnostics and the solver's report.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from autopar.errors import PlanError
from autopar.hardware.mesh import Mesh
from autopar.ir.batch import BatchShape
from autopar.ir.blocks import split_unit
from autopar.ir.graph import Graph
from autopar.ir.sbp import NdSbp, Signature, data_parallel_axes, parse_nd_sbp
from autopar.ir.training import TrainingConfig, micro_batches_text
from autopar.ir.wire import (
    DEFAULT_RUNTIME,
    Diagnostics,
    MemoryReport,
    PlanModel,
    Predicted,
    SolverReport,
    VariableLayout,
    error_path,
)

__all__ = ["FORMAT", "Plan", "check_plan_graph", "format_bytes", "recompute_line", "throughput_line"]

FORMAT = "autopar.plan/v1"

_BINARY_UNITS = (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))


def format_bytes(n: float | None) -> str:
    """``4563402752`` -> ``4.25 GiB``; under 0.01 GiB in MiB, under 0.01 MiB in KiB, so a small
    figure never prints as ``0.00 GiB``; under 0.01 KiB in bytes; None or NaN -> ``n/a``."""
    if n is None or n != n:
        return "n/a"
    for unit, size in _BINARY_UNITS:
        if abs(n) >= 0.01 * size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


@dataclass
class Plan:
    """A full assignment plus what it is predicted to cost."""

    graph_name: str
    graph_hash: str
    mesh: Mesh
    zero_stage: int
    signatures: dict[str, Signature]
    ports: dict[str, tuple[list[str], list[str]]]
    """op -> (input port names, output port names), in signature order."""
    variables: dict[str, VariableLayout] = field(default_factory=dict)
    predicted: Predicted = field(default_factory=lambda: Predicted())
    memory: MemoryReport = field(default_factory=lambda: MemoryReport())
    diagnostics: Diagnostics = field(default_factory=lambda: Diagnostics())
    solver: SolverReport | None = None
    source: str = "autopar"
    memory_budget_bytes: int | None = None
    runtime: str = DEFAULT_RUNTIME
    """Name of the runtime profile (:mod:`autopar.runtimes.profile`) the plan is priced with."""
    training: TrainingConfig = field(default_factory=TrainingConfig)
    """Micro-batches per optimizer step and checkpointing the plan is priced for
    (:mod:`autopar.cost.iteration`)."""

    # ------------------------------------------------------------ building

    @classmethod
    def from_assignment(
        cls,
        graph: Graph,
        mesh: Mesh,
        zero_stage: int,
        signatures: dict[str, Signature],
        *,
        source: str = "autopar",
        memory_budget_bytes: int | None = None,
        runtime: str = DEFAULT_RUNTIME,
        training: TrainingConfig | None = None,
    ) -> Plan:
        """Plan of ``signatures`` (op name -> signature) for ``graph``; fills the variable layouts."""
        missing = [op.name for op in graph.ops if op.name not in signatures]
        if missing:
            raise PlanError("incomplete_plan", f"no signature for op {missing[0]!r} ({len(missing)} ops)")
        ports = {op.name: (list(op.inputs), list(op.outputs)) for op in graph.ops}
        plan = cls(
            graph.name,
            graph.content_hash(),
            mesh,
            zero_stage,
            dict(signatures),
            ports,
            source=source,
            memory_budget_bytes=memory_budget_bytes,
            runtime=runtime,
            training=training or TrainingConfig(),
        )
        plan.variables = plan.variable_layouts(graph)
        return plan

    def variable_layouts(self, graph: Graph) -> dict[str, VariableLayout]:
        out: dict[str, VariableLayout] = {}
        for v in graph.variables:
            sbp = self.output_sbp(v.op, next(iter(graph.op_by_name[v.op].outputs)))
            out[v.op] = {
                "tensor": v.tensor,
                "shape": list(graph.tensors[v.tensor].shape),
                "sbp": str(sbp),
                "dp_axes": list(data_parallel_axes(sbp)),
                "split_factor": sbp.split_factor(self.mesh.shape),
            }
        return out

    # ------------------------------------------------------------ lookups

    def input_sbp(self, op: str, port: str) -> NdSbp:
        """The N-D SBP the plan gives input ``port`` of ``op``."""
        ins, _ = self.ports[op]
        return self.signatures[op].inputs[ins.index(port)]

    def output_sbp(self, op: str, port: str) -> NdSbp:
        """The N-D SBP the plan gives output ``port`` of ``op``."""
        _, outs = self.ports[op]
        return self.signatures[op].outputs[outs.index(port)]

    @property
    def step_time_s(self) -> float:
        """Seconds of one micro-batch's forward and backward with its gradient reduction
        (deprecated as a headline figure: :attr:`iteration_time_s` is what a job runs)."""
        return float(self.predicted.get("step_time_s", float("nan")))

    @property
    def iteration_time_s(self) -> float:
        """Seconds of one optimizer step as the job runs it: ``K x micro-batch +
        once-per-step``, with recomputation (:mod:`autopar.cost.iteration`); the objective the
        solver minimises and the figure plans are compared by.  Plans priced before
        iterations carry only ``step_time_s``, which is the iteration at K = 1."""
        pred = self.predicted
        return float(pred.get("iteration_time_s", pred.get("step_time_s", float("nan"))))

    @property
    def achieved_iteration_time_s(self) -> float:
        """Seconds of one optimizer step as the plan's runtime runs it: the iteration less the
        communication the runtime hides behind compute (:mod:`autopar.runtimes.profile`:
        overlapped gradient reduction and parameter gather); the figure plans and baselines
        are compared by.  Plans priced before overlap was modelled: the iteration."""
        pred = self.predicted
        return float(pred.get("achieved_iteration_time_s", self.iteration_time_s))

    @property
    def micro_batch_time_s(self) -> float:
        """Seconds of one micro-batch (forward, backward with recomputation, activation
        boxing); plans priced before iterations: :attr:`step_time_s`."""
        pred = self.predicted
        return float(pred.get("micro_batch_time_s", pred.get("step_time_s", float("nan"))))

    @property
    def once_per_step_s(self) -> float:
        """Seconds of the once-per-step work (gradient reduction, update, ZeRO gather), so that
        ``iteration_time_s = K x micro_batch_time_s + once_per_step_s``; plans priced before
        iterations: 0 (their step holds it)."""
        return float(self.predicted.get("once_per_step_time_s", 0.0))

    @property
    def memory_per_device_bytes(self) -> float:
        return float(self.memory.get("per_device_bytes", float("nan")))

    # ------------------------------------------------------------ wire format

    def to_dict(self) -> dict[str, Any]:
        ops: dict[str, Any] = {}
        for name, sig in self.signatures.items():
            ins, outs = self.ports[name]
            ops[name] = {
                "signature": str(sig),
                "inputs": {p: str(s) for p, s in zip(ins, sig.inputs)},
                "outputs": {p: str(s) for p, s in zip(outs, sig.outputs)},
            }
        return {
            "format": FORMAT,
            "source": self.source,
            "graph": {"name": self.graph_name, "hash": self.graph_hash},
            "mesh": self.mesh.to_dict(),
            "zero_stage": self.zero_stage,
            "runtime": self.runtime,
            "micro_batches": self.training.micro_batches,
            "checkpointing": self.training.checkpointing,
            **(
                {"recomputed_blocks": list(self.training.recomputed)}
                if self.training.checkpointing == "auto"
                else {}
            ),
            "memory_budget_bytes": self.memory_budget_bytes,
            "predicted": self.predicted,
            "memory": self.memory,
            "variables": self.variables,
            "diagnostics": self.diagnostics,
            "solver": self.solver,
            "ops": ops,
        }

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: Any) -> Plan:
        """The plan of a decoded ``autopar.plan/v1`` document (checked by :class:`PlanModel`).

        Raises :class:`PlanError` naming the field (``bad_format``) or the op whose SBP
        does not fit the mesh (``mesh_mismatch``).
        """
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise PlanError(
                "bad_format",
                f"unsupported plan format {data.get('format') if isinstance(data, dict) else None!r}; "
                f"expected {FORMAT!r}",
            )
        try:
            model = PlanModel.model_validate(data)
        except RecursionError:
            raise PlanError("bad_format", "the plan is nested too deeply") from None
        except ValidationError as exc:
            error = exc.errors()[0]
            path = error_path(error["loc"])
            shown = f"{error.get('input')!r:.80}"
            message = f"plan field {path}: {error['msg']} (got {shown})"
            raise PlanError("bad_format", message, field=path) from None
        return cls.from_model(model)

    @classmethod
    def from_model(cls, model: PlanModel) -> Plan:
        """The plan of a validated :class:`~autopar.ir.wire.PlanModel`; raises ``mesh_mismatch``."""
        mesh = Mesh.from_dict(model.mesh.model_dump(exclude_none=True))
        signatures: dict[str, Signature] = {}
        ports: dict[str, tuple[list[str], list[str]]] = {}
        for name, entry in model.ops.items():
            ins, outs = list(entry.inputs), list(entry.outputs)
            try:
                signatures[name] = Signature(
                    tuple(parse_nd_sbp(entry.inputs[p]) for p in ins),
                    tuple(parse_nd_sbp(entry.outputs[p]) for p in outs),
                )
            except ValueError as exc:
                raise PlanError("bad_format", f"op {name!r}: {exc}", op=name) from None
            ports[name] = (ins, outs)
        for name, sig in signatures.items():
            for s in (*sig.inputs, *sig.outputs):
                if len(s) != mesh.ndim:
                    raise PlanError(
                        "mesh_mismatch",
                        f"op {name!r}: SBP {s} has {len(s)} axes but the mesh "
                        f"{list(mesh.shape)} has {mesh.ndim}",
                        op=name,
                    )
        return cls(
            graph_name=model.graph.name,
            graph_hash=model.graph.hash,
            mesh=mesh,
            zero_stage=model.zero_stage,
            signatures=signatures,
            ports=ports,
            variables=dict(model.variables),
            predicted=model.predicted,
            memory=model.memory,
            diagnostics=model.diagnostics,
            solver=model.solver,
            source=model.source,
            memory_budget_bytes=model.memory_budget_bytes,
            runtime=model.runtime,
            training=_training(model.micro_batches, model.checkpointing, model.recomputed_blocks),
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> Plan:
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise PlanError("bad_json", f"plan is not valid JSON: {exc}") from None
        except RecursionError:
            raise PlanError("bad_json", "the plan is nested too deeply") from None
        return cls.from_dict(data)

    @classmethod
    def load(cls, path: str) -> Plan:
        with open(path, "rb") as fh:
            return cls.from_json(fh.read())

    def save(self, path: str) -> None:
        with open(path, "w") as fh:
            fh.write(self.to_json(indent=1))

    def summary(self, batch: BatchShape | None = None) -> str:
        """A few human-readable lines; with the graph's ``batch``
        (:func:`autopar.ir.batch.batch_shape`) also the throughput."""
        pred, mem = self.predicted, self.memory
        k = self.training.micro_batches
        iteration = float(pred.get("iteration_time_s", float("nan")))
        lines = [
            f"plan for {self.graph_name} ({self.source}) on mesh {list(self.mesh.shape)} "
            f"over {self.mesh.cluster}, ZeRO-{self.zero_stage}",
            f"  iteration   {iteration * 1e3:10.2f} ms modelled "
            f"(one optimizer step: {micro_batches_text(k)} of "
            f"{pred.get('micro_batch_time_s', float('nan')) * 1e3:.2f} ms each + "
            f"{pred.get('once_per_step_time_s', float('nan')) * 1e3:.2f} ms once per step; checkpointing "
            f"{self.training.checkpointing}; runtime {self.runtime})",
            f"              {pred.get('achieved_iteration_time_s', float('nan')) * 1e3:10.2f} ms as the "
            f"runtime runs it, hiding {pred.get('hidden_comm_time_s', float('nan')) * 1e3:.2f} ms of "
            "communication behind compute (gradient reduction behind backward, parameter gathers "
            "behind forward)",
        ]
        if batch is not None:  # at the iteration as the runtime runs it
            lines.append(throughput_line(batch, k, float(pred.get("achieved_iteration_time_s", iteration))))
        if k > 1:  # at K = 1 this is the iteration itself
            lines.append(
                f"  at K = 1    {pred.get('step_time_s', float('nan')) * 1e3:10.2f} ms one micro-batch "
                f"with the once-per-step work, without recomputation (compute "
                f"{pred.get('compute_time_s', float('nan')) * 1e3:.2f} ms, comm "
                f"{pred.get('comm_time_s', float('nan')) * 1e3:.2f} ms)"
            )
        lines.append(
            f"  memory/dev  {format_bytes(mem.get('per_device_bytes', float('nan'))):>13} "
            f"(params {format_bytes(mem.get('params_bytes', 0))}, "
            f"grads {format_bytes(mem.get('grads_bytes', 0))}, "
            f"optimizer {format_bytes(mem.get('optimizer_bytes', 0))}, "
            f"activations {format_bytes(mem.get('activation_peak_bytes', 0))})"
        )
        if self.training.checkpointing == "auto":
            lines.append(recompute_line(self.training.recomputed, pred.get("recompute_time_s")))
        if self.solver:
            s = self.solver
            lines.append(
                f"  solver      {s.get('status')}, proven gap {100 * float(s.get('gap') or 0):.2f}% "
                f"in {float(s.get('wall_s') or 0):.1f} s"
            )
            stats = s.get("stats")
            hand = stats.get("hand_layout") if isinstance(stats, dict) else None
            if isinstance(hand, dict) and hand.get("returned"):
                searched = hand.get("searched_achieved_iteration_time_s")
                achieved = float(pred.get("achieved_iteration_time_s", float("nan")))
                lines.append(
                    hand_layout_line(
                        achieved, float(searched) if isinstance(searched, (int, float)) else None
                    )
                )
        fb = self.diagnostics.get("fallback_ops") or []
        if fb:
            lines.append(
                f"  fallback    {len(fb)} ops with no rule (all-B): "
                f"{sorted(set(self.diagnostics.get('fallback_op_types', [])))}"
            )
        return "\n".join(lines)


def hand_layout_line(achieved_s: float, searched_s: float | None) -> str:
    """The summary's line for a plan that is Megatron-LM's layout on its mesh
    (``solver/planner/hand_layout.py``), ``achieved_s`` seconds as its runtime runs it: what
    the searched plan achieved, when there was one."""
    head = f"  layout      Megatron-LM's on this mesh: {1e3 * achieved_s:.2f} ms as the runtime runs it"
    if searched_s is None:
        return head + ", no searched plan of lower objective"
    return (
        f"{head}, faster than the searched plan's {1e3 * float(searched_s):.2f} ms (the solver prices "
        "every boxing on its own and hides none)"
    )


def _training(micro_batches: int, checkpointing: str, recomputed: list[str]) -> TrainingConfig:
    try:
        return TrainingConfig(micro_batches, checkpointing, tuple(recomputed))
    except ValueError as exc:
        raise PlanError(
            "bad_format", f"plan field micro_batches/checkpointing/recomputed_blocks: {exc}"
        ) from None


def throughput_line(batch: BatchShape, micro_batches: int, iteration_s: float) -> str:
    """The summary line of the modelled throughput: ``micro_batches`` micro-batches of ``batch``
    per iteration of ``iteration_s`` seconds."""
    per = f"{batch.samples} samples" + (f" of {batch.sequence} tokens" if batch.sequence else "")
    return (
        f"  throughput  {batch.throughput_text(micro_batches, iteration_s)} "
        f"({micro_batches} x {per} per iteration)"
    )


def recompute_line(units: tuple[str, ...], recompute_s: float | None) -> str:
    """The summary line of the units (blocks, op groups of blocks) ``auto`` checkpointing
    recomputes and their cost: the blocks recomputed whole, then the blocks by the groups
    they recompute, each with up to three names."""
    if not units:
        return "  recompute   none (every block keeps its activations)"
    by_block: dict[str, list[str]] = {}
    for unit in units:
        block, group = split_unit(unit)
        by_block.setdefault(block, []).append(group or "whole")
    kinds: dict[str, list[str]] = {}
    for block, groups in by_block.items():
        kinds.setdefault("whole" if "whole" in groups else " + ".join(sorted(groups)), []).append(block)
    parts = []
    for kind in sorted(kinds, key=lambda k: (k != "whole", k)):
        blocks = sorted(kinds[kind], key=_natural)
        names = ", ".join(blocks[:3]) + (", ..." if len(blocks) > 3 else "")
        noun = "block" if len(blocks) == 1 else "blocks"
        parts.append(f"{kind} in {len(blocks)} {noun} ({names})")
    cost = float("nan") if recompute_s is None else float(recompute_s)
    return f"  recompute   {'; '.join(parts)}; {cost * 1e3:.2f} ms per step recomputing"


def _natural(name: str) -> tuple[object, ...]:
    """``layers.10`` after ``layers.9``."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in name.split("."))


def check_plan_graph(graph: Graph, plan: Plan, remedy: str) -> None:
    """Raise ``[plan_graph_mismatch]`` when ``plan`` records the content hash of another graph
    than ``graph`` (a plan without a recorded hash, hand-written, is not checked); ``remedy``
    ends the message (how to plan this graph from where the caller stands)."""
    if plan.graph_hash and plan.graph_hash != graph.content_hash():
        raise PlanError(
            "plan_graph_mismatch",
            f"the plan was made for graph {plan.graph_name!r} (content hash {plan.graph_hash[:12]}), "
            f"not for this graph {graph.name!r} ({graph.content_hash()[:12]}); give the graph the plan "
            f"was made for, or plan this one: {remedy}",
            plan_graph_hash=plan.graph_hash,
        )
