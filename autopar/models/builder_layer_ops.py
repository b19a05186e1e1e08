"""Layer ops of the graph builder: normalisations, embedding gathers, reductions and the loss,
each with the backward ops OneFlow's autograd emits for it (:mod:`autopar.models.builder`)."""

from __future__ import annotations

from collections.abc import Sequence

from autopar.models.builder_core import GradList, Param
from autopar.models.builder_tensor_ops import TensorOps

__all__ = ["LayerOps"]


class LayerOps(TensorOps):
    """Normalisations, embedding gathers, reductions and the loss."""

    # ------------------------------------------------------------ normalisation

    def rms_norm(self, x: str, weight: Param, *, epsilon: float, name: str) -> str:
        """T5 layer norm (no mean, no bias): ``rms_norm(x, weight) -> y, inv_rms``.

        Backward: ``rms_norm_grad(dy, x, inv_rms, weight)`` and
        ``rms_norm_param_grad(dy, x, inv_rms)``.
        """
        op = self.qualify(name)
        shape = self.shape(x)
        w = self.use(weight)
        y, inv_rms = self.emit(
            op,
            "rms_norm",
            {"x_0": x, "weight_0": w},
            [("y_0", shape, self.dtype(x)), ("inv_rms_0", shape[:-1], "float32")],
            {"normalized_shape": [shape[-1]], "epsilon": epsilon},
        )

        def bw(g: GradList) -> GradList:
            dy = g[0]
            assert dy is not None
            dx = dw = None
            if self.requires_grad(x):
                dx = self.emit(
                    f"{op}_grad",
                    "rms_norm_grad",
                    {"dy_0": dy, "x_0": x, "inv_rms_0": inv_rms, "weight_0": w},
                    [("dx_0", shape, self.dtype(dy))],
                )[0]
            if self.requires_grad(w):
                dw = self.emit(
                    f"{op}_param_grad",
                    "rms_norm_param_grad",
                    {"dy_0": dy, "x_0": x, "inv_rms_0": inv_rms},
                    [("weight_grad_0", self.shape(w), self.dtype(dy))],
                )[0]
            return [dx, dw]

        self._record(op, [x, w], [y], bw)
        return y

    def layer_norm(self, x: str, gamma: Param, beta: Param, *, epsilon: float, name: str) -> str:
        """``layer_norm(x, beta, gamma) -> y, mean, inv_variance`` over the last dim.

        Backward: ``layer_norm_grad(dy, x, mean, inv_variance, gamma)`` and
        ``layer_norm_param_grad(dy, x, mean, inv_variance) -> beta_diff, gamma_diff``.
        """
        op = self.qualify(name)
        shape = self.shape(x)
        axis = len(shape) - 1
        g_t = self.use(gamma)
        b_t = self.use(beta)
        y, mean, inv_var = self.emit(
            op,
            "layer_norm",
            {"x_0": x, "beta_0": b_t, "gamma_0": g_t},
            [
                ("y_0", shape, self.dtype(x)),
                ("mean_0", shape[:-1], "float32"),
                ("inv_variance_0", shape[:-1], "float32"),
            ],
            {
                "center": True,
                "scale": True,
                "begin_norm_axis": axis,
                "begin_params_axis": axis,
                "epsilon": epsilon,
            },
        )

        def bw(g: GradList) -> GradList:
            dy = g[0]
            assert dy is not None
            dx = dg = db = None
            if self.requires_grad(g_t) or self.requires_grad(b_t):
                db, dg = self.emit(
                    f"{op}_param_grad",
                    "layer_norm_param_grad",
                    {"dy_0": dy, "x_0": x, "mean_0": mean, "inv_variance_0": inv_var},
                    [
                        ("beta_diff_0", self.shape(b_t), self.dtype(dy)),
                        ("gamma_diff_0", self.shape(g_t), self.dtype(dy)),
                    ],
                    {"begin_params_axis": axis},
                )
            if self.requires_grad(x):
                dx = self.emit(
                    f"{op}_grad",
                    "layer_norm_grad",
                    {
                        "dy_0": dy,
                        "x_0": x,
                        "mean_0": mean,
                        "inv_variance_0": inv_var,
                        "gamma_0": g_t,
                    },
                    [("dx_0", shape, self.dtype(dy))],
                    {"begin_norm_axis": axis, "epsilon": epsilon},
                )[0]
            return [dx, dg, db]

        self._record(op, [x, g_t, b_t], [y], bw)
        return y

    # ------------------------------------------------------------ embedding, reductions, loss

    def gather(self, table: str, indices: str, *, name: str) -> str:
        """Embedding lookup ``gather(in=table [V, H], indices) -> indices.shape + [H]`` (axis 0).

        Backward: ``unsorted_segment_sum_like(data=dy, segment_ids=indices, like=table)``.
        """
        op = self.qualify(name)
        tshape = self.shape(table)
        (out,) = self.emit(
            op,
            "gather",
            {"in_0": table, "indices_0": indices},
            [("out_0", (*self.shape(indices), *tshape[1:]), self.dtype(table))],
            {"axis": 0},
        )
        self._record_grad(
            op,
            table,
            out,
            "unsorted_segment_sum_like",
            lambda dy: {"data_0": dy, "segment_ids_0": indices, "like_0": table},
            ("out_0", tshape),
            {"axis": 0},
        )
        return out

    def reduce_sum(self, x: str, axis: Sequence[int], *, keepdims: bool = False, name: str) -> str:
        """``reduce_sum``; backward ``broadcast_like(dy, like=x, broadcast_axes=axis)``."""
        op = self.qualify(name)
        shape = self.shape(x)
        axes = sorted(a % len(shape) for a in axis)
        out_shape = tuple((1 if i in axes else d) for i, d in enumerate(shape) if keepdims or i not in axes)
        (y,) = self.emit(
            op,
            "reduce_sum",
            {"input_tensor_0": x},
            [("output_tensor_0", out_shape, self.dtype(x))],
            {"axis": axes, "keepdims": keepdims},
        )
        self._record_grad(
            op,
            x,
            y,
            "broadcast_like",
            lambda dy: {"x_0": dy, "like_0": x},
            ("y_0", shape),
            {"broadcast_axes": axes},
        )
        return y

    def sparse_softmax_cross_entropy(self, logits: str, labels: str, *, name: str) -> str:
        """Per-row loss of ``logits [N, V]`` against ``labels [N]``: outputs ``prob_0``, ``out_0``.

        Backward: ``sparse_softmax_cross_entropy_grad(label, dy, prob) -> prediction_diff``.
        """
        op = self.qualify(name)
        n, depth = self.shape(logits)
        prob, out = self.emit(
            op,
            "sparse_softmax_cross_entropy",
            {"prediction_0": logits, "label_0": labels},
            [("prob_0", (n, depth), self.dtype(logits)), ("out_0", (n,), self.dtype(logits))],
            {"depth": depth},
        )
        self._record_grad(
            op,
            logits,
            out,
            "sparse_softmax_cross_entropy_grad",
            lambda dy: {"label_0": labels, "dy_0": dy, "prob_0": prob},
            ("prediction_diff_0", (n, depth)),
            {"depth": depth},
        )
        return out

    def lm_loss(self, logits: str, labels: str, loss_mask: str, *, name: str = "loss") -> str:
        """LiBai's masked LM loss: ``sum(CE(logits, labels) * loss_mask) / tokens``.

        ``logits [B, S, V]`` (compute dtype) is flattened and cast to ``float32`` as
        Megatron/LiBai do before the cross entropy; ``labels`` (int64) and ``loss_mask``
        (float32) are ``[B, S]`` inputs.  Returns the scalar loss (shape ``()``).
        """
        with self.scope(name):
            bsz, seq, vocab = self.shape(logits)
            n = bsz * seq
            flat = self.reshape(logits, (n, vocab), name="logits_flat")
            if self.dtype(flat) != "float32":
                flat = self.cast(flat, "float32", name="logits_fp32")
            lab = self.reshape(labels, (n,), name="labels_flat")
            mask = self.reshape(loss_mask, (n,), name="mask_flat")
            ce = self.sparse_softmax_cross_entropy(flat, lab, name="cross_entropy")
            ce = self.broadcast_mul(ce, mask, name="mask_mul")
            total = self.reduce_sum(ce, [0], name="sum")
            return self.scalar_mul(total, 1.0 / n, name="mean")
