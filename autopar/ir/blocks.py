"""Blocks of a training graph (its transformer layers) and the op groups inside them.

* :func:`layer_of` -- the block (module scope) an op belongs to, from its dotted name;
* :func:`op_groups` -- the forward op groups of each block, found from the graph's structure
  (op types and tensor shapes, not names), each a unit a runtime may fuse into one kernel or
  a plan may recompute apart from its block:

  ==================  ============================================================  =========
  group               forward ops                                                   Megatron
  ==================  ============================================================  =========
  ``attention_core``  from a ``batch_matmul`` making scores ``[.., sq, sk]`` through  core
                      every op on scores-shaped tensors (scale, mask or bias add,     attention
                      softmax, casts, dropout) to the ``batch_matmul`` reading them
  ``mlp_activation``  an activation (GeLU, fast GeLU, ReLU, SiLU) and the gated       MLP
                      product that multiplies it                                     activation
  ``norm``            a layer norm or RMS norm                                       layernorm
  ``dropout``         a dropout outside the attention core                           --
  ==================  ============================================================  =========

  (the last column: Megatron-Core's names for its selective recompute modules,
  ``--recompute-modules``, megatron/core/transformer/transformer_config.py);
* :func:`attention_backward_ops` -- the backward ops of each attention core: the ones that
  read or write a tensor of its scores' shape.

A group is named ``<block>::<group>`` (:func:`group_unit`); a unit is a block or a group.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from autopar.ir.graph import Graph, Op, Role

__all__ = [
    "ACTIVATION_OPS",
    "GROUPS",
    "TOP_LEVEL",
    "UNIT_SEPARATOR",
    "attention_backward_ops",
    "group_unit",
    "layer_of",
    "op_groups",
    "split_unit",
]

TOP_LEVEL = "(top level)"
"""Layer of ops whose name has no dot (graph inputs such as ``input_ids``)."""

UNIT_SEPARATOR = "::"
"""Between a block and a group in a unit's name: ``layers.3::attention_core``."""

GROUPS = ("attention_core", "mlp_activation", "norm", "dropout")
"""The op groups of a block, in the order :func:`op_groups` looks for them."""

ACTIVATION_OPS = frozenset({"gelu", "fast_gelu", "gelu_tanh", "relu", "silu", "quick_gelu"})
"""Element-wise MLP activations."""
_GATE_OPS = frozenset({"broadcast_mul", "mul", "multiply"})
_NORM_OPS = frozenset({"layer_norm", "rms_norm", "fused_rms_norm", "skip_layer_norm", "skip_rms_norm"})
_DROPOUT_OPS = frozenset({"dropout"})


def layer_of(op_name: str) -> str:
    """The layer (module scope) of an op, from its dotted name.

    Up to the first numeric component when there is one (``decoder.layers.1.mlp.wo``
    -> ``decoder.layers.1``; OneFlow names an op ``<scope>-<type>-<id>``, so
    ``model.h.0-add_n-40``, the residual add of block ``model.h.0``, -> ``model.h.0``); else
    the first component (``encoder.final_norm.weight.cast`` -> ``encoder``,
    ``shared.weight`` -> ``shared``); ``(top level)`` for a name without dots (graph inputs
    such as ``input_ids``).
    """
    parts = op_name.split(".")
    if len(parts) == 1:
        return TOP_LEVEL
    for i, part in enumerate(parts):
        scope = part.split("-", 1)[0]
        if scope.isdigit():
            return ".".join([*parts[:i], scope])
    return parts[0]


def group_unit(block: str, group: str) -> str:
    """``layers.3`` and ``attention_core`` -> ``layers.3::attention_core``."""
    return f"{block}{UNIT_SEPARATOR}{group}"


def split_unit(unit: str) -> tuple[str, str | None]:
    """``layers.3::attention_core`` -> ``("layers.3", "attention_core")``; a block ->
    ``(block, None)``."""
    block, sep, group = unit.partition(UNIT_SEPARATOR)
    return (block, group) if sep else (unit, None)


