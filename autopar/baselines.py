"""Reference plans autopar must beat (BRIEF section 5).

* ``megatron``: the hand-written dp x tp layout.  Parameters laid out as
  Megatron does (column-parallel / row-parallel / vocab-parallel, recognised
  from the graph's structure, not from names); data ``S(0)`` on the dp axis;
  every other op takes, in topological order, the signature with the least
  input boxing plus compute, where a partial sum (``P``) may only come out of a
  tensor-parallel matmul or flow towards a weight gradient, so partial sums are
  all-reduced as soon as they are used, as in Megatron.
* ``inferred``: OneFlow's SBP inference as LiBai uses it: the same parameter
  layout, and every other op greedily picks, in topological order, the
  signature with the least boxing of its inputs (first one on ties), nothing else.
* ``data-parallel``: parameters ``B``, data ``S(0)`` on every axis, greedy as
  ``megatron``.
* ``single-device``: every op replicated (all ``B``): each device does the work of one.

The mesh's last axis is tensor-parallel when the mesh has two or more axes;
the others are data-parallel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from autopar.boxing import boxing_time
from autopar.cluster import Mesh
from autopar.costs import op_compute_time, op_signatures, rule_context
from autopar.errors import ConfigError
from autopar.graph import DTYPE_BYTES, Graph, Op, Role
from autopar.plan import Plan
from autopar.rules.registry import RuleSet, default_rules
from autopar.sbp import B, NdSbp, Partial, S, Signature

__all__ = ["BASELINES", "BaselineKind", "baseline_plan", "megatron_parameter_layout"]


class BaselineKind(str, Enum):
    MEGATRON = "megatron"
    INFERRED = "inferred"
    DATA_PARALLEL = "data-parallel"
    SINGLE_DEVICE = "single-device"


BASELINES = [k.value for k in BaselineKind]

NORM_OPS = frozenset({"rms_norm", "layer_norm", "fused_rms_norm", "skip_rms_norm", "skip_layer_norm"})
LOSS_OPS = frozenset(
    {
        "sparse_softmax_cross_entropy",
        "sparse_softmax_cross_entropy_ms",
        "sparse_cross_entropy",
        "sparse_cross_entropy_ms",
        "softmax_cross_entropy",
    }
)
MATMUL_OPS = frozenset({"matmul", "broadcast_matmul", "fused_matmul_bias", "batch_matmul"})
EMBEDDING_OPS = frozenset({"gather", "embedding"})


@dataclass(frozen=True)
class _Structure:
    """What the baselines need to know about the graph."""

    variable_tensor: dict[str, str]  # variable tensor -> variable op
    param_source: dict[str, str]  # tensor -> variable op, through casts/identities
    grad_path: frozenset[str]  # tensors that flow only into weight gradients


def _structure(graph: Graph) -> _Structure:
    var_tensor = {v.tensor: v.op for v in graph.variables}
    source: dict[str, str] = dict(var_tensor)
    for op in graph.topological_order:
        if op.type in ("cast", "identity", "amp_white_identity", "parallel_cast", "hierarchical_parallel_cast") and len(op.inputs) == 1:
            (t,) = op.inputs.values()
            if t in source:
                for o in op.outputs.values():
                    source[o] = source[t]
    # weight-gradient path: tensors whose every consumer chain ends in a variable's gradient
    grads = {v.grad for v in graph.variables if v.grad}
    path: set[str] = set(grads)
    for op in reversed(graph.topological_order):
        outs = list(op.outputs.values())
        if outs and all(o in path for o in outs) and op.type in (
            "cast",
            "identity",
            "add_n",
            "reduce_sum",
            "reduce_sum_like",
            "scalar_mul",
            "broadcast_matmul_grad_b",
            "matmul",
            "unsorted_segment_sum_like",
            "unsorted_segment_sum",
            "rms_norm_param_grad",
            "layer_norm_param_grad",
            "broadcast_add",
            "bias_add",
        ):
            for t in op.inputs.values():
                if t not in source and len(graph.consumers.get(t, [])) == 1:
                    path.add(t)
    # only the tensors produced by ops whose outputs are all gradients count
    return _Structure(var_tensor, source, frozenset(path))


def _weight_input(op: Op, st: _Structure) -> str | None:
    """The port of ``op`` that reads a (cast) parameter, if any."""
    for port, t in op.inputs.items():
        if t in st.param_source:
            return port
    return None


def _forward_reach(graph: Graph, start: str, st: _Structure) -> tuple[bool, bool]:
    """From tensor ``start``, following forward ops: (reaches a weight matmul, reaches a loss)."""
    seen: set[str] = set()
    stack = [start]
    hit_matmul = hit_loss = False
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        for cname, _ in graph.consumers.get(t, []):
            cop = graph.op_by_name[cname]
            if cop.role is not Role.FORWARD:
                continue
            if cop.type in MATMUL_OPS and _weight_input(cop, st) is not None:
                hit_matmul = True
                continue
            if cop.type in NORM_OPS:
                continue
            if cop.type in LOSS_OPS:
                hit_loss = True
                continue
            stack.extend(cop.outputs.values())
    return hit_matmul, hit_loss


def megatron_parameter_layout(graph: Graph, mesh: Mesh) -> dict[str, NdSbp]:
    """Variable op -> Megatron N-D SBP (dp axes ``B``, tp axis per the layer's role).

    * a weight used by a forward matmul whose output reaches another weight
      matmul before a normalisation (QKV, wi_0/wi_1, fc1) or feeds the loss
      (LM head) is column-parallel: split on its output dim;
    * a weight matmul whose output reaches a normalisation first (attention
      output, wo, fc2) is row-parallel: split on its input dim;
    * an embedding table is vocab-parallel: split on dim 0; a tied LM head
      follows the embedding;
    * a 1-D bias added to a column-parallel output is split; everything else ``B``.
    """
    ndim = mesh.ndim
    replicated = NdSbp(tuple(B for _ in range(ndim)))
    layout: dict[str, NdSbp] = {v.op: replicated for v in graph.variables}
    if ndim < 2 or mesh.shape[-1] == 1:
        return layout
    st = _structure(graph)
    tp = ndim - 1

    def tp_split(dim: int) -> NdSbp:
        return replicated.replace(tp, S(dim))

    column_outputs: set[str] = set()
    for op in graph.topological_order:
        if op.role is not Role.FORWARD:
            continue
        wport = _weight_input(op, st)
        if wport is None:
            continue
        var = st.param_source[op.inputs[wport]]
        wshape = graph.tensors[op.inputs[wport]].shape
        if op.type in EMBEDDING_OPS and len(wshape) == 2:
            if mesh.shape[tp] and wshape[0] % mesh.shape[tp] == 0:
                layout[var] = tp_split(0)
            continue
        if op.type not in MATMUL_OPS or len(wshape) != 2:
            continue
        (out,) = list(op.outputs.values())[:1]
        hit_matmul, hit_loss = _forward_reach(graph, out, st)
        weight_is_b = wport.startswith("b")
        transposed = bool(op.attrs.get("transpose_b" if weight_is_b else "transpose_a", False))
        # weight as b: [in, out] unless transposed ([out, in]); as a: [out, in] unless transposed
        if weight_is_b:
            out_dim, in_dim = (0, 1) if transposed else (1, 0)
        else:
            out_dim, in_dim = (1, 0) if transposed else (0, 1)
        column = hit_matmul or hit_loss
        dim = out_dim if column else in_dim
        if wshape[dim] % mesh.shape[tp] != 0:
            continue
        if var in layout and layout[var] != replicated and layout[var] != tp_split(dim):
            continue  # tied weight already laid out (vocab-parallel embedding)
        layout[var] = tp_split(dim)
        if column:
            column_outputs.add(out)
    # biases added to column-parallel outputs are split with them
    for op in graph.ops:
        if op.role is not Role.FORWARD or op.type not in ("bias_add", "broadcast_add", "fused_matmul_bias"):
            continue
        ins = list(op.inputs.values())
        if not any(t in column_outputs for t in ins):
            continue
        for t in ins:
            if t in st.param_source and len(graph.tensors[t].shape) == 1:
                n = graph.tensors[t].shape[0]
                if n % mesh.shape[tp] == 0:
                    layout[st.param_source[t]] = tp_split(0)
    return layout


def _closest(sigs: list[Signature], out_target: NdSbp) -> Signature:
    def score(sig: Signature) -> int:
        return sum(1 for a, b in zip(sig.outputs[0], out_target) if a != b) if sig.outputs else 0

    return min(sigs, key=score)


def baseline_plan(
    kind: str | BaselineKind,
    graph: Graph,
    mesh: Mesh,
    zero_stage: int = 0,
    *,
    rules: RuleSet | None = None,
) -> Plan:
    """Build the ``kind`` baseline plan of ``graph`` on ``mesh`` (signatures only; evaluate it next)."""
    try:
        kind = BaselineKind(kind)
    except ValueError:
        raise ConfigError("unknown_baseline", f"unknown baseline {kind!r}; choose one of {BASELINES}") from None
    rules = rules or default_rules()
    ndim = mesh.ndim
    replicated = NdSbp(tuple(B for _ in range(ndim)))
    st = _structure(graph)
    tp_axis = ndim - 1 if ndim >= 2 else None

    if kind is BaselineKind.SINGLE_DEVICE:
        var_layout = {v.op: replicated for v in graph.variables}
        data = replicated
    elif kind is BaselineKind.DATA_PARALLEL:
        var_layout = {v.op: replicated for v in graph.variables}
        data = NdSbp(tuple(S(0) for _ in range(ndim)))
    else:
        var_layout = megatron_parameter_layout(graph, mesh)
        data = NdSbp(tuple(B if a == tp_axis else S(0) for a in range(ndim)))

    box_memo: dict[tuple[tuple[int, ...], int, NdSbp, NdSbp], float] = {}

    def box(shape: tuple[int, ...], itemsize: int, src: NdSbp, dst: NdSbp) -> float:
        key = (shape, itemsize, src, dst)
        hit = box_memo.get(key)
        if hit is None:
            hit = boxing_time(shape, itemsize, src, dst, mesh)
            box_memo[key] = hit
        return hit

    def allowed_partial(op: Op, sig: Signature) -> bool:
        """Megatron discipline: partial sums only out of tp matmuls / towards weight grads."""
        for port, out in zip(op.outputs, sig.outputs):
            t = op.outputs[port]
            for axis, v in enumerate(out):
                if not isinstance(v, Partial):
                    continue
                if t in st.grad_path:
                    continue
                if axis == tp_axis and (
                    (op.type in MATMUL_OPS or op.type in EMBEDDING_OPS) and _weight_input(op, st) is not None
                ):
                    continue
                return False
        return True

    chosen: dict[str, Signature] = {}
    tensor_sbp: dict[str, NdSbp] = {}
    for op in graph.topological_order:
        ctx = rule_context(graph, op, mesh.shape, zero_stage)
        sigs, _ = op_signatures(rules, ctx)
        sig: Signature | None = None
        if op.name in var_layout or op.type == "variable":
            target = var_layout.get(op.name, replicated)
            sig = _closest(sigs, target)
        elif op.type == "input":
            sig = _closest(sigs, data)
        elif kind is BaselineKind.SINGLE_DEVICE:
            sig = min(sigs, key=lambda s: sum(v != B for p in (*s.inputs, *s.outputs) for v in p))
        else:
            candidates = sigs
            if op.role is Role.OPTIMIZER:
                # the optimizer takes the parameter as laid out
                model_ports = [i for i, p in enumerate(op.inputs) if p.startswith("model_") and not p.startswith("model_diff")]
                if model_ports:
                    i = model_ports[0]
                    want = tensor_sbp.get(list(op.inputs.values())[i])
                    matching = [s for s in sigs if s.inputs[i] == want]
                    candidates = matching or sigs
            elif kind is not BaselineKind.INFERRED:
                filtered = [s for s in candidates if allowed_partial(op, s)]
                candidates = filtered or candidates
            rule = rules.get(op.type)
            best = math.inf
            for cand in candidates:
                cost = 0.0
                for port, dst in zip(op.inputs, cand.inputs):
                    t = op.inputs[port]
                    spec = graph.tensors[t]
                    cost += box(spec.shape, DTYPE_BYTES[spec.dtype], tensor_sbp[t], dst)
                    if cost >= best:
                        break
                if kind is not BaselineKind.INFERRED and cost < best:
                    cost += op_compute_time(rule, ctx, cand, mesh)
                if cost < best:
                    best, sig = cost, cand
            if sig is None:
                sig = candidates[0]
        chosen[op.name] = sig
        for port, out in zip(op.outputs, sig.outputs):
            tensor_sbp[op.outputs[port]] = out
    return Plan.from_assignment(graph, mesh, zero_stage, chosen, source=f"baseline:{kind.value}")

