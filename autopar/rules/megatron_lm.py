"""The rules of Megatron-LM's runtime: OneFlow's, its vocab-parallel cross-entropy and fused-linear layout.

The ``megatron`` baseline (:mod:`autopar.baselines`) is a claim about what
Megatron-LM runs, not about what OneFlow can compile.  One of its kernels has no
OneFlow signature: a log-softmax over a vocabulary split across the
tensor-parallel ranks.  OneFlow 0.9's ``log_softmax`` splits only the dims before
the normalised one (``oneflow/user/ops/log_softmax_op.cpp``, ``GetSbp``: ``FOR_RANGE(axis,
0, NumAxes() - 1)``), so a composite cross-entropy (``log_softmax`` then ``nll``, what
``flow.nn.functional.cross_entropy`` builds) of a vocab-split head gathers the logits.
Megatron-LM's ``_VocabParallelCrossEntropy``
(``megatron/core/tensor_parallel/cross_entropy.py``) keeps them split: each rank
takes the max of its vocabulary slice and all-reduces it (MAX), subtracts it,
all-reduces the sum of the exponentials (SUM) and the target's logit (SUM, masked to
the rank that owns the target), all three of ``[b, s]`` floats; its backward is
``softmax - one_hot`` on each rank's slice, no communication.

:func:`megatron_lm_rules` is :func:`autopar.rules.default_rules` with that kernel:
``log_softmax`` also offers ``(S(last)) -> S(last)`` and ``log_softmax_grad``
``(S(last), S(last)) -> S(last)``.  And Megatron-LM's layout of a fused projection: its
``query_key_value`` (``key_value``, a SwiGLU ``dense_h_to_4h``) holds on each rank that
rank's share of every part, so a column split of the fused output is a split by heads
of q, k and v: ``reshape`` of ``[..., k*h*d]`` to ``[..., k, h, d]`` maps ``S(last)`` to the
heads dim (:func:`fused_heads_reshape`, timm's ``qkv``), and a ``narrow`` of one of ``k``
equal parts keeps ``S(last)`` (:func:`fused_part_narrow`, HF GPT-2's ``c_attn`` split).
The cross-entropy's ``[b, s]`` all-reduces happen inside the op and are not priced
(``h`` times smaller than the activation all-reduces; the same convention as
``sparse_softmax_cross_entropy``'s vocab split in :mod:`autopar.rules.families.loss`
and Megatron-LM's hand count in ``benchmarks/heldout_truth.py``).  Only plans of the ``megatron`` baseline are
built and evaluated with these rules (:func:`rules_for_source`); autopar's own plans,
which OneFlow must compile, never get them.
"""

from __future__ import annotations

import dataclasses
from functools import cache

from autopar.ir.sbp import P, Split
from autopar.rules.families import nn, views
from autopar.rules.families._common import partial_ok, port_map, sig, uniform
from autopar.rules.registry import OneDSignature, RuleContext, RuleSet, default_rules

__all__ = ["MEGATRON_SOURCE", "megatron_lm_rules", "rules_for_source"]

MEGATRON_SOURCE = "baseline:megatron"
"""The ``Plan.source`` of the ``megatron`` baseline's plans."""


def vocab_parallel_log_softmax(ctx: RuleContext) -> list[OneDSignature]:
    """OneFlow's ``log_softmax`` signatures plus ``(S(last)) -> S(last)`` (Megatron-LM's
    ``_VocabParallelCrossEntropy`` forward: max, sum of exponentials all-reduced inside)."""
    last = ctx.outputs[0].ndim - 1
    pm = port_map(ctx, ("in",), ("prob",))
    return [*nn.softmax(ctx), sig(pm, {"in": Split(last)}, {"prob": Split(last)})]


def vocab_parallel_log_softmax_grad(ctx: RuleContext) -> list[OneDSignature]:
    """OneFlow's ``log_softmax_grad`` signatures plus ``(S(last), S(last)) -> S(last)``
    (Megatron-LM's backward: ``softmax - one_hot`` on each rank's vocabulary slice)."""
    last = ctx.outputs[0].ndim - 1
    pm = port_map(ctx, ("prob", "dy"), ("dx",))
    return [*nn.softmax_grad(ctx), sig(pm, {"prob": Split(last), "dy": Split(last)}, {"dx": Split(last)})]


FUSED_PROJECTIONS = (2, 3)
"""Projections a fused linear's output holds per head: key and value, or query, key and value."""


def _fused_heads_dims(fused: tuple[int, ...], merged: tuple[int, ...]) -> tuple[int, int] | None:
    """(dim of ``merged``, dim of ``fused``) when ``fused`` is ``merged`` with its last dim
    written as ``[projections, heads, head_dim]`` (projections 2 or 3): the merged last dim
    and the heads dim; None otherwise."""
    lead = len(merged) - 1
    if len(fused) != lead + 3 or fused[:lead] != merged[:lead]:
        return None
    projections, heads, head_dim = fused[lead:]
    if projections not in FUSED_PROJECTIONS or projections * heads * head_dim != merged[lead]:
        return None
    return lead, lead + 1


