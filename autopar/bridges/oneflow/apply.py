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
   builds by op key (:func:`autopar.bridges.oneflow.convert.op_keys`), which hints and
   probes do not disturb.

:func:`check_fidelity` reads the SBP OneFlow chose for every op of the built job
and reports the share of the plan's ops whose ports all match, the share of
the plan's boxing bytes whose producer and consumer SBPs match, and every
mismatch.

OneFlow is imported inside the functions.
"""

from __future__ import annotations

import re
import types
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from autopar.bridges.oneflow.convert import op_keys, parse_nd_sbp_text
from autopar.bridges.oneflow.iteration import (
    checkpoint_modules,
    plan_recomputed_scopes,
)
from autopar.bridges.oneflow.jobs import _require_oneflow
from autopar.errors import PlanError
from autopar.ir.plan import Plan
from autopar.ir.sbp import B, Broadcast, NdSbp, P, SbpValue, Split

__all__ = ["ApplyReport", "apply_plan", "from_flow_sbp", "plan_input_sbps", "remove_hints", "to_flow_sbp"]

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
    """the plan's ``K``: pass it to :func:`autopar.bridges.oneflow.make_train_graph`"""
    recomputed: dict[str, str] = field(default_factory=dict)
    """layer scope the plan recomputes -> its module path: pass the paths to
    :func:`autopar.bridges.oneflow.make_train_graph` as ``checkpointing``"""


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


def _clear_lazy_grads(graph: Any) -> None:
    """Drop the lazy gradients a graph build left on its modules' parameters (before rebuilding)."""
    flow = _require_oneflow()
    for block in graph._blocks.values():
        module = block.to(flow.nn.Module)
        if isinstance(module, flow.nn.Module):
            for param in module.parameters():
                param.grad = None
