"""Shape checks of the op families: an op whose input and output shapes disagree is refused.

A sharding rule reads the shapes it needs (a matmul's ``m``, ``k`` and ``n``) but does not
prove them consistent: a matmul of ``[8, 32, 63]`` by ``[64, 64]`` or a reshape of 16,384
elements to 8,704 would be planned and priced as if they were real.  Each family here says
what its shapes must satisfy; :func:`autopar.rules.check.check_graph_rules` runs the check
of every op (once per alike op) and refuses the first that fails with
:class:`autopar.errors.GraphError` ``shape_mismatch``, naming the op and the dims.

==========================  =====================================================
family                      invariant
==========================  =====================================================
matmul, batch_matmul,       ``a``'s contracted dim equals ``b``'s; the output is
broadcast_matmul            ``batch x m x n``, batch dims broadcast (numpy rules)
broadcast_matmul_grad_b     ``a`` and ``b`` agree but for their last dims; the
                            output is ``[a.last, b.last]``
fused_matmul_bias           ``x[..., k] @ weight[n, k]^T + bias[n]`` is ``[..., n]``
reshape, flatten, ...       as many elements out as in
unary ops, their grads      the output has the input's shape (grads: ``dy`` too)
broadcast binary ops        the output is the inputs broadcast (numpy rules)
any op with a ``shape``     its output has that shape (``-1``: a dim left to infer);
attr (reshape, variable,    graph outputs excepted (:data:`SHAPE_ATTR_EXEMPT`)
input, constant ...)
==========================  =====================================================

Op types not listed are checked by their sharding rule alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from autopar.ir.graph import Op, TensorSpec
from autopar.rules.families._common import port_map
from autopar.rules.families.elementwise import BROADCAST_OPS, LINEAR_UNARY_OPS, UNARY_GRAD_OPS, UNARY_OPS
from autopar.rules.families.matmul import MATMUL_OPS
from autopar.rules.families.views import RESHAPE_OPS
from autopar.rules.registry import RuleContext

__all__ = ["SHAPE_ATTR", "SHAPE_CHECKS", "broadcast_shape", "shape_attr_problem", "shape_problem"]

ShapeCheck = Callable[[RuleContext], str | None]
"""What is wrong with an op's shapes (a sentence naming the dims), or None."""


