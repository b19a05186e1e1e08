"""Per-device memory model: model states under ZeRO, and activation peak.

Model states (ZeRO paper, Rajbhandari et al. 2020, section 3 and figure 1).
Per parameter element a device keeps ``K_p`` bytes of parameter, ``K_g`` of
gradient and ``K_o`` of optimizer states.  By default they come from the
graph (:func:`graph_state_bytes`): ``K_p`` = the variable's dtype size, ``K_g``
= its gradient tensor's, ``K_o`` = the optimizer's state count times the
variable's dtype size (plus a float32 master copy when the variable itself is
half precision).  A OneFlow AMP graph (float32 variables, float16 compute)
gives 4 + 4 + 8; the low-precision working copies (one ``cast`` per parameter) are
then ordinary activations.  The ZeRO paper's mixed-precision policy
(:data:`MIXED_PRECISION_ADAM`: 2 + 2 + 12, working copy = the parameter) is
available explicitly.  With ``Psi`` parameters on a device after tensor
splitting and ``Nd`` data-parallel ranks:

==========  ========================================
ZeRO stage  bytes per device
==========  ========================================
0           (K_p + K_g + K_o) Psi
1           (K_p + K_g) Psi + K_o Psi / Nd
2           K_p Psi + (K_g + K_o) Psi / Nd
3           (K_p + K_g + K_o) Psi / Nd
==========  ========================================

ZeRO-3 gathers each parameter before its forward and again before its
backward use; the gathered copy is transient: :func:`zero3_gather_buffer_bytes`.

A variable's data-parallel axes are the mesh axes on which its SBP is ``B``:
the parameter is replicated there, so ZeRO shards its gradients and optimizer
states over them.  ``Nd`` is the product of those axes' sizes under the
``all_axes`` ZeRO sharding (``ideal`` runtime); OneFlow 0.9 (``one_axis``)
shards over one of them only, ``Nd`` = that axis's size (:func:`zero_dp_size`).

Activations: a tensor occupies ``bytes / split_factor`` per device (an uneven split:
its largest shard, OneFlow's ``BalancedSplitter``; :func:`shard_bytes`) from the op
that produces it to its last consumer in topological order (forward outputs
used by backward ops therefore stay alive through the forward pass).  The
activation peak is the maximum, over positions in the order, of the live bytes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from autopar.errors import ConfigError
from autopar.ir.graph import DTYPE_BYTES, Graph, Variable
from autopar.ir.optimizer import state_count
from autopar.ir.sbp import NdSbp, data_parallel_axes, local_shape, shard_numel

__all__ = [
    "FP32_ADAM",
    "MIXED_PRECISION_ADAM",
    "MemoryBreakdown",
    "Precision",
    "StateBytes",
    "activation_intervals",
    "boxed_copy_bytes",
    "graph_state_bytes",
    "model_state_bytes",
    "model_state_tensors",
    "shard_bytes",
    "zero3_gather_buffer_bytes",
    "zero_dp_size",
]


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter element of each model state."""

    param: int
    grad: int
    optimizer: int


MIXED_PRECISION_ADAM = StateBytes(param=2, grad=2, optimizer=12)
"""fp16 param + fp16 grad + fp32 (master, m, v): ZeRO paper's K = 12."""
FP32_ADAM = StateBytes(param=4, grad=4, optimizer=8)
"""fp32 param + fp32 grad + fp32 (m, v)."""


def graph_state_bytes(graph: Graph, variable: Variable) -> StateBytes:
    """Bytes per element of ``variable``'s parameter, gradient and optimizer states, from dtypes.

    ``param`` = the variable tensor's dtype size; ``grad`` = the gradient
    tensor's (0 when frozen); ``optimizer`` = states x the variable's dtype size
    (:func:`autopar.ir.optimizer.state_count`: Adam keeps ``m`` and ``v``), plus a
    float32 master copy (4 bytes) when the variable is half precision.  Units:
    bytes per element.  Source: OneFlow AMP keeps float32 variables and one
    hidden state variable per optimizer state, typed like the parameter.
    """
    param = DTYPE_BYTES[graph.tensors[variable.tensor].dtype]
    grad = DTYPE_BYTES[graph.tensors[variable.grad].dtype] if variable.grad else 0
    optimizer = 0
    if variable.optimizer:
        op = graph.op_by_name[variable.optimizer]
        optimizer = state_count(op.type, op.attrs) * param + (4 if param < 4 else 0)
    return StateBytes(param=param, grad=grad, optimizer=optimizer)


class Precision(str, Enum):
    MIXED = "mixed"
    FP32 = "fp32"

    @property
    def state_bytes(self) -> StateBytes:
        return MIXED_PRECISION_ADAM if self is Precision.MIXED else FP32_ADAM


@dataclass(frozen=True)
class MemoryBreakdown:
    """Per-device bytes."""

    params: float
    grads: float
    optimizer: float
    activations: float

    @property
    def model_states(self) -> float:
        return self.params + self.grads + self.optimizer

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations


