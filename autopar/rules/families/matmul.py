"""Matrix multiplies: ``matmul``, ``batch_matmul``, ``broadcast_matmul``, their fused
and gradient forms.

For ``out[m, n] = sum_k a[m, k] * b[k, n]`` the 1-D signatures are (Megatron's
column- and row-parallel linear layers are the second and third)::

    (S(m), B)     -> S(m)     split rows of a
    (B, S(n))     -> S(n)     split columns of b            column-parallel
    (S(k), S(k))  -> P        split the contracted dim      row-parallel
    (P, B)        -> P        linear in a
    (B, P)        -> P        linear in b
    (B, B)        -> B

where ``m``, ``k``, ``n`` are the dims of each operand after ``transpose_a`` /
``transpose_b``; batch dims add ``(S(i), S(i)) -> S(i)`` (both operands carry
the dim) or ``(S(i), B) -> S(i)`` (``b`` broadcast over it).  An optional
``_add_to_output`` input takes the output's SBP.

FLOPs are logical, for the whole op: ``2 * numel(out) * K`` with ``K`` the
contracted length (``2 * M * N * K`` per batch); the cost model divides by the
number of devices that share the work.
"""

from __future__ import annotations

import math

from autopar.ir.sbp import B, P, SbpValue, Split
from autopar.rules.families._common import PortMap, partial_ok, port_map, sig
from autopar.rules.registry import CostKind, OneDSignature, RuleContext, register

__all__ = ["MATMUL_OPS", "matmul_flops"]

MATMUL_OPS = ("matmul", "batch_matmul", "broadcast_matmul")


def _layout(ctx: RuleContext, pm: PortMap) -> tuple[int, int, int, int, int, int]:
    """(a_m, a_k, b_k, b_n, a_ndim, b_ndim) of the two operands after transposes."""
    a = pm.input("a")
    b = pm.input("b")
    if a is None or b is None:
        raise ValueError(f"op {ctx.op.name!r} ({ctx.op.type}) needs inputs a_0 and b_0")
    ta, tb = bool(ctx.attr("transpose_a", False)), bool(ctx.attr("transpose_b", False))
    na, nb = a.ndim, b.ndim
    a_m, a_k = (na - 1, na - 2) if ta else (na - 2, na - 1)
    b_k, b_n = (nb - 1, nb - 2) if tb else (nb - 2, nb - 1)
    return a_m, a_k, b_k, b_n, na, nb


def matmul_flops(ctx: RuleContext) -> float:
    """Logical FLOPs of a matmul-like op: ``2 * numel(out) * K``.

    Units: floating-point operations for the whole (unsplit) op.  ``K`` is the
    contracted length: ``a``'s ``k`` dim for ``matmul`` / ``batch_matmul`` /
    ``broadcast_matmul``, ``x``'s last dim for ``fused_matmul_bias``, and the
    product of ``a``'s leading dims (batch x rows, all summed) for
    ``broadcast_matmul_grad_b``.  Source: a GEMM of ``M x K`` by ``K x N`` does
    ``M*N*K`` multiply-adds = ``2*M*N*K`` FLOPs (Kaplan et al. 2020, sec. 2.1).
    """
    out = ctx.outputs[0]
    t = ctx.op.type
    if t == "broadcast_matmul_grad_b":
        pm = port_map(ctx, ("a", "b"))
        a = pm.input("a") or ctx.inputs[0]
        k = math.prod(a.shape[:-1])
    elif t == "fused_matmul_bias":
        pm = port_map(ctx, ("x", "weight", "bias"))
        x = pm.input("x") or ctx.inputs[0]
        k = x.shape[-1]
    else:
        pm = port_map(ctx, ("a", "b"))
        _, a_k, _, _, _, _ = _layout(ctx, pm)
        a_spec = pm.input("a")
        assert a_spec is not None  # _layout checked it
        k = a_spec.shape[a_k]
    return 2.0 * out.numel * k


