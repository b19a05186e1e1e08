"""Graph IR of one training step, and its wire format ``autopar.graph/v1``.

A :class:`Graph` holds

* tensors: name -> :class:`TensorSpec` (logical shape, dtype);
* ops: :class:`Op` with a type (OneFlow user-op names: ``matmul``,
  ``broadcast_add`` ...), attrs, a role (forward / backward / optimizer) and
  ordered ports mapping port names (OneFlow's ``a_0``, ``out_0`` ...) to tensors;
* variables: :class:`Variable` linking a parameter's ``variable`` op and tensor
  to its gradient tensor and the optimizer op that updates it.

Each tensor has exactly one producer.  Port names are kept as given so a plan
maps back to the framework.  See ``docs/graph-format.md`` for the JSON format.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from typing import Any

from pydantic import ValidationError

from autopar.errors import GraphError
from autopar.infra.collector import collector_paused
from autopar.ir.content_key import canonical_numbers
from autopar.ir.wire import DTYPES, GRAPH_DOCUMENT, GraphModel, error_path

__all__ = ["DTYPE_BYTES", "FORMAT", "Graph", "Op", "Role", "TensorSpec", "Variable", "register_validator"]

FORMAT = "autopar.graph/v1"

DTYPE_BYTES: dict[str, int] = {  # keys: autopar.ir.wire.DTYPES
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "float64": 8,
    "int8": 1,
    "uint8": 1,
    "int32": 4,
    "int64": 8,
    "bool": 1,
}


class Role(str, Enum):
    """Where an op sits in the training step."""

    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"


_ROLES: dict[str, Role] = {role.value: role for role in Role}


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """A logical tensor: name, shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]

    @property
    def ndim(self) -> int:
        return len(self.shape)


@dataclass(slots=True)
class Op:
    """One op: ``inputs`` / ``outputs`` map port name -> tensor name, in port order."""

    name: str
    type: str
    inputs: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)
    role: Role = Role.FORWARD

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "name": self.name,
            "type": self.type,
            "role": self.role.value,
            "inputs": dict(self.inputs),
            "outputs": dict(self.outputs),
        }
        if self.attrs:
            d["attrs"] = self.attrs
        return d


@dataclass(frozen=True, slots=True)
class Variable:
    """A trainable (or frozen) parameter.

    ``op`` is the ``variable`` op producing ``tensor``; ``grad`` is the gradient
    tensor the optimizer consumes (None when frozen); ``optimizer`` the op that
    updates it (None when frozen).
    """

    op: str
    tensor: str
    grad: str | None = None
    optimizer: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "tensor": self.tensor, "grad": self.grad, "optimizer": self.optimizer}