def model_state_bytes(
    local_numel: float, dp_size: int, zero_stage: int, states: StateBytes = MIXED_PRECISION_ADAM
) -> tuple[float, float, float]:
    """(param, grad, optimizer) bytes per device for one variable.

    ``local_numel`` = Psi, the variable's elements on a device after its
    splits; ``dp_size`` = Nd, the product of its data-parallel axes' sizes.
    Formula: table in the module docstring (ZeRO paper, figure 1).
    """
    if zero_stage not in (0, 1, 2, 3):
        raise ConfigError("bad_zero_stage", f"ZeRO stage must be 0, 1, 2 or 3, got {zero_stage}")
    if dp_size < 1:
        raise ValueError(f"dp_size must be >= 1, got {dp_size}")
    nd = float(dp_size)
    param = states.param * local_numel
    grad = states.grad * local_numel
    opt = states.optimizer * local_numel
    if zero_stage >= 1:
        opt /= nd
    if zero_stage >= 2:
        grad /= nd
    if zero_stage >= 3:
        param /= nd
    return param, grad, opt


def zero_dp_size(
    shape: Sequence[int], sbp: NdSbp, mesh_shape: Sequence[int], zero_sharding: str = "all_axes"
) -> int:
    """``Nd``: over how many devices ZeRO shards a variable laid out as ``sbp``.

    ``all_axes``: the product of its data-parallel axes' sizes (ZeRO paper).
    ``data_axes`` (Megatron-LM's distributed optimizer): the same less the last axis of a
    mesh of two or more axes (the tensor-parallel group does not shard).
    ``one_axis`` (OneFlow 0.9): the factor by which OneFlow's ZeRO layout
    (:func:`autopar.rules.families.optimizer.oneflow_zero_shard`) splits it
    further -- the size of the one axis it shards, 1 when it shards none
    (also when a shard would keep fewer than OneFlow's ``shard_min_size``
    elements, :func:`autopar.runtimes.profile.parse_zero_sharding`).
    """
    from autopar.runtimes.profile import parse_zero_sharding

    if parse_zero_sharding(zero_sharding)[0] == "one_axis":
        from autopar.rules.families.optimizer import zero_shard

        if local_shape(shape, sbp, mesh_shape) is None:
            return 1
        sharded = zero_shard(shape, sbp, mesh_shape, zero_sharding)
        return sharded.split_factor(mesh_shape) // sbp.split_factor(mesh_shape)
    axes = data_parallel_axes(sbp)
    if parse_zero_sharding(zero_sharding)[0] == "data_axes" and len(mesh_shape) > 1:
        axes = tuple(a for a in axes if a != len(mesh_shape) - 1)  # Megatron-LM: not the tp axis
    return math.prod(mesh_shape[a] for a in axes)


def variable_state_bytes(
    shape: Sequence[int],
    sbp: NdSbp,
    mesh_shape: Sequence[int],
    zero_stage: int,
    states: StateBytes = MIXED_PRECISION_ADAM,
    zero_sharding: str = "all_axes",
) -> tuple[float, float, float]:
    """(param, grad, optimizer) bytes per device of a variable of ``shape`` laid out as ``sbp``.

    ``Nd`` = :func:`zero_dp_size` under ``zero_sharding`` (the runtime's
    :class:`autopar.runtimes.profile.ZeroSharding`).
    """
    local = shard_bytes(shape, 1, sbp, mesh_shape)
    dp = zero_dp_size(shape, sbp, mesh_shape, zero_sharding)
    return model_state_bytes(local, dp, zero_stage, states)


def model_state_tensors(graph: Graph, working_copy_is_state: bool = False) -> set[str]:
    """Tensors accounted as model states rather than activations.

    Variable tensors, gradient tensors, and the low-precision gradient that is
    cast into a gradient tensor.  With ``working_copy_is_state`` (the ZeRO
    paper's policy, where the fp16 parameter is the "2 Psi") the variables'
    direct casts too; by default they are activations, live from the cast to
    their last (backward) use, as OneFlow keeps them.
    """
    out: set[str] = set()
    var_tensors = {v.tensor for v in graph.variables}
    grads = {v.grad for v in graph.variables if v.grad}
    out |= var_tensors | grads
    for op in graph.ops:
        if op.type in ("cast", "amp_white_identity", "identity") and len(op.inputs) == 1:
            (src,) = op.inputs.values()
            if src in var_tensors and working_copy_is_state:
                out.update(op.outputs.values())
            if any(t in grads for t in op.outputs.values()):
                out.add(src)
    return out


