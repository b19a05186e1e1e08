"""The walk of the ``megatron`` and ``data-parallel`` baselines: every op in topological order
takes the signature with the least input boxing and compute among those Megatron's discipline
allows (a partial sum only from a tensor-parallel matmul or towards a weight gradient, reduced
as soon as it is used; constants whole on every rank; weight gradients in their parameter's
layout).

With sequence parallelism (Megatron-LM's ``--sequence-parallel``, Korthikanti et al. 2022
section 4.2.2) the ops between the tensor-parallel regions -- norms, dropouts, residual adds,
bias adds after a row-parallel linear, and their gradients -- split the sequence on the
tensor-parallel axis: a row-parallel linear's partial sum is reduce-scattered to the sequence
split instead of all-reduced, and a column-parallel linear all-gathers its input
(:meth:`_GreedyWalk._sequence_dim`).
"""

from __future__ import annotations

import math
from collections import Counter

from autopar.baselines.problem import _Layout, _Problem
from autopar.cost.compute import op_compute_time
from autopar.cost.edges import same_layout
from autopar.cost.fusion import fused_kernels
from autopar.ir.graph import DTYPE_BYTES, Graph, Op, Role, Variable
from autopar.ir.optimizer import model_port_index
from autopar.ir.sbp import B, Broadcast, NdSbp, Partial, Signature, Split
from autopar.ir.structure import (
    EMBEDDING_OPS,
    GRADIENT_CARRIERS,
    MATMUL_OPS,
    PASS_THROUGH_OPS,
    SUM_OPS,
    VOCAB_PARALLEL_LOSS_OPS,
    _gradient_owners,
    _Structure,
    _weight_input,
)
from autopar.runtimes.megatron_lm.linears import _input_gradient_matmuls
from autopar.runtimes.registry import boxing_time, runtime_profile


