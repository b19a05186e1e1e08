"""Reference plans autopar must beat (BRIEF section 5).

* ``megatron``: the hand-written dp x tp layout.  Parameters laid out as
  Megatron does (column-parallel / row-parallel / vocab-parallel, recognised
  from the graph's structure, not from names); data ``S(0)`` on the dp axis;
  every other op takes, in topological order, the signature with the least
  input boxing plus compute, where a partial sum (``P``) may only come out of a
  tensor-parallel matmul or flow towards a weight gradient, so partial sums are
  all-reduced as soon as they are used, as in Megatron: input gradients are
  summed as partial sums only within one Megatron linear (fused QKV, key/value,
  gated fc1), each linear's all-reduced at its producer; constants are computed
  whole on every rank; weight gradients keep their parameter's
  tensor-parallel layout.
* ``inferred``: OneFlow's SBP inference as LiBai uses it: the same parameter
  layout, and every other op picks, in topological order, what OneFlow 0.9's
  greedy inference picks (:mod:`autopar.oneflow_inference`: its candidate
  order, its copy cost and tie-breaks; 99 % of op signatures as OneFlow's own
  on the jobs of ``benchmarks/fidelity.py``).
* ``data-parallel``: parameters ``B``, data ``S(0)`` on every axis, greedy as
  ``megatron``.
* ``single-device``: every op replicated (all ``B``): each device does the work of one.

The mesh's last axis is tensor-parallel when the mesh has two or more axes;
the others are data-parallel.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from enum import Enum

from autopar.boxing import boxing_time
from autopar.cluster import Mesh
from autopar.costs import op_compute_time, op_signatures, rule_context
from autopar.errors import ConfigError
from autopar.graph import DTYPE_BYTES, Graph, Op, Role, Variable
from autopar.oneflow_inference import SOURCE_TYPES, infer_like_oneflow
from autopar.optimizer import model_port_index, parameter_sources, weight_gradient_path
from autopar.plan import Plan
from autopar.rules.registry import RuleContext, RuleSet, default_rules
from autopar.runtime import DEFAULT_RUNTIME, runtime_profile
from autopar.sbp import B, NdSbp, Partial, S, Signature, Split

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
        # OneFlow's SplitSparseSoftmaxCrossEntropyOpPass (job_rewriter) rewrites a
        # model-split sparse_softmax_cross_entropy_ms into split-softmax stages + nll
        "nll",
    }
)
VOCAB_PARALLEL_LOSS_OPS = frozenset({"reduce_sum", "nll"})
"""Loss reductions over the vocabulary that Megatron leaves as partial sums on the tensor-parallel axis."""
MATMUL_OPS = frozenset({"matmul", "broadcast_matmul", "fused_matmul_bias", "batch_matmul"})
EMBEDDING_OPS = frozenset({"gather", "embedding"})
SUM_OPS = frozenset({"add_n", "add", "broadcast_add"})
"""Ops that sum their inputs: partial sums in, partial sum out (no reduction needed yet)."""
PASS_THROUGH_OPS = frozenset({"cast", "identity", "amp_white_identity"})
"""Ops that hand their input on unchanged (a gradient keeps the linears it sums)."""
VOCAB_PARALLEL_RATIO = 8
"""An embedding table with at least this many rows per column is a vocabulary (vocab-parallel)."""


@dataclass(frozen=True)
class _Structure:
    """What the baselines need to know about the graph."""

    param_source: dict[str, str]  # tensor -> variable op, through casts/identities
    grad_path: frozenset[str]  # tensors that flow only into weight gradients
    grad_feeds: frozenset[str]  # backward tensors read only to produce weight gradients


def _structure(graph: Graph) -> _Structure:
    path = weight_gradient_path(graph)
    return _Structure(parameter_sources(graph), path, _weight_gradient_feeds(graph, path))


def _weight_gradient_feeds(graph: Graph, path: frozenset[str]) -> frozenset[str]:
    """Backward tensors read only by ops that produce weight gradients (``path``) and
    nothing else: a position table's gradient summed over the batch before its
    scatter-add.  Data-parallel training keeps these partial over the batch until the
    gradient's reduction, as it does the weight gradient itself."""
    feeds = set()
    for op in graph.ops:
        if op.role is not Role.BACKWARD:
            continue
        for t in op.outputs.values():
            consumers = [graph.op_by_name[c] for c, _ in graph.consumers.get(t, [])]
            if (
                t not in path
                and consumers
                and all(
                    c.role is Role.BACKWARD and all(o in path for o in c.outputs.values()) for c in consumers
                )
            ):
                feeds.add(t)
    return frozenset(feeds)


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


