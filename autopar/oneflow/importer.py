"""Import a OneFlow training ``Job`` as an ``autopar.graph/v1`` graph.

The job is what ``nn.Graph._full_job_proto`` holds after ``build_graph``:
forward, backward (OneFlow autograd) and optimizer ops, with ZeRO's and
auto-parallel's rewrites when enabled.  The import keeps OneFlow's op names,
port names and logical blob names, so a plan maps back op by op:

* user ops: type ``user_conf.op_type_name``; ports are OneFlow's arg names with
  the index of the blob in the arg (``a_0``, ``in_0``, ``in_1``, ``out_0``),
  in ``input_order`` / ``output_order``; attrs decoded to plain JSON (shapes as
  lists, dtypes as autopar names);
* ``variable_conf`` -> type ``variable`` with outputs ``{"out": lbn}``;
  ``input_conf`` -> ``input``; ``output_conf`` / ``return_conf`` -> ``output``;
  other system confs -> their conf name without ``_conf`` (``identity``,
  ``learning_rate_schedule``, ``tick`` ...), ports named after the conf fields;
* tensors: every blob the kept ops read or write, with shape and dtype from
  ``helper.lbn2logical_blob_desc``.

What the import removes, and why (all recorded in ``graph.meta["oneflow"]``):

* optimizer *state* variables (Adam ``m``, ``v`` ...) and the optimizer ports
  that read them: the memory model counts optimizer states once per parameter
  from its :class:`~autopar.graph.Variable`;
* the optimizer's scalar side inputs (``learning_rate_0``, ``bias_correction1_0``
  ...) and the ops that only compute them (train-step counter, learning-rate
  schedule, bias-correction factors, the step ``assign``): they do not depend
  on the model or the data and are ``B`` scalars whatever the plan;
* ZeRO's ``System-ZeRO-ParallelCast-*`` ops, which pin a variable's layout for
  the forward pass: their consumers read the variable directly, so the plan
  chooses that layout; the pinned layout is kept in
  ``meta["oneflow"]["zero_layouts"]``;
* ``identity`` ops whose input is a parameter (a model reads parameters so to
  keep OneFlow from boxing a variable's own buffer): consumers read the
  parameter.

Ops with no data dependence on the model or the inputs (``arange`` and the
relative-position bucket arithmetic, masks, constants) compute the same value
whatever the plan; OneFlow computes them replicated.  The ones whose outputs a
data-dependent op reads are kept as inputless ops (same name and outputs; type
``constant`` with ``attrs["folded_type"]`` when they had inputs), the ops
feeding them are dropped (``meta["oneflow"]["dropped"]["constant_input"]``).

Roles: ops downstream of the loss-gradient seed (``train_conf.loss_grad_lbn``)
are backward; optimizer update ops (they read ``model_0`` and ``model_diff_0``)
and ops between a variable's gradient and its update (clipping) are optimizer;
the rest is forward.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from autopar.errors import GraphError
from autopar.graph import Graph, Op, Role, TensorSpec, Variable
from autopar.oneflow.convert import dtype_name, nd_sbp_from_strings, parallel_size
from autopar.oneflow.iteration import (
    ACCUMULATION_OP_TYPES,
    FAKE_FORWARD_PREFIXES,
    is_recompute_op,
    job_training,
    original_name,
)
from autopar.oneflow.jobs import load_job

__all__ = ["OPTIMIZER_MODEL_PORTS", "import_job", "job_mesh_shape"]

OPTIMIZER_MODEL_PORTS = ("model_0", "model_diff_0")
"""Ports of an optimizer update op that the import keeps (parameter and gradient)."""

_NON_USER_TYPES = {
    "variable_conf": "variable",
    "input_conf": "input",
    "output_conf": "output",
    "return_conf": "output",
}
_ZERO_CAST_PREFIX = "System-ZeRO-"
_DIFF_SCALE_PREFIX = "Sys-DiffScale-ScalarMul-"


@dataclass
class _RawOp:
    name: str
    kind: str  # the OperatorConf oneof: user_conf, variable_conf, ...
    type: str
    inputs: dict[str, str]  # port -> lbn
    outputs: dict[str, str]
    attrs: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------ decoding


def _decode_attr(value: Any) -> Any:
    """A OneFlow ``AttrValue`` as plain JSON."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    inner = getattr(value, kind)
    if kind in ("at_shape", "at_stride"):
        return [int(d) for d in inner.dim]
    if kind == "at_data_type":
        return _dtype_or_raw(value.DESCRIPTOR.fields_by_name[kind].enum_type.values_by_number[inner].name)
    if kind in ("at_list_shape", "at_list_stride"):
        return [[int(d) for d in s.dim] for s in inner.val]
    if kind == "at_list_data_type":
        enum = value.DESCRIPTOR.fields_by_name[kind].message_type.fields_by_name["val"].enum_type
        return [_dtype_or_raw(enum.values_by_number[v].name) for v in inner.val]
    if kind.startswith("at_list_"):
        return list(inner.val)
    if kind == "at_float":
        return float(inner)
    return inner


