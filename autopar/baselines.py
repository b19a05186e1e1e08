"""Reference plans autopar must beat (BRIEF section 5).

* ``megatron``: the hand-written dp x tp layout.  Parameters laid out as
  Megatron does (column-parallel / row-parallel / vocab-parallel, recognised
  from the graph's structure, not from names); data ``S(0)`` on the dp axis;
  every other op takes, in topological order, the signature with the least
  input boxing plus compute, where a partial sum (``P``) may only come out of a
  tensor-parallel matmul or flow towards a weight gradient, so partial sums are
  all-reduced as soon as they are used, as in Megatron: one all-reduce per
  Megatron linear's input gradient (fused QKV, key/value, gated fc1), so a partial
  sum of input gradients completes at most one linear before it is all-reduced
  (:meth:`_GreedyWalk._completes_one_linear`); constants are computed
  whole on every rank; weight gradients keep their parameter's
  tensor-parallel layout; nothing is split on the tensor-parallel axis but
  what a tensor-parallel parameter's split reaches (no sequence parallelism).
  Its plans are built and evaluated with Megatron-LM's rules
  (:mod:`autopar.rules.megatron_lm`): a vocab-parallel cross-entropy written as
  ``log_softmax`` + ``nll``, and a fused q/k/v output split by heads.
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
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from typing import ClassVar

from autopar.boxing import boxing_time
from autopar.cluster import Mesh
from autopar.costs import op_compute_time, op_signatures, rule_context
from autopar.errors import ConfigError
from autopar.graph import DTYPE_BYTES, Graph, Op, Role, Variable
from autopar.oneflow_inference import SOURCE_TYPES, infer_like_oneflow
from autopar.optimizer import model_port_index, parameter_sources, weight_gradient_path
from autopar.plan import Plan
from autopar.rules.megatron_lm import rules_for_source
from autopar.rules.registry import RuleContext, RuleSet
from autopar.runtime import DEFAULT_RUNTIME, runtime_profile
from autopar.sbp import B, Broadcast, NdSbp, Partial, S, Signature, Split

__all__ = [
    "BASELINES",
    "BaselineKind",
    "baseline_plan",
    "batch_size",
    "megatron_input_gradient_linears",
    "megatron_parameter_layout",
]


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
    replicated = NdSbp(tuple(B for _ in range(mesh.ndim)))
    layout: dict[str, NdSbp] = {v.op: replicated for v in graph.variables}
    if mesh.ndim < 2 or mesh.shape[-1] == 1:
        return layout, {}
    walk = _TensorParallelWalk(graph, mesh, _structure(graph), layout)
    walk.lay_out_weights()
    walk.split_head_tables()
    walk.split_column_biases()
    return layout, _fused_linears(walk.columns)


class _TensorParallelWalk:
    """The steps of :func:`_megatron_layout`; fills ``layout`` in place."""

    def __init__(self, graph: Graph, mesh: Mesh, st: _Structure, layout: dict[str, NdSbp]) -> None:
        self.graph, self.mesh, self.st, self.layout = graph, mesh, st, layout
        self.tp = mesh.ndim - 1
        self.replicated = NdSbp(tuple(B for _ in range(mesh.ndim)))
        self.column_outputs: set[str] = set()
        self.region: set[str] = set()  # activations split on tp downstream of a column-parallel matmul
        self.columns: list[tuple[str, str, set[str]]] = []  # (variable, activation read, forward region)
        self.tables: list[tuple[str, str, tuple[int, ...]]] = []  # (variable, gathered tensor, table shape)
        self.classes = _loss_classes(graph)

    def tp_split(self, dim: int) -> NdSbp:
        return self.replicated.replace(self.tp, S(dim))

    def lay_out_weights(self) -> None:
        """Embedding tables vocab-parallel, weight matmuls column- or row-parallel, in topological order."""
        for op in self.graph.topological_order:
            if op.role is not Role.FORWARD:
                continue
            wport = _weight_input(op, self.st)
            if wport is None:
                continue
            wshape = self.graph.tensors[op.inputs[wport]].shape
            if op.type in EMBEDDING_OPS and len(wshape) == 2:
                self._embedding(op, wport, wshape)
            elif op.type in MATMUL_OPS and len(wshape) == 2:
                self._matmul(op, wport, wshape)

    def _embedding(self, op: Op, wport: str, wshape: tuple[int, ...]) -> None:
        """Vocabulary tables are vocab-parallel; small tables (positions, buckets) stay replicated.

        A vocabulary: a table of at least :data:`VOCAB_PARALLEL_RATIO` rows per column, or one
        with more rows than columns and as many rows as the loss has classes (the word
        embeddings of a language model, whose head predicts one of their rows; Megatron-LM's
        ``VocabParallelEmbedding`` holds them, while position and token-type tables are plain
        ``Embedding`` s: ``megatron/legacy/model/language_model.py``, ``Embedding``)."""
        var = self.st.param_source[op.inputs[wport]]
        vocabulary = wshape[0] >= VOCAB_PARALLEL_RATIO * wshape[1] or (
            wshape[0] > wshape[1] and wshape[0] in self.classes
        )
        if vocabulary and wshape[0] % self.mesh.shape[self.tp] == 0:
            self.layout[var] = self.tp_split(0)
        self.tables.append((var, next(iter(op.outputs.values())), wshape))

    def _matmul(self, op: Op, wport: str, wshape: tuple[int, ...]) -> None:
        """A weight matmul: column-parallel if its output reaches another weight matmul or the
        loss before a norm (and it is not the second of a pair), row-parallel if it is the
        second of a pair (its input downstream of a column-parallel one), else replicated."""
        var = self.st.param_source[op.inputs[wport]]
        (out,) = list(op.outputs.values())[:1]
        activation = [t for p, t in op.inputs.items() if p != wport]
        if any(t in self.region for t in activation):
            column = False  # the second matmul of a Megatron pair
        else:
            hit_matmul, hit_loss = _forward_reach(self.graph, out, self.st)
            column = hit_matmul or hit_loss
            if not column:
                # Megatron-LM's RowParallelLinear takes its input split (input_is_parallel,
                # after a column-parallel one); a linear on a whole activation whose output is
                # normalised next is a plain replicated Linear (BertLMHead's dense,
                # megatron/legacy/model/bert_model.py: get_linear_layer)
                return
        out_dim, in_dim = _weight_dims(op, wport)
        dim = out_dim if column else in_dim
        if wshape[dim] % self.mesh.shape[self.tp] != 0:
            return
        if self.layout[var] != self.replicated and self.layout[var] != self.tp_split(dim):
            return  # tied weight already laid out (vocab-parallel embedding)
        self.layout[var] = self.tp_split(dim)
        if column:
            self.column_outputs.add(out)
            reach = _forward_region(self.graph, out, self.st)
            self.region |= reach
            self.columns.extend((var, t, reach) for t in activation)

    def split_head_tables(self) -> None:
        """A per-head table (T5's relative position bias [buckets, heads]) whose gathered
        values are added to head-split attention scores is split by heads, as each
        tensor-parallel rank adds only its heads' slice of the bias (NeMo's Megatron T5,
        CoreAttention.forward: relative_position_bias[:, offset : offset + heads_per_partition])."""
        for var, gathered, wshape in self.tables:
            if wshape[1] % self.mesh.shape[self.tp] != 0:
                continue
            if _meets_region(self.graph, gathered, self.region, self.st):
                self.layout[var] = self.tp_split(1)

    def split_column_biases(self) -> None:
        """Biases added to column-parallel outputs are split with them."""
        for op in self.graph.ops:
            if op.role is not Role.FORWARD or op.type not in (
                "bias_add",
                "broadcast_add",
                "fused_matmul_bias",
            ):
                continue
            ins = list(op.inputs.values())
            if not any(t in self.column_outputs for t in ins):
                continue
            for t in ins:
                shape = self.graph.tensors[t].shape
                if t in self.st.param_source and len(shape) == 1 and shape[0] % self.mesh.shape[self.tp] == 0:
                    self.layout[self.st.param_source[t]] = self.tp_split(0)


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


def _closest(sigs: list[Signature], out_target: NdSbp) -> Signature:
    def score(sig: Signature) -> int:
        return sum(1 for a, b in zip(sig.outputs[0], out_target) if a != b) if sig.outputs else 0

    return min(sigs, key=score)


@dataclass
class _Problem:
    """What every baseline strategy reads: the graph, the mesh and how to price it."""

    graph: Graph
    mesh: Mesh
    zero_stage: int
    rules: RuleSet
    runtime: str
    _contexts: dict[str, tuple[RuleContext, list[Signature]]] = field(default_factory=dict)
    _batch: list[int | None] = field(default_factory=list)

    @property
    def batch(self) -> int | None:
        """The batch size (:func:`batch_size`), found once."""
        if not self._batch:
            self._batch.append(batch_size(self.graph))
        return self._batch[0]

    @property
    def replicated(self) -> NdSbp:
        return NdSbp(tuple(B for _ in range(self.mesh.ndim)))

    @property
    def tp_axis(self) -> int | None:
        """The tensor-parallel axis: the last one of a mesh with two or more axes."""
        return self.mesh.ndim - 1 if self.mesh.ndim >= 2 else None

    def signatures_of(self, op: Op) -> tuple[RuleContext, list[Signature]]:
        """The op's rule context and valid signatures (one rule evaluation per op)."""
        found = self._contexts.get(op.name)
        if found is None:
            sharding = runtime_profile(self.runtime).zero_sharding.value
            ctx = rule_context(self.graph, op, self.mesh.shape, self.zero_stage, sharding)
            found = self._contexts[op.name] = (ctx, op_signatures(self.rules, ctx)[0])
        return found

    def source_signature(self, op: Op, layout: _Layout) -> Signature:
        """A source op's signature: the closest to :func:`_source_layout` of ``layout``."""
        _, sigs = self.signatures_of(op)
        target = _source_layout(self.graph, op, layout.variables, layout.data, self.batch, self.replicated)
        return _closest(sigs, target)

    def to_plan(self, kind: BaselineKind, chosen: dict[str, Signature]) -> Plan:
        return Plan.from_assignment(
            self.graph,
            self.mesh,
            self.zero_stage,
            chosen,
            source=f"baseline:{kind.value}",  # MEGATRON_SOURCE for megatron
            runtime=runtime_profile(self.runtime).name,
        )


