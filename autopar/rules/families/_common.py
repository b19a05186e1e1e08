"""Helpers shared by the op families: find ports by OneFlow name, build 1-D signatures.

Port names in the IR are OneFlow's blob names with an index (``a_0``, ``in_1``,
``model_diff_0``); a rule speaks of the *base* name (``a``, ``in``,
``model_diff``).  OneFlow stores an op's inputs in a protobuf map, so importers
may list ports in any order: rules therefore look ports up by name and
:func:`sig` writes each SBP into the position the op actually uses.

When none of an op's ports carry a name the rule knows (a hand-built graph that
calls its ports ``x`` and ``y`` for a ``matmul``), the names the rule declares
are matched by position instead, in OneFlow's declaration order.

Every function here is pure: it reads the :class:`RuleContext` and returns new
values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autopar.ir.graph import TensorSpec
from autopar.ir.ports import base_name
from autopar.ir.sbp import B, SbpValue, Split
from autopar.rules.registry import OneDSignature, RuleContext

__all__ = [
    "FLOAT_DTYPES",
    "PortMap",
    "all_splits",
    "base_name",
    "broadcast_dim_map",
    "is_float",
    "norm_dim",
    "norm_dims",
    "partial_ok",
    "port_map",
    "reshape_dim_map",
    "sig",
    "uniform",
]

FLOAT_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})
"""Dtypes whose values may be held as partial sums (``P``)."""


def _resolve(actual: Sequence[str], declared: Sequence[str]) -> tuple[str, ...]:
    bases = tuple(base_name(p) for p in actual)
    if not declared or any(b in declared for b in bases):
        return bases
    # No port carries a known name: fall back to OneFlow's declaration order.
    return tuple(declared[i] if i < len(declared) else b for i, b in enumerate(bases))


@dataclass(frozen=True)
class PortMap:
    """Base name and full name of every input and output port, in the op's port order."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    input_ports: tuple[str, ...]
    output_ports: tuple[str, ...]
    input_specs: tuple[TensorSpec, ...]
    output_specs: tuple[TensorSpec, ...]

    def has_input(self, name: str) -> bool:
        return name in self.inputs

    def has_output(self, name: str) -> bool:
        return name in self.outputs

    def input(self, name: str) -> TensorSpec | None:
        """Spec of the first input port called ``name`` (base name), or None if absent."""
        for base, spec in zip(self.inputs, self.input_specs, strict=True):
            if base == name:
                return spec
        return None

    def output(self, name: str) -> TensorSpec | None:
        """Spec of the first output port called ``name`` (base name), or None if absent."""
        for base, spec in zip(self.outputs, self.output_specs, strict=True):
            if base == name:
                return spec
        return None


def port_map(ctx: RuleContext, inputs: Sequence[str] = (), outputs: Sequence[str] = ()) -> PortMap:
    """Index ``ctx``'s ports by base name.

    ``inputs`` / ``outputs`` are the names the rule knows, in OneFlow's
    declaration order (used only when no actual port carries one of them).
    """
    in_ports = tuple(ctx.op.inputs)
    out_ports = tuple(ctx.op.outputs)
    return PortMap(
        inputs=_resolve(in_ports, inputs),
        outputs=_resolve(out_ports, outputs),
        input_ports=in_ports,
        output_ports=out_ports,
        input_specs=tuple(ctx.inputs),
        output_specs=tuple(ctx.outputs),
    )


def _lookup(values: Mapping[str, SbpValue], full: str, base: str, default: SbpValue) -> SbpValue:
    if full in values:
        return values[full]
    return values.get(base, default)