def _dtype_or_raw(enum_name: str) -> str:
    try:
        return dtype_name(enum_name)
    except GraphError:
        return enum_name


def _indexed(args: Any, order: Iterable[str]) -> dict[str, str]:
    """OneFlow ``{arg: ListString}`` -> ``{arg_i: lbn}`` in ``order`` (then any remaining args)."""
    out: dict[str, str] = {}
    names = list(order) + sorted(set(args) - set(order))
    for arg in names:
        if arg not in args:
            continue
        for i, lbn in enumerate(args[arg].s):
            out[f"{arg}_{i}"] = lbn
    return out


def _read_user_op(op: Any) -> _RawOp:
    conf = op.user_conf
    return _RawOp(
        name=op.name,
        kind="user_conf",
        type=conf.op_type_name,
        inputs=_indexed(conf.input, conf.input_order),
        outputs=_indexed(conf.output, conf.output_order),
        attrs={k: _decode_attr(v) for k, v in sorted(conf.attr.items())},
    )


def _read_system_op(op: Any, kind: str, lbns: set[str], outputs_by_op: dict[str, list[str]]) -> _RawOp:
    """A non-user op: inputs are the conf's string fields naming blobs, outputs its ``op/...`` blobs."""
    conf = getattr(op, kind)
    inputs: dict[str, str] = {}
    attrs: dict[str, Any] = {}
    for fd, value in conf.ListFields():
        if fd.type == fd.TYPE_STRING:
            values = list(value) if fd.label == fd.LABEL_REPEATED else [value]
            blobs = [v for v in values if v in lbns]
            if blobs and len(blobs) == len(values):
                if fd.label == fd.LABEL_REPEATED:
                    inputs.update({f"{fd.name}_{i}": v for i, v in enumerate(values)})
                else:
                    inputs[fd.name] = values[0]
    if kind == "variable_conf":
        attrs = {
            "shape": [int(d) for d in conf.shape.dim],
            "dtype": _dtype_or_raw(
                conf.DESCRIPTOR.fields_by_name["data_type"].enum_type.values_by_number[conf.data_type].name
            ),
            "trainable": bool(conf.trainable),
            "nd_sbp": list(conf.nd_sbp),
        }
    elif kind in ("input_conf", "output_conf", "return_conf") and conf.HasField("blob_conf"):
        attrs = {"shape": [int(d) for d in conf.blob_conf.shape.dim]}
    outputs = {lbn.split("/", 1)[1]: lbn for lbn in outputs_by_op.get(op.name, [])}
    op_type = _NON_USER_TYPES.get(kind, kind.removesuffix("_conf"))
    return _RawOp(op.name, kind, op_type, inputs, outputs, attrs)


def _strings(value: Any) -> list[str]:
    """A proto string field that is singular in some OneFlow versions and repeated in others."""
    return [value] if isinstance(value, str) else list(value)


