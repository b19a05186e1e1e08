"""A Vision Transformer classifier as a OneFlow 0.9 training job (held-out: evaluation).

Written from the public description (Dosovitskiy et al. 2021, "An Image is Worth
16x16 Words", section 3.1, eq. 1-4; timm's ``VisionTransformer``), not from
autopar's graph builders or examples:

* patch embedding as a ``Conv2d`` with kernel = stride = patch size, flattened;
* a learned class token concatenated in front, learned position embeddings added;
* pre-LN blocks: LayerNorm, multi-head attention with one fused ``qkv`` linear laid
  out ``[3, heads, head_dim]`` (timm), ``proj``; LayerNorm, MLP ``fc1`` (GELU) ``fc2``;
* final LayerNorm, a linear ``head`` on the class token, cross-entropy over classes.

``LIBAI_LAYOUT``: LiBai's ViT (``libai/models/vision_transformer.py``): ``qkv`` and
``fc1`` column-parallel (with their biases), ``proj`` and ``fc2`` row-parallel; the
patch embedding, tokens, norms and the classifier head replicated.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import oneflow as flow
import oneflow.nn as nn


@dataclass(frozen=True)
class ViTConfig:
    image_size: int = 32
    patch_size: int = 8
    in_chans: int = 3
    num_classes: int = 10
    embed_dim: int = 64
    depth: int = 2
    num_heads: int = 4
    mlp_ratio: int = 4


LIBAI_LAYOUT = {
    "qkv.weight": "col",
    "qkv.bias": "col",
    "proj.weight": "row",
    "fc1.weight": "col",
    "fc1.bias": "col",
    "fc2.weight": "row",
}
"""Parameter name suffix -> LiBai's tensor-parallel style; anything else replicated."""


class Block(nn.Module):
    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        d = config.embed_dim
        self.num_heads = config.num_heads
        self.norm1 = nn.LayerNorm(d, eps=1e-6)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d, eps=1e-6)
        self.fc1 = nn.Linear(d, config.mlp_ratio * d)
        self.fc2 = nn.Linear(config.mlp_ratio * d, d)

    def attention(self, x: flow.Tensor) -> flow.Tensor:
        b, n, c = x.shape
        hd = c // self.num_heads
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, hd).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = flow.matmul(q, k.transpose(-2, -1)) * (hd**-0.5)
        out = flow.matmul(attn.softmax(dim=-1), v).transpose(1, 2).reshape(b, n, c)
        return self.proj(out)

    def forward(self, x: flow.Tensor) -> flow.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.fc2(flow.nn.functional.gelu(self.fc1(self.norm2(x))))


class VisionTransformer(nn.Module):
    """``forward(images, labels)`` -> mean classification loss."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        d = config.embed_dim
        patches = (config.image_size // config.patch_size) ** 2
        self.patch_embed = nn.Conv2d(config.in_chans, d, config.patch_size, stride=config.patch_size)
        self.cls_token = nn.Parameter(flow.zeros(1, 1, d))
        self.pos_embed = nn.Parameter(flow.zeros(1, patches + 1, d))
        self.blocks = nn.ModuleList([Block(config) for _ in range(config.depth)])
        self.norm = nn.LayerNorm(d, eps=1e-6)
        self.head = nn.Linear(d, config.num_classes)

    def forward(self, images: flow.Tensor, labels: flow.Tensor) -> flow.Tensor:
        x = self.patch_embed(images).flatten(2).transpose(1, 2)  # [b, patches, d]
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        x = flow.cat([cls, x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x)[:, 0])
        return flow.nn.functional.cross_entropy(logits, labels)


def build(batch: int = 8, **overrides: int) -> tuple[nn.Module, list[np.ndarray]]:
    """The tiny model and deterministic ``images``, ``labels``."""
    config = ViTConfig(**overrides)  # type: ignore[arg-type]
    rng = np.random.default_rng(3)
    size = config.image_size
    images = rng.standard_normal((batch, config.in_chans, size, size), dtype=np.float32)
    labels = rng.integers(0, config.num_classes, size=(batch,), dtype=np.int64)
    return VisionTransformer(config), [images, labels]