def broadcast_shape(*shapes: Sequence[int]) -> tuple[int, ...] | None:
    """The numpy broadcast of ``shapes`` (aligned on the right; a dim of 1 stretches), or None."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        dims = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0} - {1}
        if len(dims) > 1:
            return None
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def _matmul(ctx: RuleContext) -> str | None:
    pm = port_map(ctx, ("a", "b", "_add_to_output"), ("out",))
    a, b, out = pm.input("a"), pm.input("b"), ctx.outputs[0] if ctx.outputs else None
    if a is None or b is None or out is None or a.ndim < 2 or b.ndim < 2:
        return "needs inputs a and b of at least 2 dims and an output"
    ta, tb = bool(ctx.attr("transpose_a", False)), bool(ctx.attr("transpose_b", False))
    m, k = (a.shape[-1], a.shape[-2]) if ta else (a.shape[-2], a.shape[-1])
    k_b, n = (b.shape[-1], b.shape[-2]) if tb else (b.shape[-2], b.shape[-1])
    if k != k_b:
        return f"contracts a's dim of {k} with b's of {k_b} (a {list(a.shape)}, b {list(b.shape)})"
    batch = broadcast_shape(a.shape[:-2], b.shape[:-2])
    want = None if batch is None else (*batch, m, n)
    if want != tuple(out.shape):
        return f"gives {list(out.shape)} from a {list(a.shape)} and b {list(b.shape)}; expected " + (
            f"{list(want)}" if want is not None else "batch dims that broadcast"
        )
    return None


def _matmul_grad_b(ctx: RuleContext) -> str | None:
    pm = port_map(ctx, ("a", "b", "_add_to_output"), ("out",))
    a, b = pm.input("a"), pm.input("b")
    if a is None or b is None or not ctx.outputs:
        return "needs inputs a and b and an output"
    out = ctx.outputs[0]
    if a.shape[:-1] != b.shape[:-1] or tuple(out.shape) != (a.shape[-1], b.shape[-1]):
        return (
            f"gives {list(out.shape)} from a {list(a.shape)} and b {list(b.shape)}; expected a and b "
            "alike but for their last dims and the output [a.last, b.last]"
        )
    return None


def _fused_matmul_bias(ctx: RuleContext) -> str | None:
    pm = port_map(ctx, ("x", "weight", "bias"), ("out",))
    x, w = pm.input("x"), pm.input("weight")
    if x is None or w is None or w.ndim != 2 or not ctx.outputs:
        return "needs x, a 2-dim weight and an output"
    out = ctx.outputs[0]
    if x.shape[-1] != w.shape[1] or tuple(out.shape) != (*x.shape[:-1], w.shape[0]):
        return (
            f"gives {list(out.shape)} from x {list(x.shape)} and weight {list(w.shape)} "
            "(x[..., k] @ weight[n, k]^T)"
        )
    return None


def _same_elements(ctx: RuleContext) -> str | None:
    """Every port holds as many elements (a reshape's input, output and ``like``)."""
    if not ctx.inputs or not ctx.outputs:
        return "needs an input and an output"
    counts = {tuple(t.shape): math.prod(t.shape) for t in (*ctx.inputs, *ctx.outputs)}
    if len(set(counts.values())) > 1:
        shapes = ", ".join(f"{list(s)} ({n} elements)" for s, n in counts.items())
        return f"reshapes between {shapes}"
    return None


def _same_shape(ctx: RuleContext) -> str | None:
    shapes = {tuple(t.shape) for t in (*ctx.inputs, *ctx.outputs)}
    if len(shapes) > 1:
        return f"has tensors of shapes {sorted(list(s) for s in shapes)} where one shape belongs"
    return None


def _broadcast(ctx: RuleContext) -> str | None:
    if not ctx.outputs:
        return "needs an output"
    want = broadcast_shape(*(t.shape for t in ctx.inputs))
    out = tuple(ctx.outputs[0].shape)
    if want != out:
        inputs = [list(t.shape) for t in ctx.inputs]
        return f"gives {list(out)} from inputs {inputs}, which broadcast to " + (
            f"{list(want)}" if want is not None else "nothing (mismatched dims)"
        )
    return None


SHAPE_CHECKS: dict[str, ShapeCheck] = {
    **dict.fromkeys(MATMUL_OPS, _matmul),
    "broadcast_matmul_grad_b": _matmul_grad_b,
    "fused_matmul_bias": _fused_matmul_bias,
    **dict.fromkeys(RESHAPE_OPS, _same_elements),
    **dict.fromkeys(("reshape_like",), _same_elements),
    **dict.fromkeys((*UNARY_OPS, *LINEAR_UNARY_OPS, *UNARY_GRAD_OPS), _same_shape),
    **dict.fromkeys(BROADCAST_OPS, _broadcast),
}
"""Op type -> its family's shape check."""


SHAPE_ATTR = "shape"
"""The attr by which an op states the shape of what it produces (a reshape's target, a
variable's or an input's shape)."""
SHAPE_ATTR_EXEMPT = frozenset({"output"})
"""Op types whose ``shape`` attr is not the tensor the op holds: a graph output's is the
value the job returns (under gradient accumulation, K packed micro-batch values)."""


def shape_attr_problem(op: Op, outputs: Sequence[TensorSpec]) -> str | None:
    """What makes ``op``'s ``shape`` attr disagree with its output tensor, or None: the attr
    must be a list of dims with the output's rank and dims (``-1``: a dim left to infer)."""
    if SHAPE_ATTR not in op.attrs or op.type in SHAPE_ATTR_EXEMPT or len(outputs) != 1:
        return None
    stated = op.attrs[SHAPE_ATTR]
    out = outputs[0]
    if not isinstance(stated, list) or not all(
        isinstance(d, int | float) and not isinstance(d, bool) and float(d).is_integer() for d in stated
    ):
        return f"attr {SHAPE_ATTR!r} is {str(stated)[:80]}, not a list of integer dims"
    dims = [int(d) for d in stated]
    if len(dims) != len(out.shape) or any(d not in (-1, n) for d, n in zip(dims, out.shape, strict=True)):
        return f"attr {SHAPE_ATTR!r} {dims} disagrees with its output {out.name!r} of shape {list(out.shape)}"
    return None


def shape_problem(ctx: RuleContext) -> str | None:
    """What is wrong with the shapes of ``ctx.op`` (its family's check), or None."""
    check = SHAPE_CHECKS.get(ctx.op.type)
    return check(ctx) if check is not None else None