@register(*MATMUL_OPS, cost=CostKind.MATMUL, flops=matmul_flops)
def matmul(ctx: RuleContext) -> list[OneDSignature]:
    """``(S(m), B) -> S(m)``, ``(B, S(n)) -> S(n)``, ``(S(k), S(k)) -> P``, ``(P, B) -> P``,
    ``(B, P) -> P``, ``(B, B) -> B``, plus batch-dim splits ``(S(i), S(i)|B) -> S(i)``."""
    pm = port_map(ctx, ("a", "b", "_add_to_output"), ("out",))
    a_m, a_k, b_k, b_n, na, nb = _layout(ctx, pm)
    out_nd = ctx.outputs[0].ndim
    a = pm.input("a")
    b = pm.input("b")
    assert a is not None and b is not None

    def mk(av: SbpValue, bv: SbpValue, ov: SbpValue) -> OneDSignature:
        return sig(pm, {"a": av, "b": bv, "_add_to_output": ov}, {"out": ov})

    sigs = [
        mk(Split(a_m), B, Split(out_nd - 2)),
        mk(B, Split(b_n), Split(out_nd - 1)),
        mk(B, B, B),
    ]
    # Batch dims: out's leading dims, aligned to the right with a's and b's.
    for i in range(out_nd - 2):
        ai = i - (out_nd - na)
        bi = i - (out_nd - nb)
        a_full = 0 <= ai < na - 2 and a.shape[ai] == ctx.outputs[0].shape[i]
        b_full = 0 <= bi < nb - 2 and b.shape[bi] == ctx.outputs[0].shape[i]
        if not (a_full or b_full):
            continue
        sigs.append(mk(Split(ai) if a_full else B, Split(bi) if b_full else B, Split(i)))
    if partial_ok(*ctx.outputs):
        sigs.append(mk(Split(a_k), Split(b_k), P))
        if partial_ok(a, b):
            sigs += [mk(P, B, P), mk(B, P, P)]
    return sigs


@register("broadcast_matmul_grad_b", cost=CostKind.MATMUL, flops=matmul_flops)
def broadcast_matmul_grad_b(ctx: RuleContext) -> list[OneDSignature]:
    """``out[k, n] = sum over a's leading dims of a[..., k] * b[..., n]``.

    Splitting any leading (batch or row) dim of both gives ``P`` (the weight
    gradient of a data-parallel linear layer); ``(S(last), B) -> S(0)``,
    ``(B, S(last)) -> S(1)``, ``(B, B) -> B``.  No partial-sum input: OneFlow
    0.9's ``BroadcastMatmulGradBOp::GetSbp`` (``matmul_op.cpp``) has no
    ``(P, B)`` / ``(B, P)`` signature and refuses them when pinned (observed:
    "Empty sbp signature after filtering" for ``((B, B), (P, P)) -> (P, P)``).
    """
    pm = port_map(ctx, ("a", "b", "_add_to_output"), ("out",))
    a = pm.input("a")
    b = pm.input("b")
    if a is None or b is None:
        raise ValueError(f"op {ctx.op.name!r} (broadcast_matmul_grad_b) needs a_0 and b_0")

    def mk(av: SbpValue, bv: SbpValue, ov: SbpValue) -> OneDSignature:
        return sig(pm, {"a": av, "b": bv, "_add_to_output": ov}, {"out": ov})

    sigs = [
        mk(Split(a.ndim - 1), B, Split(0)),
        mk(B, Split(b.ndim - 1), Split(1)),
        mk(B, B, B),
    ]
    if partial_ok(*ctx.outputs):
        for i in range(min(a.ndim, b.ndim) - 1):
            if a.shape[i] == b.shape[i]:
                sigs.append(mk(Split(i), Split(i), P))
    return sigs


@register("fused_matmul_bias", cost=CostKind.MATMUL, flops=matmul_flops)
def fused_matmul_bias(ctx: RuleContext) -> list[OneDSignature]:
    """``out = x @ weight^T + bias`` with ``weight`` ``[N, K]`` (OneFlow's Linear layout).

    Rows of ``x``: ``(S(i), B, B) -> S(i)``; column-parallel ``(B, S(0), S(0)) -> S(last)``;
    row-parallel ``(S(last), S(1), P) -> P`` (the bias is added once: ``P``);
    ``(P, B, P) -> P``, ``(B, P, P) -> P``, ``(B, B, B) -> B``.
    """
    pm = port_map(ctx, ("x", "weight", "bias", "_add_to_output"), ("out",))
    x = pm.input("x")
    if x is None:
        raise ValueError(f"op {ctx.op.name!r} (fused_matmul_bias) needs an input x_0")
    last = x.ndim - 1

    def mk(xv: SbpValue, wv: SbpValue, bv: SbpValue, ov: SbpValue) -> OneDSignature:
        return sig(pm, {"x": xv, "weight": wv, "bias": bv, "_add_to_output": ov}, {"out": ov})

    sigs = [mk(Split(i), B, B, Split(i)) for i in range(last)]
    sigs += [mk(B, Split(0), Split(0), Split(last)), mk(B, B, B, B)]
    if partial_ok(*ctx.outputs):
        sigs.append(mk(Split(last), Split(1), P, P))
        if partial_ok(*ctx.inputs):
            sigs += [mk(P, B, P, P), mk(B, P, P, P)]
    return sigs