@dataclass(frozen=True)
class _Layout:
    """Where a baseline puts its sources: parameters, batch inputs, and Megatron's linears."""

    variables: dict[str, NdSbp]
    data: NdSbp
    fused: dict[str, int] = field(default_factory=dict)  # column-parallel variable -> linear id


class Baseline(ABC):
    """One reference plan: a parameter layout and a rule for every other op's signature."""

    kind: ClassVar[BaselineKind]

    @abstractmethod
    def signatures(self, problem: _Problem) -> dict[str, Signature]:
        """Op name -> the signature this baseline gives it."""

    def plan(self, problem: _Problem) -> Plan:
        return problem.to_plan(self.kind, self.signatures(problem))


class SingleDeviceBaseline(Baseline):
    """Every op replicated (all ``B``): each device does the work of one."""

    kind = BaselineKind.SINGLE_DEVICE

    def signatures(self, problem: _Problem) -> dict[str, Signature]:
        layout = _Layout({v.op: problem.replicated for v in problem.graph.variables}, problem.replicated)
        chosen: dict[str, Signature] = {}
        for op in problem.graph.topological_order:
            if op.name in layout.variables or op.type in ("variable", "input", "pipeline_recv"):
                chosen[op.name] = problem.source_signature(op, layout)
            else:
                _, sigs = problem.signatures_of(op)
                chosen[op.name] = min(
                    sigs, key=lambda s: sum(v != B for p in (*s.inputs, *s.outputs) for v in p)
                )
        return chosen


