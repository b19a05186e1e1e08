"""GraphBuilder: write a model's forward pass once, get forward + backward + AdamW.

The builder emits ops at OneFlow 0.9 granularity (op types are OneFlow user-op
names, ports are OneFlow bn names with index, attrs as in
``oneflow/ir/include/OneFlow/OneFlowUserOps.td``) and keeps a **tape**: every
differentiable forward op records a closure that, given the gradient of its
output, emits the backward ops OneFlow's autograd would emit for it (the
``gradient_funcs`` of OneFlow 0.9)::

    forward helper            backward ops emitted
    ------------------------  -------------------------------------------------
    broadcast_matmul(x, W^T)  broadcast_matmul(dy, W), broadcast_matmul_grad_b(dy, x)
    batch_matmul(a, b)        batch_matmul x2 (transposes follow OneFlow's MatMul grad)
    broadcast_add(x, bias)    reduce_sum_like(dy, bias) for the broadcast side
    add (same shapes)         add_n forward; gradient passes through unchanged
    softmax / dropout         softmax_grad / dropout_grad
    gelu / fast_gelu          gelu_grad / fast_gelu_grad
    rms_norm / layer_norm     rms_norm_grad + rms_norm_param_grad / layer_norm_grad + _param_grad
    gather (embedding)        unsorted_segment_sum_like
    reshape / transpose       reshape / transpose with the inverse perm
    cast                      cast back to the input dtype
    reduce_sum / scalar_mul   broadcast_like / scalar_mul
    sparse_softmax_cross_entropy  sparse_softmax_cross_entropy_grad

A tensor read by several differentiable ops gets its gradient contributions
summed by one ``add_n`` just before its producer's backward runs.

Mixed precision follows OneFlow AMP: parameters are ``float32`` ``variable`` ops,
each cast once to the compute dtype, and every use reads that one copy (OneFlow's
``AutoMixedPrecision`` pass groups the edges it casts by source blob and inserts one
``cast`` per blob: ``InsertCastOpImpl``, ``edges_group_by_lbn``, in
``oneflow/core/job_rewriter/auto_mixed_precision.cpp``); the gradient of a copy read
several times (a shared or tied embedding) is summed by one ``add_n`` in the compute
dtype and flows back through one ``cast`` to ``float32``.  :meth:`GraphBuilder.optimizer`
optionally clips gradients by global norm exactly as OneFlow's optimizer pass
does (``multi_reduce_sum_pow_abs`` per gradient, an ``add_n`` tree of at most 8
inputs, ``scalar_pow``, ``scalar_add``, ``reciprocal_no_nan``, ``scalar_mul``,
``clip_by_scalar_max``, then ``scalar_mul_by_tensor`` per gradient) and ends
with one ``adam_update`` per parameter (inputs ``model_0``, ``model_diff_0``).

Nothing here validates per op: :meth:`GraphBuilder.build` returns the
:class:`~autopar.ir.graph.Graph` and the caller validates it once.
"""

from __future__ import annotations

from autopar.errors import GraphError
from autopar.ir.graph import Role, Variable
from autopar.models.builder_core import ADD_N_MAX_INPUTS, GradList, Param, Shape, _scalar_attrs
from autopar.models.builder_layer_ops import LayerOps

__all__ = ["GraphBuilder", "Param"]


