"""Translations between OneFlow's protobuf vocabulary and autopar's.

OneFlow says *axis* for a tensor dim (``split_parallel.axis``); here that is a
*dim*, and *axis* is a mesh axis.  Everything in this module is pure Python and
works on protobuf messages by duck typing, so it is tested without OneFlow.

* ``SbpParallel`` (``split_parallel.axis`` / ``broadcast_parallel`` /
  ``partial_sum_parallel``) <-> ``S(d)`` / ``B`` / ``P``;
* ``NdSbp`` (``sbp_parallel[]``, one per mesh axis) <-> :class:`~autopar.ir.sbp.NdSbp`,
  where OneFlow's one-value form on an N-D mesh (it writes ``(B, B)`` as ``B``,
  and a 1-D placement over all devices as one value) is repeated on every axis:
  ``S(d)`` over the flattened devices is ``(S(d), S(d))`` row-major;
* OneFlow ``DataType`` names (``kFloat``) <-> autopar dtypes (``float32``);
* op names <-> *op keys*: OneFlow names user ops ``{scope}-{type}-{counter}``
  with one counter for the whole job, so inserting a layout hint renumbers
  every later op.  The key ``{scope}-{type}#{k}`` (the k-th op of that type in
  that scope, in job order) survives such insertions and matches ops of two
  builds of the same model.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from autopar.errors import GraphError, PlanError
from autopar.ir.sbp import B, NdSbp, P, SbpValue, Split, parse_nd_sbp, parse_sbp

__all__ = [
    "DTYPES",
    "dtype_name",
    "input_bns",
    "nd_sbp_from_proto",
    "nd_sbp_from_strings",
    "normalize_nd_sbp",
    "op_key_parts",
    "op_keys",
    "parallel_size",
    "parse_nd_sbp_text",
    "sbp_from_proto",
    "sbp_strings",
]

DTYPES: dict[str, str] = {
    "kChar": "int8",
    "kFloat": "float32",
    "kDouble": "float64",
    "kInt8": "int8",
    "kInt32": "int32",
    "kInt64": "int64",
    "kUInt8": "uint8",
    "kFloat16": "float16",
    "kBFloat16": "bfloat16",
    "kBool": "bool",
}
"""OneFlow ``DataType`` enum names that autopar models, and their autopar dtype."""


def dtype_name(enum_name: str, where: str = "") -> str:
    """autopar dtype of a OneFlow ``DataType`` name (``kFloat`` -> ``float32``)."""
    try:
        return DTYPES[enum_name]
    except KeyError:
        raise GraphError(
            "unknown_dtype",
            f"{where or 'a tensor'} has OneFlow dtype {enum_name}, which autopar does not model; "
            f"supported: {sorted(DTYPES)}",
        ) from None


def sbp_from_proto(msg: Any) -> SbpValue:
    """``S(d)``, ``B`` or ``P`` of a OneFlow ``SbpParallel`` message."""
    kind = msg.WhichOneof("parallel_type")
    if kind == "split_parallel":
        return Split(int(msg.split_parallel.axis))
    if kind == "broadcast_parallel":
        return B
    if kind == "partial_sum_parallel":
        return P
    raise PlanError("bad_sbp", f"OneFlow SbpParallel has no parallel type set: {msg!r}")


def normalize_nd_sbp(values: Sequence[SbpValue], ndim: int) -> NdSbp:
    """An ``ndim``-axis SBP from OneFlow's values: one value stands for itself on every axis."""
    if len(values) == ndim:
        return NdSbp(tuple(values))
    if len(values) == 1:
        return NdSbp(tuple(values) * ndim)
    raise PlanError(
        "mesh_mismatch",
        f"OneFlow N-D SBP {list(map(str, values))} has {len(values)} axes but the mesh has {ndim}; "
        "import the job with the mesh it was built on",
    )


def nd_sbp_from_proto(msg: Any, ndim: int) -> NdSbp:
    """:class:`NdSbp` of a OneFlow ``NdSbp`` message on an ``ndim``-axis mesh."""
    return normalize_nd_sbp([sbp_from_proto(v) for v in msg.sbp_parallel], ndim)