class DataParallelBaseline(Baseline):
    """Parameters ``B``, data ``S(0)`` on every axis, the rest greedy under Megatron's discipline."""

    kind = BaselineKind.DATA_PARALLEL

    def signatures(self, problem: _Problem) -> dict[str, Signature]:
        graph, ndim = problem.graph, problem.mesh.ndim
        layout = _Layout(
            {v.op: problem.replicated for v in graph.variables}, NdSbp(tuple(S(0) for _ in range(ndim)))
        )
        return _GreedyWalk(problem, layout, _structure(graph), megatron=False).run()


class MegatronBaseline(Baseline):
    """Megatron-LM's dp x tp layout; every other op greedy under its discipline (module docstring)."""

    kind = BaselineKind.MEGATRON

    def signatures(self, problem: _Problem) -> dict[str, Signature]:
        _check_heads_divide(problem)
        return _GreedyWalk(problem, _libai_layout(problem), _structure(problem.graph), megatron=True).run()


def _check_heads_divide(problem: _Problem) -> None:
    """Megatron-LM gives every tensor-parallel rank the same number of attention heads and
    refuses a degree that does not divide them (``num_attention_heads_per_partition =
    divide(num_attention_heads, world_size)``, megatron/core/transformer/attention.py;
    ``ensure_divisibility``, megatron/core/utils.py).  Checked where the graph says its
    heads (a built model's ``meta["config"]["heads"]``); an imported job's layout splits
    what its shapes allow."""
    tp_axis = problem.tp_axis
    heads = ((problem.graph.meta or {}).get("config") or {}).get("heads")
    if tp_axis is None or not isinstance(heads, int) or heads <= 0:
        return
    tp = problem.mesh.shape[tp_axis]
    if heads % tp:
        fits = ", ".join(str(d) for d in range(1, heads + 1) if heads % d == 0)
        raise ConfigError(
            "megatron_heads_split",
            f"Megatron-LM cannot split {heads} attention heads over a tensor-parallel degree of {tp} "
            f"(megatron/core/transformer/attention.py divides the heads evenly): use a tensor-parallel "
            f"degree (the mesh's last axis) that divides {heads}: one of {fits}",
        )


