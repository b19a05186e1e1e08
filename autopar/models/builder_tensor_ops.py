"""Tensor ops of the graph builder: element-wise ops, views and matmuls, each with the
backward ops OneFlow's autograd emits for it (the tape; :mod:`autopar.models.builder`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from autopar.errors import GraphError
from autopar.models.builder_core import (
    BuilderCore,
    GradList,
    Param,
    Shape,
    _broadcast_axes,
    _broadcast_shape,
    _scalar_attrs,
)

__all__ = ["TensorOps"]


class TensorOps(BuilderCore):
    """Element-wise ops, views and matmuls (forward helpers that record their backward)."""

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