def fused_heads_reshape(ctx: RuleContext) -> list[OneDSignature]:
    """OneFlow's ``reshape`` signatures plus, for a fused projection's output ``[..., k*h*d]``
    viewed as ``[..., k, h, d]`` (``k`` 2 or 3: timm's ``qkv``), ``(S(last)) -> S(heads)``
    and back.  Megatron-LM lays a fused ``query_key_value`` (``key_value``) out so that a
    tensor-parallel rank's slice of the output dim holds its own heads' q, k and v
    (``ParallelAttention``: ``mixed_x_layer.view(sq, b, np, 3 * hn)``; checkpoint
    converters permute a ``[3, heads, head_dim]`` weight into that order), so its
    column split is a split by heads."""
    x, y = ctx.inputs[0].shape, ctx.outputs[0].shape
    sigs = list(views.reshape(ctx))
    split = _fused_heads_dims(y, x)
    if split is not None:
        sigs.append(((Split(split[0]),), (Split(split[1]),)))
    merge = _fused_heads_dims(x, y)
    if merge is not None:
        sigs.append(((Split(merge[1]),), (Split(merge[0]),)))
    return sigs


def fused_part_narrow(ctx: RuleContext) -> list[OneDSignature]:
    """OneFlow's ``narrow`` / ``narrow_grad`` signatures plus, for one of ``k`` (2 or 3) equal
    parts of the last dim (``flow.split`` of HF GPT-2's fused ``c_attn`` output into q, k,
    v; a SwiGLU fc1 chunked into gate and up), ``S(last)`` in and out (``narrow_grad``:
    ``dy`` and ``like`` too).  Megatron-LM's fused column-parallel linear holds on each
    rank its share of every part (``query_key_value`` by heads; ``dense_h_to_4h`` with
    ``--swiglu``, chunked per rank), so each part stays split where the whole was."""
    sigs = list(views.slice_like(ctx))
    whole = ctx.outputs[0].shape if ctx.op.type == "narrow_grad" else ctx.inputs[0].shape
    last = len(whole) - 1
    dim, length, start = (int(ctx.attr(a, -1)) for a in ("dim", "length", "start"))
    if dim % len(whole) != last or length <= 0 or start % length != 0:
        return sigs
    if whole[last] // length in FUSED_PROJECTIONS and whole[last] % length == 0:
        sigs.append(uniform(ctx, Split(last)))
    return sigs


def norm_weight_grad_of_partial(ctx: RuleContext) -> list[OneDSignature]:
    """OneFlow's ``layer_norm_param_grad`` / ``rms_norm_param_grad`` signatures plus
    ``dy`` ``P`` ``-> P`` (the weight gradient is linear in ``dy``).  Megatron-LM's norm
    backward reads the activation gradient after its one all-reduce
    (``copy_to_tensor_model_parallel_region``'s backward), and the norm's input gradient
    and weight gradient share that one all-reduce; a per-edge model charges each consumer
    of a partial tensor its own all-reduce, so the weight gradient reads the partial sum
    and the all-reduce is charged once, on the input-gradient path.  OneFlow 0.9 does not
    offer it (``LayerNormParamGradOp::GetSbp``: row splits only), so autopar's own plans
    never get it."""
    layer_norm = ctx.op.type == "layer_norm_param_grad"
    sigs = list(nn.layer_norm_param_grad(ctx) if layer_norm else nn.rms_norm_param_grad(ctx))
    declared: tuple[str, ...] = ("dy", "x", "mean", "inv_variance") if layer_norm else ("dy", "x", "inv_rms")
    if partial_ok(*ctx.outputs):
        sigs.append(sig(port_map(ctx, declared), {"dy": P}, {}, out_default=P))
    return sigs


@cache
def megatron_lm_rules() -> RuleSet:
    """:func:`default_rules` with Megatron-LM's vocab-parallel ``log_softmax`` (module docstring)."""
    rules = dict(default_rules().rules)
    for op_type, fn in (
        ("log_softmax", vocab_parallel_log_softmax),
        ("log_softmax_grad", vocab_parallel_log_softmax_grad),
        ("reshape", fused_heads_reshape),
        ("narrow", fused_part_narrow),
        ("narrow_grad", fused_part_narrow),
        ("layer_norm_param_grad", norm_weight_grad_of_partial),
        ("rms_norm_param_grad", norm_weight_grad_of_partial),
    ):
        rules[op_type] = dataclasses.replace(rules[op_type], name=fn.__name__, fn=fn)
    return RuleSet(rules)


def rules_for_source(source: str) -> RuleSet:
    """The rules a plan of ``source`` is built and evaluated with: Megatron-LM's for the
    ``megatron`` baseline, OneFlow's (:func:`default_rules`) for every other plan."""
    return megatron_lm_rules() if source == MEGATRON_SOURCE else default_rules()
