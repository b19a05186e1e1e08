"""SBP algebra: split / broadcast / partial-sum values, N-D SBPs and op signatures.

Vocabulary: an *axis* is a mesh axis, a *dim* is a tensor dim.

* ``S(d)``: the tensor is split along tensor dim ``d`` over a mesh axis;
* ``B``: broadcast (every device of the axis holds the whole tensor);
* ``P``: partial sum (every device holds an addend of the tensor).

An :class:`NdSbp` holds one value per mesh axis and prints like ``(S(0), B)``;
a 1-D SBP prints as its single value (``S(0)``).  A :class:`Signature` gives the
N-D SBP of every input and output port of an op and prints like
``(S(0), B) -> S(0)`` (inputs in port order; several outputs are parenthesised).

Every printed form parses back with :func:`parse_sbp`, :func:`parse_nd_sbp` and
:func:`parse_signature`; tests and plans use these strings.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Union

__all__ = [
    "B",
    "Broadcast",
    "NdSbp",
    "P",
    "Partial",
    "S",
    "SbpValue",
    "Signature",
    "Split",
    "balanced_sizes",
    "data_parallel_axes",
    "is_even",
    "local_shape",
    "nd",
    "parse_nd_sbp",
    "parse_sbp",
    "parse_signature",
    "shard_numel",
]


def data_parallel_axes(sbp: NdSbp) -> tuple[int, ...]:
    """Mesh axes on which a variable laid out as ``sbp`` is replicated (``B``)."""
    return tuple(i for i, v in enumerate(sbp) if isinstance(v, Broadcast))


@dataclass(frozen=True, slots=True)
class Split:
    """``S(dim)``: split along tensor dim ``dim``."""

    dim: int

    def __str__(self) -> str:
        return f"S({self.dim})"

    def __repr__(self) -> str:
        return f"Split(dim={self.dim})"


@dataclass(frozen=True, slots=True)
class Broadcast:
    """``B``: replicated on every device of the axis."""

    def __str__(self) -> str:
        return "B"

    def __repr__(self) -> str:
        return "Broadcast()"


@dataclass(frozen=True, slots=True)
class Partial:
    """``P``: every device holds an addend; the tensor is their sum."""

    def __str__(self) -> str:
        return "P"

    def __repr__(self) -> str:
        return "Partial()"


SbpValue = Union[Split, Broadcast, Partial]  # noqa: UP007 - a runtime alias on Python 3.10

B = Broadcast()
P = Partial()


def S(dim: int) -> Split:
    """Return ``S(dim)``."""
    if dim < 0:
        raise ValueError(f"S(dim) needs dim >= 0, got {dim}")
    return Split(dim)


@dataclass(frozen=True, slots=True)
class NdSbp:
    """One SBP value per mesh axis."""

    values: tuple[SbpValue, ...]
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError("an N-D SBP needs at least one mesh axis")
        object.__setattr__(self, "_hash", hash(self.values))

    def __hash__(self) -> int:
        # cached: N-D SBPs key every boxing and cost table lookup
        return self._hash

    def __str__(self) -> str:
        if len(self.values) == 1:
            return str(self.values[0])
        return "(" + ", ".join(str(v) for v in self.values) + ")"

    def __repr__(self) -> str:
        return f"NdSbp{self!s}" if len(self.values) > 1 else f"NdSbp({self!s})"

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, axis: int) -> SbpValue:
        return self.values[axis]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.values)

    def replace(self, axis: int, value: SbpValue) -> NdSbp:
        """Return a copy with mesh axis ``axis`` set to ``value``."""
        vals = list(self.values)
        vals[axis] = value
        return NdSbp(tuple(vals))

    @property
    def has_partial(self) -> bool:
        return any(isinstance(v, Partial) for v in self.values)

    def split_factor(self, mesh_shape: Sequence[int]) -> int:
        """Number of pieces the tensor is cut into (product of split axes' sizes)."""
        factor = 1
        for value, size in zip(self.values, mesh_shape):
            if isinstance(value, Split):
                factor *= size
        return factor

    def fits(self, shape: Sequence[int], mesh_shape: Sequence[int]) -> bool:
        """True if OneFlow accepts this layout of a tensor of ``shape`` (:func:`local_shape`)."""
        return local_shape(shape, self, mesh_shape) is not None


def nd(*values: SbpValue) -> NdSbp:
    """Shorthand: ``nd(S(0), B)`` is the 2-D SBP ``(S(0), B)``."""
    return NdSbp(tuple(values))


def balanced_sizes(size: int, parts: int) -> tuple[int, ...]:
    """The part sizes when OneFlow's ``BalancedSplitter`` cuts ``size`` into ``parts``.

    The first ``size % parts`` parts get ``size // parts + 1`` elements, the others
    ``size // parts`` (``oneflow/core/common/balanced_splitter.cpp``; e.g. 17 into 2:
    9, 8).  Units: elements.
    """
    base, extra = divmod(size, parts)
    return tuple(base + 1 if i < extra else base for i in range(parts))


def local_shape(shape: Sequence[int], sbp: NdSbp, mesh_shape: Sequence[int]) -> tuple[int, ...] | None:
    """Per-device shape of a tensor of logical ``shape`` laid out as ``sbp``: the largest shard.

    Returns ``None`` when OneFlow 0.9 refuses the layout.  The one place autopar
    decides split legality, as OneFlow does (``Storage4NdSbp`` /
    ``FilterNdSbpByLogicalShape``, ``oneflow/core/framework/sbp_infer_util.cpp``):
    going through the mesh axes in order, a split dim must exist and its size
    (floor-divided by the earlier axes splitting it) must be at least the axis
    size.  Splits need not divide: OneFlow cuts with ``BalancedSplitter``
    (:func:`balanced_sizes`), so the largest shard has ``ceil(dim / n)`` rows
    per split, nested ceils being the ceil of the product.  Units: elements per dim.
    """
    if len(sbp) != len(mesh_shape):
        raise ValueError(f"SBP {sbp} has {len(sbp)} axes but the mesh has {len(mesh_shape)}")
    floor = list(shape)
    local = list(shape)
    for value, size in zip(sbp.values, mesh_shape):
        if isinstance(value, Split):
            if value.dim >= len(local) or floor[value.dim] < size:
                return None
            floor[value.dim] //= size
            local[value.dim] = -(-local[value.dim] // size)
    return tuple(local)


def is_even(shape: Sequence[int], sbp: NdSbp, mesh_shape: Sequence[int]) -> bool:
    """True when every split of ``sbp`` divides ``shape`` evenly (all shards the same size)."""
    factors = [1] * len(shape)
    for value, size in zip(sbp.values, mesh_shape):
        if isinstance(value, Split):
            if value.dim >= len(shape):
                return False
            factors[value.dim] *= size
    return all(d % f == 0 for d, f in zip(shape, factors))


def shard_numel(shape: Sequence[int], sbp: NdSbp, mesh_shape: Sequence[int]) -> float:
    """Elements of the largest shard of a tensor of ``shape`` laid out as ``sbp``.

    ``numel / split_factor`` when every split divides (the same float as before uneven
    splits were allowed), else the product of :func:`local_shape` (``ceil(dim / n)``
    per split dim: ``BalancedSplitter``'s first part).  The device holding it sets
    the peak memory and the time.  Raises ``ValueError`` for a layout OneFlow refuses.
    """
    if is_even(shape, sbp, mesh_shape):
        return math.prod(shape) / sbp.split_factor(mesh_shape)
    local = local_shape(shape, sbp, mesh_shape)
    if local is None:
        raise ValueError(f"layout {sbp} is not one of shape {list(shape)} on mesh {list(mesh_shape)}")
    return float(math.prod(local))


@dataclass(frozen=True, slots=True)
class Signature:
    """N-D SBP of every input and output port of an op, in port order."""

    inputs: tuple[NdSbp, ...]
    outputs: tuple[NdSbp, ...]

    def __str__(self) -> str:
        ins = "(" + ", ".join(str(s) for s in self.inputs) + ")"
        if len(self.outputs) == 1:
            outs = str(self.outputs[0])
        else:
            outs = "(" + ", ".join(str(s) for s in self.outputs) + ")"
        return f"{ins} -> {outs}"

    def __repr__(self) -> str:
        return f"Signature({self!s})"


# ---------------------------------------------------------------- parsing

_VALUE_RE = re.compile(r"\s*(S\(\s*(\d+)\s*\)|B|P)\s*")


def parse_sbp(text: str) -> SbpValue:
    """Parse ``S(0)``, ``B`` or ``P``."""
    m = _VALUE_RE.fullmatch(text)
    if not m:
        raise ValueError(f"not an SBP value: {text!r} (expected S(d), B or P)")
    if m.group(2) is not None:
        return Split(int(m.group(2)))
    return B if m.group(1) == "B" else P


def _split_top_level(text: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    tail = "".join(current)
    if tail.strip():
        parts.append(tail)
    return [p.strip() for p in parts]


def _strip_parens(text: str) -> str | None:
    text = text.strip()
    if not (text.startswith("(") and text.endswith(")")):
        return None
    depth = 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and i != len(text) - 1:
            return None
    return text[1:-1]


def parse_nd_sbp(text: str) -> NdSbp:
    """Parse ``(S(0), B)`` or a 1-D ``S(0)``."""
    inner = _strip_parens(text)
    if inner is None:
        return NdSbp((parse_sbp(text),))
    return NdSbp(tuple(parse_sbp(p) for p in _split_top_level(inner)))


def parse_signature(text: str, ndim: int | None = None) -> Signature:
    """Parse ``(S(0), B) -> S(0)`` (N-D ports in parentheses, outputs too when several).

    ``ndim`` (the number of mesh axes) resolves ``(S(0), B)`` on the right-hand
    side: two 1-D outputs when ``ndim == 1``, one 2-D output otherwise.
    """
    if "->" not in text:
        raise ValueError(f"not a signature: {text!r} (expected 'INPUTS -> OUTPUTS')")
    left, right = (t.strip() for t in text.split("->", 1))
    inner = _strip_parens(left)
    if inner is None:
        raise ValueError(f"signature inputs must be parenthesised: {left!r}")
    inputs = tuple(parse_nd_sbp(p) for p in _split_top_level(inner))
    right_inner = _strip_parens(right)
    parts = _split_top_level(right_inner) if right_inner is not None else []
    if ndim is None:
        ndim = len(inputs[0]) if inputs else None
    several = len(parts) > 1 and (ndim == 1 or all(_strip_parens(p) is not None for p in parts))
    if right_inner is not None and not right_inner.strip():
        return Signature(inputs, ())
    outputs = tuple(parse_nd_sbp(p) for p in parts) if several else (parse_nd_sbp(right),)
    return Signature(inputs, outputs)


def all_values(ndim: int, *, partial: bool = True) -> Iterable[SbpValue]:
    """Every 1-D SBP value for a tensor of ``ndim`` dims."""
    yield B
    if partial:
        yield P
    for d in range(ndim):
        yield Split(d)
