"""Op rules: which N-D SBP signatures an op accepts, and how much work it does.

A rule is registered once per op family::

    @register("relu", "gelu", "tanh", cost=CostKind.MEMORY)
    def elementwise(ctx: RuleContext) -> list[OneDSignature]:
        ...

and returns the **1-D** signatures valid on one mesh axis: for each input port
(in port order) and each output port, an SBP value.  For example ``matmul``
(``C = A @ B``, no transposes) returns::

    ((S(0), B), (S(0),))    # split rows of A            (S(0), B) -> S(0)
    ((B, S(1)), (S(1),))    # split columns of B         (B, S(1)) -> S(1)
    ((S(1), S(0)), (P,))    # split the contracted dim   (S(1), S(0)) -> P
    ((P, B), (P,))          # linear in A                (P, B) -> P
    ((B, P), (P,))          # linear in B                (B, P) -> P
    ((B, B), (B,))          # replicate                  (B, B) -> B

:func:`nd_signatures` takes the Cartesian product over mesh axes and keeps only
products where every port's layout is one OneFlow accepts (:func:`autopar.ir.sbp.local_shape`:
a split dim at least as long as the axes cutting it; uneven splits are cut by
OneFlow's ``BalancedSplitter``).  A rule may also return full N-D signatures by setting
``nd=True`` at registration (used by optimizer ops whose layout depends on the
variable's whole N-D SBP).

An op type with no rule gets :func:`fallback_signatures` (every port ``B``) and is
reported in the plan's diagnostics; planning never crashes on it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from autopar.ir.graph import DTYPE_BYTES, Op, TensorSpec
from autopar.ir.optimizer import model_port_index
from autopar.ir.sbp import B, NdSbp, SbpValue, Signature, Split, is_even, local_shape

__all__ = [
    "CostKind",
    "OneDSignature",
    "Rule",
    "RuleContext",
    "RuleSet",
    "axis_product",
    "default_rules",
    "fallback_signatures",
    "nd_signatures",
    "planning_signatures",
    "register",
]

OneDSignature = tuple[tuple[SbpValue, ...], tuple[SbpValue, ...]]


class CostKind(str, Enum):
    """How an op's compute time is modelled."""

    MATMUL = "matmul"  # FLOPs / (peak * matmul_efficiency)
    MEMORY = "memory"  # bytes read + written / (memory bandwidth * memory_efficiency)
    FREE = "free"  # views, variables, ticks: no time
    RECEIVE = "receive"  # a pipeline stage's receive: bytes of its layout / link (costs.receive_time)


@dataclass(frozen=True)
class RuleContext:
    """What a rule sees: the op, its input and output tensors, the mesh shape, the ZeRO stage."""

    op: Op
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    mesh_shape: tuple[int, ...]
    zero_stage: int = 0
    zero_sharding: str = "all_axes"
    """``all_axes`` or ``one_axis``: where ZeRO shards a replicated parameter
    (:class:`autopar.runtimes.profile.ZeroSharding`)."""
    gather_dtype: str | None = None
    """An optimizer op's: the dtype its parameter's ZeRO gather moves (the forward's copy,
    :func:`autopar.cost.zero_gathers.zero_gather_dtype`); None: the parameter's own dtype."""

    @property
    def attrs(self) -> dict[str, Any]:
        return self.op.attrs

    def attr(self, name: str, default: Any = None) -> Any:
        return self.op.attrs.get(name, default)


RuleFn = Callable[[RuleContext], Sequence[Any]]
FlopsFn = Callable[[RuleContext], float]
FitsFn = Callable[[RuleContext, Signature], bool]


@dataclass(frozen=True)
class Rule:
    """One op family: its signature function, cost kind and optional FLOP count."""

    name: str
    fn: RuleFn
    cost: CostKind
    flops: FlopsFn | None = None
    nd: bool = False
    fits: FitsFn | None = None
    """An op-specific test each N-D signature must also pass (e.g. ``reshape``'s: a split of
    unequal dims must divide); None: only :func:`autopar.ir.sbp.local_shape`'s."""


@dataclass
class RuleSet:
    """op type -> :class:`Rule`.  Build with :func:`default_rules` or register your own."""

    rules: dict[str, Rule] = field(default_factory=dict)

    def register(
        self,
        *op_types: str,
        cost: CostKind = CostKind.MEMORY,
        flops: FlopsFn | None = None,
        nd: bool = False,
        fits: FitsFn | None = None,
    ) -> Callable[[RuleFn], RuleFn]:
        def deco(fn: RuleFn) -> RuleFn:
            for t in op_types:
                if t in self.rules:
                    raise ValueError(f"op type {t!r} already has rule {self.rules[t].name!r}")
                self.rules[t] = Rule(fn.__name__, fn, cost, flops, nd, fits)
            return fn

        return deco

    def get(self, op_type: str) -> Rule | None:
        return self.rules.get(op_type)

    def __contains__(self, op_type: str) -> bool:
        return op_type in self.rules


_DEFAULT: RuleSet | None = None