def _not_finite(value: Any) -> bool:
    """Whether an attr value holds a float that is not finite (NaN, an infinity), at any depth."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        value = value.values()
    elif not isinstance(value, list | tuple):
        return False
    return any(_not_finite(v) for v in value)


def _check_finite_attrs(op: Op) -> None:
    """``non_finite_number`` naming the attr of ``op`` that holds NaN or an infinity."""
    for name, value in op.attrs.items():
        if _not_finite(value):
            raise GraphError(
                "non_finite_number",
                f"op {op.name!r} attr {name!r} holds a number that is not finite; send finite numbers",
                op=op.name,
            )


class Graph:
    """A training-step graph.  Build it, then call :meth:`validate`."""

    def __init__(
        self,
        name: str,
        tensors: Iterable[TensorSpec],
        ops: Iterable[Op],
        variables: Iterable[Variable] = (),
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.tensors: dict[str, TensorSpec] = {}
        for t in tensors:
            if t.name in self.tensors:
                raise GraphError("duplicate_tensor", f"tensor {t.name!r} is declared twice", tensor=t.name)
            self.tensors[t.name] = t
        self.ops: list[Op] = list(ops)
        self.variables: list[Variable] = list(variables)
        self.meta: dict[str, Any] = dict(meta or {})
        self.rules_checked = False
        """Set by :func:`autopar.rules.check.check_graph_rules` once every op's rule read the graph."""

    # ------------------------------------------------------------ lookups

    @cached_property
    def op_by_name(self) -> dict[str, Op]:
        table: dict[str, Op] = {}
        for op in self.ops:
            if op.name in table:
                raise GraphError("duplicate_op", f"op {op.name!r} appears twice", op=op.name)
            table[op.name] = op
        return table

    @cached_property
    def producer(self) -> dict[str, tuple[str, str]]:
        """tensor name -> (op name, output port)."""
        table: dict[str, tuple[str, str]] = {}
        for op in self.ops:
            for port, tensor in op.outputs.items():
                if tensor in table:
                    raise GraphError(
                        "two_producers",
                        f"tensor {tensor!r} is produced by both {table[tensor][0]!r} and {op.name!r}",
                        op=op.name,
                        tensor=tensor,
                    )
                table[tensor] = (op.name, port)
        return table

    @cached_property
    def consumers(self) -> dict[str, list[tuple[str, str]]]:
        """tensor name -> [(op name, input port)]."""
        table: dict[str, list[tuple[str, str]]] = {t: [] for t in self.tensors}
        for op in self.ops:
            for port, tensor in op.inputs.items():
                table.setdefault(tensor, []).append((op.name, port))
        return table

    @cached_property
    def variable_by_op(self) -> dict[str, Variable]:
        return {v.op: v for v in self.variables}

    def tensor(self, name: str) -> TensorSpec:
        try:
            return self.tensors[name]
        except KeyError:
            raise GraphError("unknown_tensor", f"tensor {name!r} is not declared", tensor=name) from None

    def input_specs(self, op: Op) -> list[TensorSpec]:
        return [self.tensors[t] for t in op.inputs.values()]

    def output_specs(self, op: Op) -> list[TensorSpec]:
        return [self.tensors[t] for t in op.outputs.values()]

    # ------------------------------------------------------------ order

    @cached_property
    def topological_order(self) -> list[Op]:
        """Ops in a topological order that keeps the given order where it can (Kahn)."""
        ops = self.ops
        made_by = {tensor: i for i, op in enumerate(ops) for tensor in op.outputs.values()}
        indegree = [0] * len(ops)
        successors: list[list[int]] = [[] for _ in ops]
        for i, op in enumerate(ops):
            for p in {made_by[t] for t in op.inputs.values() if t in made_by}:
                successors[p].append(i)
                indegree[i] += 1
        ready = [i for i, d in enumerate(indegree) if d == 0]  # ascending: already a heap
        order: list[Op] = []
        pop, push = heapq.heappop, heapq.heappush
        while ready:
            i = pop(ready)
            order.append(ops[i])
            for s in successors[i]:
                indegree[s] -= 1
                if indegree[s] == 0:
                    push(ready, s)
        if len(order) != len(ops):
            stuck = [i for i, d in enumerate(indegree) if d > 0]
            raise GraphError(
                "cycle",
                f"the graph has a cycle through op {ops[stuck[0]].name!r} ({len(stuck)} ops involved)",
                op=ops[stuck[0]].name,
            )
        return order

    # ------------------------------------------------------------ validation

    def validate(self) -> Graph:
        """Check the graph and return it; raise :class:`GraphError` naming the culprit."""
        with collector_paused():
            return self._validate()

    def _validate(self) -> Graph:
        for t in self.tensors.values():
            if t.dtype not in DTYPE_BYTES:
                raise GraphError(
                    "unknown_dtype",
                    f"tensor {t.name!r} has unknown dtype {t.dtype!r}; use one of {sorted(DTYPE_BYTES)}",
                    tensor=t.name,
                )
            for d in t.shape:
                if not isinstance(d, int) or d < 0:
                    raise GraphError(
                        "bad_shape", f"tensor {t.name!r} has invalid shape {list(t.shape)}", tensor=t.name
                    )
        tensors = self.tensors
        ops = self.op_by_name
        producer = self.producer
        for op in self.ops:
            if not op.name or not op.type:
                raise GraphError("bad_op", f"op {op.name!r} needs a name and a type", op=op.name)
            _check_finite_attrs(op)
            for port, tensor in op.inputs.items():
                if tensor not in producer:  # every produced tensor is an op's output, checked below
                    raise GraphError(
                        "dangling_tensor",
                        f"op {op.name!r} port {port!r} names tensor {tensor!r}, which is not declared"
                        if tensor not in tensors
                        else f"op {op.name!r} port {port!r} reads tensor {tensor!r}, which no op produces",
                        op=op.name,
                        tensor=tensor,
                    )
            for port, tensor in op.outputs.items():
                if tensor not in tensors:
                    raise GraphError(
                        "dangling_tensor",
                        f"op {op.name!r} port {port!r} names tensor {tensor!r}, which is not declared",
                        op=op.name,
                        tensor=tensor,
                    )
        for tname in self.tensors:
            if tname not in producer:
                raise GraphError(
                    "dangling_tensor", f"tensor {tname!r} is declared but no op produces it", tensor=tname
                )
        for v in self.variables:
            vop = ops.get(v.op)
            if vop is None or v.tensor not in vop.outputs.values():
                raise GraphError(
                    "bad_variable", f"variable {v.op!r} must name an op that produces {v.tensor!r}", op=v.op
                )
            if v.grad is not None:
                g = self.tensors.get(v.grad)
                if g is None:
                    raise GraphError(
                        "bad_variable", f"variable {v.op!r} names unknown gradient {v.grad!r}", op=v.op
                    )
                if g.shape != self.tensors[v.tensor].shape:
                    raise GraphError(
                        "shape_mismatch",
                        f"variable {v.op!r}: gradient {v.grad!r} has shape {list(g.shape)} but the "
                        f"parameter has {list(self.tensors[v.tensor].shape)}",
                        op=v.op,
                    )
            if v.optimizer is not None and v.optimizer not in ops:
                raise GraphError(
                    "bad_variable", f"variable {v.op!r} names unknown optimizer op {v.optimizer!r}", op=v.op
                )
        _ = self.topological_order
        _check_variables_once(self.variables)
        _check_dim_attrs(self)
        for check in _VALIDATORS:
            check(self)
        return self

    # ------------------------------------------------------------ wire format

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "name": self.name,
            "meta": self.meta,
            "tensors": {t.name: {"shape": list(t.shape), "dtype": t.dtype} for t in self.tensors.values()},
            "ops": [op.to_dict() for op in self.ops],
            "variables": [v.to_dict() for v in self.variables],
        }

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, separators=None if indent else (",", ":"))

    @classmethod
    def from_dict(cls, data: Any) -> Graph:
        """The graph of a decoded ``autopar.graph/v1`` document (checked by :data:`GRAPH_DOCUMENT`).

        Raises :class:`GraphError` naming the field: ``bad_format`` (wrong type, missing
        or unknown field, over a limit of :mod:`autopar.ir.wire`), ``bad_shape``,
        ``unknown_dtype``, ``bad_role``.  Call :meth:`validate` for the whole-graph checks.
        """
        if not isinstance(data, dict):
            raise GraphError("bad_format", "a graph must be a JSON object")
        if data.get("format") != FORMAT:
            raise GraphError("bad_format", _format_message(data))
        try:
            with collector_paused():
                model = GRAPH_DOCUMENT.validate_python(data)
                return cls.from_model(model)
        except RecursionError:
            raise GraphError("bad_format", "the graph is nested too deeply") from None
        except ValidationError as exc:
            raise _graph_error(exc) from None

    @classmethod
    def from_json(cls, text: str | bytes) -> Graph:
        try:
            with collector_paused():
                model = GRAPH_DOCUMENT.validate_json(text)
                return cls.from_model(model)
        except ValidationError as exc:
            if exc.errors()[0]["type"] != "json_invalid":
                # a type error first: say it as from_dict does (format before fields)
                try:
                    data = json.loads(text)
                except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
                    data = None
                if data is not None:
                    return cls.from_dict(data)
            raise _graph_error(exc) from None

    @classmethod
    def from_model(cls, model: GraphModel) -> Graph:
        """The graph of a validated document (:data:`~autopar.ir.wire.GRAPH_DOCUMENT`'s output).

        The graph takes the document's dicts (ports, attrs) as they are: validation built
        them, so nothing else holds them.
        """
        tensors = [TensorSpec(name, tuple(t["shape"]), t["dtype"]) for name, t in model["tensors"].items()]
        role = _ROLES
        ops = [
            Op(
                op["name"],
                op["type"],
                op.get("inputs", {}),
                op.get("outputs", {}),
                op.get("attrs", {}),
                role[op.get("role", "forward")],
            )
            for op in model["ops"]
        ]
        variables = [
            Variable(v["op"], v["tensor"], v.get("grad"), v.get("optimizer"))
            for v in model.get("variables", [])
        ]
        return cls(model.get("name", "graph"), tensors, ops, variables, model.get("meta", {}))

    @classmethod
    def load(cls, path: str) -> Graph:
        with open(path, "rb") as fh:
            return cls.from_json(fh.read())

    def save(self, path: str) -> None:
        with open(path, "w") as fh:
            fh.write(self.to_json())

    def content_hash(self) -> str:
        """SHA-256 hex of the canonical graph: what the plan key and the memo keys see of it.

        It covers every tensor (name, shape, dtype), every op (name, type, role, ports in
        order, attrs) and every variable.  It ignores the graph's ``name`` and ``meta``, the
        order of ops, tensors and variables, the order of keys in a JSON object, JSON
        whitespace, and how a number is written: an integer-valued float equals the int
        (``1.0`` and ``1``; ``0.0`` and ``0``), and ``0.01`` equals ``1e-2``
        (:func:`~autopar.ir.content_key.canonical_numbers`).
        """
        canonical = {
            "tensors": sorted((n, list(t.shape), t.dtype) for n, t in self.tensors.items()),
            "ops": sorted(json.dumps(_canonical_op(op), sort_keys=True) for op in self.ops),
            "variables": sorted(json.dumps(v.to_dict(), sort_keys=True) for v in self.variables),
        }
        return hashlib.sha256(json.dumps(canonical, sort_keys=True).encode()).hexdigest()

    def __repr__(self) -> str:
        return (
            f"Graph({self.name!r}, ops={len(self.ops)}, tensors={len(self.tensors)}, "
            f"variables={len(self.variables)})"
        )


