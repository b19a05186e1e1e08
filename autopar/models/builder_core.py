"""The core of :class:`~autopar.models.builder.GraphBuilder`: its tensors, ops, tape, scopes,
inputs and parameters, and the finished graph; the shapes of broadcasting and the attrs of
OneFlow's scalar ops."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from autopar.errors import GraphError
from autopar.ir.graph import Graph, Op, Role, TensorSpec, Variable

__all__ = ["BuilderCore", "Param"]

Shape = tuple[int, ...]
GradList = list[str | None]
BackwardFn = Callable[[GradList], GradList]

FLOAT_DTYPES = ("float16", "bfloat16", "float32")
ADD_N_MAX_INPUTS = 8
"""OneFlow's ``AddLbns`` in the clip-by-global-norm pass sums at most 8 tensors per ``add_n``."""


@dataclass(frozen=True, slots=True)
class Param:
    """A trainable parameter: its ``variable`` op, ``float32`` tensor, shape and weight decay."""

    name: str
    tensor: str
    shape: Shape
    weight_decay: float

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True, slots=True)
class _TapeEntry:
    """One differentiable forward op: grads of ``outputs`` -> grads of ``inputs``."""

    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    backward: BackwardFn


def _broadcast_shape(x: Shape, y: Shape) -> Shape:
    """Numpy broadcasting of two shapes; raise GraphError when they do not broadcast."""
    nd = max(len(x), len(y))
    xs = (1,) * (nd - len(x)) + x
    ys = (1,) * (nd - len(y)) + y
    out = []
    for a, b in zip(xs, ys, strict=True):
        if a != b and a != 1 and b != 1:
            raise GraphError("shape_mismatch", f"shapes {list(x)} and {list(y)} do not broadcast")
        out.append(max(a, b))
    return tuple(out)


def _broadcast_axes(small: Shape, big: Shape) -> list[int]:
    """Axes of ``big`` along which ``small`` (left-extended with 1s) was broadcast."""
    ext = (1,) * (len(big) - len(small)) + small
    return [i for i, (s, b) in enumerate(zip(ext, big, strict=True)) if s == 1 and b != 1]


def _scalar_attrs(value: float) -> dict[str, Any]:
    """Attrs of OneFlow's scalar ops (``scalar_mul``, ``scalar_add``, ``scalar_pow``)."""
    return {
        "has_int_operand": False,
        "has_float_operand": True,
        "int_operand": 0,
        "float_operand": value,
    }