def activation_intervals(
    graph: Graph, working_copy_is_state: bool = False, unmaterialized: frozenset[str] = frozenset()
) -> dict[str, tuple[int, int]]:
    """Tensor -> (first, last) position in the topological order where it is live.

    Live from its producer's position to its last consumer's (inclusive).
    Model-state tensors (see :func:`model_state_tensors`) are excluded, and so are the
    ``unmaterialized`` ones (made and used inside one fused kernel, never written to memory:
    :attr:`autopar.cost.fusion.Kernels.internal`).
    """
    order = graph.topological_order
    pos = {op.name: i for i, op in enumerate(order)}
    excluded = model_state_tensors(graph, working_copy_is_state)
    intervals: dict[str, tuple[int, int]] = {}
    for tname, (pname, _) in graph.producer.items():
        if tname in excluded or tname in unmaterialized:
            continue
        start = pos[pname]
        end = start
        for cname, _ in graph.consumers.get(tname, []):
            end = max(end, pos[cname])
        intervals[tname] = (start, end)
    return intervals


def shard_bytes(shape: Sequence[int], itemsize: int, sbp: NdSbp, mesh_shape: Sequence[int]) -> float:
    """Bytes of the largest shard of a tensor of ``shape`` laid out as ``sbp``: the device
    that holds it sets the peak.

    ``numel * itemsize / split_factor`` when every split divides; else OneFlow's
    ``BalancedSplitter`` shard, ``ceil(dim / n)`` rows per split dim
    (:func:`autopar.ir.sbp.local_shape`), times ``itemsize``.  A layout OneFlow
    refuses (the evaluator reports it) counts as the even share.  Units: bytes.
    """
    try:
        return shard_numel(shape, sbp, mesh_shape) * itemsize
    except ValueError:
        return math.prod(shape) * itemsize / sbp.split_factor(mesh_shape)


def boxed_copy_bytes(
    numel: int, dtype: str, dst: NdSbp, mesh_shape: Sequence[int], shape: Sequence[int] | None = None
) -> float:
    """Bytes per device of the copy a consumer receives when an input is boxed into ``dst``.

    ``numel * itemsize / split_factor(dst)``: an all-gathered ``B`` input is the
    whole tensor, a zero-filled ``P`` input too; with the tensor's ``shape``, the
    largest shard of an uneven split (:func:`shard_bytes`).  The copy is live while
    the consuming op runs.  Units: bytes.
    """
    if shape is not None:
        return shard_bytes(shape, DTYPE_BYTES[dtype], dst, mesh_shape)
    return numel * DTYPE_BYTES[dtype] / dst.split_factor(mesh_shape)


def zero3_gather_buffer_bytes(
    graph: Graph, variable_sbp: Mapping[str, NdSbp], mesh_shape: Sequence[int]
) -> float:
    """Transient bytes per device of ZeRO-3's gathered parameters.

    The largest variable, gathered back to its layout before ZeRO sharding
    (local size after its own splits), in its own dtype, twice: the one in use
    and the next one prefetched (DeepSpeed ``stage3_prefetch_bucket_size``,
    FSDP's forward prefetch).  A lower bound on any implementation's live
    gathered parameters.  Units: bytes.
    """
    largest = 0.0
    for v in graph.variables:
        sbp = variable_sbp.get(v.op)
        if sbp is None:
            continue
        spec = graph.tensors[v.tensor]
        largest = max(largest, shard_bytes(spec.shape, DTYPE_BYTES[spec.dtype], sbp, mesh_shape))
    return 2 * largest


def activation_profile(
    graph: Graph,
    tensor_sbp: Mapping[str, NdSbp],
    mesh_shape: Sequence[int],
    *,
    consumer_copies: Sequence[tuple[int, float]] = (),
    working_copy_is_state: bool = False,
    spans: Sequence[tuple[str, int, int]] | None = None,
) -> list[float]:
    """Live activation bytes per device at each position of the topological order.

    ``tensor_sbp`` maps every tensor to the N-D SBP its producer outputs.
    Per tensor: ``nbytes / split_factor`` (``P`` and ``B`` hold the full size; an uneven
    split, its largest shard: :func:`shard_bytes`).
    ``consumer_copies`` are ``(position, bytes)`` of boxed input copies
    (:func:`boxed_copy_bytes`), live at their consumer's position only.
    ``spans``: (tensor, first, last) live spans to use instead of
    :func:`activation_intervals` (a recomputed tensor lives twice:
    :func:`autopar.cost.activation_spans.activation_spans`).
    """
    n = len(graph.ops)
    delta = [0.0] * (n + 1)
    for pos, size in consumer_copies:
        delta[pos] += size
        delta[pos + 1] -= size
    if spans is None:
        spans = [(t, s, e) for t, (s, e) in activation_intervals(graph, working_copy_is_state).items()]
    for tname, start, end in spans:
        spec = graph.tensors[tname]
        size = shard_bytes(spec.shape, DTYPE_BYTES[spec.dtype], tensor_sbp[tname], mesh_shape)
        delta[start] += size
        delta[end + 1] -= size
    profile: list[float] = []
    running = 0.0
    for i in range(n):
        running += delta[i]
        profile.append(running)
    return profile