def job_mesh_shape(job: Any) -> tuple[int, ...]:
    """The device mesh of a job: the hierarchy of the placement holding the most ops."""
    best: tuple[int, tuple[int, ...]] | None = None
    for group in job.placement.placement_group:
        conf = group.parallel_conf
        shape = tuple(int(d) for d in conf.hierarchy.dim) or (parallel_size(conf.device_name),)
        size = len(group.op_set.op_name)
        if best is None or size > best[0]:
            best = (size, shape)
    return best[1] if best else (1,)


# ------------------------------------------------------------------ the import


def _descendants(starts: Iterable[str], consumers: dict[str, list[str]]) -> set[str]:
    """Ops reachable from the ops in ``starts`` (included) along data edges."""
    seen = set(starts)
    queue = deque(seen)
    while queue:
        for nxt in consumers.get(queue.popleft(), ()):
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return seen


def import_job(
    job: Any,
    *,
    name: str | None = None,
    zero_stage: int | None = None,
    bypass_parameter_identities: bool = True,
) -> Graph:
    """Import a OneFlow ``Job`` (message, serialized bytes or ``.pb`` path) as a validated :class:`Graph`.

    ``zero_stage`` overrides the ZeRO stage recorded in ``meta`` (OneFlow's job
    only says whether ZeRO is on; it is recorded as stage 2, OneFlow's default).
    ``bypass_parameter_identities`` makes ``identity`` ops that only re-read a
    parameter transparent (the example models read parameters so on CPU).
    Raises :class:`~autopar.errors.GraphError` naming the op or blob when the job
    cannot be represented (unknown dtype, blob without a descriptor).

    Three steps: read (every op of the job, decoded), classify (drop or fold what is
    not part of the training step's data flow, give each kept op its role), convert
    (tensors, ops, variables and ``meta`` of the graph).
    """
    job = load_job(job)
    imp = _read(job)
    _strip_iteration(imp)
    _drop_zero_casts(imp)
    if bypass_parameter_identities:
        _bypass_parameter_identities(imp)
    state_candidates = _strip_optimizer_ports(imp)
    consumers_of = _drop_optimizer_state(imp, state_candidates)
    _fold_constants(imp, consumers_of)
    backward, optimizer = _roles(imp)
    tensors = _tensors(imp)
    ops = [
        Op(r.name, r.type, dict(r.inputs), dict(r.outputs), r.attrs, _role(r.name, backward, optimizer))
        for r in imp.kept
    ]
    variables = _variables(imp, tensors)
    meta = _meta(imp, job, zero_stage)
    graph = Graph(name or job.job_conf.job_name or "oneflow-job", tensors.values(), ops, variables, meta)
    graph.meta["training"] = job_training(job, graph)
    return graph.validate()


@dataclass
class _Import:
    """A job being imported: its ops as read, what is kept, and why the rest went."""

    blob_desc: Any
    """``helper.lbn2logical_blob_desc``: blob name -> its shape and dtype."""
    lbns: set[str]
    raw: list[_RawOp]
    """Every op of the job, in its order."""
    train: Any
    """The job's ``train_conf`` (None: not a training job)."""
    trainable: dict[str, str]
    """Variable op -> gradient blob, from ``train_conf``."""
    kept: list[_RawOp] = field(default_factory=list)
    by_name: dict[str, _RawOp] = field(default_factory=dict)
    producer: dict[str, str] = field(default_factory=dict)
    """Blob -> the op that makes it."""
    rename: dict[str, str] = field(default_factory=dict)
    """Blob -> the blob its consumers read instead (a dropped cast or identity's input)."""
    dropped: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    """Reason -> dropped ops."""
    dropped_ports: dict[str, list[str]] = field(default_factory=dict)
    zero_layouts: dict[str, list[str]] = field(default_factory=dict)
    """Variable -> its ZeRO cast's N-D SBP."""
    update_ops: set[str] = field(default_factory=set)
    folded: list[str] = field(default_factory=list)
    """Ops folded into inputless ``constant`` ops."""
    shape_of: dict[str, str] = field(default_factory=dict)
    """Blob -> the blob whose descriptor it takes (a graph input: its ``unpack``'s micro-batch)."""

    def read_through(self, renamed: dict[str, str]) -> None:
        """Kept ops read the blobs ``renamed`` maps to."""
        for r in self.kept:
            r.inputs = {p: renamed.get(t, t) for p, t in r.inputs.items()}