class _GreedyWalk:
    """The ``megatron`` and ``data-parallel`` walk: every op in topological order takes the
    signature with the least (input boxing, inputs whose layout changes, compute) among
    those Megatron's discipline allows (:meth:`_disciplined`).  ``megatron``: constants
    are computed whole on every rank and weight gradients keep their parameter's layout."""

    def __init__(self, problem: _Problem, layout: _Layout, st: _Structure, *, megatron: bool) -> None:
        self.p, self.graph, self.layout, self.st, self.megatron = problem, problem.graph, layout, st, megatron
        self.tp_axis = problem.tp_axis
        self.sp = problem.sequence_parallel and megatron and self.tp_axis is not None
        self.hidden = _hidden_size(self.graph) if self.sp else None
        self.lowering = runtime_profile(problem.runtime).lowering.value
        self.kernels = fused_kernels(self.graph, runtime_profile(problem.runtime))
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
        disciplined = [s for s in sigs if self._disciplined(op, s)] or sigs
        d = self._sequence_dim(op)
        if d is None:
            return disciplined
        tp = self.tp_axis
        assert tp is not None
        hidden = [i for i, t in enumerate(op.outputs.values()) if self._is_hidden(t)]
        sequence = [s for s in disciplined if all(s.outputs[i][tp] == Split(d) for i in hidden)]
        return sequence or disciplined

    def _is_hidden(self, tensor: str) -> bool:
        """A hidden-state activation ``[..., seq, hidden]`` (not a weight gradient)."""
        spec = self.graph.tensors[tensor]
        return spec.ndim >= 3 and spec.shape[-1] == self.hidden and tensor not in self.st.grad_path

    def _sequence_dim(self, op: Op) -> int | None:
        """Under sequence parallelism: the dim ``op``'s hidden-state outputs split on the
        tensor-parallel axis (the sequence, the dim before the hidden one), when ``op`` is in
        a sequence-parallel region: not a matmul or embedding, with a hidden-state output,
        and every activation input (3 dims or more) whole, sequence-split or a partial sum
        there (a head- or FFN-split input, such as the attention context before the reshape
        that merges its heads, is inside a tensor-parallel region); else None."""
        tp = self.tp_axis
        if not self.sp or tp is None or op.type in MATMUL_OPS or op.type in EMBEDDING_OPS:
            return None
        outs = [t for t in op.outputs.values() if self._is_hidden(t)]
        if not outs:
            return None
        d = self.graph.tensors[outs[0]].ndim - 2
        for t in op.inputs.values():
            sbp = self.tensor_sbp.get(t)
            if sbp is None or self.graph.tensors[t].ndim < 3:
                continue
            if isinstance(sbp[tp], Split) and sbp[tp] != Split(d):
                return None  # a head- or FFN-split activation: inside a tensor-parallel region
        return d

    def _boxing(self, op: Op, cand: Signature, bound: float) -> tuple[float, int]:
        """(Seconds of input boxing, inputs whose layout changes) of ``cand``; stops
        summing once over ``bound`` (the candidate then loses anyway)."""
        boxing = 0.0
        changed = 0
        for port, dst in zip(op.inputs, cand.inputs):
            t = op.inputs[port]
            src = self.tensor_sbp[t]
            if src != dst:
                fused = self.kernels.same_kernel(self.graph.producer[t][0], op.name)
                if fused and not same_layout(src, dst, self.p.mesh.shape):
                    return math.inf, changed + 1  # a fused kernel cannot box between its ops
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
            and self._keeps_weight_layout(op, sig)
        )

    def _keeps_weight_layout(self, op: Op, sig: Signature) -> bool:
        """Megatron never moves a weight: a tensor-parallel linear (or embedding) reads its
        weight as laid out, and moves the activation instead (an all-gather of a
        sequence-parallel input before a column-parallel linear)."""
        if not self.megatron or (op.type not in MATMUL_OPS and op.type not in EMBEDDING_OPS):
            return True
        port = _weight_input(op, self.st)
        if port is None:
            return True
        laid_out = self.tensor_sbp.get(op.inputs[port])
        return laid_out is None or sig.inputs[list(op.inputs).index(port)] == laid_out

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
        d = self._sequence_dim(op)
        if d is not None and all(out[tp] in (Split(d), B) for out in sig.outputs):
            return True  # sequence parallelism slices the sequence of the residual stream
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
        d = self._sequence_dim(op)
        whole = [
            i
            for i in op.inputs.values()
            if isinstance(self.tensor_sbp[i][axis], Broadcast)
            or (d is not None and self.tensor_sbp[i][axis] == Split(d))
        ]
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
            if want is None:
                continue
            if isinstance(out[tp], Split) and out[tp] != want[tp]:
                return False
            if isinstance(want[tp], Split) and out[tp] != want[tp]:
                return False  # a tensor-parallel weight's gradient is made in its shard
        return True

    def _resolves_partial(self, op: Op, sig: Signature) -> bool:
        """Megatron all-reduces a tensor-parallel partial sum to ``B`` (never scatters it)
        and never turns a whole or split tensor into a partial sum, except a whole one that
        joins a linear's partial input gradient (:meth:`_joins_input_gradient`)."""
        tp = self.tp_axis
        if tp is None:
            return True
        d = self._sequence_dim(op)
        scattered = (Split(d),) if d is not None else ()
        for port, dst in zip(op.inputs, sig.inputs):
            t = op.inputs[port]
            src = self.tensor_sbp[t]
            # under sequence parallelism a partial hidden state is reduce-scattered to its
            # sequence wherever it is read (a norm's weight gradient reads the gradient the
            # norm's input gradient does, in one layout: one reduce-scatter)
            seq = (Split(self.graph.tensors[t].ndim - 2),) if self.sp and self._is_hidden(t) else ()
            if isinstance(src[tp], Partial) and not (
                isinstance(dst[tp], (Partial, type(B))) or dst[tp] in scattered or dst[tp] in seq
            ):
                return False  # all-reduced; reduce-scattered to the sequence under sequence parallelism
            if (
                isinstance(dst[tp], Partial)
                and not isinstance(src[tp], Partial)
                and not (
                    (isinstance(src[tp], Broadcast) or src[tp] in scattered)
                    and self._joins_input_gradient(op, tp)
                )
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


def _hidden_size(graph: Graph) -> int | None:
    """The hidden size: the model's (``meta["config"]["hidden"]``), else the last dim most of
    the graph's 3-D forward activations share."""
    hidden = ((graph.meta or {}).get("config") or {}).get("hidden")
    if isinstance(hidden, int) and hidden > 0:
        return hidden
    dims = Counter(
        graph.tensors[t].shape[-1]
        for op in graph.ops
        if op.role is Role.FORWARD
        for t in op.outputs.values()
        if graph.tensors[t].ndim == 3
    )
    return dims.most_common(1)[0][0] if dims else None