class BuilderCore:
    """A graph under construction: tensors, ops, the tape of differentiable ops, scopes and
    parameters (what every op helper of :class:`~autopar.models.builder.GraphBuilder` writes to).

    :class:`~autopar.models.builder.GraphBuilder` records a forward pass, then emits backward,
    optional gradient clipping and AdamW.

    Typical use::

        b = GraphBuilder("tiny", compute_dtype="float16")
        ids = b.input("input_ids", (8, 32), "int64")
        emb = b.param("wte.weight", (512, 64), weight_decay=0.01)
        h = b.gather(b.use(emb), ids, name="wte.gather")
        ...
        b.backward(loss)
        b.optimizer(lr=1e-4, weight_decay=0.01, clip_grad_max_norm=1.0)
        graph = b.build(meta={...}).validate()

    Forward helpers take an op name relative to the current :meth:`scope`; the
    backward ops of forward op ``X`` are named ``X_grad`` (plus a suffix when
    there are several).  Every tensor is named ``<op>/<port>`` like OneFlow's
    logical blob names.
    """

    def __init__(self, name: str, *, compute_dtype: str = "float16", param_dtype: str = "float32") -> None:
        for what, dt in (("compute_dtype", compute_dtype), ("param_dtype", param_dtype)):
            if dt not in FLOAT_DTYPES:
                raise GraphError("unknown_dtype", f"{what} {dt!r} is not one of {list(FLOAT_DTYPES)}")
        self.name = name
        self.compute_dtype = compute_dtype
        self.param_dtype = param_dtype
        self._tensors: dict[str, TensorSpec] = {}
        self._ops: list[Op] = []
        self._op_names: set[str] = set()
        self._params: list[Param] = []
        self._param_copies: dict[str, str] = {}
        """Parameter name -> its compute-dtype copy (:meth:`use`)."""
        self._param_grads: dict[str, str] = {}
        self._tape: list[_TapeEntry] = []
        self._requires_grad: set[str] = set()
        self._scope: list[str] = []
        self._role = Role.FORWARD
        self._variables: list[Variable] = []
        self._loss: str | None = None

    # ------------------------------------------------------------ basics

    @contextmanager
    def scope(self, name: str) -> Iterator[None]:
        """Prefix op names created inside the block with ``name.``."""
        self._scope.append(name)
        try:
            yield
        finally:
            self._scope.pop()

    def qualify(self, local: str) -> str:
        return ".".join([*self._scope, local]) if self._scope else local

    def spec(self, tensor: str) -> TensorSpec:
        try:
            return self._tensors[tensor]
        except KeyError:
            raise GraphError(
                "unknown_tensor", f"tensor {tensor!r} has not been created", tensor=tensor
            ) from None

    def shape(self, tensor: str) -> Shape:
        return self.spec(tensor).shape

    def dtype(self, tensor: str) -> str:
        return self.spec(tensor).dtype

    def requires_grad(self, tensor: str) -> bool:
        return tensor in self._requires_grad

    @property
    def params(self) -> tuple[Param, ...]:
        return tuple(self._params)

    @property
    def op_count(self) -> int:
        return len(self._ops)

    def emit(
        self,
        op_name: str,
        op_type: str,
        inputs: dict[str, str],
        outputs: Sequence[tuple[str, Shape, str]],
        attrs: dict[str, Any] | None = None,
    ) -> list[str]:
        """Append one op (full name ``op_name``) in the current role; return its output tensors."""
        if op_name in self._op_names:
            raise GraphError(
                "duplicate_op",
                f"op {op_name!r} is emitted twice; give it a unique name",
                op=op_name,
            )
        self._op_names.add(op_name)
        out_map: dict[str, str] = {}
        names: list[str] = []
        for port, shape, dtype in outputs:
            tname = f"{op_name}/{port}"
            self._tensors[tname] = TensorSpec(tname, tuple(shape), dtype)
            out_map[port] = tname
            names.append(tname)
        self._ops.append(Op(op_name, op_type, dict(inputs), out_map, dict(attrs or {}), self._role))
        return names

    def _record(self, op: str, inputs: Sequence[str], outputs: Sequence[str], fn: BackwardFn) -> None:
        """Put a differentiable op on the tape when any of its ``inputs`` requires grad."""
        if any(t in self._requires_grad for t in inputs):
            self._tape.append(_TapeEntry(op, tuple(inputs), tuple(outputs), fn))
            self._requires_grad.update(outputs)

    def _record_grad(
        self,
        op: str,
        x: str,
        y: str,
        grad_type: str,
        grad_inputs: Callable[[str], dict[str, str]],
        grad_output: tuple[str, Shape],
        attrs: dict[str, Any] | None = None,
        *,
        dtype: str | None = None,
    ) -> None:
        """Tape ``op`` (``x`` -> ``y``) whose backward is one ``{op}_grad`` op of ``grad_type``.

        The grad op reads ``grad_inputs(dy)`` and writes ``grad_output`` (port, shape) in
        ``dtype`` (default: the dtype of ``dy``).
        """

        def bw(g: GradList) -> GradList:
            dy = g[0]
            assert dy is not None
            port, shape = grad_output
            return [
                self.emit(
                    f"{op}_grad", grad_type, grad_inputs(dy), [(port, shape, dtype or self.dtype(dy))], attrs
                )[0]
            ]

        self._record(op, [x], [y], bw)

    # ------------------------------------------------------------ inputs and parameters

    def input(self, name: str, shape: Shape, dtype: str) -> str:
        """A data input (token ids, labels, masks): an ``input`` op with output port ``out``."""
        return self.emit(
            self.qualify(name),
            "input",
            {},
            [("out", shape, dtype)],
            {"shape": list(shape), "dtype": dtype},
        )[0]

    def param(self, name: str, shape: Shape, *, weight_decay: float) -> Param:
        """A trainable ``float32`` parameter: a ``variable`` op with output port ``out``."""
        full = self.qualify(name)
        (tensor,) = self.emit(
            full,
            "variable",
            {},
            [("out", shape, self.param_dtype)],
            {"shape": list(shape), "dtype": self.param_dtype, "trainable": True},
        )
        p = Param(full, tensor, tuple(shape), weight_decay)
        self._params.append(p)
        self._requires_grad.add(tensor)
        return p

    # ------------------------------------------------------------ result

    def build(self, meta: dict[str, Any] | None = None) -> Graph:
        """The finished :class:`Graph` (not validated: call ``.validate()`` once)."""
        if not self._variables and self._params:
            raise GraphError("bad_builder", "call optimizer() before build()")
        return Graph(self.name, self._tensors.values(), self._ops, self._variables, meta)