# ---------------------------------------------------------------- read


def _read(job: Any) -> _Import:
    """Every op of ``job`` decoded, who produces each blob, and what ``train_conf`` says."""
    blob_desc = job.helper.lbn2logical_blob_desc
    lbns = set(blob_desc.keys())
    outputs_by_op: dict[str, list[str]] = defaultdict(list)
    for lbn in lbns:
        outputs_by_op[lbn.split("/", 1)[0]].append(lbn)
    for lbns_of_op in outputs_by_op.values():
        lbns_of_op.sort()
    raw: list[_RawOp] = []
    for op in job.net.op:
        kind = op.WhichOneof("op_type")
        if kind == "user_conf":
            raw.append(_read_user_op(op))
        else:
            raw.append(_read_system_op(op, kind, lbns, outputs_by_op))
    train = job.job_conf.train_conf if job.job_conf.HasField("train_conf") else None
    trainable: dict[str, str] = {}  # variable op -> grad lbn from train_conf
    if train is not None:
        for opt_conf in train.optimizer_conf:
            trainable.update(zip(opt_conf.variable_op_names, opt_conf.variable_grad_lbns))
    imp = _Import(blob_desc, lbns, raw, train, trainable, kept=list(raw))
    imp.by_name = {r.name: r for r in raw}
    imp.producer = {lbn: r.name for r in raw for lbn in r.outputs.values()}
    return imp


# ---------------------------------------------------------------- classify


def _strip_iteration(imp: _Import) -> None:
    """0. The iteration: the graph is the graph of one micro-batch.

    Gradient accumulation's ops: consumers of a ``repeat`` (after a variable) or an ``acc``
    (on a gradient) read its input; a source reading a repeated tick loses that port; an
    input's ``unpack`` and an output's ``pack`` go, the input and output taking one
    micro-batch's shape; so does each accumulated gradient's ``1/K`` scaling
    (``Sys-DiffScale-ScalarMul``).  Checkpointing's recompute copies
    (:data:`autopar.oneflow.iteration.FAKE_FORWARD_PREFIXES`) and the boxing identities of
    their outputs: the backward reads the forward op's own output.  ``K`` and the
    recomputed blocks are in ``meta["training"]``
    (:func:`autopar.oneflow.iteration.job_training`)."""
    recompute: list[str] = []
    accumulation: list[str] = []
    ticks: set[str] = set()
    packed: dict[str, str] = {}
    for r in imp.kept:
        if is_recompute_op(r.name) and not original_name(r.name).startswith(_ZERO_CAST_PREFIX):
            for out in r.outputs.values():
                for prefix in FAKE_FORWARD_PREFIXES:
                    if out.startswith(prefix):
                        imp.rename[out] = out[len(prefix) :]
            recompute.append(r.name)
        elif (
            not is_recompute_op(r.name)
            and any(f in r.name for f in FAKE_FORWARD_PREFIXES)
            and len(r.inputs) == len(r.outputs) == 1
        ):
            # OneFlow's boxing identity (Sys-Boxing-GroupIdentity-...) of a recompute copy
            imp.rename[next(iter(r.outputs.values()))] = next(iter(r.inputs.values()))
            recompute.append(r.name)
        elif r.kind == "user_conf" and r.type in ACCUMULATION_OP_TYPES and len(r.inputs) == 1:
            (src,) = r.inputs.values()
            (out,) = r.outputs.values()
            if r.type == "repeat" and imp.by_name[imp.producer[src]].kind != "variable_conf":
                ticks.add(out)  # a source's repeated tick: a port the source did not have
            imp.rename[out] = src
            if r.type == "unpack":
                imp.shape_of[src] = out
            if r.type == "pack":
                packed[out] = src
            accumulation.append(r.name)
    if accumulation:  # the 1/K scaling of each accumulated gradient: none with one micro-batch
        for r in imp.kept:
            if r.name.startswith(_DIFF_SCALE_PREFIX) and r.type == "scalar_mul" and len(r.inputs) == 1:
                imp.rename[next(iter(r.outputs.values()))] = next(iter(r.inputs.values()))
                accumulation.append(r.name)
    gone = {*recompute, *accumulation}
    if not gone:
        return
    for reason, names in (("recompute", recompute), ("accumulation", accumulation)):
        if names:
            imp.dropped[reason] = names
    imp.kept = [r for r in imp.kept if r.name not in gone]
    for r in imp.kept:
        r.inputs = {p: t for p, t in r.inputs.items() if t not in ticks}
        if any(t in packed for t in r.inputs.values()) and len(r.inputs) == len(r.outputs) == 1:
            # an output of K packed values: the one micro-batch's value
            imp.shape_of[next(iter(r.outputs.values()))] = packed[next(iter(r.inputs.values()))]
    for blob in list(imp.rename):  # a boxing identity reads a copy, which reads the original
        target = imp.rename[blob]
        while target in imp.rename and imp.rename[target] != target:
            target = imp.rename[target]
        imp.rename[blob] = target
    imp.read_through(imp.rename)
    for r in imp.kept:
        if r.kind == "input_conf" and "shape" in r.attrs:
            micro = imp.shape_of.get(next(iter(r.outputs.values()), ""))
            if micro is not None:
                r.attrs["shape"] = [int(d) for d in imp.blob_desc[micro].shape.dim]


