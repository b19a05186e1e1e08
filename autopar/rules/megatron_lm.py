"""The rules of Megatron-LM's runtime: OneFlow's rules plus its vocab-parallel cross-entropy.

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
``(S(last), S(last)) -> S(last)``.  The ``[b, s]`` all-reduces happen inside the op
and are not priced (``s x h`` / ``s`` times smaller than the activation all-reduces;
the same convention as ``sparse_softmax_cross_entropy``'s vocab split in
:mod:`autopar.rules.families.loss` and Megatron-LM's hand count in
``benchmarks/heldout_truth.py``).  Only plans of the ``megatron`` baseline are
built and evaluated with these rules (:func:`rules_for_source`); autopar's own plans,
which OneFlow must compile, never get them.
"""

from __future__ import annotations

import dataclasses
from functools import cache

from autopar.rules.families import nn
from autopar.rules.families._common import port_map, sig
from autopar.rules.registry import OneDSignature, RuleContext, RuleSet, default_rules
from autopar.sbp import Split

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


@cache
def megatron_lm_rules() -> RuleSet:
    """:func:`default_rules` with Megatron-LM's vocab-parallel ``log_softmax`` (module docstring)."""
    rules = dict(default_rules().rules)
    for op_type, fn in (
        ("log_softmax", vocab_parallel_log_softmax),
        ("log_softmax_grad", vocab_parallel_log_softmax_grad),
    ):
        rules[op_type] = dataclasses.replace(rules[op_type], name=fn.__name__, fn=fn)
    return RuleSet(rules)


def rules_for_source(source: str) -> RuleSet:
    """The rules a plan of ``source`` is built and evaluated with: Megatron-LM's for the
    ``megatron`` baseline, OneFlow's (:func:`default_rules`) for every other plan."""
    return megatron_lm_rules() if source == MEGATRON_SOURCE else default_rules()