def _forward_region(graph: Graph, start: str, st: _Structure) -> set[str]:
    """Tensors reachable from ``start`` through forward ops other than norms and weight matmuls."""
    seen = {start}
    stack = [start]
    while stack:
        t = stack.pop()
        for cname, _ in graph.consumers.get(t, []):
            cop = graph.op_by_name[cname]
            if cop.role is not Role.FORWARD or cop.type in NORM_OPS or cop.type in LOSS_OPS:
                continue
            if cop.type in MATMUL_OPS and _weight_input(cop, st) is not None:
                continue
            for o in cop.outputs.values():
                if o not in seen:
                    seen.add(o)
                    stack.append(o)
    return seen


def _meets_region(graph: Graph, start: str, region: set[str], st: _Structure) -> bool:
    """Whether a forward op downstream of ``start`` also reads a tensor of ``region``."""
    reach = _forward_region(graph, start, st)
    for t in reach:
        for cname, _ in graph.consumers.get(t, []):
            cop = graph.op_by_name[cname]
            if cop.role is Role.FORWARD and any(i in region and i not in reach for i in cop.inputs.values()):
                return True
    return False


def megatron_parameter_layout(graph: Graph, mesh: Mesh) -> dict[str, NdSbp]:
    """Variable op -> Megatron N-D SBP (dp axes ``B``, tp axis per the layer's role).

    * a weight used by a forward matmul whose output reaches another weight
      matmul before a normalisation (QKV, wi_0/wi_1, fc1) or feeds the loss
      (LM head) is column-parallel: split on its output dim;
    * a weight matmul whose output reaches a normalisation first (attention
      output, wo, fc2) is row-parallel: split on its input dim;
    * an embedding table is vocab-parallel: split on dim 0; a tied LM head
      follows the embedding;
    * a table whose gathered values are added to the head-split scores of
      a column-parallel attention (T5's relative position bias ``[buckets, heads]``)
      is split by heads (dim 1);
    * a 1-D bias added to a column-parallel output is split; everything else ``B``.
    """
    return _megatron_layout(graph, mesh)[0]


