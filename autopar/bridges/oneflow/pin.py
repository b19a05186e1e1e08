"""Pinning a plan on OneFlow's job: each op matched to the plan's op, and its N-D SBP signature
pinned so OneFlow's inference cannot choose another (:func:`pin_plan`); ZeRO's layouts and the
graph's outputs laid out as the plan says.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from autopar.bridges.oneflow.apply import _flatten, _rebuild, from_flow_sbp, to_flow_sbp
from autopar.bridges.oneflow.convert import op_key_parts, op_keys
from autopar.bridges.oneflow.iteration import (
    original_name,
)
from autopar.bridges.oneflow.jobs import _require_oneflow
from autopar.errors import PlanError
from autopar.ir.plan import Plan
from autopar.ir.sbp import Broadcast, NdSbp, Split

__all__ = ["match_plan_ops", "pin_plan"]


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

    By op key (:func:`autopar.bridges.oneflow.convert.op_keys`), else, for an op whose
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
    from autopar.bridges.oneflow.importer import import_job

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