def _drop_zero_casts(imp: _Import) -> None:
    """1. ZeRO parallel casts: consumers read the variable itself."""
    for r in imp.kept:
        name = original_name(r.name)  # a recompute copy of a cast (checkpointing) is one too
        if name.startswith(_ZERO_CAST_PREFIX) and r.type in ("hierarchical_parallel_cast", "parallel_cast"):
            (src,) = r.inputs.values()
            for out in r.outputs.values():
                imp.rename[out] = src
            if name == r.name or imp.producer.get(src, src) not in imp.zero_layouts:
                imp.zero_layouts[imp.producer.get(src, src)] = list(r.attrs.get("nd_sbp") or [])
            imp.dropped["zero_cast"].append(r.name)
    imp.kept = [r for r in imp.kept if r.name not in set(imp.dropped["zero_cast"])]
    imp.read_through(imp.rename)


def _bypass_parameter_identities(imp: _Import) -> None:
    """1b. Identities that only re-read a parameter (what a model does so that OneFlow
    boxes a copy, not the variable's own buffer): consumers read the parameter."""
    variable_of = {  # blob -> the parameter it re-reads (a chain of identities included)
        lbn: lbn
        for r in imp.kept
        if r.kind == "variable_conf" and not r.name.startswith("System-")
        for lbn in r.outputs.values()
    }
    changed = True
    while changed:  # a compiled job may put a boxing identity between two (any op order)
        changed = False
        for r in imp.kept:
            if r.type in ("identity", "amp_white_identity") and len(r.inputs) == 1 and len(r.outputs) == 1:
                (src,) = r.inputs.values()
                (out,) = r.outputs.values()
                if src in variable_of and out not in variable_of:
                    variable_of[out] = imp.rename[out] = variable_of[src]
                    imp.dropped["parameter_identity"].append(r.name)
                    changed = True
    if imp.dropped["parameter_identity"]:
        gone = set(imp.dropped["parameter_identity"])
        imp.kept = [r for r in imp.kept if r.name not in gone]
        imp.read_through(imp.rename)