def register(
    *op_types: str,
    cost: CostKind = CostKind.MEMORY,
    flops: FlopsFn | None = None,
    nd: bool = False,
    fits: FitsFn | None = None,
) -> Callable[[RuleFn], RuleFn]:
    """Register a rule in the default rule set (used by the modules in ``autopar.rules``)."""
    return _registry().register(*op_types, cost=cost, flops=flops, nd=nd, fits=fits)


def _registry() -> RuleSet:
    # The default set is filled once, when ``autopar.rules`` imports the family
    # modules (this module's package, so imported before anyone can call
    # default_rules()); it is never mutated after that.
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = RuleSet()
    return _DEFAULT


def default_rules() -> RuleSet:
    """The rule set covering OneFlow's MT5 / GPT / BERT training jobs."""
    return _registry()


def fallback_signatures(ctx: RuleContext) -> list[Signature]:
    """Safe rule for unknown ops: every port ``B`` on every axis."""
    bcast = NdSbp(tuple(B for _ in ctx.mesh_shape))
    return [Signature(tuple(bcast for _ in ctx.inputs), tuple(bcast for _ in ctx.outputs))]


def _fits(ctx: RuleContext, sig: Signature) -> bool:
    for spec, sbp in zip((*ctx.inputs, *ctx.outputs), (*sig.inputs, *sig.outputs)):
        if local_shape(spec.shape, sbp, ctx.mesh_shape) is None:
            return False
    return True


def nd_signatures(rule: Rule, ctx: RuleContext) -> list[Signature]:
    """All valid N-D signatures of ``ctx.op`` under ``rule`` (deduplicated, ordered)."""
    raw = rule.fn(ctx)
    if rule.nd:
        sigs = [s for s in raw if isinstance(s, Signature)]
    else:
        one_d: list[OneDSignature] = list(dict.fromkeys(raw))
        n_in, n_out = len(ctx.inputs), len(ctx.outputs)
        for ins, outs in one_d:
            if len(ins) != n_in or len(outs) != n_out:
                raise ValueError(
                    f"rule {rule.name!r} gave {len(ins)} inputs / {len(outs)} outputs for op "
                    f"{ctx.op.name!r} ({ctx.op.type}) with {n_in} / {n_out}"
                )
        sigs = axis_product(one_d, n_in, n_out, len(ctx.mesh_shape))
    out = [s for s in dict.fromkeys(sigs) if _fits(ctx, s)]
    if rule.fits is not None:
        out = [s for s in out if rule.fits(ctx, s)]
    return out


def axis_product(one_d: Sequence[OneDSignature], n_in: int, n_out: int, n_axes: int) -> list[Signature]:
    """Every N-D signature taking one of ``one_d`` on each of ``n_axes`` mesh axes, in
    ``itertools.product`` order (what :func:`nd_signatures` does for a 1-D rule)."""
    sigs = []
    for combo in itertools.product(one_d, repeat=n_axes):
        ins_nd = tuple(NdSbp(tuple(c[0][i] for c in combo)) for i in range(n_in))
        outs_nd = tuple(NdSbp(tuple(c[1][i] for c in combo)) for i in range(n_out))
        sigs.append(Signature(ins_nd, outs_nd))
    return sigs


def planning_signatures(ctx: RuleContext, sigs: Sequence[Signature]) -> list[Signature]:
    """The signatures the planner searches: those of ``sigs`` whose every split divides
    evenly (:func:`autopar.ir.sbp.is_even`); all of ``sigs`` when none does.

    OneFlow accepts uneven splits (:func:`autopar.ir.sbp.local_shape`), so plans OneFlow
    infers are evaluated with them, but the planner keeps its search space to even
    layouts: an uneven shard leaves devices idle for its difference, and the options
    it adds (e.g. 12 heads over 8 devices) grow the search for little.
    """
    model = model_port_index(ctx.op)
    if model is not None:
        # an optimizer update: its parameter's layout is the choice; where OneFlow's ZeRO then
        # shards the gradient and states unevenly, it does (``IsSplitValid``: floor division)
        spec = ctx.inputs[model]
        even = [s for s in sigs if is_even(spec.shape, s.inputs[model], ctx.mesh_shape)]
        return even or list(sigs)
    specs = (*ctx.inputs, *ctx.outputs)
    even = [
        s
        for s in sigs
        if all(is_even(spec.shape, sbp, ctx.mesh_shape) for spec, sbp in zip(specs, (*s.inputs, *s.outputs)))
    ]
    return even or list(sigs)


def work_share(sig: Signature, mesh_shape: Sequence[int]) -> int:
    """Devices sharing an op's work: product of the sizes of axes on which some port is split.

    An axis where every port is ``B`` or ``P`` repeats the full work on each device.
    """
    share = 1
    for axis, size in enumerate(mesh_shape):
        if any(isinstance(s[axis], Split) for s in (*sig.inputs, *sig.outputs)):
            share *= size
    return share


def tensor_bytes(spec: TensorSpec) -> int:
    return math.prod(spec.shape) * DTYPE_BYTES.get(spec.dtype, 4)