def sig(
    pm: PortMap,
    inputs: Mapping[str, SbpValue],
    outputs: Mapping[str, SbpValue],
    default: SbpValue = B,
    out_default: SbpValue | None = None,
) -> OneDSignature:
    """A 1-D signature in the op's port order.

    ``inputs`` / ``outputs`` map a full port name (``in_1``) or a base name
    (``in``, covering every ``in_*`` port) to an SBP value; ports not named get
    ``default`` (outputs: ``out_default`` when given).
    """
    out_fill = default if out_default is None else out_default
    in_pairs = zip(pm.input_ports, pm.inputs, strict=True)
    out_pairs = zip(pm.output_ports, pm.outputs, strict=True)
    ins = tuple(_lookup(inputs, full, base, default) for full, base in in_pairs)
    outs = tuple(_lookup(outputs, full, base, out_fill) for full, base in out_pairs)
    return ins, outs


def uniform(ctx: RuleContext, value: SbpValue) -> OneDSignature:
    """Every port of ``ctx`` takes ``value``."""
    return tuple(value for _ in ctx.inputs), tuple(value for _ in ctx.outputs)


def all_splits(ndim: int) -> list[Split]:
    """``S(0) ... S(ndim-1)``."""
    return [Split(d) for d in range(ndim)]


def norm_dim(dim: int, ndim: int) -> int:
    """Turn a possibly negative dim into ``0 <= dim < ndim`` (``ndim`` 0 counts as 1)."""
    n = max(ndim, 1)
    return dim + n if dim < 0 else dim


def norm_dims(dims: Sequence[int] | int | None, ndim: int) -> list[int]:
    """Normalise a dim list; ``None`` or an empty list means every dim (OneFlow's reduce)."""
    if dims is None:
        return list(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    if len(dims) == 0:
        return list(range(ndim))
    return sorted({norm_dim(int(d), ndim) for d in dims})


def is_float(spec: TensorSpec | None) -> bool:
    return spec is not None and spec.dtype in FLOAT_DTYPES


def partial_ok(*specs: TensorSpec | None) -> bool:
    """True when every given tensor can be a partial sum (floating point)."""
    return all(is_float(s) for s in specs if s is not None)


def broadcast_dim_map(shape: Sequence[int], full: Sequence[int]) -> dict[int, int]:
    """Numpy broadcasting: full dim -> dim of ``shape`` that holds it unbroadcast.

    ``shape`` is aligned to the right of ``full``; a missing dim or a size-1 dim
    under a larger full dim is broadcast and does not appear in the map.
    """
    offset = len(full) - len(shape)
    out: dict[int, int] = {}
    for j, size in enumerate(full):
        i = j - offset
        if 0 <= i < len(shape) and shape[i] == size:
            out[j] = i
    return out


def reshape_dim_map(in_shape: Sequence[int], out_shape: Sequence[int]) -> dict[int, int]:
    """Input dim -> output dim such that ``S(in)`` on the input is ``S(out)`` on the output.

    Both shapes are cut into the smallest blocks of consecutive dims with equal
    products (size-1 dims ignored).  Splitting a block's *leading* dim into n
    contiguous pieces splits the flattened block into the same n pieces on both
    sides, so only leading dims map (``[B*S, H] -> [B, S, H]`` maps 0 -> 0, not
    S); divisibility of both leading dims is checked later by ``local_shape``.
    Returns ``{}`` when the element counts differ.
    """
    ins = [(i, s) for i, s in enumerate(in_shape) if s != 1]
    outs = [(j, s) for j, s in enumerate(out_shape) if s != 1]
    if math.prod(in_shape) != math.prod(out_shape):
        return {}
    mapping: dict[int, int] = {}
    a = b = 0
    while a < len(ins) and b < len(outs):
        lead_in, lead_out = ins[a][0], outs[b][0]
        pa, pb = ins[a][1], outs[b][1]
        a += 1
        b += 1
        while pa != pb:
            if pa < pb:
                if a >= len(ins):
                    return mapping
                pa *= ins[a][1]
                a += 1
            else:
                if b >= len(outs):
                    return mapping
                pb *= outs[b][1]
                b += 1
        mapping[lead_in] = lead_out
    return mapping
