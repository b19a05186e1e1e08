"""A OneFlow ``Job``'s ops as the importer reads them: user and system ops decoded into plain
records (:class:`_RawOp`, attrs and dtypes), and the state of one import (:class:`_Import`).
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from autopar.bridges.oneflow.convert import dtype_name
from autopar.errors import GraphError

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