def op_groups(graph: Graph, blocks: Iterable[str]) -> dict[str, str]:
    """Forward op name -> its group unit (:func:`group_unit`), for the ops of ``blocks`` that
    belong to a group (module docstring).  An op is in at most one group: the attention core
    first, then the MLP activation, norms and dropouts."""
    wanted = frozenset(blocks)
    forward: dict[str, list[Op]] = defaultdict(list)
    for op in graph.topological_order:
        if op.role is Role.FORWARD:
            block = layer_of(op.name)
            if block in wanted:
                forward[block].append(op)
    out: dict[str, str] = {}
    for block, ops in forward.items():
        for group, members in (
            ("attention_core", _attention_cores(graph, ops)),
            ("mlp_activation", _mlp_activations(graph, ops)),
            ("norm", [op.name for op in ops if op.type in _NORM_OPS]),
            ("dropout", [op.name for op in ops if op.type in _DROPOUT_OPS]),
        ):
            for name in members:
                out.setdefault(name, group_unit(block, group))
    return out


def _attention_cores(graph: Graph, ops: list[Op]) -> list[str]:
    """The attention-core ops among one block's forward ops (module docstring)."""
    in_block = {op.name for op in ops}
    members: list[str] = []
    for op in ops:
        if op.type != "batch_matmul" or op.name in members:
            continue
        shape = graph.tensors[next(iter(op.outputs.values()))].shape
        found = _core_from(graph, op, shape, in_block)
        if found:
            members.extend(found)
    return members


def _core_from(graph: Graph, scores: Op, shape: tuple[int, ...], in_block: set[str]) -> list[str]:
    """The core that starts at ``scores``: every forward op of the block reached from it along
    tensors of ``shape``, when one of them is a ``batch_matmul`` that reads such a tensor and
    makes another shape (the attention over the values); else empty."""
    if len(shape) < 3:
        return []
    seen = [scores.name]
    closing: str | None = None
    frontier = list(scores.outputs.values())
    while frontier:
        tensor = frontier.pop()
        for consumer, _ in graph.consumers.get(tensor, []):
            op = graph.op_by_name[consumer]
            if consumer in seen or consumer not in in_block or op.role is not Role.FORWARD:
                continue
            outs = [graph.tensors[t].shape for t in op.outputs.values()]
            if op.type == "batch_matmul" and all(s != shape for s in outs):
                closing = closing or consumer
                seen.append(consumer)
                continue
            if outs and all(s == shape or len(s) < len(shape) for s in outs):
                seen.append(consumer)
                frontier.extend(t for t in op.outputs.values() if graph.tensors[t].shape == shape)
    return seen if closing is not None else []


def _mlp_activations(graph: Graph, ops: list[Op]) -> list[str]:
    """Activations, and the gated product that multiplies one by another tensor of its shape."""
    members: list[str] = []
    for op in ops:
        if op.type not in ACTIVATION_OPS:
            continue
        members.append(op.name)
        out = next(iter(op.outputs.values()))
        for consumer, _ in graph.consumers.get(out, []):
            gate = graph.op_by_name[consumer]
            shapes = {graph.tensors[t].shape for t in gate.inputs.values()}
            if gate.type in _GATE_OPS and gate.role is Role.FORWARD and len(shapes) == 1:
                members.append(consumer)
    return members


def attention_backward_ops(graph: Graph, groups: dict[str, str]) -> dict[str, str]:
    """Backward op name -> the attention-core unit whose backward it is: a backward op of the
    core's block that reads or writes a tensor of the core's scores shape (the gradients of
    the probabilities and scores, and the products that read them)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for name, unit in groups.items():
        if unit.endswith(UNIT_SEPARATOR + "attention_core") and unit not in shapes:
            op = graph.op_by_name[name]
            shapes[unit] = graph.tensors[next(iter(op.outputs.values()))].shape
    by_block = {split_unit(unit)[0]: (unit, shape) for unit, shape in shapes.items()}
    out: dict[str, str] = {}
    for op in graph.ops:
        if op.role is not Role.BACKWARD:
            continue
        found = by_block.get(layer_of(op.name))
        if found is None:
            continue
        unit, shape = found
        tensors = [*op.inputs.values(), *op.outputs.values()]
        if any(graph.tensors[t].shape == shape for t in tensors):
            out[op.name] = unit
    return out
