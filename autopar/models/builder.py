"""GraphBuilder: write a model's forward pass once, get forward + backward + AdamW.

The builder emits ops at OneFlow 0.9 granularity (op types are OneFlow user-op
names, ports are OneFlow bn names with index, attrs as in
``oneflow/ir/include/OneFlow/OneFlowUserOps.td``) and keeps a **tape**: every
differentiable forward op records a closure that, given the gradient of its
output, emits the backward ops OneFlow's autograd would emit for it (the
``gradient_funcs`` of OneFlow 0.9)::

    forward helper            backward ops emitted
    ------------------------  -------------------------------------------------
    broadcast_matmul(x, W^T)  broadcast_matmul(dy, W), broadcast_matmul_grad_b(dy, x)
    batch_matmul(a, b)        batch_matmul x2 (transposes follow OneFlow's MatMul grad)
    broadcast_add(x, bias)    reduce_sum_like(dy, bias) for the broadcast side
    add (same shapes)         add_n forward; gradient passes through unchanged
    softmax / dropout         softmax_grad / dropout_grad
    gelu / fast_gelu          gelu_grad / fast_gelu_grad
    rms_norm / layer_norm     rms_norm_grad + rms_norm_param_grad / layer_norm_grad + _param_grad
    gather (embedding)        unsorted_segment_sum_like
    reshape / transpose       reshape / transpose with the inverse perm
    cast                      cast back to the input dtype
    reduce_sum / scalar_mul   broadcast_like / scalar_mul
    sparse_softmax_cross_entropy  sparse_softmax_cross_entropy_grad

A tensor read by several differentiable ops gets its gradient contributions
summed by one ``add_n`` just before its producer's backward runs.

Mixed precision follows OneFlow AMP: parameters are ``float32`` ``variable`` ops,
each cast once to the compute dtype, and every use reads that one copy (OneFlow's
``AutoMixedPrecision`` pass groups the edges it casts by source blob and inserts one
``cast`` per blob: ``InsertCastOpImpl``, ``edges_group_by_lbn``, in
``oneflow/core/job_rewriter/auto_mixed_precision.cpp``); the gradient of a copy read
several times (a shared or tied embedding) is summed by one ``add_n`` in the compute
dtype and flows back through one ``cast`` to ``float32``.  :meth:`GraphBuilder.optimizer`
optionally clips gradients by global norm exactly as OneFlow's optimizer pass
does (``multi_reduce_sum_pow_abs`` per gradient, an ``add_n`` tree of at most 8
inputs, ``scalar_pow``, ``scalar_add``, ``reciprocal_no_nan``, ``scalar_mul``,
``clip_by_scalar_max``, then ``scalar_mul_by_tensor`` per gradient) and ends
with one ``adam_update`` per parameter (inputs ``model_0``, ``model_diff_0``).

Nothing here validates per op: :meth:`GraphBuilder.build` returns the
:class:`~autopar.graph.Graph` and the caller validates it once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from autopar.errors import GraphError
from autopar.graph import Graph, Op, Role, TensorSpec, Variable

__all__ = ["GraphBuilder", "Param"]

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


class GraphBuilder:
    """Record a forward pass, then emit backward, optional gradient clipping and AdamW.

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

    def use(self, p: Param) -> str:
        """The parameter in the compute dtype: one ``cast`` per parameter, which every use
        reads (OneFlow AMP casts each blob once; module docstring)."""
        if self.compute_dtype == self.param_dtype:
            return p.tensor
        copy = self._param_copies.get(p.name)
        if copy is None:
            copy = self.cast(p.tensor, self.compute_dtype, name=f"{p.name}.cast", qualify=False)
            self._param_copies[p.name] = copy
        return copy

    # ------------------------------------------------------------ element-wise and views

    def cast(self, x: str, dtype: str, *, name: str, qualify: bool = True) -> str:
        op = self.qualify(name) if qualify else name
        src = self.dtype(x)
        (y,) = self.emit(
            op,
            "cast",
            {"in_0": x},
            [("out_0", self.shape(x), dtype)],
            {"dtype": dtype, "pin_memory": False},
        )
        self._record_grad(
            op,
            x,
            y,
            "cast",
            lambda dy: {"in_0": dy},
            ("out_0", self.shape(x)),
            {"dtype": src, "pin_memory": False},
            dtype=src,
        )
        return y

    def reshape(self, x: str, shape: Shape, *, name: str) -> str:
        if math.prod(shape) != self.spec(x).numel:
            raise GraphError("shape_mismatch", f"cannot reshape {list(self.shape(x))} to {list(shape)}")
        op = self.qualify(name)
        src = self.shape(x)
        (y,) = self.emit(
            op, "reshape", {"in_0": x}, [("out_0", shape, self.dtype(x))], {"shape": list(shape)}
        )
        self._record_grad(op, x, y, "reshape", lambda dy: {"in_0": dy}, ("out_0", src), {"shape": list(src)})
        return y

    def transpose(self, x: str, perm: Sequence[int], *, name: str) -> str:
        src = self.shape(x)
        if sorted(perm) != list(range(len(src))):
            raise GraphError("bad_perm", f"perm {list(perm)} is not a permutation of {len(src)} dims")
        op = self.qualify(name)
        out_shape = tuple(src[p] for p in perm)
        (y,) = self.emit(
            op,
            "transpose",
            {"input_0": x},
            [("output_0", out_shape, self.dtype(x))],
            {"perm": list(perm)},
        )
        inverse = [0] * len(perm)
        for i, p in enumerate(perm):
            inverse[p] = i
        self._record_grad(
            op, x, y, "transpose", lambda dy: {"input_0": dy}, ("output_0", src), {"perm": inverse}
        )
        return y

    def narrow(self, x: str, dim: int, start: int, length: int, *, name: str) -> str:
        """``x`` cut to ``[start, start + length)`` along ``dim``: OneFlow's ``narrow`` (what
        ``flow.chunk`` emits); its gradient is ``narrow_grad`` (``dy`` placed into zeros
        shaped ``like`` ``x``)."""
        src = self.shape(x)
        if not 0 <= dim < len(src) or start < 0 or length < 1 or start + length > src[dim]:
            raise GraphError(
                "bad_narrow",
                f"cannot narrow dim {dim} of {list(src)} to [{start}, {start + length})",
            )
        op = self.qualify(name)
        out_shape = tuple(length if d == dim else n for d, n in enumerate(src))
        attrs = {"dim": dim, "start": start, "length": length}
        (y,) = self.emit(op, "narrow", {"in_0": x}, [("out_0", out_shape, self.dtype(x))], attrs)
        self._record_grad(op, x, y, "narrow_grad", lambda dy: {"dy_0": dy, "like_0": x}, ("dx_0", src), attrs)
        return y

    def add(self, *xs: str, name: str) -> str:
        """Sum of same-shape tensors: OneFlow's ``x + y`` on equal shapes is ``add_n``."""
        shape = self.shape(xs[0])
        if any(self.shape(x) != shape for x in xs):
            raise GraphError(
                "shape_mismatch",
                f"add of shapes {[list(self.shape(x)) for x in xs]}; use broadcast_add",
            )
        op = self.qualify(name)
        (y,) = self.emit(
            op,
            "add_n",
            {f"in_{i}": x for i, x in enumerate(xs)},
            [("out_0", shape, self.dtype(xs[0]))],
        )
        self._record(op, list(xs), [y], lambda g: [g[0]] * len(xs))
        return y

    def _binary_grad_side(self, fwd: str, suffix: str, dz: str, side: str) -> str:
        """Gradient of a broadcast operand: ``dz`` itself or ``reduce_sum_like(dz, like=side)``."""
        if self.shape(side) == self.shape(dz):
            return dz
        axes = _broadcast_axes(self.shape(side), self.shape(dz))
        return self.emit(
            f"{fwd}_grad{suffix}",
            "reduce_sum_like",
            {"x_0": dz, "like_0": side},
            [("y_0", self.shape(side), self.dtype(dz))],
            {"axis": axes},
        )[0]

    def broadcast_add(self, x: str, y: str, *, name: str) -> str:
        return self._broadcast_binary("broadcast_add", x, y, name=name)

    def broadcast_mul(self, x: str, y: str, *, name: str) -> str:
        return self._broadcast_binary("broadcast_mul", x, y, name=name)

    def _broadcast_binary(self, op_type: str, x: str, y: str, *, name: str) -> str:
        """``broadcast_add`` / ``broadcast_mul``.  Backward, per operand that needs a gradient:
        ``dz`` (add) or ``broadcast_mul(dz, other)`` (mul), summed over the broadcast axes."""
        op = self.qualify(name)
        shape = _broadcast_shape(self.shape(x), self.shape(y))
        (z,) = self.emit(op, op_type, {"x_0": x, "y_0": y}, [("z_0", shape, self.dtype(x))])

        def bw(g: GradList) -> GradList:
            dz = g[0]
            assert dz is not None
            grads: GradList = []
            for side, other, tag in ((x, y, "x"), (y, x, "y")):
                if not self.requires_grad(side):
                    grads.append(None)
                elif op_type == "broadcast_add":
                    grads.append(self._binary_grad_side(op, f"_{tag}", dz, side))
                else:
                    (prod,) = self.emit(
                        f"{op}_grad_{tag}",
                        "broadcast_mul",
                        {"x_0": dz, "y_0": other},
                        [("z_0", shape, self.dtype(dz))],
                    )
                    grads.append(self._binary_grad_side(op, f"_{tag}_sum", prod, side))
            return grads

        self._record(op, [x, y], [z], bw)
        return z

    def scalar_mul(self, x: str, value: float, *, name: str) -> str:
        op = self.qualify(name)
        (y,) = self.emit(
            op,
            "scalar_mul",
            {"in_0": x},
            [("out_0", self.shape(x), self.dtype(x))],
            _scalar_attrs(value),
        )
        self._record_grad(
            op, x, y, "scalar_mul", lambda dy: {"in_0": dy}, ("out_0", self.shape(x)), _scalar_attrs(value)
        )
        return y

    def _unary(self, x: str, op_type: str, grad_type: str, grad_ports: tuple[str, str], *, name: str) -> str:
        """An element-wise activation whose grad op takes (x, dy) in the order of ``grad_ports``."""
        op = self.qualify(name)
        (y,) = self.emit(op, op_type, {"in_0": x}, [("out_0", self.shape(x), self.dtype(x))])

        def grad_inputs(dy: str) -> dict[str, str]:
            tensors = {"x": x, "dy": dy}
            return {f"{p}_0": tensors[p] for p in grad_ports}

        self._record_grad(op, x, y, grad_type, grad_inputs, ("dx_0", self.shape(x)))
        return y

    def gelu(self, x: str, *, name: str) -> str:
        """Exact (erf) GELU: ``gelu`` / ``gelu_grad(x, dy)``."""
        return self._unary(x, "gelu", "gelu_grad", ("x", "dy"), name=name)

    def fast_gelu(self, x: str, *, name: str) -> str:
        """Tanh-approximate GELU (HF ``gelu_new``): ``fast_gelu`` / ``fast_gelu_grad(dy, x)``."""
        return self._unary(x, "fast_gelu", "fast_gelu_grad", ("dy", "x"), name=name)

    def softmax(self, x: str, *, name: str) -> str:
        """Softmax over the last dim: ``softmax`` / ``softmax_grad(y, dy)``."""
        op = self.qualify(name)
        (y,) = self.emit(op, "softmax", {"in_0": x}, [("out_0", self.shape(x), self.dtype(x))])
        self._record_grad(
            op, x, y, "softmax_grad", lambda dy: {"y_0": y, "dy_0": dy}, ("dx_0", self.shape(x))
        )
        return y

    def dropout(self, x: str, rate: float, *, name: str) -> str:
        """``dropout`` (outputs ``out_0``, bool ``mask_0``) / ``dropout_grad(dy, mask)``.

        Rate 0 emits nothing and returns ``x``.
        """
        if rate <= 0.0:
            return x
        op = self.qualify(name)
        y, mask = self.emit(
            op,
            "dropout",
            {"in_0": x},
            [("out_0", self.shape(x), self.dtype(x)), ("mask_0", self.shape(x), "bool")],
            {"rate": rate},
        )
        self._record_grad(
            op,
            x,
            y,
            "dropout_grad",
            lambda dy: {"dy_0": dy, "mask_0": mask},
            ("dx_0", self.shape(x)),
            {"scale": 1.0 / (1.0 - rate)},
        )
        return y

    # ------------------------------------------------------------ matmuls

    @staticmethod
    def _matmul_shape(a: Shape, b: Shape, ta: bool, tb: bool) -> Shape:
        m, ka = (a[-1], a[-2]) if ta else (a[-2], a[-1])
        kb, n = (b[-1], b[-2]) if tb else (b[-2], b[-1])
        if ka != kb:
            raise GraphError(
                "shape_mismatch",
                f"matmul of {list(a)} (transpose_a={ta}) and {list(b)} (transpose_b={tb}): "
                f"contracted dims {ka} != {kb}",
            )
        return (*a[:-2], m, n)

    def _mm(self, op: str, op_type: str, a: str, b: str, ta: bool, tb: bool, alpha: float) -> str:
        shape = self._matmul_shape(self.shape(a), self.shape(b), ta, tb)
        return self.emit(
            op,
            op_type,
            {"a_0": a, "b_0": b},
            [("out_0", shape, self.dtype(a))],
            {"transpose_a": ta, "transpose_b": tb, "alpha": alpha},
        )[0]

    def matmul(
        self,
        a: str,
        b: str,
        *,
        transpose_a: bool = False,
        transpose_b: bool = False,
        alpha: float = 1.0,
        name: str,
    ) -> str:
        """2-D ``matmul`` (or ``batch_matmul`` when both operands have the same leading batch dims).

        Backward follows OneFlow's ``MatMul`` gradient::

            da = a^T ? MatMul(b, dy, transpose_b, True) : MatMul(dy, b, False, !transpose_b)
            db = b^T ? MatMul(dy, a, True, transpose_a)  : MatMul(a, dy, !transpose_a, False)
        """
        op_type = "matmul" if len(self.shape(a)) == 2 else "batch_matmul"
        if len(self.shape(a)) != len(self.shape(b)) or self.shape(a)[:-2] != self.shape(b)[:-2]:
            raise GraphError(
                "shape_mismatch",
                f"{op_type} needs equal batch dims, got {list(self.shape(a))} and {list(self.shape(b))}",
            )
        op = self.qualify(name)
        out = self._mm(op, op_type, a, b, transpose_a, transpose_b, alpha)

        def bw(g: GradList) -> GradList:
            dy = g[0]
            assert dy is not None
            da = db = None
            if self.requires_grad(a):
                if transpose_a:
                    da = self._mm(f"{op}_grad_a", op_type, b, dy, transpose_b, True, alpha)
                else:
                    da = self._mm(f"{op}_grad_a", op_type, dy, b, False, not transpose_b, alpha)
            if self.requires_grad(b):
                if transpose_b:
                    db = self._mm(f"{op}_grad_b", op_type, dy, a, True, transpose_a, alpha)
                else:
                    db = self._mm(f"{op}_grad_b", op_type, a, dy, not transpose_a, False, alpha)
            return [da, db]

        self._record(op, [a, b], [out], bw)
        return out

    def broadcast_matmul(
        self, a: str, b: str, *, transpose_b: bool = False, alpha: float = 1.0, name: str
    ) -> str:
        """``a [..., m, k] @ b`` with a 2-D ``b`` (``[k, n]``, or ``[n, k]`` with ``transpose_b``).

        Backward (OneFlow's ``BroadcastMatmul`` gradient): ``da = broadcast_matmul(dy, b,
        transpose_b=!transpose_b)``; ``db = broadcast_matmul_grad_b(dy, a)`` when ``transpose_b``
        else ``broadcast_matmul_grad_b(a, dy)`` (batch dims summed).
        """
        if len(self.shape(b)) != 2 or len(self.shape(a)) < 3:
            raise GraphError(
                "shape_mismatch",
                "broadcast_matmul needs a batched a and a 2-D b, got "
                f"{list(self.shape(a))} and {list(self.shape(b))}",
            )
        op = self.qualify(name)
        out = self._mm(op, "broadcast_matmul", a, b, False, transpose_b, alpha)

        def bw(g: GradList) -> GradList:
            dy = g[0]
            assert dy is not None
            da = db = None
            if self.requires_grad(a):
                da = self._mm(f"{op}_grad_a", "broadcast_matmul", dy, b, False, not transpose_b, alpha)
            if self.requires_grad(b):
                first, second = (dy, a) if transpose_b else (a, dy)
                db = self.emit(
                    f"{op}_grad_b",
                    "broadcast_matmul_grad_b",
                    {"a_0": first, "b_0": second},
                    [("out_0", (self.shape(first)[-1], self.shape(second)[-1]), self.dtype(dy))],
                    {"alpha": alpha},
                )[0]
            return [da, db]

        self._record(op, [a, b], [out], bw)
        return out

    def linear(self, x: str, weight: Param, bias: Param | None = None, *, name: str) -> str:
        """OneFlow/LiBai ``Linear``: ``broadcast_matmul(x, W, transpose_b=True)`` (W ``[out, in]``),
        then ``broadcast_add`` of the bias."""
        y = self.broadcast_matmul(x, self.use(weight), transpose_b=True, name=f"{name}.matmul")
        if bias is not None:
            y = self.broadcast_add(y, self.use(bias), name=f"{name}.bias_add")
        return y

    # ------------------------------------------------------------ normalisation

    def rms_norm(self, x: str, weight: Param, *, epsilon: float, name: str) -> str:
        """T5 layer norm (no mean, no bias): ``rms_norm(x, weight) -> y, inv_rms``.

        Backward: ``rms_norm_grad(dy, x, inv_rms, weight)`` and
        ``rms_norm_param_grad(dy, x, inv_rms)``.
        """
        op = self.qualify(name)
        shape = self.shape(x)
        w = self.use(weight)
        y, inv_rms = self.emit(
            op,
            "rms_norm",
            {"x_0": x, "weight_0": w},
            [("y_0", shape, self.dtype(x)), ("inv_rms_0", shape[:-1], "float32")],
            {"normalized_shape": [shape[-1]], "epsilon": epsilon},
        )

        def bw(g: GradList) -> GradList:
            dy = g[0]
            assert dy is not None
            dx = dw = None
            if self.requires_grad(x):
                dx = self.emit(
                    f"{op}_grad",
                    "rms_norm_grad",
                    {"dy_0": dy, "x_0": x, "inv_rms_0": inv_rms, "weight_0": w},
                    [("dx_0", shape, self.dtype(dy))],
                )[0]
            if self.requires_grad(w):
                dw = self.emit(
                    f"{op}_param_grad",
                    "rms_norm_param_grad",
                    {"dy_0": dy, "x_0": x, "inv_rms_0": inv_rms},
                    [("weight_grad_0", self.shape(w), self.dtype(dy))],
                )[0]
            return [dx, dw]

        self._record(op, [x, w], [y], bw)
        return y

    def layer_norm(self, x: str, gamma: Param, beta: Param, *, epsilon: float, name: str) -> str:
        """``layer_norm(x, beta, gamma) -> y, mean, inv_variance`` over the last dim.

        Backward: ``layer_norm_grad(dy, x, mean, inv_variance, gamma)`` and
        ``layer_norm_param_grad(dy, x, mean, inv_variance) -> beta_diff, gamma_diff``.
        """
        op = self.qualify(name)
        shape = self.shape(x)
        axis = len(shape) - 1
        g_t = self.use(gamma)
        b_t = self.use(beta)
        y, mean, inv_var = self.emit(
            op,
            "layer_norm",
            {"x_0": x, "beta_0": b_t, "gamma_0": g_t},
            [
                ("y_0", shape, self.dtype(x)),
                ("mean_0", shape[:-1], "float32"),
                ("inv_variance_0", shape[:-1], "float32"),
            ],
            {
                "center": True,
                "scale": True,
                "begin_norm_axis": axis,
                "begin_params_axis": axis,
                "epsilon": epsilon,
            },
        )

        def bw(g: GradList) -> GradList:
            dy = g[0]
            assert dy is not None
            dx = dg = db = None
            if self.requires_grad(g_t) or self.requires_grad(b_t):
                db, dg = self.emit(
                    f"{op}_param_grad",
                    "layer_norm_param_grad",
                    {"dy_0": dy, "x_0": x, "mean_0": mean, "inv_variance_0": inv_var},
                    [
                        ("beta_diff_0", self.shape(b_t), self.dtype(dy)),
                        ("gamma_diff_0", self.shape(g_t), self.dtype(dy)),
                    ],
                    {"begin_params_axis": axis},
                )
            if self.requires_grad(x):
                dx = self.emit(
                    f"{op}_grad",
                    "layer_norm_grad",
                    {
                        "dy_0": dy,
                        "x_0": x,
                        "mean_0": mean,
                        "inv_variance_0": inv_var,
                        "gamma_0": g_t,
                    },
                    [("dx_0", shape, self.dtype(dy))],
                    {"begin_norm_axis": axis, "epsilon": epsilon},
                )[0]
            return [dx, dg, db]

        self._record(op, [x, g_t, b_t], [y], bw)
        return y

    # ------------------------------------------------------------ embedding, reductions, loss

    def gather(self, table: str, indices: str, *, name: str) -> str:
        """Embedding lookup ``gather(in=table [V, H], indices) -> indices.shape + [H]`` (axis 0).

        Backward: ``unsorted_segment_sum_like(data=dy, segment_ids=indices, like=table)``.
        """
        op = self.qualify(name)
        tshape = self.shape(table)
        (out,) = self.emit(
            op,
            "gather",
            {"in_0": table, "indices_0": indices},
            [("out_0", (*self.shape(indices), *tshape[1:]), self.dtype(table))],
            {"axis": 0},
        )
        self._record_grad(
            op,
            table,
            out,
            "unsorted_segment_sum_like",
            lambda dy: {"data_0": dy, "segment_ids_0": indices, "like_0": table},
            ("out_0", tshape),
            {"axis": 0},
        )
        return out

    def reduce_sum(self, x: str, axis: Sequence[int], *, keepdims: bool = False, name: str) -> str:
        """``reduce_sum``; backward ``broadcast_like(dy, like=x, broadcast_axes=axis)``."""
        op = self.qualify(name)
        shape = self.shape(x)
        axes = sorted(a % len(shape) for a in axis)
        out_shape = tuple((1 if i in axes else d) for i, d in enumerate(shape) if keepdims or i not in axes)
        (y,) = self.emit(
            op,
            "reduce_sum",
            {"input_tensor_0": x},
            [("output_tensor_0", out_shape, self.dtype(x))],
            {"axis": axes, "keepdims": keepdims},
        )
        self._record_grad(
            op,
            x,
            y,
            "broadcast_like",
            lambda dy: {"x_0": dy, "like_0": x},
            ("y_0", shape),
            {"broadcast_axes": axes},
        )
        return y

    def sparse_softmax_cross_entropy(self, logits: str, labels: str, *, name: str) -> str:
        """Per-row loss of ``logits [N, V]`` against ``labels [N]``: outputs ``prob_0``, ``out_0``.

        Backward: ``sparse_softmax_cross_entropy_grad(label, dy, prob) -> prediction_diff``.
        """
        op = self.qualify(name)
        n, depth = self.shape(logits)
        prob, out = self.emit(
            op,
            "sparse_softmax_cross_entropy",
            {"prediction_0": logits, "label_0": labels},
            [("prob_0", (n, depth), self.dtype(logits)), ("out_0", (n,), self.dtype(logits))],
            {"depth": depth},
        )
        self._record_grad(
            op,
            logits,
            out,
            "sparse_softmax_cross_entropy_grad",
            lambda dy: {"label_0": labels, "dy_0": dy, "prob_0": prob},
            ("prediction_diff_0", (n, depth)),
            {"depth": depth},
        )
        return out

    def lm_loss(self, logits: str, labels: str, loss_mask: str, *, name: str = "loss") -> str:
        """LiBai's masked LM loss: ``sum(CE(logits, labels) * loss_mask) / tokens``.

        ``logits [B, S, V]`` (compute dtype) is flattened and cast to ``float32`` as
        Megatron/LiBai do before the cross entropy; ``labels`` (int64) and ``loss_mask``
        (float32) are ``[B, S]`` inputs.  Returns the scalar loss (shape ``()``).
        """
        with self.scope(name):
            bsz, seq, vocab = self.shape(logits)
            n = bsz * seq
            flat = self.reshape(logits, (n, vocab), name="logits_flat")
            if self.dtype(flat) != "float32":
                flat = self.cast(flat, "float32", name="logits_fp32")
            lab = self.reshape(labels, (n,), name="labels_flat")
            mask = self.reshape(loss_mask, (n,), name="mask_flat")
            ce = self.sparse_softmax_cross_entropy(flat, lab, name="cross_entropy")
            ce = self.broadcast_mul(ce, mask, name="mask_mul")
            total = self.reduce_sum(ce, [0], name="sum")
            return self.scalar_mul(total, 1.0 / n, name="mean")

    # ------------------------------------------------------------ backward

    def _sum_grads(self, contributions: dict[str, list[str]], tensor: str) -> str | None:
        grads = contributions.pop(tensor, None)
        if not grads:
            return None
        spec = self._tensors[tensor]
        for gname in grads:
            if self._tensors[gname].shape != spec.shape:
                raise GraphError(
                    "shape_mismatch",
                    f"gradient {gname!r} has shape {list(self._tensors[gname].shape)} "
                    f"but tensor {tensor!r} has {list(spec.shape)}",
                    tensor=tensor,
                )
        if len(grads) == 1:
            return grads[0]
        return self.emit(
            f"{tensor.replace('/', '.')}_grad_add_n",
            "add_n",
            {f"in_{i}": gname for i, gname in enumerate(grads)},
            [("out_0", spec.shape, self._tensors[grads[0]].dtype)],
        )[0]

    def backward(self, loss: str) -> None:
        """Emit the backward pass from scalar ``loss`` (seeded by ``ones_like(loss)``)."""
        if self._loss is not None:
            raise GraphError("bad_builder", "backward() was already called")
        if loss not in self._requires_grad:
            raise GraphError("bad_builder", f"loss {loss!r} does not depend on any parameter", tensor=loss)
        self._loss = loss
        self._role = Role.BACKWARD
        producer = loss.split("/", 1)[0]
        (seed,) = self.emit(
            f"{producer}_grad_seed",
            "ones_like",
            {"like_0": loss},
            [("out_0", self.shape(loss), self.dtype(loss))],
        )
        contributions: dict[str, list[str]] = {loss: [seed]}
        for entry in reversed(self._tape):
            gys: GradList = [self._sum_grads(contributions, t) for t in entry.outputs]
            if all(g is None for g in gys):
                continue
            gxs = entry.backward(gys)
            for t, gx in zip(entry.inputs, gxs, strict=True):
                if gx is not None and t in self._requires_grad:
                    contributions.setdefault(t, []).append(gx)
        for p in self._params:
            grad = self._sum_grads(contributions, p.tensor)
            if grad is None:
                raise GraphError(
                    "unused_parameter",
                    f"parameter {p.name!r} does not reach the loss; remove it",
                    op=p.name,
                )
            if self.dtype(grad) != self.param_dtype:
                raise GraphError(
                    "bad_builder",
                    f"gradient of {p.name!r} is {self.dtype(grad)}, not {self.param_dtype}",
                )
            self._param_grads[p.name] = grad

    # ------------------------------------------------------------ optimizer

    def _add_tree(self, tensors: list[str], prefix: str) -> str:
        """OneFlow's ``AddLbns``: repeatedly ``add_n`` the last (up to) 8 tensors."""
        pending = list(tensors)
        k = 0
        while len(pending) > 1:
            start = max(0, len(pending) - ADD_N_MAX_INPUTS)
            chunk = pending[start:]
            del pending[start:]
            spec = self._tensors[chunk[0]]
            (out,) = self.emit(
                f"{prefix}_{k}",
                "add_n",
                {f"in_{i}": t for i, t in enumerate(chunk)},
                [("out_0", spec.shape, spec.dtype)],
            )
            pending.append(out)
            k += 1
        return pending[0]

    def _clip_by_global_norm(self, grads: list[str], max_norm: float, norm_type: float) -> list[str]:
        """OneFlow's ``ClipGradientByGlobalNorm`` job pass (p-norm, no aggregation)."""
        scalar: Shape = ()
        prefix = "clip_grad"
        partial = [
            self.emit(
                f"{p.name}.grad_norm",
                "multi_reduce_sum_pow_abs",
                {"x_0": g},
                [("y_0", scalar, "float32")],
                {"p": norm_type},
            )[0]
            for p, g in zip(self._params, grads, strict=True)
        ]
        total = self._add_tree(partial, f"{prefix}.global_norm_add")
        (norm,) = self.emit(
            f"{prefix}.global_pow",
            "scalar_pow",
            {"in_0": total},
            [("out_0", scalar, "float32")],
            _scalar_attrs(1.0 / norm_type),
        )
        (eps,) = self.emit(
            f"{prefix}.add_eps",
            "scalar_add",
            {"in_0": norm},
            [("out_0", scalar, "float32")],
            _scalar_attrs(1e-6),
        )
        (inv,) = self.emit(f"{prefix}.inv", "reciprocal_no_nan", {"x_0": eps}, [("y_0", scalar, "float32")])
        (coeff,) = self.emit(
            f"{prefix}.coeff",
            "scalar_mul",
            {"in_0": inv},
            [("out_0", scalar, "float32")],
            _scalar_attrs(max_norm),
        )
        (clamped,) = self.emit(
            f"{prefix}.clamp",
            "clip_by_scalar_max",
            {"x_0": coeff},
            [("y_0", scalar, "float32")],
            {"floating_max": 1.0, "integral_max": 0},
        )
        return [
            self.emit(
                f"{p.name}.grad_clip",
                "scalar_mul_by_tensor",
                {"x_0": g, "scalar_0": clamped},
                [("y_0", self.shape(g), self.dtype(g))],
            )[0]
            for p, g in zip(self._params, grads, strict=True)
        ]

    def optimizer(
        self,
        *,
        lr: float,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-8,
        clip_grad_max_norm: float | None = None,
        clip_grad_norm_type: float = 2.0,
        do_bias_correction: bool = True,
    ) -> None:
        """Optionally clip gradients by global norm (backward role), then one ``adam_update`` per
        parameter (optimizer role) with the parameter's own weight decay (AdamW)."""
        if self._loss is None:
            raise GraphError("bad_builder", "call backward(loss) before optimizer()")
        grads = [self._param_grads[p.name] for p in self._params]
        if clip_grad_max_norm is not None:
            grads = self._clip_by_global_norm(grads, clip_grad_max_norm, clip_grad_norm_type)
        self._role = Role.OPTIMIZER
        for p, g in zip(self._params, grads, strict=True):
            op = f"{p.name}.adam_update"
            self.emit(
                op,
                "adam_update",
                {"model_0": p.tensor, "model_diff_0": g},
                [],
                {
                    "learning_rate_val": lr,
                    "bias_correction1_val": 1.0,
                    "bias_correction2_val": 1.0,
                    "scale": 1.0,
                    "l1": 0.0,
                    "l2": 0.0,
                    "beta1": beta1,
                    "beta2": beta2,
                    "epsilon": epsilon,
                    "weight_decay": p.weight_decay,
                    "amsgrad": False,
                    "do_bias_correction": do_bias_correction,
                },
            )
            self._variables.append(Variable(p.name, p.tensor, g, op))

    # ------------------------------------------------------------ result

    def build(self, meta: dict[str, Any] | None = None) -> Graph:
        """The finished :class:`Graph` (not validated: call ``.validate()`` once)."""
        if not self._variables and self._params:
            raise GraphError("bad_builder", "call optimizer() before build()")
        return Graph(self.name, self._tensors.values(), self._ops, self._variables, meta)