def _megatron_layout(graph: Graph, mesh: Mesh) -> tuple[dict[str, NdSbp], dict[str, int]]:
    """:func:`megatron_parameter_layout`, and each column-parallel weight's Megatron linear.

    The second map takes a column-parallel variable to the id of the one linear
    Megatron-LM makes of it and its siblings: column-parallel matmuls that read
    the same activation and whose outputs meet before the next weight matmul or
    norm are one fused linear (Q, K, V as ``query_key_value``; a cross-attention's
    K, V as ``key_value``; ``wi_0``, ``wi_1`` as the gated ``dense_h_to_4h``).
    Megatron-LM all-reduces the input gradient once per such linear
    (``copy_to_tensor_model_parallel_region``, megatron/core/tensor_parallel/mappings.py).
    """
    ndim = mesh.ndim
    replicated = NdSbp(tuple(B for _ in range(ndim)))
    layout: dict[str, NdSbp] = {v.op: replicated for v in graph.variables}
    if ndim < 2 or mesh.shape[-1] == 1:
        return layout, {}
    st = _structure(graph)
    tp = ndim - 1

    def tp_split(dim: int) -> NdSbp:
        return replicated.replace(tp, S(dim))

    column_outputs: set[str] = set()
    region: set[str] = set()  # activations split on tp downstream of a column-parallel matmul
    columns: list[tuple[str, str, set[str]]] = []  # (variable, activation read, forward region)
    tables: list[tuple[str, str, tuple[int, ...]]] = []  # (variable, gathered tensor, table shape)
    for op in graph.topological_order:
        if op.role is not Role.FORWARD:
            continue
        wport = _weight_input(op, st)
        if wport is None:
            continue
        var = st.param_source[op.inputs[wport]]
        wshape = graph.tensors[op.inputs[wport]].shape
        if op.type in EMBEDDING_OPS and len(wshape) == 2:
            # vocabulary tables are vocab-parallel; small tables (positions, buckets) stay replicated
            if wshape[0] >= VOCAB_PARALLEL_RATIO * wshape[1] and wshape[0] % mesh.shape[tp] == 0:
                layout[var] = tp_split(0)
            tables.append((var, next(iter(op.outputs.values())), wshape))
            continue
        if op.type not in MATMUL_OPS or len(wshape) != 2:
            continue
        (out,) = list(op.outputs.values())[:1]
        activation = [t for p, t in op.inputs.items() if p != wport]
        if any(t in region for t in activation):
            column = False  # the second matmul of a Megatron pair
        else:
            hit_matmul, hit_loss = _forward_reach(graph, out, st)
            column = hit_matmul or hit_loss
        weight_is_b = wport.startswith("b")
        transposed = bool(op.attrs.get("transpose_b" if weight_is_b else "transpose_a", False))
        # weight as b: [in, out] unless transposed ([out, in]); as a: [out, in] unless transposed
        if weight_is_b:
            out_dim, in_dim = (0, 1) if transposed else (1, 0)
        else:
            out_dim, in_dim = (1, 0) if transposed else (0, 1)
        dim = out_dim if column else in_dim
        if wshape[dim] % mesh.shape[tp] != 0:
            continue
        if layout[var] != replicated and layout[var] != tp_split(dim):
            continue  # tied weight already laid out (vocab-parallel embedding)
        layout[var] = tp_split(dim)
        if column:
            column_outputs.add(out)
            reach = _forward_region(graph, out, st)
            region |= reach
            columns.extend((var, t, reach) for t in activation)
    # a per-head table (T5's relative position bias [buckets, heads]) whose gathered
    # values are added to head-split attention scores is split by heads, as each
    # tensor-parallel rank adds only its heads' slice of the bias (NeMo's Megatron T5,
    # CoreAttention.forward: relative_position_bias[:, offset : offset + heads_per_partition])
    for var, gathered, wshape in tables:
        if wshape[1] % mesh.shape[tp] != 0:
            continue
        if _meets_region(graph, gathered, region, st):
            layout[var] = tp_split(1)
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
    return layout, _fused_linears(columns)


def _fused_linears(columns: list[tuple[str, str, set[str]]]) -> dict[str, int]:
    """Column-parallel variable -> fused-linear id: variables whose matmuls read the same
    activation and whose forward regions meet share an id (union-find)."""
    parent = {var: var for var, _, _ in columns}

    def find(v: str) -> str:
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    for i, (var_a, act_a, reach_a) in enumerate(columns):
        for var_b, act_b, reach_b in columns[i + 1 :]:
            if act_a == act_b and not reach_a.isdisjoint(reach_b):
                parent[find(var_b)] = find(var_a)
    roots = sorted({find(v) for v in parent})
    ids = {root: i for i, root in enumerate(roots)}
    return {var: ids[find(var)] for var in parent}


