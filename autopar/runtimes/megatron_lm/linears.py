"""Megatron-LM's tensor-parallel linears, recognised from a graph's structure.

Column-parallel (weight split on its output dim), row-parallel (its input dim) and
vocab-parallel embeddings, found by what each matmul's weight reaches, not by names
(:func:`megatron_parameter_layout`); the sibling column-parallel linears Megatron-LM runs as
one GEMM (``query_key_value``, ``key_value``, the gated ``dense_h_to_4h``), and the backward
matmuls that compute parts of one such linear's input gradient
(:func:`megatron_input_gradient_linears`), all-reduced once by the runtime.
"""

from __future__ import annotations

from autopar.hardware.mesh import Mesh
from autopar.ir.graph import Graph, Op, Role
from autopar.ir.sbp import B, NdSbp, S
from autopar.ir.structure import (
    EMBEDDING_OPS,
    MATMUL_OPS,
    VOCAB_PARALLEL_RATIO,
    _forward_reach,
    _forward_region,
    _fused_linears,
    _loss_classes,
    _meets_region,
    _Structure,
    _structure,
    _weight_dims,
    _weight_input,
)

__all__ = ["megatron_input_gradient_linears", "megatron_parameter_layout"]


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
