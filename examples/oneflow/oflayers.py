"""Small OneFlow building blocks shared by the example models (MT5, GPT, BERT).

Parameters are initialised from a numpy ``Generator`` so every rank builds the
same values without any communication (and a one-rank run gives the same
model); with ``rng=None`` they are left uninitialised (``flow.empty``, no
memory touched), which is enough to build and export a job for planning.

``read_param(module, p)`` is how every layer reads a parameter: when the
module's ``identity_reads`` is set it goes through an ``identity`` op.  OneFlow
0.9 on CPU aborts (``Check failed: separated_header_mem_ptr() == nullptr``)
when a boxing sends a *variable's* own buffer to another rank (the buffer is
shared with the eager tensor and has a separated header the socket comm net
cannot send); an identity gives the boxing an ordinary buffer.  autopar's
import makes these identities transparent, so plans are the same either way.
"""

from __future__ import annotations

import math

import numpy as np
import oneflow as flow
import oneflow.nn as nn


def make_param(shape: tuple[int, ...], rng: np.random.Generator | None, std: float) -> nn.Parameter:
    """A float32 parameter of ``shape``: N(0, std^2) from ``rng``, or uninitialised when ``rng`` is None."""
    if rng is None:
        return nn.Parameter(flow.empty(*shape, dtype=flow.float32))
    data = rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
    return nn.Parameter(flow.tensor(data, dtype=flow.float32))


def read_param(module: nn.Module, param: flow.Tensor) -> flow.Tensor:
    """``param``, through an ``identity`` op when ``module.identity_reads`` (see the module docstring)."""
    return flow._C.identity(param) if getattr(module, "identity_reads", False) else param


def ones_param(shape: tuple[int, ...]) -> nn.Parameter:
    return nn.Parameter(flow.ones(*shape, dtype=flow.float32))


def zeros_param(shape: tuple[int, ...]) -> nn.Parameter:
    return nn.Parameter(flow.zeros(*shape, dtype=flow.float32))


class Linear(nn.Module):
    """``y = x @ weight.T (+ bias)`` with OneFlow's ``[out, in]`` weight layout."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bias: bool = False,
        rng: np.random.Generator | None = None,
        std: float = 0.02,
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = make_param((out_features, in_features), rng, std)
        self.bias = zeros_param((out_features,)) if bias else None

    def forward(self, x: flow.Tensor) -> flow.Tensor:
        out = flow._C.matmul(x, read_param(self, self.weight), transpose_a=False, transpose_b=True)
        if self.bias is not None:
            out = out + read_param(self, self.bias)
        return out


class Embedding(nn.Module):
    """Lookup table ``weight[ids]`` as OneFlow's ``gather`` (what LiBai's VocabEmbedding emits)."""

    def __init__(
        self, num_embeddings: int, dim: int, *, rng: np.random.Generator | None = None, std: float = 0.02
    ) -> None:
        super().__init__()
        self.weight = make_param((num_embeddings, dim), rng, std)

    def forward(self, ids: flow.Tensor) -> flow.Tensor:
        return flow._C.gather(read_param(self, self.weight), ids, axis=0)


class LayerNorm(nn.Module):
    """LayerNorm over the last dim with weight and bias (GPT, BERT).

    ``fused=True`` emits OneFlow's ``layer_norm`` op (no CPU kernel in 0.9: fine
    for building and exporting jobs); ``fused=False`` emits the composite
    (``var``, ``rsqrt`` ...) that OneFlow uses on CPU.
    """

    def __init__(self, dim: int, eps: float = 1e-5, *, fused: bool = False) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.fused = fused
        self.weight = ones_param((dim,))
        self.bias = zeros_param((dim,))

    def forward(self, x: flow.Tensor) -> flow.Tensor:
        weight, bias = read_param(self, self.weight), read_param(self, self.bias)
        if self.fused:
            axis = x.ndim - 1
            return flow._C.layer_norm_affine(
                x, weight, bias, begin_norm_axis=axis, begin_params_axis=axis, epsilon=self.eps
            )
        return flow.nn.functional.layer_norm(x, (self.dim,), weight, bias, self.eps)


class RMSNorm(nn.Module):
    """T5's layer norm: ``weight * x / sqrt(mean(x^2) + eps)``, no mean, no bias.

    ``fused=True`` emits OneFlow's fused ``rms_norm`` op (CUDA only in 0.9: fine
    for building and exporting jobs); ``fused=False`` emits the composite that
    ``flow._C.rms_layer_norm`` lowers to and runs on CPU.
    """

    def __init__(self, dim: int, eps: float = 1e-6, *, fused: bool = False) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.fused = fused
        self.weight = ones_param((dim,))

    def forward(self, x: flow.Tensor) -> flow.Tensor:
        weight = read_param(self, self.weight)
        if self.fused:
            return flow._C.rms_norm(x, weight, normalized_shape=(self.dim,), epsilon=self.eps)
        return flow._C.rms_layer_norm(x, weight, self.eps)


def set_identity_reads(model: nn.Module, enabled: bool = True) -> nn.Module:
    """Read every parameter of ``model`` through an ``identity`` op (see the module docstring)."""
    for sub in model.modules():
        sub.identity_reads = enabled
    return model


def factory_kwargs(ref: flow.Tensor) -> dict:
    """Keyword arguments that create a tensor beside ``ref`` (same placement, all ``B``)."""
    if ref.is_global:
        return {"placement": ref.placement, "sbp": [flow.sbp.broadcast] * len(ref.sbp)}
    return {"device": ref.device}


def arange(n: int, ref: flow.Tensor) -> flow.Tensor:
    return flow.arange(n, dtype=flow.int64, **factory_kwargs(ref))


def causal_mask(q_len: int, k_len: int, ref: flow.Tensor, neg: float = -1e9) -> flow.Tensor:
    """Additive mask ``[1, 1, q, k]``: 0 where key <= query, ``neg`` elsewhere."""
    q = arange(q_len, ref).reshape(q_len, 1)
    k = arange(k_len, ref).reshape(1, k_len)
    allowed = (k <= q).to(flow.float32)
    return ((1.0 - allowed) * neg).reshape(1, 1, q_len, k_len)


def normal_std(fan_in: int) -> float:
    return 1.0 / math.sqrt(fan_in)