_VALIDATORS: list[Callable[[Graph], object]] = []
"""Checks :meth:`Graph.validate` runs last, registered by modules the graph cannot import
(:func:`register_validator`): :mod:`autopar.rules` registers its rule probe
(:func:`autopar.rules.check.check_graph_rules`) when imported, as its families register rules."""


def register_validator(check: Callable[[Graph], object]) -> None:
    """Have :meth:`Graph.validate` call ``check(graph)`` (once registered, idempotent)."""
    if check not in _VALIDATORS:
        _VALIDATORS.append(check)


DIM_ATTRS = frozenset({"axis", "dim", "begin_norm_axis", "begin_params_axis", "perm", "broadcast_axes"})
"""Attrs that name tensor dims (one, or a list): :meth:`Graph.validate` checks each is an
integer (an integer-valued float such as ``0.0`` counts) within the rank of the op's tensors."""


def _check_variables_once(variables: list[Variable]) -> None:
    """Each parameter (its op, and its tensor) is listed once: a second entry would count it twice."""
    seen_ops: set[str] = set()
    seen_tensors: set[str] = set()
    for i, v in enumerate(variables):
        if v.op in seen_ops or v.tensor in seen_tensors:
            what = f"op {v.op!r}" if v.op in seen_ops else f"tensor {v.tensor!r}"
            raise GraphError(
                "duplicate_variable",
                f"variables[{i}] lists the parameter {what} a second time; list each variable once",
                op=v.op,
            )
        seen_ops.add(v.op)
        seen_tensors.add(v.tensor)


