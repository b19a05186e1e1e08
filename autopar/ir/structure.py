"""What a training graph's structure says, read from its ops (not their names).

* which variable a tensor comes from, through casts and identities; which tensors flow only
  into weight gradients (:func:`_structure`);
* an op's weight input and a matmul weight's output and input dims (:func:`_weight_input`,
  :func:`_weight_dims`); the forward region a tensor reaches (:func:`_forward_region`);
* linears that read one activation and meet before the next weight matmul: one fused GEMM in
  Megatron-LM (:func:`_fused_linears`);
* the batch size (:func:`batch_size`), the class counts of the losses, the tensors on a weight
  gradient's path (:func:`_gradient_owners`);
* the op families these read by type (:data:`MATMUL_OPS`, :data:`NORM_OPS`, ...).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from autopar.ir.graph import Graph, Op, Role, Variable
from autopar.ir.optimizer import parameter_sources, weight_gradient_path
from autopar.ir.sbp import NdSbp

__all__ = ["batch_size"]

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
GRADIENT_CARRIERS = SUM_OPS | {"identity", "amp_white_identity"}
"""Ops a weight gradient's partial sum over the batch may pass before its one reduction: sums
(a table read twice adds its gradients first) and same-dtype identities (a job that reads its
parameters through ``identity`` ops, OneFlow's CPU workaround); not casts, which would move
the reduction to another dtype."""
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


def _normalises(graph: Graph, op: Op) -> bool:
    """Whether forward ``op`` is a normalisation: a norm op, or the step of a composite
    one (an HF-style LayerNorm or RMSNorm written in element-wise ops) that scales the
    rows by a per-row ``rsqrt(var + eps)`` (or divides by its ``sqrt``): an input whose
    last dim is 1, made by ``rsqrt`` / ``sqrt``, next to one whose last dim is wider.  A
    softmax written out (``exp(x - max) / sum``) has no square root and is not one."""
    if op.type in NORM_OPS:
        return True
    shapes = [graph.tensors[t].shape for t in op.inputs.values()]
    scales = [
        t
        for t in op.inputs.values()
        if len(graph.tensors[t].shape) >= 2
        and graph.tensors[t].shape[-1] == 1
        and t in graph.producer
        and graph.op_by_name[graph.producer[t][0]].type in ("rsqrt", "sqrt")
    ]
    return bool(scales) and any(len(s) >= 2 and s[-1] > 1 for s in shapes)


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
            if _normalises(graph, cop):
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
            if cop.role is not Role.FORWARD or _normalises(graph, cop) or cop.type in LOSS_OPS:
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


def _loss_classes(graph: Graph) -> frozenset[int]:
    """The class counts of the graph's losses: the last dim of each forward loss op's first input."""
    return frozenset(
        graph.tensors[next(iter(op.inputs.values()))].shape[-1]
        for op in graph.ops
        if op.role is Role.FORWARD
        and op.type in LOSS_OPS
        and op.inputs
        and graph.tensors[next(iter(op.inputs.values()))].shape
    )


def _weight_dims(op: Op, wport: str) -> tuple[int, int]:
    """(output dim, input dim) of the weight read at ``wport`` of matmul ``op``: as ``b``
    ``[in, out]`` unless transposed (``[out, in]``); as ``a`` ``[out, in]`` unless transposed."""
    weight_is_b = wport.startswith("b")
    transposed = bool(op.attrs.get("transpose_b" if weight_is_b else "transpose_a", False))
    if weight_is_b:
        return (0, 1) if transposed else (1, 0)
    return (1, 0) if transposed else (0, 1)


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


def batch_size(graph: Graph) -> int | None:
    """The batch size: the leading dim most of the graph's inputs share (None without inputs)."""
    leading = Counter(
        graph.tensors[t].shape[0]
        for op in graph.ops
        if op.type in ("input", "pipeline_recv")
        for t in op.outputs.values()
        if graph.tensors[t].shape
    )
    return leading.most_common(1)[0][0] if leading else None


def _gradient_owners(graph: Graph, var_layout: dict[str, NdSbp], st: _Structure) -> dict[str, Variable]:
    """Tensor on a weight gradient's path (:func:`autopar.ir.optimizer.weight_gradient_path`:
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
