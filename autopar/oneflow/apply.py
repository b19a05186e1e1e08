"""Apply a plan to a OneFlow module, and check what OneFlow compiled against the plan.

:func:`apply_plan` does two things:

1. **parameters**: every parameter gets its planned N-D SBP
   (``to_global(placement, sbp=[...])``; the plan's variable ops are OneFlow's
   parameter names, e.g. ``model.encoder.block.0.layer.0.SelfAttention.q.weight``
   for the parameter ``encoder.block.0.layer.0.SelfAttention.q.weight`` of a
   module held by an ``nn.Graph`` as ``self.model``);
2. **activation hints** (when ``example_inputs`` are given): OneFlow infers each
   op's SBP greedily from its inputs as the job is built.  At every module
   boundary where the SBP OneFlow inferred differs from the plan's, a
   ``to_global(sbp=...)`` hint makes it follow the plan: on the module's output
   (the producer's planned output SBP) and on its inputs (the SBP the module's
   first ops are planned to read, i.e. a planned boxing at the boundary).

   Which plan tensor a module's output is cannot be read from a lazy tensor, so
   apply_plan first builds the module's forward once in a throwaway
   ``nn.Graph`` with identity *probes* on every module input and output: a
   probe's input blob names the tensor.  The real build then compares
   ``tensor.sbp`` (OneFlow's inference so far) with the plan at the same
   boundaries and adds a hint only where they differ.  The probe build also
   runs the backward, with tensor hooks probing the gradient that arrives at
   each module output; in the real build a hook lays that gradient out as the
   plan's backward ops produce it.  Ops are matched between
   builds by op key (:func:`autopar.oneflow.convert.op_keys`), which hints and
   probes do not disturb.

:func:`check_fidelity` reads the SBP OneFlow chose for every op of the built job
and reports the share of the plan's ops whose ports all match, the share of
the plan's boxing bytes whose producer and consumer SBPs match, and every
mismatch.

OneFlow is imported inside the functions.
"""

from __future__ import annotations

import math
import re
import types
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from autopar.boxing import boxing_plan
from autopar.errors import PlanError
from autopar.graph import DTYPE_BYTES, Graph
from autopar.oneflow.convert import op_key_parts, op_keys, parse_nd_sbp_text
from autopar.oneflow.iteration import (
    checkpoint_modules,
    configure_iteration,
    original_name,
    plan_graph_recomputed,
    plan_recomputed_scopes,
    predicted_phases,
)
from autopar.oneflow.jobs import _require_oneflow, load_job
from autopar.oneflow.traffic import PHASES, JobTraffic, count_job_traffic
from autopar.plan import Plan
from autopar.sbp import B, Broadcast, NdSbp, P, SbpValue, Split

__all__ = [
    "ApplyReport",
    "CompileReport",
    "FidelityReport",
    "apply_plan",
    "check_fidelity",
    "compile_with_plan",
    "from_flow_sbp",
    "match_plan_ops",
    "pin_plan",
    "plan_input_sbps",
    "remove_hints",
    "to_flow_sbp",
]

_ORIGINAL = "_autopar_original_forward"


# ------------------------------------------------------------------ SBP <-> oneflow.sbp


def to_flow_sbp(sbp: NdSbp) -> list[Any]:
    """``(S(0), B)`` -> ``[flow.sbp.split(0), flow.sbp.broadcast]``."""
    flow = _require_oneflow()
    out = []
    for v in sbp:
        if isinstance(v, Split):
            out.append(flow.sbp.split(v.dim))
        elif isinstance(v, Broadcast):
            out.append(flow.sbp.broadcast)
        else:
            out.append(flow.sbp.partial_sum)
    return out


def from_flow_sbp(values: Sequence[Any]) -> NdSbp:
    """``(flow.sbp.split(dim=0), flow.sbp.broadcast)`` -> ``(S(0), B)``."""
    parsed: list[SbpValue] = []
    for v in values:
        text = str(v)
        if "split" in text:
            parsed.append(Split(int(text.rsplit("=", 1)[-1].rstrip(")"))))
        elif "broadcast" in text:
            parsed.append(B)
        elif "partial" in text:
            parsed.append(P)
        else:
            raise PlanError("bad_sbp", f"cannot read OneFlow SBP {text!r}")
    return NdSbp(tuple(parsed))


_INPUT_OP_RE = re.compile(r"^_.+_input\.0\.(\d+)_\d+$")


