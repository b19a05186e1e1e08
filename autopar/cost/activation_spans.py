"""Memory over the iteration: the gradient-accumulation buffer, each variable's states, and the
span of each activation (forward output to its last backward reader), with recomputed blocks
keeping only their inputs (:func:`activation_spans`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from autopar.cost.iteration import accumulation_of, checkpoint_units, unit_members
from autopar.cost.memory import StateBytes, activation_intervals, variable_state_bytes
from autopar.ir.blocks import layer_of, split_unit
from autopar.ir.graph import Graph, Role
from autopar.ir.sbp import NdSbp
from autopar.ir.training import TrainingConfig
from autopar.runtimes.profile import RuntimeProfile

__all__ = [
    "accumulation_buffer_bytes",
    "activation_spans",
    "block_readers",
    "tensor_spans",
    "variable_memory_bytes",
]


def accumulation_buffer_bytes(
    shape: Sequence[int],
    sbp: NdSbp,
    mesh_shape: Sequence[int],
    zero_stage: int,
    states: StateBytes,
    zero_sharding: str,
    training: TrainingConfig,
    runtime: RuntimeProfile,
) -> float:
    """Bytes per device of a variable's gradient-accumulation buffer beyond its ZeRO gradient.

    With ``K > 1`` on a runtime that accumulates before reducing into a full-size buffer
    (OneFlow 0.9's acc op, in the partial gradient's layout = the parameter's forward
    layout): ``K_g x Psi - grad_ZeRO`` where ``Psi`` is the variable's elements per device
    after its splits and ``grad_ZeRO`` the gradient bytes its ZeRO stage keeps
    (:func:`autopar.cost.memory.model_state_bytes`): 0 under ZeRO-0/1 (the gradient is
    full-size anyway), ``K_g Psi (1 - 1/Nd)`` under ZeRO-2/3.  0 with ``K = 1``, on
    ``ideal`` (DeepSpeed ZeRO-2 reduces every micro-batch into its shard), and where the
    runtime reduces every micro-batch at this ZeRO stage (Megatron-FSDP).  Units: bytes.
    """
    acc = accumulation_of(runtime)
    if training.micro_batches <= 1 or not acc.full_size_buffer:
        return 0.0
    if acc.reduce_per_micro_batch_from is not None and zero_stage >= acc.reduce_per_micro_batch_from:
        return 0.0  # reduced into its shard every micro-batch (Megatron-FSDP): no full-size buffer
    local = math.prod(shape) / sbp.split_factor(mesh_shape)
    _, grad, _ = variable_state_bytes(shape, sbp, mesh_shape, zero_stage, states, zero_sharding)
    return max(0.0, states.grad * local - grad)


def variable_memory_bytes(
    shape: Sequence[int],
    sbp: NdSbp,
    mesh_shape: Sequence[int],
    zero_stage: int,
    states: StateBytes,
    zero_sharding: str,
    training: TrainingConfig,
    runtime: RuntimeProfile,
) -> tuple[float, float, float]:
    """(param, grad + accumulation buffer, optimizer) bytes per device of one variable:
    :func:`autopar.cost.memory.variable_state_bytes` plus :func:`accumulation_buffer_bytes`."""
    p, g, o = variable_state_bytes(shape, sbp, mesh_shape, zero_stage, states, zero_sharding)
    acc = accumulation_buffer_bytes(
        shape, sbp, mesh_shape, zero_stage, states, zero_sharding, training, runtime
    )
    return p, g + acc, o


def activation_spans(
    graph: Graph,
    training: TrainingConfig,
    working_copy_is_state: bool = False,
    unmaterialized: frozenset[str] = frozenset(),
) -> list[tuple[str, int, int]]:
    """(tensor, first, last) positions of the topological order where each activation is live.

    Without checkpointing: :func:`autopar.cost.memory.activation_intervals`, one span per tensor.
    With it, a tensor produced by a forward op of a recomputed unit (a block, or an op group of
    a block: :mod:`autopar.ir.blocks`) lives from its producer to its last forward use (a use
    by a later recomputed unit's forward keeps it until that unit's recompute: it is that
    unit's input), and again from the unit's recompute (the start of its block's backward, or
    for an op group the first backward use of what it makes) to its last backward use.  A
    tensor a recomputed unit reads from outside stays live until that recompute.  Source:
    Chen et al. 2016 (checkpointing), Megatron-LM ``checkpointed_forward``, Korthikanti et al.
    2022 (selective recomputation of the attention core).  ``unmaterialized``: tensors a fused
    kernel never writes to memory (:attr:`autopar.cost.fusion.Kernels.internal`): no span."""
    units = checkpoint_units(graph, training)
    if not units:
        intervals = activation_intervals(graph, working_copy_is_state, unmaterialized)
        return [(t, s, e) for t, (s, e) in intervals.items()]
    per_tensor = tensor_spans(graph, units, units, working_copy_is_state, unmaterialized)
    return [(t, s, e) for t, spans in per_tensor.items() for s, e in spans]


def tensor_spans(
    graph: Graph,
    dropped: frozenset[str],
    held: frozenset[str],
    working_copy_is_state: bool = False,
    unmaterialized: frozenset[str] = frozenset(),
) -> dict[str, list[tuple[int, int]]]:
    """Each activation's live spans when the units ``dropped`` free their own tensors after
    forward and recompute them in backward, and the units ``held`` of other blocks keep the
    tensors they read from a tensor's block until their recompute; a reader in the
    tensor's own block holds it when its unit is one of ``dropped`` (a block takes one
    policy, :mod:`autopar.cost.recompute_policies`).  :func:`activation_spans` is both sets
    equal to the recomputed units; the solver also prices the sets apart (its home block's
    policy, its reader blocks'), see ``autopar_solver.planner.recompute``."""
    intervals = activation_intervals(graph, working_copy_is_state, unmaterialized)
    order = graph.topological_order
    pos = {op.name: i for i, op in enumerate(order)}
    home = _UnitView(graph, dropped, pos)
    readers = home if held == dropped else _UnitView(graph, held, pos)
    return {
        tname: _spans_of(graph, tname, start, end, (dropped, held), pos, (home, readers))
        for tname, (start, end) in intervals.items()
    }


class _UnitView:
    """Which unit of ``units`` each forward op belongs to, and where each unit is recomputed."""

    def __init__(self, graph: Graph, units: frozenset[str], pos: dict[str, int]) -> None:
        self.member = unit_members(graph, units)
        self.recompute_at: dict[str, int] = {}
        for i, op in enumerate(graph.topological_order):
            if op.role is Role.BACKWARD:
                self.recompute_at.setdefault(layer_of(op.name), i)
        for name, unit in self.member.items():
            if split_unit(unit)[1] is None:
                continue
            for t in graph.op_by_name[name].outputs.values():
                for consumer, _ in graph.consumers.get(t, []):
                    if graph.op_by_name[consumer].role is Role.BACKWARD:
                        first = self.recompute_at.get(unit, pos[consumer])
                        self.recompute_at[unit] = min(first, pos[consumer])

    def unit(self, op_name: str) -> str | None:
        return self.member.get(op_name)


def block_readers(graph: Graph, blocks: frozenset[str]) -> dict[str, tuple[str | None, frozenset[str]]]:
    """Tensor -> (its home unit, the other units that read it in forward), among ``blocks``
    (blocks or op groups): the units whose recompute flags decide the tensor's live spans
    (home: None when its producer is not a forward op of one of ``blocks``)."""
    member = unit_members(graph, blocks)
    out: dict[str, tuple[str | None, frozenset[str]]] = {}
    for tname, (pname, _) in graph.producer.items():
        home = member.get(pname)
        readers = {member.get(c) for c, _ in graph.consumers.get(tname, [])}
        out[tname] = (home, frozenset(r for r in readers if r is not None and r != home))
    return out


def _spans_of(
    graph: Graph,
    tname: str,
    start: int,
    end: int,
    units: tuple[frozenset[str], frozenset[str]],
    pos: dict[str, int],
    views: tuple[_UnitView, _UnitView],
) -> list[tuple[int, int]]:
    """The live spans of one activation under checkpointing (see :func:`tensor_spans`;
    ``units`` = (dropped, held), ``views`` their unit views)."""
    dropped, held = units
    view, reader_view = views
    pname = graph.producer[tname][0]
    home = view.unit(pname)
    block = layer_of(pname)
    forward_end, backward_uses = start, []
    for cname, _ in graph.consumers.get(tname, []):
        consumer = graph.op_by_name[cname]
        if consumer.role is Role.FORWARD:
            forward_end = max(forward_end, pos[cname])
            own = layer_of(cname) == block
            by, holding = (view, dropped) if own else (reader_view, held)
            scope = by.unit(cname)
            if scope is not None and scope in holding and scope != home:  # an input of a recomputed unit
                forward_end = max(forward_end, by.recompute_at.get(scope, pos[cname]))
        else:
            backward_uses.append(pos[cname])
    if home is None or home not in dropped:
        return [(start, max(end, forward_end))]
    spans = [(start, forward_end)]
    if backward_uses:
        again = min(view.recompute_at.get(home, min(backward_uses)), min(backward_uses))
        if max(again, forward_end + 1) <= max(backward_uses):  # else live throughout the first
            spans.append((max(again, forward_end + 1), max(backward_uses)))
    return spans