class InferredBaseline(Baseline):
    """OneFlow's SBP inference from LiBai's layout (:func:`_inferred_plan`)."""

    kind = BaselineKind.INFERRED

    def signatures(self, problem: _Problem) -> dict[str, Signature]:
        layout = _libai_layout(problem)
        sharding = runtime_profile(problem.runtime).zero_sharding.value
        sources = {
            op.name: problem.source_signature(op, layout)
            for op in problem.graph.ops
            if op.type in SOURCE_TYPES
        }
        return infer_like_oneflow(
            problem.graph,
            tuple(problem.mesh.shape),
            sources,
            zero_stage=problem.zero_stage,
            rules=problem.rules,
            zero_sharding=sharding,
        )


def _libai_layout(problem: _Problem) -> _Layout:
    """Megatron's (and LiBai's) parameter layout, data ``S(0)`` on the data-parallel axes."""
    variables, fused = _megatron_layout(problem.graph, problem.mesh)
    tp = problem.tp_axis
    data = NdSbp(tuple(B if a == tp else S(0) for a in range(problem.mesh.ndim)))
    return _Layout(variables, data, fused)


STRATEGIES: dict[BaselineKind, Baseline] = {
    s.kind: s
    for s in (MegatronBaseline(), InferredBaseline(), DataParallelBaseline(), SingleDeviceBaseline())
}
"""Each baseline's strategy, by kind."""


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

    Boxing is priced as ``runtime`` lowers it (:mod:`autopar.runtime`).  ``rules`` None:
    the rules the plan's source is evaluated with (:func:`autopar.rules.megatron_lm.rules_for_source`:
    Megatron-LM's vocab-parallel cross-entropy for ``megatron``, OneFlow's otherwise).
    """
    try:
        kind = BaselineKind(kind)
    except ValueError:
        raise ConfigError(
            "unknown_baseline", f"unknown baseline {kind!r}; choose one of {BASELINES}"
        ) from None
    problem = _Problem(graph, mesh, zero_stage, rules or rules_for_source(f"baseline:{kind.value}"), runtime)
    return STRATEGIES[kind].plan(problem)


class _GreedyWalk:
    """The ``megatron`` and ``data-parallel`` walk: every op in topological order takes the
    signature with the least (input boxing, inputs whose layout changes, compute) among
    those Megatron's discipline allows (:meth:`_disciplined`).  ``megatron``: constants
    are computed whole on every rank and weight gradients keep their parameter's layout."""

    def __init__(self, problem: _Problem, layout: _Layout, st: _Structure, *, megatron: bool) -> None:
        self.p, self.graph, self.layout, self.st, self.megatron = problem, problem.graph, layout, st, megatron
        self.tp_axis = problem.tp_axis
        self.lowering = runtime_profile(problem.runtime).lowering.value
        self.grad_owner = _gradient_owners(self.graph, layout.variables, st) if megatron else {}
        self.grad_layout = {t: layout.variables[v.op] for t, v in self.grad_owner.items()}
        self.diff_targets: dict[str, NdSbp | None] = {}
        self.box_memo: dict[tuple[tuple[int, ...], int, NdSbp, NdSbp], float] = {}
        self.chosen: dict[str, Signature] = {}
        self.tensor_sbp: dict[str, NdSbp] = {}
        self.dgrads = _input_gradient_matmuls(self.graph, self.st, layout.fused)
        self.dgrad_ops = frozenset().union(*self.dgrads.values())
        # backward tensor -> the input-gradient matmuls whose partial sums it holds
        self.parts: dict[str, frozenset[str]] = {}

    def run(self) -> dict[str, Signature]:
        for op in self.graph.topological_order:
            sig = self._pick(op)
            self.chosen[op.name] = sig
            for port, out in zip(op.outputs, sig.outputs):
                self.tensor_sbp[op.outputs[port]] = out
            self.parts.update(self._input_gradient_parts(op, sig))
        return self.chosen

    def _input_gradient_parts(self, op: Op, sig: Signature) -> dict[str, frozenset[str]]:
        """Output tensor -> the input-gradient matmuls (:func:`_input_gradient_matmuls`) whose
        partial sums it holds on the tensor-parallel axis: such a matmul's own output; a sum,
        cast or identity carries those of the inputs it takes as partial sums."""
        tp = self.tp_axis
        if op.role is not Role.BACKWARD or tp is None:
            return {}
        parts: frozenset[str] = frozenset()
        if op.name in self.dgrad_ops:
            if any(isinstance(out[tp], Partial) for out in sig.outputs):
                parts = frozenset({op.name})
        elif op.type in SUM_OPS or op.type in PASS_THROUGH_OPS:
            parts = frozenset().union(
                *(
                    self.parts.get(t, frozenset())
                    for t, dst in zip(op.inputs.values(), sig.inputs)
                    if isinstance(dst[tp], Partial)
                )
            )
        return dict.fromkeys(op.outputs.values(), parts) if parts else {}

    def _completes_one_linear(self, tensors: list[str]) -> bool:
        """Whether the partial sums of ``tensors`` summed together complete at most one
        Megatron linear's input gradient (all its input-gradient matmuls).  Megatron-LM
        all-reduces each linear's input gradient once (``copy_to_tensor_model_parallel_region``,
        megatron/core/tensor_parallel/mappings.py; per decoder layer for the cross-attention's
        ``key_value`` on the encoder output).  OneFlow's autograd may sum the input gradients
        of several linears reading one tensor in one ``add_n`` tree that mixes them (a T5
        encoder output: one layer's v with the next layer's k and v, then the first layer's
        k); letting a partial sum complete at most one linear before its all-reduce keeps
        one all-reduce per linear, so the bytes are Megatron-LM's."""
        held = frozenset().union(*(self.parts.get(t, frozenset()) for t in tensors))
        return sum(1 for members in self.dgrads.values() if members <= held) <= 1

    def _pick(self, op: Op) -> Signature:
        if (
            op.name in self.layout.variables
            or op.type in ("variable", "input", "pipeline_recv")
            or (self.megatron and not op.inputs)
        ):
            # Megatron computes constants (position ids, causal masks) whole on every rank
            return self.p.source_signature(op, self.layout)
        ctx, sigs = self.p.signatures_of(op)
        candidates = self._candidates(op, sigs)
        rule = self.p.rules.get(op.type)
        # Megatron keeps every layout it receives unless it must change it: score by
        # (boxing time, inputs whose layout changes, compute)
        best: tuple[float, ...] = (math.inf,)
        sig: Signature | None = None
        for cand in candidates:
            boxing, changed = self._boxing(op, cand, best[0])
            score = (boxing, changed, op_compute_time(rule, ctx, cand, self.p.mesh))
            if score < best:
                best, sig = score, cand
        return candidates[0] if sig is None else sig

    def _candidates(self, op: Op, sigs: list[Signature]) -> list[Signature]:
        if op.role is Role.OPTIMIZER:
            # the optimizer takes the parameter as laid out
            i = model_port_index(op)
            if i is None:
                return sigs
            want = self.tensor_sbp.get(list(op.inputs.values())[i])
            return [s for s in sigs if s.inputs[i] == want] or sigs
        return [s for s in sigs if self._disciplined(op, s)] or sigs

    def _boxing(self, op: Op, cand: Signature, bound: float) -> tuple[float, int]:
        """(Seconds of input boxing, inputs whose layout changes) of ``cand``; stops
        summing once over ``bound`` (the candidate then loses anyway)."""
        boxing = 0.0
        changed = 0
        for port, dst in zip(op.inputs, cand.inputs):
            t = op.inputs[port]
            src = self.tensor_sbp[t]
            if src != dst:
                changed += 1
                spec = self.graph.tensors[t]
                boxing += self._box(spec.shape, DTYPE_BYTES[spec.dtype], src, dst)
            if boxing > bound:
                break
        return boxing, changed

    def _box(self, shape: tuple[int, ...], itemsize: int, src: NdSbp, dst: NdSbp) -> float:
        key = (shape, itemsize, src, dst)
        hit = self.box_memo.get(key)
        if hit is None:
            hit = self.box_memo[key] = boxing_time(shape, itemsize, src, dst, self.p.mesh, self.lowering)
        return hit

    def _disciplined(self, op: Op, sig: Signature) -> bool:
        return (
            self._allowed_partial(op, sig)
            and self._splits_only_what_is_split(op, sig)
            and self._resolves_partial(op, sig)
            and self._keeps_gradient_layout(op, sig)
            and self._reduces_gradients(op, sig)
        )

    def _splits_only_what_is_split(self, op: Op, sig: Signature) -> bool:
        """Megatron (without sequence parallelism) splits a tensor on the tensor-parallel axis
        only where a tensor-parallel parameter's split reaches it: an op gives a split output
        there only if one of its inputs is already split there, never by slicing a whole
        activation (a norm, a residual, a class token computed on a slice of the batch)."""
        tp = self.tp_axis
        if not self.megatron or tp is None:
            return True
        if not any(isinstance(out[tp], Split) for out in sig.outputs):
            return True
        return any(isinstance(self.tensor_sbp[t][tp], Split) for t in op.inputs.values())

    def _allowed_partial(self, op: Op, sig: Signature) -> bool:
        """Megatron discipline: partial sums only out of tp matmuls / towards weight grads."""
        for port, out in zip(op.outputs, sig.outputs):
            t = op.outputs[port]
            for axis, v in enumerate(out):
                if isinstance(v, Partial) and not self._partial_ok(op, sig, t, axis):
                    return False
        return True

    def _partial_ok(self, op: Op, sig: Signature, t: str, axis: int) -> bool:
        """Whether output ``t`` of ``op`` may be a partial sum on ``axis``."""
        if self.graph.tensors[t].numel <= 1:
            return True
        if t in self.st.grad_path:
            # gradients are reduced once (ZeRO reduce-scatter) before clipping reads them
            return len(self.graph.consumers.get(t, [])) <= 1
        if t in self.st.grad_feeds and axis != self.tp_axis:
            return True  # partial over the batch until the gradient's reduction
        if axis != self.tp_axis:
            return False
        if (op.type in MATMUL_OPS or op.type in EMBEDDING_OPS) and _weight_input(op, self.st) is not None:
            return True
        if (
            op.role is Role.FORWARD
            and op.type in VOCAB_PARALLEL_LOSS_OPS
            and any(isinstance(self.tensor_sbp[i][axis], Split) for i in op.inputs.values())
        ):
            # vocab-parallel cross-entropy: each rank reduces its slice of the
            # vocabulary, the partial sums are all-reduced (Megatron's
            # _VocabParallelCrossEntropy: all-reduce of the [b, s] sums and targets)
            return True
        # summing tp partial sums of input gradients (of separate Q, K, V projections)
        # before one all-reduce, as Megatron's fused QKV does, as long as the sum completes
        # at most one Megatron linear: Megatron's copy_to_tensor_model_parallel_region
        # all-reduces once per linear (a T5 encoder output read by every decoder layer's
        # key/value: once per layer)
        if op.type not in SUM_OPS or not all(isinstance(s[axis], Partial) for s in sig.inputs):
            return False
        if all(isinstance(self.tensor_sbp[i][axis], Partial) for i in op.inputs.values()):
            return self._completes_one_linear(list(op.inputs.values()))
        return self._joins_input_gradient(op, axis)

    def _joins_input_gradient(self, op: Op, axis: int) -> bool:
        """Whether backward sum ``op`` adds whole tensors to the partial input gradient of one
        Megatron linear: OneFlow's autograd sums every gradient of a tensor in one ``add_n``
        (the residual's with q's, k's and v's input gradients), where Megatron sums the
        linear's partial input gradients, all-reduces once and adds the residual.  Taking the
        whole inputs as partial sums (``B -> P`` is local: zeros on all but one rank) and
        reducing the sum once moves the same bytes as Megatron's one all-reduce."""
        if op.role is not Role.BACKWARD:
            return False
        partial = [i for i in op.inputs.values() if isinstance(self.tensor_sbp[i][axis], Partial)]
        whole = [i for i in op.inputs.values() if isinstance(self.tensor_sbp[i][axis], Broadcast)]
        if not partial or len(partial) + len(whole) != len(op.inputs):
            return False
        held = any(self.parts.get(i) for i in partial)
        return held and self._completes_one_linear(partial)

    def _keeps_gradient_layout(self, op: Op, sig: Signature) -> bool:
        """A weight gradient is not split on the tensor-parallel axis unless its parameter
        is, and then as the parameter: Megatron computes a replicated norm or position
        table's gradient whole on every tensor-parallel rank, never a slice to gather
        again before the update.  (A partial sum may still flow into a norm's weight
        gradient, :meth:`_allowed_partial`: it reads the activation gradient before its
        all-reduce, which per-edge pricing would otherwise charge twice.)"""
        tp = self.tp_axis
        if tp is None:
            return True
        for t, out in zip(op.outputs.values(), sig.outputs):
            want = self.grad_layout.get(t)
            if want is not None and isinstance(out[tp], Split) and out[tp] != want[tp]:
                return False
        return True

    def _resolves_partial(self, op: Op, sig: Signature) -> bool:
        """Megatron all-reduces a tensor-parallel partial sum to ``B`` (never scatters it)
        and never turns a whole or split tensor into a partial sum, except a whole one that
        joins a linear's partial input gradient (:meth:`_joins_input_gradient`)."""
        tp = self.tp_axis
        if tp is None:
            return True
        for port, dst in zip(op.inputs, sig.inputs):
            src = self.tensor_sbp[op.inputs[port]]
            if isinstance(src[tp], Partial) and not isinstance(dst[tp], (Partial, type(B))):
                return False
            if (
                isinstance(dst[tp], Partial)
                and not isinstance(src[tp], Partial)
                and not (isinstance(src[tp], Broadcast) and self._joins_input_gradient(op, tp))
            ):
                return False
        return True

    def _diff_target(self, v: Variable) -> NdSbp | None:
        """The layout the optimizer takes ``v``'s gradient in (``model_diff``), given the
        parameter as laid out: replicated on the data-parallel axes without ZeRO, split as
        the optimizer's shard with it."""
        if v.op not in self.diff_targets:
            self.diff_targets[v.op] = None
            opt = self.graph.op_by_name.get(v.optimizer or "")
            model_index = None if opt is None else model_port_index(opt)
            if (
                opt is not None
                and model_index is not None
                and v.grad is not None
                and v.grad in opt.inputs.values()
            ):
                diff_index = list(opt.inputs.values()).index(v.grad)
                _, osigs = self.p.signatures_of(opt)
                model = self.tensor_sbp.get(v.tensor)
                matching = [g for g in osigs if g.inputs[model_index] == model]
                if matching:
                    self.diff_targets[v.op] = matching[0].inputs[diff_index]
        return self.diff_targets[v.op]

    def _reduces_gradients(self, op: Op, sig: Signature) -> bool:
        """Megatron reduces a weight gradient over the data-parallel axes once, where it is
        made (DDP's all-reduce of the gradient buffer; with the distributed optimizer, a
        reduce-scatter to the optimizer's shard): a partial sum over the batch goes, at its
        first consumer, straight to the layout the optimizer takes it in, in the dtype it
        was made in (Megatron-LM reduces ``main_grad`` in the parameters' dtype unless
        ``--accumulate-allreduce-grads-in-fp32``), never through another split to fix
        later; a sum of such partial sums (a table read twice) adds them first, as the one
        gradient buffer does, and an ``identity`` hands it on (:data:`GRADIENT_CARRIERS`)."""
        for port, dst in zip(op.inputs, sig.inputs):
            t = op.inputs[port]
            owner = self.grad_owner.get(t)
            target = None if owner is None else self._diff_target(owner)
            if target is None:
                continue
            for axis, v in enumerate(self.tensor_sbp[t]):
                if axis == self.tp_axis or not isinstance(v, Partial):
                    continue
                if op.type in GRADIENT_CARRIERS and isinstance(dst[axis], Partial):
                    continue
                if dst[axis] != target[axis]:
                    return False
        return True


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