def plan_input_sbps(plan: Plan) -> list[NdSbp]:
    """The planned SBP of the graph's inputs, in argument order (lay the input tensors out so).

    ``nn.Graph`` names its input ops ``_{graph}_input.0.{i}_{n}`` for argument ``i``.
    """
    found: dict[int, NdSbp] = {}
    for name in plan.signatures:
        m = _INPUT_OP_RE.match(name)
        if m is not None:
            found[int(m.group(1))] = plan.output_sbp(name, plan.ports[name][1][0])
    return [found[i] for i in sorted(found)]


# ------------------------------------------------------------------ reports


@dataclass
class ApplyReport:
    """What :func:`apply_plan` did.  ``hints`` fills in while the real graph builds."""

    parameters: dict[str, str]
    """parameter name -> the N-D SBP it was laid out with"""
    unplanned: list[str]
    """parameters the plan has no variable for (left as they were)"""
    boundaries: int = 0
    """module inputs and outputs the probe matched to plan tensors"""
    hints: list[str] = field(default_factory=list)
    """``module: output 0 (S(0), S(1)) -> (S(0), B)`` for every hint added to a build"""
    micro_batches: int = 1
    """the plan's ``K``: pass it to :func:`autopar.oneflow.make_train_graph`"""
    recomputed: dict[str, str] = field(default_factory=dict)
    """layer scope the plan recomputes -> its module path: pass the paths to
    :func:`autopar.oneflow.make_train_graph` as ``checkpointing``"""


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
    """bytes the job moves by its own N-D SBP (:func:`autopar.oneflow.traffic.count_job_traffic`)"""
    predicted_bytes_per_phase: dict[str, dict[int, float]] = field(default_factory=dict)
    """autopar's bytes per axis by phase (:func:`autopar.oneflow.iteration.predicted_phases`),
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


# ------------------------------------------------------------------ parameters


def _variable_layouts(plan: Plan) -> dict[str, NdSbp]:
    ndim = plan.mesh.ndim
    out: dict[str, NdSbp] = {}
    for var, info in plan.variables.items():
        if isinstance(info, dict) and "sbp" in info:
            out[var] = parse_nd_sbp_text(str(info["sbp"]), ndim)
    return out


def _match_parameter(name: str, variables: dict[str, NdSbp], prefix: str | None) -> str | None:
    if prefix is not None:
        key = f"{prefix}{name}"
        return key if key in variables else None
    if name in variables:
        return name
    hits = [v for v in variables if v.endswith("." + name)]
    return hits[0] if len(hits) == 1 else None


def _layout_parameters(
    module: Any, plan: Plan, placement: Any, prefix: str | None, copy_values: bool
) -> tuple[dict[str, str], list[str]]:
    flow = _require_oneflow()
    layouts = _variable_layouts(plan)
    ndim = plan.mesh.ndim
    if tuple(placement.ranks.shape) != tuple(plan.mesh.shape):
        raise PlanError(
            "mesh_mismatch",
            f"the placement's ranks have shape {list(placement.ranks.shape)} but the plan's mesh is "
            f"{list(plan.mesh.shape)}; use flow.placement(type, ranks=<array of that shape>)",
        )
    applied: dict[str, str] = {}
    unplanned: list[str] = []
    for name, param in list(module.named_parameters()):
        var = _match_parameter(name, layouts, prefix)
        sbp = layouts[var] if var is not None else NdSbp((B,) * ndim)
        if var is None:
            unplanned.append(name)
        target = to_flow_sbp(sbp)
        with flow.no_grad():
            if copy_values:
                data = param.data
                if not data.is_global:
                    data = data.to_global(placement, [flow.sbp.broadcast] * ndim)
                new = data.to_global(placement, target)
            else:
                new = flow.empty(*param.shape, dtype=param.dtype, placement=placement, sbp=target)
        *owner_path, attr = name.split(".")
        owner = module
        for part in owner_path:
            owner = getattr(owner, part)
        if param.is_global:
            param.data = new
        else:
            setattr(owner, attr, flow.nn.Parameter(new, requires_grad=param.requires_grad))
        applied[name] = str(sbp)
    return applied, unplanned


# ------------------------------------------------------------------ activation hints


def _flatten(value: Any, is_tensor: Callable[[Any], bool]) -> list[Any]:
    if is_tensor(value):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _flatten(v, is_tensor)]
    return []


def _rebuild(value: Any, is_tensor: Callable[[Any], bool], fn: Callable[[Any], Any]) -> Any:
    if is_tensor(value):
        return fn(value)
    if isinstance(value, (tuple, list)):
        return type(value)(_rebuild(v, is_tensor, fn) for v in value)
    return value


class _Hinter:
    """State shared by the forward wrappers of one :func:`apply_plan` call."""

    def __init__(self, plan: Plan, graph_attr: str, report: ApplyReport) -> None:
        self.plan = plan
        self.graph_attr = graph_attr
        self.report = report
        self.mode = "off"
        self.job = ""
        self.calls: dict[str, int] = {}
        self.probes: dict[tuple[str, int, str, int], str] = {}  # boundary -> probe op name
        self.wanted: dict[tuple[str, int, str, int], NdSbp] = {}
        keys = op_keys(plan.signatures)
        self.plan_by_key = {k: name for name, k in keys.items()}

    # ---- bookkeeping

    def start_build(self, mode: str) -> None:
        self.mode = mode
        self.calls = {}

    def next_call(self, path: str) -> int:
        flow = _require_oneflow()
        job = flow._oneflow_internal.JobBuildAndInferCtx_GetCurrentJobName()
        if job != self.job:  # a new nn.Graph is being built: count calls afresh
            self.job = job
            self.calls = {}
        n = self.calls.get(path, 0)
        self.calls[path] = n + 1
        return n

    def scope(self, path: str) -> str:
        return f"{self.graph_attr}.{path}" if path else self.graph_attr

    # ---- probe build

    def probe(self, boundary: tuple[str, int, str, int], tensor: Any) -> None:
        flow = _require_oneflow()
        from oneflow.core.job import job_pb2

        flow._C.identity(tensor)
        job = job_pb2.Job()
        job.ParseFromString(flow._oneflow_internal.GetSerializedCurrentJob())
        self.probes[boundary] = job.net.op[-1].name

    def grad_probe(self, boundary: tuple[str, int, str, int]) -> Callable[[Any], None]:
        """A tensor hook that probes the gradient arriving at a module output."""

        def hook(grad: Any) -> None:
            self.probe(boundary, grad)

        return hook

    def grad_hint(self, boundary: tuple[str, int, str, int]) -> Callable[[Any], Any]:
        """A tensor hook that lays the gradient arriving at a module output out as planned."""

        def hook(grad: Any) -> Any:
            return self.hint(boundary, grad)

        return hook

    def finish_probe(self, job: Any) -> None:
        """Turn the probes of a built job into the planned SBP at each boundary."""
        probe_names = set(self.probes.values())
        keys = op_keys((op.name for op in job.net.op), skip=probe_names)
        probe_input: dict[str, str] = {}
        readers: dict[str, list[tuple[str, str]]] = {}
        for op in job.net.op:
            if op.WhichOneof("op_type") != "user_conf":
                continue
            for arg, lbns in op.user_conf.input.items():
                for i, lbn in enumerate(lbns.s):
                    if op.name in probe_names:
                        probe_input[op.name] = lbn
                    else:
                        readers.setdefault(lbn, []).append((op.name, f"{arg}_{i}"))
        for boundary, probe in self.probes.items():
            lbn = probe_input.get(probe)
            if lbn is None:
                continue
            path, _, kind, _ = boundary
            if kind in ("out", "grad"):
                producer, port = lbn.split("/", 1)
                plan_op = self.plan_by_key.get(keys.get(producer, ""))
                if plan_op is not None and port in self.plan.ports[plan_op][1]:
                    self.wanted[boundary] = self.plan.output_sbp(plan_op, port)
                continue
            scope = self.scope(path)
            wanted = set()
            for consumer, port in readers.get(lbn, []):
                if not (consumer.startswith(scope + ".") or consumer.startswith(scope + "-")):
                    continue
                plan_op = self.plan_by_key.get(keys.get(consumer, ""))
                if plan_op is not None and port in self.plan.ports[plan_op][0]:
                    wanted.add(self.plan.input_sbp(plan_op, port))
            if len(wanted) == 1:
                self.wanted[boundary] = wanted.pop()
        self.report.boundaries = len(self.wanted)

    # ---- real build

    def hint(self, boundary: tuple[str, int, str, int], tensor: Any) -> Any:
        wanted = self.wanted.get(boundary)
        if wanted is None or not tensor.is_global:
            return tensor
        current = from_flow_sbp(tensor.sbp)
        if current == wanted:
            return tensor
        path, call, kind, index = boundary
        what = {"out": "output", "in": "input", "grad": "gradient of output"}[kind]
        self.report.hints.append(f"{self.scope(path)}[{call}]: {what} {index} {current} -> {wanted}")
        return tensor.to_global(placement=tensor.placement, sbp=to_flow_sbp(wanted))


def _wrap(module: Any, path: str, hinter: _Hinter) -> None:
    flow = _require_oneflow()
    original = module.forward.__func__ if hasattr(module.forward, "__func__") else type(module).forward
    is_tensor = flow.is_tensor

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if hinter.mode == "off" or not flow._oneflow_internal.lazy_mode.is_enabled():
            return original(self, *args, **kwargs)
        call = hinter.next_call(path)
        tensors_in = [i for i, a in enumerate(args) if is_tensor(a)]
        if hinter.mode == "probe":
            for n, i in enumerate(tensors_in):
                hinter.probe((path, call, "in", n), args[i])
            out = original(self, *args, **kwargs)
            for n, t in enumerate(_flatten(out, is_tensor)):
                hinter.probe((path, call, "out", n), t)
                if t.requires_grad:
                    t.register_hook(hinter.grad_probe((path, call, "grad", n)))
            return out
        new_args = list(args)
        for n, i in enumerate(tensors_in):
            new_args[i] = hinter.hint((path, call, "in", n), args[i])
        out = original(self, *new_args, **kwargs)
        counter = iter(range(1 << 30))

        def hint_output(t: Any) -> Any:
            n = next(counter)
            t = hinter.hint((path, call, "out", n), t)
            if t.requires_grad and (path, call, "grad", n) in hinter.wanted:
                t.register_hook(hinter.grad_hint((path, call, "grad", n)))
            return t

        return _rebuild(out, is_tensor, hint_output)

    setattr(module, _ORIGINAL, original)
    module.forward = types.MethodType(forward, module)


def remove_hints(module: Any) -> None:
    """Undo the forward wrappers :func:`apply_plan` installed (parameter layouts stay)."""
    for _, sub in module.named_modules():
        if hasattr(sub, _ORIGINAL):
            del sub.forward
            delattr(sub, _ORIGINAL)


def apply_plan(
    module: Any,
    plan: Plan | dict[str, Any],
    placement: Any,
    *,
    example_inputs: Sequence[Any] | None = None,
    graph_attr: str = "model",
    prefix: str | None = None,
    copy_values: bool = True,
    backward_hints: bool = True,
    recompute: Collection[str] | None = None,
) -> ApplyReport:
    """Lay out ``module``'s parameters as ``plan`` says and install activation hints.

    ``placement`` is the ``flow.placement`` of the plan's mesh (its hierarchy
    must have the mesh's number of axes).  ``example_inputs`` (global tensors
    on that placement) enable activation hints: the module's forward is built
    once to find which plan tensor crosses each module boundary.
    ``graph_attr`` is the attribute the training ``nn.Graph`` holds the module
    as (``make_train_graph`` uses ``model``): OneFlow prefixes op and variable
    names with it.  ``prefix`` overrides how parameter names map to the plan's
    variable ops (default: the unique variable whose name ends with the
    parameter's).  ``copy_values=False`` allocates the laid-out parameters
    without copying values (enough to build and export a job).
    ``backward_hints`` (for modules whose forward returns the loss) also lays
    out, with tensor hooks, the gradient arriving at each module output as the
    plan's backward ops produce it.

    The iteration: the report carries the plan's ``K`` and the modules of the layer scopes
    it recomputes (``recompute`` overrides the plan's; a scope with no module is a
    :class:`PlanError` ``checkpoint_scope_unmatched``, raised before anything changes):
    ``make_train_graph(module, optimizer, micro_batches=report.micro_batches,
    checkpointing=report.recomputed.values())`` runs that iteration.

    Call it before creating the optimizer.  Returns an :class:`ApplyReport`;
    its ``hints`` list fills in while the training graph builds.
    """
    flow = _require_oneflow()
    if isinstance(plan, dict):
        plan = Plan.from_dict(plan)
    scopes = plan_recomputed_scopes(plan, module, graph_attr, recompute)
    recomputed = checkpoint_modules(module, scopes, graph_attr)
    applied, unplanned = _layout_parameters(module, plan, placement, prefix, copy_values)
    report = ApplyReport(applied, unplanned, micro_batches=plan.training.micro_batches, recomputed=recomputed)
    if example_inputs is None:
        return report
    hinter = _Hinter(plan, graph_attr, report)
    remove_hints(module)  # a module applied twice follows the latest plan
    for path, sub in module.named_modules():
        _wrap(sub, path, hinter)

    trainable = [p for p in module.parameters() if p.requires_grad]

    class Probe(flow.nn.Graph):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            setattr(self, graph_attr, module)
            if trainable and backward_hints:
                self.add_optimizer(flow.optim.SGD(trainable, lr=0.0))

        def build(self, *inputs: Any) -> Any:
            out = getattr(self, graph_attr)(*inputs)
            if trainable and backward_hints:
                out.backward()
            return out

    hinter.start_build("probe")
    probe = Probe()
    probe.build_graph(*example_inputs)
    _clear_lazy_grads(probe)  # the probe's backward left lazy gradients on the leaves
    hinter.finish_probe(probe._full_job_proto)
    hinter.start_build("hint")
    return report


# ------------------------------------------------------------------ matching plan ops to job ops


_VARIANT_TYPES: dict[str, tuple[str, ...]] = {
    # flow._C.sparse_softmax_cross_entropy builds the model-split variant (``_ms``) when the
    # logits are split over the classes as the job is built, else the plain op: a plan solved
    # on one job names the gradient op of the other type when the pinned build chose differently
    # (the plan's parameter or input layouts change the logits' layout at build time)
    "sparse_softmax_cross_entropy_grad": ("sparse_softmax_cross_entropy_ms_grad",),
    "sparse_softmax_cross_entropy_ms_grad": ("sparse_softmax_cross_entropy_grad",),
}
"""op type in the job -> the types OneFlow builds in its place from the same call (same ports)"""


def match_plan_ops(job_op_names: Sequence[str], plan: Plan) -> dict[str, str]:
    """Job op name -> plan op name, for the job ops (in job order) that have a plan op.

    By op key (:func:`autopar.oneflow.convert.op_keys`), else, for an op whose
    type OneFlow chooses as the job is built (:data:`_VARIANT_TYPES`), by the
    key the same op has under the other type, when no job op has that key.
    """
    job_keys = op_keys(job_op_names)
    plan_by_key = {k: n for n, k in op_keys(plan.signatures).items()}
    out: dict[str, str] = {}
    claimed: set[str] = set()
    pending: list[str] = []
    for name in job_op_names:
        plan_op = plan_by_key.get(job_keys[name])
        if plan_op is None:
            pending.append(name)
            continue
        out[name] = plan_op
        claimed.add(plan_op)
    for name in pending:
        parts = op_key_parts(name)
        if parts is None or parts[1] not in _VARIANT_TYPES:
            continue
        scope, kind = parts
        index = job_keys[name].rsplit("#", 1)[1]
        for other in _VARIANT_TYPES[kind]:
            plan_op = plan_by_key.get(f"{scope}-{other}#{index}")
            if plan_op is not None and plan_op not in claimed:
                out[name] = plan_op
                claimed.add(plan_op)
                break
    return out


def _plain_cross_entropy_layouts(imported: Any, plan: Plan, matched: dict[str, str]) -> dict[str, NdSbp]:
    """Layouts for the plain ``sparse_softmax_cross_entropy`` ops of a job whose plan has the ``_ms`` variant.

    OneFlow splits the ``_ms`` op into a softmax of ten ops
    (``SplitSparseSoftmaxCrossEntropyOpPass``), which the plain op replaces
    as a whole; what the plan fixes for it is the layout its gradient reads
    ``prob`` in.  The plain op splits the batch or replicates on each mesh
    axis, all ports alike, so every port gets that layout (when it has no split
    over the classes).  Returns job op name -> layout.
    """
    grads = {
        op.inputs.get("prob_0"): name
        for op in imported.ops
        if op.type == "sparse_softmax_cross_entropy_grad" and (name := matched.get(op.name)) is not None
    }
    out: dict[str, NdSbp] = {}
    for op in imported.ops:
        if op.type != "sparse_softmax_cross_entropy" or op.name in matched:
            continue
        grad = grads.get(op.outputs.get("prob_0"))
        if grad is None or "prob_0" not in plan.ports[grad][0]:
            continue
        layout = plan.input_sbp(grad, "prob_0")
        if all(isinstance(v, Broadcast) or v == Split(0) for v in layout):
            out[op.name] = layout
    return out


# ------------------------------------------------------------------ pinning


def _nd_sbp_message(sbp: NdSbp) -> Any:
    from oneflow.core.job import sbp_parallel_pb2

    msg = sbp_parallel_pb2.NdSbp()
    for v in sbp:
        part = msg.sbp_parallel.add()
        if isinstance(v, Split):
            part.split_parallel.axis = v.dim
        elif isinstance(v, Broadcast):
            part.broadcast_parallel.SetInParent()
        else:
            part.partial_sum_parallel.SetInParent()
    return msg


def pin_plan(
    graph: Any,
    plan: Plan | dict[str, Any],
    *,
    skip_types: Sequence[str] = ("constant",),
    skip_partial_types: Sequence[str] = (),
) -> int:
    """Write the plan's N-D SBP of every op into a built, not yet compiled ``nn.Graph``'s job.

    OneFlow compiles the job with the signatures it records
    (``job_parallel_view_conf``) and inserts the boxing between producers and
    consumers that disagree, so a pinned job follows the plan op by op, not only
    at module boundaries.  Ops are matched by op key, or as the op OneFlow
    built in the plan op's place (:func:`match_plan_ops`; a plain
    ``sparse_softmax_cross_entropy`` where the plan has the ``_ms`` variant's
    softmax gets the layout the plan's gradient reads ``prob`` in); ports the plan does not
    have (an optimizer's learning rate ...) and ops of ``skip_types`` (folded
    constants, whose inputs the plan does not see), and ops of
    ``skip_partial_types`` whose planned signature has a ``P``, keep OneFlow's
    choice.  So does every variable such an op reads directly (an update
    changes its variable in place: OneFlow takes no boxing between the two, so
    pinning one and not the other would leave the op no signature), and its ZeRO
    storage (:func:`_pin_zero_layouts`).
    Returns the number of ops pinned.  Call after ``build_graph`` and
    :func:`apply_plan`, before ``finish_complie_and_init_runtime``.
    """
    from autopar.oneflow.importer import import_job

    if isinstance(plan, dict):
        plan = Plan.from_dict(plan)
    job = graph._full_job_proto
    if job is None:
        raise PlanError("not_built", "build the graph (graph.build_graph(*inputs)) before pinning a plan")
    imported = import_job(job, zero_stage=plan.zero_stage)
    matched = match_plan_ops([op.name for op in imported.ops], plan)
    conf = job.job_parallel_view_conf.op_name2nd_sbp_signature_conf
    pinned = 0
    for op_name, layout in _plain_cross_entropy_layouts(imported, plan, matched).items():
        if op_name in conf and "sparse_softmax_cross_entropy" not in skip_types:
            for port in conf[op_name].bn_in_op2nd_sbp:
                conf[op_name].bn_in_op2nd_sbp[port].CopyFrom(_nd_sbp_message(layout))
            pinned += 1
    kept = _unpinned_ops(imported, plan, matched, skip_types, skip_partial_types)
    ops = {op.name: op for op in job.net.op}
    for op in imported.ops:
        name = matched.get(op.name)
        if name is None or op.name in kept or op.name not in conf:
            continue
        ins, outs = plan.ports[name]
        if set(ins) != set(op.inputs) or set(outs) != set(op.outputs):
            continue  # the ops differ in structure (e.g. an add_n of other arity): not the same op
        sig = plan.signatures[name]
        by_port = conf[op.name].bn_in_op2nd_sbp
        for ports, sbps in ((ins, sig.inputs), (outs, sig.outputs)):
            for port, sbp in zip(ports, sbps):
                if port in by_port:
                    by_port[port].CopyFrom(_nd_sbp_message(sbp))
        if op.type == "variable" and sig.outputs:
            # a variable's conf carries its layout too: keep the two in agreement
            var_conf = ops[op.name].variable_conf
            var_conf.ClearField("nd_sbp")
            var_conf.nd_sbp.extend(str(x) for x in sig.outputs[0])
        pinned += 1
    if plan.zero_stage > 0 and job.job_conf.optimizer_placement_optimization_mode == "distributed_split":
        plan_by_key = {k: n for n, k in op_keys(plan.signatures).items()}
        job_keys = op_keys(op.name for op in imported.ops)
        _pin_zero_layouts(job, imported, plan, plan_by_key, job_keys, skip=kept)
    graph._full_graph_proto = job
    return pinned


def _unpinned_ops(
    imported: Any,
    plan: Plan,
    matched: dict[str, str],
    skip_types: Sequence[str],
    skip_partial_types: Sequence[str],
) -> set[str]:
    """Job ops :func:`pin_plan` leaves to OneFlow: those of ``skip_types``, those of
    ``skip_partial_types`` planned with a ``P``, and every variable one of them reads
    directly (its ``model`` port: the two must agree, see :func:`pin_plan`)."""
    kept: set[str] = set()
    for op in imported.ops:
        name = matched.get(op.name)
        if op.type in skip_types:
            kept.add(op.name)
        elif name is not None and op.type in skip_partial_types:
            sig = plan.signatures[name]
            if any(s.has_partial for s in (*sig.inputs, *sig.outputs)):
                kept.add(op.name)
    for op in imported.ops:
        if op.name not in kept or op.type == "variable":
            continue
        for tensor in op.inputs.values():
            producer = imported.producer.get(tensor)
            if producer is not None and imported.op_by_name[producer[0]].type == "variable":
                kept.add(producer[0])
    return kept


def _pin_zero_layouts(
    job: Any,
    imported: Any,
    plan: Plan,
    plan_by_key: dict[str, str],
    job_keys: dict[str, str],
    skip: Collection[str] = (),
) -> None:
    """Keep OneFlow's ZeRO storage consistent with the plan's layouts.

    The plan gives a variable the layout its forward consumers read (``v``) and
    its update the gradient layout (``g``, the runtime's ZeRO shard).  In
    OneFlow's job ZeRO stores the variable as ``g``
    (``optimizer_placement_optimization_pass.cpp``: ``variable_conf.nd_sbp``),
    its ``adam_update`` reads ``model`` and ``model_diff`` (and the states) in
    ``g``, and a ``System-ZeRO-ParallelCast`` (``hierarchical_parallel_cast``,
    attribute ``nd_sbp``) turns it into ``v`` for the forward.  Pinning ``v``
    on the variable would store it unsharded and give the update two layouts;
    this writes ``g`` on the variable, its states and its update's ``model``,
    and ``v`` on the cast's ports and attribute.  Variables in ``skip`` (left to
    OneFlow, with their updates) keep OneFlow's storage.
    """
    conf = job.job_parallel_view_conf.op_name2nd_sbp_signature_conf
    ops = {op.name: op for op in job.net.op}
    casts: dict[str, list[Any]] = {}
    for op in job.net.op:
        cast_name = original_name(op.name)  # a recomputed block has a copy of its casts
        if cast_name.startswith("System-ZeRO-ParallelCast-") and op.WhichOneof("op_type") == "user_conf":
            (lbn,) = op.user_conf.input["in"].s
            casts.setdefault(lbn.split("/", 1)[0], []).append(op)
    # a cast after the identity a model reads its parameter through, and after the repeat
    # gradient accumulation puts after the variable (variable -> repeat -> identity -> cast)
    for _ in range(3):
        for op in job.net.op:
            if op.name in casts and op.WhichOneof("op_type") == "user_conf" and op.user_conf.input:
                (lbns,) = op.user_conf.input.values()
                found = casts.setdefault(lbns.s[0].split("/", 1)[0], [])
                found.extend(c for c in casts[op.name] if c not in found)
    for v in imported.variables:
        update_name = plan_by_key.get(job_keys.get(v.optimizer or "", ""))
        var_name = plan_by_key.get(job_keys.get(v.op, ""))
        if update_name is None or var_name is None or v.optimizer not in conf or v.op not in conf:
            continue
        if v.op in skip or v.optimizer in skip:
            continue
        ins, _ = plan.ports[update_name]
        sig = plan.signatures[update_name]
        if "model_0" not in ins or "model_diff_0" not in ins:
            continue
        layout = sig.inputs[ins.index("model_0")]
        stored = sig.inputs[ins.index("model_diff_0")]
        if layout == stored:
            continue
        var_op = ops[v.op]
        var_op.variable_conf.ClearField("nd_sbp")
        var_op.variable_conf.nd_sbp.extend(str(x) for x in stored)
        conf[v.op].bn_in_op2nd_sbp["out"].CopyFrom(_nd_sbp_message(stored))
        update = conf[v.optimizer].bn_in_op2nd_sbp
        for port in ("model_0", "model_copy_0"):
            if port in update:
                update[port].CopyFrom(_nd_sbp_message(stored))
        for cast in casts.get(v.op, []):
            attr = cast.user_conf.attr["nd_sbp"].at_list_string.val
            del attr[:]
            attr.extend(str(x) for x in layout)
            if cast.name in conf:
                for port in ("in_0", "out_0"):
                    if port in conf[cast.name].bn_in_op2nd_sbp:
                        conf[cast.name].bn_in_op2nd_sbp[port].CopyFrom(_nd_sbp_message(layout))


def _planned_output_layouts(plan: Plan) -> list[NdSbp]:
    """The layouts the plan's ``nn.Graph`` output ops take, in argument order (``output:0.0`` ...)."""
    outputs = [
        (tuple(int(i) for i in key.split(":", 1)[1].split(".") if i), name)
        for name, key in op_keys(plan.signatures).items()
        if key.startswith("output:") and plan.signatures[name].inputs
    ]
    return [plan.signatures[name].inputs[0] for _, name in sorted(outputs)]


def _lay_out_graph_outputs(graph: Any, plan: Plan) -> None:
    """Make an unbuilt ``nn.Graph`` return its tensors in the layouts the plan's output ops take.

    A pin cannot move an ``nn.Graph`` output: OneFlow 0.9 gives the output op the N-D
    SBP the returned tensor had as the job was built (``FetchOutputOpExpr`` in
    ``lazy_op_interpreter.cpp`` writes it into ``output_conf.blob_conf.nd_sbp``, and
    ``OutputOp::InferNdSbpSignature`` in ``output_op.cpp`` reads only that, not
    ``job_parallel_view_conf``), and ``nn.Graph`` allocates the eager output buffers in
    that layout (``graph.py``, ``build_real_output``).  The build infers it from the
    plan's parameter and input layouts, not from the pins (a plan that reads its inputs
    ``B`` and splits the batch inside returns its loss ``(B, B)`` where the plan leaves
    it ``(P, P)``).  So the graph's ``build`` gets a ``to_global`` on each returned
    tensor whose build-time layout differs from the plan's (a ``hierarchical_parallel_cast``
    after the backward, none where they agree; ``prune_parallel_cast_op_pass.cpp`` drops
    it again when the pinned producer already has that layout, so the output op reads the
    producer as planned), as :func:`apply_plan`'s hints do at module boundaries.  Left
    as built when the number of returned tensors is not the number of the plan's output
    ops.
    """
    wanted = _planned_output_layouts(plan)
    if not wanted:
        return
    flow = _require_oneflow()
    build = graph.build

    def build_laid_out(*args: Any, **kwargs: Any) -> Any:
        out = build(*args, **kwargs)
        if len(_flatten(out, flow.is_tensor)) != len(wanted):
            return out
        layouts = iter(wanted)

        def lay_out(t: Any) -> Any:
            sbp = next(layouts)
            if not t.is_global or from_flow_sbp(t.sbp) == sbp:
                return t
            return t.to_global(placement=t.placement, sbp=to_flow_sbp(sbp))

        return _rebuild(out, flow.is_tensor, lay_out)

    graph.build = build_laid_out


def _clear_lazy_grads(graph: Any) -> None:
    """Drop the lazy gradients a graph build left on its modules' parameters (before rebuilding)."""
    flow = _require_oneflow()
    for block in graph._blocks.values():
        module = block.to(flow.nn.Module)
        if isinstance(module, flow.nn.Module):
            for param in module.parameters():
                param.grad = None


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
    holds as ``graph_attr`` (:func:`autopar.oneflow.iteration.checkpoint_modules`: a scope
    with no module is a :class:`PlanError` ``checkpoint_scope_unmatched``).  ``inputs``
    then hold ``K`` micro-batches each.
    """
    from autopar.oneflow.importer import import_job

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
    from :mod:`autopar.boxing`, the tensor's size where no boxing plan exists.
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
    consumer input SBP), ring bytes per device from :mod:`autopar.boxing`; a
    planned boxing matches when both ends compiled as planned.

    Bytes: ``counted`` is what the job moves by its own N-D SBP on every edge
    (:func:`autopar.oneflow.traffic.count_job_traffic`: ZeRO casts, optimizer
    inputs and ops the import drops included, each hop priced as OneFlow 0.9
    lowers it), next to the plan's ``predicted.comm_bytes_per_axis``.

    The iteration (``plan_graph``: the graph the plan was solved on): the counted bytes by
    phase (``per_micro_batch``, ``recompute``, ``once_per_step``: when the job runs each hop,
    read from its ``repeat`` / ``acc`` ops and recompute copies) next to autopar's
    (:func:`autopar.oneflow.iteration.predicted_phases` at the job's ``K``, recomputing
    ``recompute`` scopes or the plan's, :func:`~autopar.oneflow.iteration.plan_graph_recomputed`).
    """
    from autopar.oneflow.importer import import_job
    from autopar.oneflow.plans import import_plan

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