def _dim_values(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else [value]


def _is_dim(d: Any, rank: int) -> bool:
    """``d`` is an integer (or an integer-valued float) from ``-rank`` to ``rank - 1``."""
    if isinstance(d, bool) or not isinstance(d, int | float):
        return False
    if isinstance(d, float) and not (math.isfinite(d) and d.is_integer()):
        return False
    return -rank <= d < rank


def _check_dim_attrs(graph: Graph) -> None:
    """Every :data:`DIM_ATTRS` value is an integer ``d`` with ``-rank <= d < rank``, where rank is
    the largest rank among the op's tensors (at least 1); ``null`` means "every dim"."""
    for op in graph.ops:
        if not op.attrs or DIM_ATTRS.isdisjoint(op.attrs):
            continue
        ranks = [len(graph.tensors[t].shape) for t in (*op.inputs.values(), *op.outputs.values())]
        rank = max([1, *ranks])
        for name in DIM_ATTRS.intersection(op.attrs):
            for d in _dim_values(op.attrs[name]):
                if d is not None and not _is_dim(d, rank):
                    shown = repr(d) if len(repr(d)) <= 40 else repr(d)[:37] + "..."
                    raise GraphError(
                        "bad_attr",
                        f"op {op.name!r} ({op.type}): attr {name!r} = {shown} is not a dim of its "
                        f"tensors; give an integer from {-rank} to {rank - 1}",
                        op=op.name,
                    )


def _canonical_op(op: Op) -> dict[str, Any]:
    """``op.to_dict()`` with its attrs' numbers canonical (an integer-valued float as the int)."""
    d = op.to_dict()
    if op.attrs:
        d["attrs"] = canonical_numbers(op.attrs)
    return d


MAKE_A_GRAPH = (
    "make one with `autopar model NAME --out g.json` or `autopar oneflow import job.pb --out g.json` "
    "(docs/graph-format.md)"
)
"""How to make a graph document, the end of a format error."""


def _format_message(data: dict[str, Any]) -> str:
    """The error of a document whose ``format`` is missing or not :data:`FORMAT`: what is
    expected, and how to make one."""
    if "format" not in data:
        return f'the graph has no "format" field; autopar reads "format": "{FORMAT}" graphs: {MAKE_A_GRAPH}'
    shown = repr(data["format"]) if len(repr(data["format"])) <= 80 else repr(data["format"])[:77] + "..."
    return f"unsupported graph format {shown}; expected {FORMAT!r}: {MAKE_A_GRAPH}"


def _graph_error(exc: ValidationError) -> GraphError:
    """The first problem pydantic found, as a :class:`GraphError` naming the field."""
    error = exc.errors()[0]
    loc, value = error["loc"], error.get("input")
    shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
    if error["type"] == "json_invalid":
        return GraphError("bad_json", f"graph is not valid JSON: {error['msg']}")
    if loc and loc[0] == "format":
        return GraphError("bad_format", _format_message({"format": value}))
    path = error_path(loc)
    if len(loc) >= 3 and loc[0] == "tensors" and loc[2] == "shape":
        return GraphError(
            "bad_shape",
            f"tensor {loc[1]!r} has invalid shape at {path}: {error['msg']} (got {shown})",
            tensor=str(loc[1]),
        )
    if len(loc) == 3 and loc[0] == "tensors" and loc[2] == "dtype":
        return GraphError(
            "unknown_dtype",
            f"tensor {loc[1]!r} has unknown dtype {shown}; use one of {sorted(DTYPES)}",
            tensor=str(loc[1]),
        )
    if len(loc) == 3 and loc[0] == "ops" and loc[2] == "role":
        return GraphError("bad_role", f"{path} is {shown}; use forward, backward or optimizer")
    return GraphError("bad_format", f"graph field {path}: {error['msg']} (got {shown})", field=path)