def megatron_input_gradient_linears(graph: Graph, mesh: Mesh) -> dict[str, int]:
    """Backward matmul op -> the Megatron linear (an id of :func:`_megatron_layout`'s map) whose
    input gradient it computes a part of, on ``mesh``'s tensor-parallel axis.

    Megatron-LM runs the column-parallel linears that read one activation and meet before
    the next weight matmul as one GEMM (``query_key_value``; a cross-attention's
    ``key_value``; the gated ``dense_h_to_4h``), so the input-gradient matmuls of a graph
    written with separate ``q``, ``k``, ``v`` (or ``k``, ``v``) are parts of one GEMM's
    output, all-reduced once (``copy_to_tensor_model_parallel_region``,
    megatron/core/tensor_parallel/mappings.py).  Empty without a tensor-parallel axis."""
    _, fused = _megatron_layout(graph, mesh)
    if not fused:
        return {}
    found = _input_gradient_matmuls(graph, _structure(graph), fused)
    return {op: linear for linear, ops in found.items() for op in ops}


def _input_gradient_matmuls(graph: Graph, st: _Structure, fused: dict[str, int]) -> dict[int, frozenset[str]]:
    """Megatron linear (:func:`_megatron_layout` id) -> its input-gradient matmuls: the
    backward matmuls that read one of its column-parallel weights (``dy @ W``; the weight
    gradient's matmul reads the activation, not the weight)."""
    found: dict[int, set[str]] = {}
    for op in graph.ops:
        wport = _weight_input(op, st) if op.role is Role.BACKWARD and op.type in MATMUL_OPS else None
        if wport is not None and st.param_source[op.inputs[wport]] in fused:
            found.setdefault(fused[st.param_source[op.inputs[wport]]], set()).add(op.name)
    return {linear: frozenset(ops) for linear, ops in found.items()}


def _source_layout(
    graph: Graph, op: Op, var_layout: dict[str, NdSbp], data: NdSbp, batch: int | None, replicated: NdSbp
) -> NdSbp:
    """The layout a baseline gives a source op: a parameter its ``var_layout`` entry
    (else replicated); a batch input ``data``; any other input or constant replicated
    (T5's position buckets are the same on every rank)."""
    if op.name in var_layout or op.type == "variable":
        return var_layout.get(op.name, replicated)
    if op.type in ("input", "pipeline_recv"):  # a stage's received activation: data-parallel too
        spec = graph.tensors[next(iter(op.outputs.values()))]
        return data if spec.shape[:1] == (batch,) else replicated
    return replicated