def _batch_size(graph: Graph) -> int | None:
    """The batch size: the leading dim most of the graph's inputs share (None without inputs)."""
    leading = Counter(
        graph.tensors[t].shape[0]
        for op in graph.ops
        if op.type == "input"
        for t in op.outputs.values()
        if graph.tensors[t].shape
    )
    return leading.most_common(1)[0][0] if leading else None


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
    runtime: str = DEFAULT_RUNTIME,
) -> Plan:
    """Build the ``kind`` baseline plan of ``graph`` on ``mesh`` (signatures only; evaluate it next).

    Boxing is priced as ``runtime`` lowers it (:mod:`autopar.runtime`).
    """
    try:
        kind = BaselineKind(kind)
    except ValueError:
        raise ConfigError(
            "unknown_baseline", f"unknown baseline {kind!r}; choose one of {BASELINES}"
        ) from None
    rules = rules or default_rules()
    ndim = mesh.ndim
    replicated = NdSbp(tuple(B for _ in range(ndim)))
    st = _structure(graph)
    tp_axis = ndim - 1 if ndim >= 2 else None
    batch = _batch_size(graph)

    fused: dict[str, int] = {}
    if kind is BaselineKind.SINGLE_DEVICE:
        var_layout = {v.op: replicated for v in graph.variables}
        data = replicated
    elif kind is BaselineKind.DATA_PARALLEL:
        var_layout = {v.op: replicated for v in graph.variables}
        data = NdSbp(tuple(S(0) for _ in range(ndim)))
    else:
        var_layout, fused = _megatron_layout(graph, mesh)
        data = NdSbp(tuple(B if a == tp_axis else S(0) for a in range(ndim)))

    lowering = runtime_profile(runtime).lowering.value
    box_memo: dict[tuple[tuple[int, ...], int, NdSbp, NdSbp], float] = {}

    def box(shape: tuple[int, ...], itemsize: int, src: NdSbp, dst: NdSbp) -> float:
        key = (shape, itemsize, src, dst)
        hit = box_memo.get(key)
        if hit is None:
            hit = boxing_time(shape, itemsize, src, dst, mesh, lowering)
            box_memo[key] = hit
        return hit

    def allowed_partial(op: Op, sig: Signature) -> bool:
        """Megatron discipline: partial sums only out of tp matmuls / towards weight grads."""
        for port, out in zip(op.outputs, sig.outputs):
            t = op.outputs[port]
            for axis, v in enumerate(out):
                if not isinstance(v, Partial):
                    continue
                if graph.tensors[t].numel <= 1:
                    continue
                if t in st.grad_path:
                    # gradients are reduced once (ZeRO reduce-scatter) before clipping reads them
                    if len(graph.consumers.get(t, [])) > 1:
                        return False
                    continue
                if t in st.grad_feeds and axis != tp_axis:
                    continue  # partial over the batch until the gradient's reduction
                if axis == tp_axis and (
                    (op.type in MATMUL_OPS or op.type in EMBEDDING_OPS) and _weight_input(op, st) is not None
                ):
                    continue
                if (
                    axis == tp_axis
                    and op.role is Role.FORWARD
                    and op.type in VOCAB_PARALLEL_LOSS_OPS
                    and any(isinstance(tensor_sbp[i][axis], Split) for i in op.inputs.values())
                ):
                    # vocab-parallel cross-entropy: each rank reduces its slice of the
                    # vocabulary, the partial sums are all-reduced (Megatron's
                    # _VocabParallelCrossEntropy: all-reduce of the [b, s] sums and targets)
                    continue
                if (
                    axis == tp_axis
                    and op.type in SUM_OPS
                    and all(isinstance(s[axis], Partial) for s in sig.inputs)
                    and all(isinstance(tensor_sbp[i][axis], Partial) for i in op.inputs.values())
                    and len(set().union(*(linears.get(i, ()) for i in op.inputs.values()))) <= 1
                ):
                    # summing tp partial sums of one Megatron linear (the input gradients
                    # of separate Q, K, V projections) before its one all-reduce, as
                    # Megatron's fused QKV does; the input gradients of different linears
                    # (a T5 encoder output read by every decoder layer's key/value) are
                    # each all-reduced at their producer, as Megatron's
                    # copy_to_tensor_model_parallel_region does per linear
                    continue
                return False
        return True

    def keeps_gradient_layout(op: Op, sig: Signature) -> bool:
        """A weight gradient is not split on the tensor-parallel axis unless its parameter
        is, and then as the parameter: Megatron computes a replicated norm or position
        table's gradient whole on every tensor-parallel rank, never a slice to gather
        again before the update.  (A partial sum may still flow into a norm's weight
        gradient, :func:`allowed_partial`: it reads the activation gradient before its
        all-reduce, which per-edge pricing would otherwise charge twice.)"""
        if tp_axis is None:
            return True
        for t, out in zip(op.outputs.values(), sig.outputs):
            want = grad_layout.get(t)
            if want is not None and isinstance(out[tp_axis], Split) and out[tp_axis] != want[tp_axis]:
                return False
        return True

    def resolves_partial(op: Op, sig: Signature) -> bool:
        """Megatron all-reduces a tensor-parallel partial sum to ``B`` (never scatters it)
        and never turns a whole or split tensor into a partial sum."""
        if tp_axis is None:
            return True
        for port, dst in zip(op.inputs, sig.inputs):
            src = tensor_sbp[op.inputs[port]]
            if isinstance(src[tp_axis], Partial) and not isinstance(dst[tp_axis], (Partial, type(B))):
                return False
            if isinstance(dst[tp_axis], Partial) and not isinstance(src[tp_axis], Partial):
                return False
        return True

    if kind is BaselineKind.INFERRED:
        return _inferred_plan(graph, mesh, zero_stage, var_layout, data, batch, rules, runtime)

    grad_owner = _gradient_owners(graph, var_layout, st) if kind is BaselineKind.MEGATRON else {}
    grad_layout = {t: var_layout[v.op] for t, v in grad_owner.items()}
    diff_targets: dict[str, NdSbp | None] = {}
    contexts: dict[str, tuple[RuleContext, list[Signature]]] = {}

    def signatures_of(op: Op) -> tuple[RuleContext, list[Signature]]:
        """The op's rule context and valid signatures (one rule evaluation per op, shared by
        the walk and :func:`diff_target`)."""
        found = contexts.get(op.name)
        if found is None:
            ctx = rule_context(
                graph, op, mesh.shape, zero_stage, runtime_profile(runtime).zero_sharding.value
            )
            found = contexts[op.name] = (ctx, op_signatures(rules, ctx)[0])
        return found

    def diff_target(v: Variable) -> NdSbp | None:
        """The layout the optimizer takes ``v``'s gradient in (``model_diff``), given the
        parameter as laid out: replicated on the data-parallel axes without ZeRO, split as
        the optimizer's shard with it."""
        if v.op not in diff_targets:
            diff_targets[v.op] = None
            opt = graph.op_by_name.get(v.optimizer or "")
            model_index = None if opt is None else model_port_index(opt)
            if (
                opt is not None
                and model_index is not None
                and v.grad is not None
                and v.grad in opt.inputs.values()
            ):
                diff_index = list(opt.inputs.values()).index(v.grad)
                _, osigs = signatures_of(opt)
                model = tensor_sbp.get(v.tensor)
                matching = [g for g in osigs if g.inputs[model_index] == model]
                if matching:
                    diff_targets[v.op] = matching[0].inputs[diff_index]
        return diff_targets[v.op]

    def reduces_gradients(op: Op, sig: Signature) -> bool:
        """Megatron reduces a weight gradient over the data-parallel axes once, where it is
        made (DDP's all-reduce of the gradient buffer; with the distributed optimizer, a
        reduce-scatter to the optimizer's shard): a partial sum over the batch goes, at its
        first consumer, straight to the layout the optimizer takes it in, in the dtype it
        was made in (Megatron-LM reduces ``main_grad`` in the parameters' dtype unless
        ``--accumulate-allreduce-grads-in-fp32``), never through another split to fix
        later; a sum of such partial sums (a table read twice) adds them first, as the one
        gradient buffer does."""
        for port, dst in zip(op.inputs, sig.inputs):
            t = op.inputs[port]
            owner = grad_owner.get(t)
            if owner is None:
                continue
            target = diff_target(owner)
            if target is None:
                continue
            src = tensor_sbp[t]
            for axis, v in enumerate(src):
                if axis == tp_axis or not isinstance(v, Partial):
                    continue
                if op.type in SUM_OPS and isinstance(dst[axis], Partial):
                    continue
                if dst[axis] != target[axis]:
                    return False
        return True

    chosen: dict[str, Signature] = {}
    tensor_sbp: dict[str, NdSbp] = {}
    linears: dict[str, frozenset[int]] = {}  # backward tensor -> the linears whose input gradient it sums
    for op in graph.topological_order:
        linears.update(_input_gradient_linears(op, st, fused, linears))
        ctx, sigs = signatures_of(op)
        sig: Signature | None = None
        if (
            op.name in var_layout
            or op.type in ("variable", "input")
            or (kind is BaselineKind.MEGATRON and not op.inputs)
        ):
            # Megatron computes constants (position ids, causal masks) whole on every rank
            sig = _closest(sigs, _source_layout(graph, op, var_layout, data, batch, replicated))
        elif kind is BaselineKind.SINGLE_DEVICE:
            sig = min(sigs, key=lambda s: sum(v != B for p in (*s.inputs, *s.outputs) for v in p))
        else:
            candidates = sigs
            if op.role is Role.OPTIMIZER:
                # the optimizer takes the parameter as laid out
                model_index = model_port_index(op)
                if model_index is not None:
                    i = model_index
                    want = tensor_sbp.get(list(op.inputs.values())[i])
                    matching = [s for s in sigs if s.inputs[i] == want]
                    candidates = matching or sigs
            elif kind is not BaselineKind.INFERRED:
                filtered = [
                    s
                    for s in candidates
                    if allowed_partial(op, s)
                    and resolves_partial(op, s)
                    and keeps_gradient_layout(op, s)
                    and reduces_gradients(op, s)
                ]
                candidates = filtered or candidates
            rule = rules.get(op.type)
            # Megatron keeps every layout it receives unless it must change it: score by
            # (boxing time, inputs whose layout changes, compute); OneFlow's inference by
            # boxing time alone, first signature on ties.
            best: tuple[float, ...] = (math.inf,)
            for cand in candidates:
                boxing = 0.0
                changed = 0
                for port, dst in zip(op.inputs, cand.inputs):
                    t = op.inputs[port]
                    src = tensor_sbp[t]
                    if src != dst:
                        changed += 1
                        spec = graph.tensors[t]
                        boxing += box(spec.shape, DTYPE_BYTES[spec.dtype], src, dst)
                    if boxing > best[0]:
                        break
                if kind is BaselineKind.INFERRED:
                    score: tuple[float, ...] = (boxing,)
                else:
                    score = (boxing, changed, op_compute_time(rule, ctx, cand, mesh))
                if score < best:
                    best, sig = score, cand
            if sig is None:
                sig = candidates[0]
        chosen[op.name] = sig
        for port, out in zip(op.outputs, sig.outputs):
            tensor_sbp[op.outputs[port]] = out
    return Plan.from_assignment(
        graph,
        mesh,
        zero_stage,
        chosen,
        source=f"baseline:{kind.value}",
        runtime=runtime_profile(runtime).name,
    )