def nd_sbp_from_strings(values: Iterable[str], ndim: int) -> NdSbp:
    """:class:`NdSbp` of OneFlow's string form (``["B", "S(0)"]``, as in ``variable_conf.nd_sbp``)."""
    parsed = [parse_sbp(v) for v in values]
    if not parsed:
        return NdSbp((B,) * ndim)
    return normalize_nd_sbp(parsed, ndim)


def parse_nd_sbp_text(text: str, ndim: int) -> NdSbp:
    """Parse autopar's printed form (``(B, S(0))`` or ``B``) onto an ``ndim``-axis mesh."""
    return normalize_nd_sbp(parse_nd_sbp(text).values, ndim)


def sbp_strings(sbp: NdSbp) -> list[str]:
    """OneFlow's string form of an N-D SBP (``["B", "S(0)"]``)."""
    return [str(v) for v in sbp]


_DEVICE_RE = re.compile(r"^@?\d+:(\d+)(?:-(\d+))?$")


def parallel_size(device_names: Iterable[str]) -> int:
    """Devices named by a ``ParallelConf``'s ``device_name`` list (``"@0:0-3"`` is 4 devices)."""
    total = 0
    for name in device_names:
        m = _DEVICE_RE.match(name.strip())
        if not m:
            raise GraphError("bad_placement", f"cannot read OneFlow device name {name!r}")
        first, last = int(m.group(1)), int(m.group(2) or m.group(1))
        total += last - first + 1
    return total


_OP_NAME_RE = re.compile(r"^(?:(?P<scope>.*)-)?(?P<type>[A-Za-z0-9_]+)-(?P<counter>\d+)$")


_INTERFACE_RE = re.compile(r"^_.+_\d+_(?P<kind>input|output)\.(?P<arg>[0-9.]+)_\d+$")


def op_key_parts(name: str) -> tuple[str, str] | None:
    """``(scope, type)`` of a OneFlow user-op name ``{scope}-{type}-{counter}``, else None."""
    m = _OP_NAME_RE.match(name)
    if m is None:
        return None
    return m.group("scope") or "", m.group("type")


def op_keys(names: Iterable[str], skip: Iterable[str] = ()) -> dict[str, str]:
    """Op name -> op key, for op names in job order.

    ``model.l1-matmul-7`` becomes ``model.l1-matmul#0`` if it is the first
    ``matmul`` named in scope ``model.l1``; names without OneFlow's
    ``-{type}-{counter}`` suffix (variables, system ops) are their own key,
    except ``nn.Graph``'s input and output ops (``_TrainGraph_0_input.0.1_3``),
    which are keyed by argument (``input:0.1``) since they carry the graph's name.
    Names in ``skip`` (ops this bridge inserted) get no key and are not counted.
    """
    skipped = set(skip)
    seen: dict[tuple[str, str], int] = {}
    keys: dict[str, str] = {}
    for name in names:
        if name in skipped:
            continue
        interface = _INTERFACE_RE.match(name)
        if interface is not None:  # nn.Graph I/O ops carry the graph's name: key by argument
            keys[name] = f"{interface.group('kind')}:{interface.group('arg')}"
            continue
        parts = op_key_parts(name)
        if parts is None:
            keys[name] = name
            continue
        k = seen.get(parts, 0)
        seen[parts] = k + 1
        keys[name] = f"{parts[0]}-{parts[1]}#{k}"
    return keys


def input_bns(op: Any, lbns: Any) -> list[tuple[str, str]]:
    """``(bn, lbn)`` of every data input of an ``OperatorConf`` (OneFlow's blob names)."""
    kind = op.WhichOneof("op_type")
    if kind == "user_conf":
        return [(f"{arg}_{i}", lbn) for arg, lst in op.user_conf.input.items() for i, lbn in enumerate(lst.s)]
    conf = getattr(op, kind)
    out: list[tuple[str, str]] = []
    for fd, value in conf.ListFields():
        if fd.type != fd.TYPE_STRING:
            continue
        if fd.label == fd.LABEL_REPEATED:
            out.extend((f"{fd.name}_{i}", v) for i, v in enumerate(value) if v in lbns)
        elif value in lbns:
            out.append((fd.name, value))
    return out