class GraphBuilder(LayerOps):
    """Record a forward pass, then emit backward, optional gradient clipping and AdamW.

    Typical use::

        b = GraphBuilder("tiny", compute_dtype="float16")
        ids = b.input("input_ids", (8, 32), "int64")
        emb = b.param("wte.weight", (512, 64), weight_decay=0.01)
        h = b.gather(b.use(emb), ids, name="wte.gather")
        ...
        b.backward(loss)
        b.optimizer(lr=1e-4, weight_decay=0.01, clip_grad_max_norm=1.0)
        graph = b.build(meta={...}).validate()

    Forward helpers take an op name relative to the current :meth:`scope`; the
    backward ops of forward op ``X`` are named ``X_grad`` (plus a suffix when
    there are several).  Every tensor is named ``<op>/<port>`` like OneFlow's
    logical blob names.
    """

    # ------------------------------------------------------------ backward

    def _sum_grads(self, contributions: dict[str, list[str]], tensor: str) -> str | None:
        grads = contributions.pop(tensor, None)
        if not grads:
            return None
        spec = self._tensors[tensor]
        for gname in grads:
            if self._tensors[gname].shape != spec.shape:
                raise GraphError(
                    "shape_mismatch",
                    f"gradient {gname!r} has shape {list(self._tensors[gname].shape)} "
                    f"but tensor {tensor!r} has {list(spec.shape)}",
                    tensor=tensor,
                )
        if len(grads) == 1:
            return grads[0]
        return self.emit(
            f"{tensor.replace('/', '.')}_grad_add_n",
            "add_n",
            {f"in_{i}": gname for i, gname in enumerate(grads)},
            [("out_0", spec.shape, self._tensors[grads[0]].dtype)],
        )[0]

    def backward(self, loss: str) -> None:
        """Emit the backward pass from scalar ``loss`` (seeded by ``ones_like(loss)``)."""
        if self._loss is not None:
            raise GraphError("bad_builder", "backward() was already called")
        if loss not in self._requires_grad:
            raise GraphError("bad_builder", f"loss {loss!r} does not depend on any parameter", tensor=loss)
        self._loss = loss
        self._role = Role.BACKWARD
        producer = loss.split("/", 1)[0]
        (seed,) = self.emit(
            f"{producer}_grad_seed",
            "ones_like",
            {"like_0": loss},
            [("out_0", self.shape(loss), self.dtype(loss))],
        )
        contributions: dict[str, list[str]] = {loss: [seed]}
        for entry in reversed(self._tape):
            gys: GradList = [self._sum_grads(contributions, t) for t in entry.outputs]
            if all(g is None for g in gys):
                continue
            gxs = entry.backward(gys)
            for t, gx in zip(entry.inputs, gxs, strict=True):
                if gx is not None and t in self._requires_grad:
                    contributions.setdefault(t, []).append(gx)
        for p in self._params:
            grad = self._sum_grads(contributions, p.tensor)
            if grad is None:
                raise GraphError(
                    "unused_parameter",
                    f"parameter {p.name!r} does not reach the loss; remove it",
                    op=p.name,
                )
            if self.dtype(grad) != self.param_dtype:
                raise GraphError(
                    "bad_builder",
                    f"gradient of {p.name!r} is {self.dtype(grad)}, not {self.param_dtype}",
                )
            self._param_grads[p.name] = grad

    # ------------------------------------------------------------ optimizer

    def _add_tree(self, tensors: list[str], prefix: str) -> str:
        """OneFlow's ``AddLbns``: repeatedly ``add_n`` the last (up to) 8 tensors."""
        pending = list(tensors)
        k = 0
        while len(pending) > 1:
            start = max(0, len(pending) - ADD_N_MAX_INPUTS)
            chunk = pending[start:]
            del pending[start:]
            spec = self._tensors[chunk[0]]
            (out,) = self.emit(
                f"{prefix}_{k}",
                "add_n",
                {f"in_{i}": t for i, t in enumerate(chunk)},
                [("out_0", spec.shape, spec.dtype)],
            )
            pending.append(out)
            k += 1
        return pending[0]

    def _clip_by_global_norm(self, grads: list[str], max_norm: float, norm_type: float) -> list[str]:
        """OneFlow's ``ClipGradientByGlobalNorm`` job pass (p-norm, no aggregation)."""
        scalar: Shape = ()
        prefix = "clip_grad"
        partial = [
            self.emit(
                f"{p.name}.grad_norm",
                "multi_reduce_sum_pow_abs",
                {"x_0": g},
                [("y_0", scalar, "float32")],
                {"p": norm_type},
            )[0]
            for p, g in zip(self._params, grads, strict=True)
        ]
        total = self._add_tree(partial, f"{prefix}.global_norm_add")
        (norm,) = self.emit(
            f"{prefix}.global_pow",
            "scalar_pow",
            {"in_0": total},
            [("out_0", scalar, "float32")],
            _scalar_attrs(1.0 / norm_type),
        )
        (eps,) = self.emit(
            f"{prefix}.add_eps",
            "scalar_add",
            {"in_0": norm},
            [("out_0", scalar, "float32")],
            _scalar_attrs(1e-6),
        )
        (inv,) = self.emit(f"{prefix}.inv", "reciprocal_no_nan", {"x_0": eps}, [("y_0", scalar, "float32")])
        (coeff,) = self.emit(
            f"{prefix}.coeff",
            "scalar_mul",
            {"in_0": inv},
            [("out_0", scalar, "float32")],
            _scalar_attrs(max_norm),
        )
        (clamped,) = self.emit(
            f"{prefix}.clamp",
            "clip_by_scalar_max",
            {"x_0": coeff},
            [("y_0", scalar, "float32")],
            {"floating_max": 1.0, "integral_max": 0},
        )
        return [
            self.emit(
                f"{p.name}.grad_clip",
                "scalar_mul_by_tensor",
                {"x_0": g, "scalar_0": clamped},
                [("y_0", self.shape(g), self.dtype(g))],
            )[0]
            for p, g in zip(self._params, grads, strict=True)
        ]

    def optimizer(
        self,
        *,
        lr: float,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-8,
        clip_grad_max_norm: float | None = None,
        clip_grad_norm_type: float = 2.0,
        do_bias_correction: bool = True,
    ) -> None:
        """Optionally clip gradients by global norm (backward role), then one ``adam_update`` per
        parameter (optimizer role) with the parameter's own weight decay (AdamW)."""
        if self._loss is None:
            raise GraphError("bad_builder", "call backward(loss) before optimizer()")
        grads = [self._param_grads[p.name] for p in self._params]
        if clip_grad_max_norm is not None:
            grads = self._clip_by_global_norm(grads, clip_grad_max_norm, clip_grad_norm_type)
        self._role = Role.OPTIMIZER
        for p, g in zip(self._params, grads, strict=True):
            op = f"{p.name}.adam_update"
            self.emit(
                op,
                "adam_update",
                {"model_0": p.tensor, "model_diff_0": g},
                [],
                {
                    "learning_rate_val": lr,
                    "bias_correction1_val": 1.0,
                    "bias_correction2_val": 1.0,
                    "scale": 1.0,
                    "l1": 0.0,
                    "l2": 0.0,
                    "beta1": beta1,
                    "beta2": beta2,
                    "epsilon": epsilon,
                    "weight_decay": p.weight_decay,
                    "amsgrad": False,
                    "do_bias_correction": do_bias_correction,
                },
            )
            self._variables.append(Variable(p.name, p.tensor, g, op))