def _gradient_owners(graph: Graph, var_layout: dict[str, NdSbp], st: _Structure) -> dict[str, Variable]:
    """Tensor on a weight gradient's path (:func:`autopar.optimizer.weight_gradient_path`:
    back from the gradient while the shape stays the parameter's) -> its parameter."""
    layouts: dict[str, Variable] = {}
    for v in graph.variables:
        if not v.grad or v.op not in var_layout:
            continue
        shape = graph.tensors[v.grad].shape
        stack = [v.grad]
        while stack:
            t = stack.pop()
            if t in layouts or t in st.param_source or t not in st.grad_path:
                continue
            if graph.tensors[t].shape != shape:
                continue
            layouts[t] = v
            stack.extend(graph.op_by_name[graph.producer[t][0]].inputs.values())
    return layouts


def _input_gradient_linears(
    op: Op, st: _Structure, fused: dict[str, int], linears: dict[str, frozenset[int]]
) -> dict[str, frozenset[int]]:
    """The Megatron linears (:func:`_megatron_layout` ids) whose input gradient ``op``'s
    outputs hold: a backward matmul reading a column-parallel weight yields that
    linear's input gradient; a sum, cast or identity carries its inputs' linears."""
    if op.role is not Role.BACKWARD:
        return {}
    ids: frozenset[int] = frozenset()
    wport = _weight_input(op, st)
    if op.type in MATMUL_OPS and wport is not None:
        var = st.param_source[op.inputs[wport]]
        if var in fused:
            ids = frozenset({fused[var]})
    elif op.type in SUM_OPS or op.type in PASS_THROUGH_OPS:
        ids = frozenset().union(*(linears.get(t, frozenset()) for t in op.inputs.values()))
    return dict.fromkeys(op.outputs.values(), ids) if ids else {}