def _strip_optimizer_ports(imp: _Import) -> dict[str, int]:
    """2. Optimizer update ops keep only the parameter and its gradient.  Returns the
    variables that fed a dropped port (optimizer state, if nothing else reads them)."""
    imp.update_ops = {
        r.name
        for r in imp.kept
        if r.kind == "user_conf" and all(p in r.inputs for p in OPTIMIZER_MODEL_PORTS)
    }
    state_candidates: dict[str, int] = defaultdict(int)
    for upd in imp.update_ops:
        r = imp.by_name[upd]
        extra = [p for p in r.inputs if p not in OPTIMIZER_MODEL_PORTS]
        for p in extra:
            state = imp.producer.get(r.inputs[p])
            if (
                state is not None
                and imp.by_name[state].kind == "variable_conf"
                and state not in imp.trainable
            ):
                state_candidates[state] += 1
        if extra:
            imp.dropped_ports[upd] = extra
            r.inputs = {p: t for p, t in r.inputs.items() if p in OPTIMIZER_MODEL_PORTS}
    return state_candidates


def _drop_optimizer_state(imp: _Import, state_candidates: dict[str, int]) -> dict[str, list[str]]:
    """3. Optimizer state variables: read by nothing once those ports are gone.  Returns
    op -> the kept ops that read it (before dropping them)."""
    consumers_of: dict[str, list[str]] = defaultdict(list)
    for r in imp.kept:
        for t in r.inputs.values():
            maker = imp.producer.get(t)
            if maker is not None:
                consumers_of[maker].append(r.name)
    for var in state_candidates:
        if not consumers_of.get(var):
            imp.dropped["optimizer_state"].append(var)
    imp.kept = [r for r in imp.kept if r.name not in set(imp.dropped["optimizer_state"])]
    return consumers_of


def _fold_constants(imp: _Import, consumers_of: dict[str, list[str]]) -> None:
    """4. Ops with no data dependence on the model or the data: those a kept op reads
    become inputless ``constant`` ops (same name and outputs); the rest are dropped."""
    producer = imp.producer
    sources = [
        r.name
        for r in imp.kept
        if r.kind == "input_conf" or (r.kind == "variable_conf" and not r.name.startswith("System-"))
    ]
    dependent = _descendants(sources, consumers_of)
    kept_names = {r.name for r in imp.kept}
    frontier: set[str] = set()
    for r in imp.kept:
        if r.name in dependent:
            for t in r.inputs.values():
                maker = producer.get(t)
                if maker is not None and maker in kept_names and maker not in dependent:
                    frontier.add(maker)
    folded_into: set[str] = set()
    for r in imp.kept:
        if r.name in frontier and r.inputs:
            queue = deque(producer[t] for t in r.inputs.values() if t in producer)
            while queue:
                up = queue.popleft()
                if up not in folded_into:
                    folded_into.add(up)
                    queue.extend(producer[t] for t in imp.by_name[up].inputs.values() if t in producer)
            r.attrs = {"folded_type": r.type}
            r.type = "constant"
            r.inputs = {}
            imp.folded.append(r.name)
    keep = dependent | frontier
    for r in imp.kept:
        if r.name not in keep:
            imp.dropped["constant_input" if r.name in folded_into else "system"].append(r.name)
    imp.kept = [r for r in imp.kept if r.name in keep]


def _roles(imp: _Import) -> tuple[set[str], set[str]]:
    """5. Roles: the backward ops (reached from the loss gradient) and the optimizer ops
    (the updates, and everything downstream of a gradient's consumers)."""
    producer = imp.producer
    consumers_kept: dict[str, list[str]] = defaultdict(list)
    for r in imp.kept:
        for t in r.inputs.values():
            if t in producer:
                consumers_kept[producer[t]].append(r.name)
    backward: set[str] = set()
    optimizer: set[str] = set(imp.update_ops)
    if imp.train is not None:
        seeds = [producer[g] for g in _strings(imp.train.loss_grad_lbn) if g in producer]
        backward = _descendants(seeds, consumers_kept)
    grad_lbns = {r.inputs["model_diff_0"] for r in imp.kept if r.name in imp.update_ops}
    grad_lbns |= {imp.rename.get(g, g) for g in imp.trainable.values()}
    after_grads = set()
    for g in grad_lbns:
        readers = consumers_kept.get(producer.get(g, ""), ())
        for c in (c for c in readers if g in imp.by_name[c].inputs.values()):
            after_grads |= _descendants([c], consumers_kept)
    optimizer |= after_grads
    return backward, optimizer


