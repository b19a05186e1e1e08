"""What autopar knows about optimizer update ops: their ports and the state they keep.

The one place that reads an optimizer op's ports.  OneFlow's update ops
(``adam_update``, ``sgd_update`` ...) take the parameter (``model``), its
gradient (``model_diff``), an optional low-precision copy (``model_copy``),
scalars, and the optimizer states (``m``, ``v`` ...), which OneFlow keeps as
hidden variables that a serialized graph does not list as tensors.  Port names
carry an index suffix (``model_0``), stripped with
:func:`autopar.rules.registry.base_name`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from autopar.ir.graph import Graph, Op, Role
from autopar.ir.ports import base_name

__all__ = [
    "IN_PLACE_PORTS",
    "OPTIMIZER_OPS",
    "SCALAR_PORTS",
    "grad_port_index",
    "model_port_index",
    "parameter_sources",
    "state_count",
    "weight_gradient_path",
]

OPTIMIZER_OPS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "adam_update": (
        "model", "model_diff", "model_copy", "learning_rate", "scale_by_tensor", "skip_if",
        "bias_correction1", "bias_correction2", "m", "v", "max_v",
    ),
    "sgd_update": (
        "model", "model_diff", "model_copy", "learning_rate", "scale_by_tensor", "skip_if",
    ),
    "momentum_update": (
        "model", "model_diff", "momentum", "learning_rate", "scale_by_tensor", "skip_if",
    ),
    "adagrad_update": (
        "model", "model_diff", "learning_rate", "scale_by_tensor", "skip_if", "train_step",
        "sum",
    ),
    "rmsprop_update": (
        "model", "model_diff", "learning_rate", "scale_by_tensor", "skip_if", "mean_square",
        "mean_gradient",
    ),
    "ftrl_update": ("model", "model_diff", "learning_rate", "skip_if", "accumulate", "z"),
    "adadelta_update": (
        "model", "model_diff", "learning_rate", "skip_if", "square_avgs", "acc_deltas",
    ),
    "lamb_update": (
        "model", "model_diff", "learning_rate", "scale_by_tensor", "skip_if",
        "bias_correction1", "bias_correction2", "m", "v",
    ),
    "lars_update": (
        "model", "model_diff", "learning_rate", "momentum", "scale_by_tensor", "skip_if",
    ),
})  # fmt: skip
"""Optimizer ops and their inputs in OneFlow's declaration order."""

SCALAR_PORTS = frozenset(
    {"learning_rate", "scale_by_tensor", "skip_if", "bias_correction1", "bias_correction2", "train_step"}
)
"""Inputs that are scalars (always ``B``)."""

IN_PLACE_PORTS = frozenset({"model", "m", "v", "momentum", "max_v"})
"""Inputs the update writes in place: they must keep the variable's layout."""

_NOT_STATE = frozenset({"model", "model_diff", "model_copy"}) | SCALAR_PORTS


def grad_port_index(op: Op) -> int:
    """Index of the gradient input (``model_diff``); 0 when the op has none."""
    for i, port in enumerate(op.inputs):
        if base_name(port) == "model_diff":
            return i
    return 0


def model_port_index(op: Op) -> int | None:
    """Index of the parameter input (``model``), or None."""
    for i, port in enumerate(op.inputs):
        if base_name(port) == "model":
            return i
    return None


def state_count(op_type: str, attrs: Mapping[str, object]) -> int:
    """Optimizer state tensors kept per parameter element (each of the parameter's dtype).

    Adam: ``m`` and ``v`` (and ``max_v`` with ``amsgrad``); momentum: 1; SGD: 0.
    Source: OneFlow ``oneflow/core/job_rewriter/adam_optm.cpp`` and friends,
    which create one hidden variable per state, shaped and typed like the parameter.
    """
    ports = OPTIMIZER_OPS.get(op_type, ())
    states = [p for p in ports if p not in _NOT_STATE]
    if op_type == "adam_update" and not attrs.get("amsgrad", False):
        states = [p for p in states if p != "max_v"]
    return len(states)


_PASS_THROUGH = ("cast", "identity", "amp_white_identity", "parallel_cast", "hierarchical_parallel_cast")


def parameter_sources(graph: Graph) -> dict[str, str]:
    """Tensor -> variable op, for every variable tensor and its casts / identities."""
    source: dict[str, str] = {v.tensor: v.op for v in graph.variables}
    for op in graph.topological_order:
        if op.type in _PASS_THROUGH and len(op.inputs) == 1:
            (t,) = op.inputs.values()
            if t in source:
                for o in op.outputs.values():
                    source[o] = source[t]
    return source


def weight_gradient_path(graph: Graph) -> frozenset[str]:
    """Tensors on a weight gradient's way to its optimizer.

    From each variable's gradient back through its producers while the tensor
    keeps the parameter's shape (casts, clipping, the ``add_n`` of a
    parameter's uses, the weight-gradient matmul's output), never into the forward pass
    (a ``[tokens, width]`` activation may have a square weight's shape).  Boxing on these
    tensors is the data-parallel gradient reduction that frameworks bucket and
    overlap with the backward pass.
    """
    source = parameter_sources(graph)
    path: set[str] = set()
    for v in graph.variables:
        if not v.grad:
            continue
        shape = graph.tensors[v.grad].shape
        stack = [v.grad]
        while stack:
            t = stack.pop()
            if t in path or t in source or graph.tensors[t].shape != shape:
                continue
            prod = graph.op_by_name[graph.producer[t][0]]
            if prod.role is Role.FORWARD:
                continue  # an activation that happens to have the parameter's shape (tokens = width)
            path.add(t)
            stack.extend(prod.inputs.values())
    return frozenset(path)