def _source_layout(
    graph: Graph, op: Op, var_layout: dict[str, NdSbp], data: NdSbp, batch: int | None, replicated: NdSbp
) -> NdSbp:
    """The layout a baseline gives a source op: a parameter its ``var_layout`` entry
    (else replicated); a batch input ``data``; any other input or constant replicated
    (T5's position buckets are the same on every rank)."""
    if op.name in var_layout or op.type == "variable":
        return var_layout.get(op.name, replicated)
    if op.type == "input":
        spec = graph.tensors[next(iter(op.outputs.values()))]
        return data if spec.shape[:1] == (batch,) else replicated
    return replicated


def _inferred_plan(
    graph: Graph,
    mesh: Mesh,
    zero_stage: int,
    var_layout: dict[str, NdSbp],
    data: NdSbp,
    batch: int | None,
    rules: RuleSet,
    runtime: str,
) -> Plan:
    """OneFlow's SBP inference from LiBai's layout: the sources laid out as LiBai does
    (parameters by :func:`megatron_parameter_layout`, batch inputs ``data``, the rest
    ``B``), every other op as OneFlow 0.9's greedy inference picks
    (:func:`autopar.oneflow_inference.infer_like_oneflow`, its own copy cost, not the runtime's)."""
    replicated = NdSbp(tuple(B for _ in range(mesh.ndim)))
    sharding = runtime_profile(runtime).zero_sharding.value
    sources: dict[str, Signature] = {}
    for op in graph.ops:
        if op.type not in SOURCE_TYPES:
            continue
        sigs, _ = op_signatures(rules, rule_context(graph, op, mesh.shape, zero_stage, sharding))
        sources[op.name] = _closest(sigs, _source_layout(graph, op, var_layout, data, batch, replicated))
    chosen = infer_like_oneflow(
        graph, tuple(mesh.shape), sources, zero_stage=zero_stage, rules=rules, zero_sharding=sharding
    )
    return Plan.from_assignment(
        graph,
        mesh,
        zero_stage,
        chosen,
        source=f"baseline:{BaselineKind.INFERRED.value}",
        runtime=runtime_profile(runtime).name,
    )