def _role(name: str, backward: set[str], optimizer: set[str]) -> Role:
    return Role.OPTIMIZER if name in optimizer else Role.BACKWARD if name in backward else Role.FORWARD


# ---------------------------------------------------------------- convert


def _tensors(imp: _Import) -> dict[str, TensorSpec]:
    """6. Every blob a kept op reads or writes, with its logical shape and dtype."""
    tensors: dict[str, TensorSpec] = {}
    for r in imp.kept:
        for t in (*r.inputs.values(), *r.outputs.values()):
            if t in tensors:
                continue
            desc = imp.blob_desc.get(imp.shape_of.get(t, t)) if t in imp.lbns else None
            if desc is None:
                raise GraphError(
                    "unknown_blob",
                    f"op {r.name!r} uses blob {t!r}, which has no entry in helper.lbn2logical_blob_desc; "
                    "export the job after build_graph (graph._full_job_proto)",
                    op=r.name,
                    tensor=t,
                )
            enum = desc.DESCRIPTOR.fields_by_name["data_type"].enum_type.values_by_number[desc.data_type].name
            tensors[t] = TensorSpec(t, tuple(int(d) for d in desc.shape.dim), dtype_name(enum, f"blob {t!r}"))
    return tensors


def _variables(imp: _Import, tensors: dict[str, TensorSpec]) -> list[Variable]:
    """Each model variable with its gradient and update op (when the job has them)."""
    update_of_var: dict[str, str] = {}
    for upd in imp.update_ops:
        param_op = imp.producer.get(imp.by_name[upd].inputs["model_0"])
        if param_op is not None:
            update_of_var[param_op] = upd
    variables: list[Variable] = []
    for r in imp.kept:
        if r.kind != "variable_conf" or r.name.startswith("System-"):
            continue
        (tensor,) = r.outputs.values()
        update = update_of_var.get(r.name)
        if update is not None:
            grad: str | None = imp.by_name[update].inputs["model_diff_0"]
        elif r.name in imp.trainable:
            grad = imp.rename.get(imp.trainable[r.name], imp.trainable[r.name])
            grad = grad if grad in tensors else None
        else:
            grad = None
        variables.append(Variable(r.name, tensor, grad, update))
    return variables


def _meta(imp: _Import, job: Any, zero_stage: int | None) -> dict[str, Any]:
    """The graph's ``meta``: the job's mesh, ZeRO stage, and what the import dropped or folded."""
    mesh_shape = job_mesh_shape(job)
    zero_on = job.job_conf.optimizer_placement_optimization_mode == "distributed_split"
    meta: dict[str, Any] = {
        "source": "oneflow",
        "job_name": job.job_conf.job_name,
        "mesh_shape": list(mesh_shape),
        "zero_stage": zero_stage if zero_stage is not None else (2 if zero_on else 0),
        "oneflow": {
            "op_count": len(imp.raw),
            "tensor_count": len(imp.lbns),
            "dropped": {k: sorted(v) for k, v in sorted(imp.dropped.items())},
            "dropped_ports": imp.dropped_ports,
            "folded_to_constant": sorted(imp.folded),
            "zero_layouts": {
                var: str(nd_sbp_from_strings(v, len(mesh_shape)))
                for var, v in sorted(imp.zero_layouts.items())
            },
        },
    }
    if imp.train is not None:
        meta["loss"] = _strings(imp.train.loss_lbn)
    return meta
