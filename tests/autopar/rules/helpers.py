"""Build rule contexts for one op and list its signatures by printed form."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from autopar.ir.graph import Op, TensorSpec
from autopar.ir.sbp import Signature, local_shape
from autopar.rules import Rule, RuleContext, default_rules, nd_signatures

PortSpec = Sequence[int] | tuple[Sequence[int], str]


def _spec(name: str, value: Any, dtype: str) -> TensorSpec:
    """``value`` is a shape, or ``(shape, dtype)``."""
    if len(value) == 2 and isinstance(value[1], str):
        return TensorSpec(name, tuple(value[0]), value[1])
    return TensorSpec(name, tuple(value), dtype)


def make_ctx(
    op_type: str,
    inputs: Mapping[str, PortSpec],
    outputs: Mapping[str, PortSpec],
    attrs: Mapping[str, Any] | None = None,
    mesh: Sequence[int] = (4, 2),
    zero_stage: int = 0,
    dtype: str = "float16",
) -> RuleContext:
    """A context for one op; ports map name -> shape or (shape, dtype)."""
    in_specs = [_spec(f"t_{p}", v, dtype) for p, v in inputs.items()]
    out_specs = [_spec(f"t_{p}", v, dtype) for p, v in outputs.items()]
    op = Op(
        name=f"{op_type}_op",
        type=op_type,
        inputs={p: s.name for p, s in zip(inputs, in_specs, strict=True)},
        outputs={p: s.name for p, s in zip(outputs, out_specs, strict=True)},
        attrs=dict(attrs or {}),
    )
    return RuleContext(op, tuple(in_specs), tuple(out_specs), tuple(mesh), zero_stage)


def rule_for(op_type: str) -> Rule:
    rule = default_rules().get(op_type)
    assert rule is not None, f"no rule for {op_type!r}"
    return rule


def flops(ctx: RuleContext) -> float:
    fn = rule_for(ctx.op.type).flops
    assert fn is not None, f"{ctx.op.type} has no FLOP count"
    return fn(ctx)


def signatures(ctx: RuleContext) -> list[Signature]:
    return nd_signatures(rule_for(ctx.op.type), ctx)


def printed(ctx: RuleContext) -> set[str]:
    return {str(s) for s in signatures(ctx)}


def assert_all_fit(ctx: RuleContext) -> list[Signature]:
    """Every offered signature gives every port an even local shape; returns them."""
    sigs = signatures(ctx)
    assert sigs, f"{ctx.op.type}: no signature offered"
    specs = (*ctx.inputs, *ctx.outputs)
    for s in sigs:
        for spec, sbp in zip(specs, (*s.inputs, *s.outputs), strict=True):
            assert local_shape(spec.shape, sbp, ctx.mesh_shape) is not None, (
                f"{ctx.op.type}: {s} does not fit {spec.name} {spec.shape}"
            )
    assert len({str(s) for s in sigs}) == len(sigs), f"{ctx.op.type}: duplicate signatures"
    return sigs


def replicated(ctx: RuleContext) -> str:
    """Printed form of the all-``B`` signature of ``ctx``."""
    b = "(" + ", ".join("B" for _ in ctx.mesh_shape) + ")" if len(ctx.mesh_shape) > 1 else "B"
    ins = "(" + ", ".join(b for _ in ctx.inputs) + ")"
    outs = b if len(ctx.outputs) == 1 else "(" + ", ".join(b for _ in ctx.outputs) + ")"
    return f"{ins} -> {outs}"


def partial_outputs(ctx: RuleContext) -> list[Signature]:
    return [s for s in signatures(ctx) if any(o.has_partial for o in s.outputs)]
