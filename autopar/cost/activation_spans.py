"""Memory over the iteration: the gradient-accumulation buffer, each variable's states, and the
span of each activation (forward output to its last backward reader), with recomputed blocks
keeping only their inputs (:func:`activation_spans`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from autopar.cost.iteration import accumulation_of, checkpoint_blocks, layer_of
from autopar.cost.memory import StateBytes, activation_intervals, variable_state_bytes
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
    full-size anyway), ``K_g Psi (1 - 1/Nd)`` under ZeRO-2/3.  0 with ``K = 1`` and on
    ``ideal`` (DeepSpeed ZeRO-2 reduces every micro-batch into its shard).  Units: bytes.
    """
    if training.micro_batches <= 1 or not accumulation_of(runtime).full_size_buffer:
        return 0.0
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
    graph: Graph, training: TrainingConfig, working_copy_is_state: bool = False
) -> list[tuple[str, int, int]]:
    """(tensor, first, last) positions of the topological order where each activation is live.

    Without checkpointing: :func:`autopar.cost.memory.activation_intervals`, one span per tensor.
    With it, a tensor produced by a forward op of a recomputed block lives from its
    producer to its last forward use (a use by a later recomputed block's forward keeps it
    until that block's recompute: it is that block's input), and again from the start of
    its block's backward (the recompute) to its last backward use.  A tensor a recomputed
    block reads from outside stays live until that block's backward starts.  Source:
    Chen et al. 2016 (checkpointing), Megatron-LM ``checkpointed_forward``."""
    blocks = checkpoint_blocks(graph, training)
    if not blocks:
        intervals = activation_intervals(graph, working_copy_is_state)
        return [(t, s, e) for t, (s, e) in intervals.items()]
    per_tensor = tensor_spans(graph, blocks, blocks, working_copy_is_state)
    return [(t, s, e) for t, spans in per_tensor.items() for s, e in spans]


def tensor_spans(
    graph: Graph, dropped: frozenset[str], held: frozenset[str], working_copy_is_state: bool = False
) -> dict[str, list[tuple[int, int]]]:
    """Each activation's live spans when the blocks ``dropped`` free their own tensors after
    forward and recompute them in backward, and the blocks ``held`` keep the tensors they
    read from outside until their backward starts (:func:`activation_spans` is both sets
    equal to the recomputed blocks; the solver also prices the sets apart, see
    ``autopar_solver.planner.recompute``)."""
    intervals = activation_intervals(graph, working_copy_is_state)
    order = graph.topological_order
    pos = {op.name: i for i, op in enumerate(order)}
    backward_start: dict[str, int] = {}
    for i, op in enumerate(order):
        if op.role is Role.BACKWARD:
            backward_start.setdefault(layer_of(op.name), i)
    return {
        tname: _spans_of(graph, tname, start, end, (dropped, held), pos, backward_start)
        for tname, (start, end) in intervals.items()
    }


def block_readers(graph: Graph, blocks: frozenset[str]) -> dict[str, tuple[str | None, frozenset[str]]]:
    """Tensor -> (its home block, the other blocks that read it in forward), among ``blocks``:
    the blocks whose recompute flags decide the tensor's live spans (home: None when its
    producer is not a forward op of one of ``blocks``)."""
    out: dict[str, tuple[str | None, frozenset[str]]] = {}
    for tname, (pname, _) in graph.producer.items():
        producer = graph.op_by_name[pname]
        home = layer_of(pname) if producer.role is Role.FORWARD else None
        home = home if home in blocks else None
        readers = {
            layer_of(c) for c, _ in graph.consumers.get(tname, []) if graph.op_by_name[c].role is Role.FORWARD
        }
        out[tname] = (home, frozenset(r for r in readers if r in blocks and r != home))
    return out


def _spans_of(
    graph: Graph,
    tname: str,
    start: int,
    end: int,
    blocks: tuple[frozenset[str], frozenset[str]],
    pos: dict[str, int],
    backward_start: dict[str, int],
) -> list[tuple[int, int]]:
    """The live spans of one activation under checkpointing (see :func:`tensor_spans`;
    ``blocks`` = (dropped, held))."""
    dropped, held = blocks
    pname = graph.producer[tname][0]
    producer = graph.op_by_name[pname]
    home = layer_of(pname) if producer.role is Role.FORWARD else None
    forward_end, backward_uses = start, []
    for cname, _ in graph.consumers.get(tname, []):
        consumer = graph.op_by_name[cname]
        if consumer.role is Role.FORWARD:
            forward_end = max(forward_end, pos[cname])
            scope = layer_of(cname)
            if scope in held and scope != home:  # an input of a recomputed block
                forward_end = max(forward_end, backward_start.get(scope, pos[cname]))
        else:
            backward_uses.append(pos[cname])
    if home not in dropped:
        return [(start, max(end, forward_end))]
    spans = [(start, forward_end)]
    if backward_uses:
        again = min(backward_start.get(home, min(backward_uses)), min(backward_uses))
        if max(again, forward_end + 1) <= max(backward_uses):  # else live throughout the first
            spans.append((max(again, forward_end + 1), max(backward_uses)))
    return spans
