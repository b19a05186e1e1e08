"""Activation memory per transformer layer against Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models" (section 4, equations 1-5), by hand: bytes per layer
of a GPT layer in fp16 with sequence length ``s``, micro-batch ``b``, hidden ``h``, heads ``a``,
tensor-parallel degree ``t``:

=====================================  ===============================
no parallelism, nothing recomputed     ``s b h (34 + 5 a s / h)``
tensor parallel                        ``s b h (10 + 24 / t + 5 a s / (h t))``
tensor and sequence parallel           ``s b h (34 / t + 5 a s / (h t))``
tensor parallel, selective             ``s b h (10 + 24 / t)``
tensor and sequence parallel,          ``s b h 34 / t``
selective
FlashAttention (no ``s x s`` kept)     as selective
=====================================  ===============================

The model's figure is the difference of the activation peak between a graph of three layers
and one of two (the layer's own share), with parameters' working copies counted as model
states (``Precision.MIXED``: Megatron-LM keeps fp16 parameters, not activations).  The
layer-norm statistics (fp32 mean and inverse variance, ``4 s b`` bytes each, over ``t`` under
sequence parallelism) are the 0.02 ``s b h`` the paper leaves out.
"""

from __future__ import annotations

import pytest

from autopar.baselines.plans import baseline_plan
from autopar.cost.evaluate import evaluate
from autopar.cost.memory import Precision
from autopar.hardware.cluster import Cluster
from autopar.hardware.mesh import Mesh
from autopar.ir.training import TrainingConfig
from autopar.models import build

H, A, S, B = 1024, 16, 512, 4
SBH = S * B * H
STATS = 2 * 2 * 4 * S * B / SBH  # two norms' fp32 mean and inverse variance, in s b h units


def _formula(t: int, sp: bool, selective: bool) -> float:
    """Korthikanti et al. 2022's bytes per layer over ``s b h``."""
    scores = 0.0 if selective else 5 * A * S / (H * t)
    if t == 1:
        return 34 + scores
    if sp:
        return 34 / t + scores
    return 10 + 24 / t + scores


def _per_layer(t: int, sp: bool, checkpointing: str, runtime: str) -> float:
    peaks = []
    for layers in (2, 3):
        g = build("gpt-1.3b", layers=layers, hidden=H, heads=A, ffn=4 * H, vocab=8192, seq=S, batch=B)
        if t == 1:
            mesh, kind = Mesh(Cluster.parse("1x1", "a100-80g"), (1,)), "single-device"
        else:
            mesh, kind = Mesh(Cluster.parse(f"1x{t}", "a100-80g"), (1, t)), "megatron"
        plan = baseline_plan(kind, g, mesh, 0, runtime=runtime, sequence_parallel=sp)
        ev = evaluate(g, plan, training=TrainingConfig(1, checkpointing), precision=Precision.MIXED)
        assert ev.valid, ev.errors[:3]
        peaks.append(ev.memory.activations)
    return (peaks[1] - peaks[0]) / SBH


@pytest.mark.parametrize(
    ("t", "sp", "checkpointing"),
    [
        (1, False, "off"),
        (1, False, "selective"),
        (8, False, "off"),
        (8, False, "selective"),
        (8, True, "off"),
        (8, True, "selective"),
    ],
)
def test_activation_bytes_per_layer_are_korthikantis(t: int, sp: bool, checkpointing: str) -> None:
    got = _per_layer(t, sp, checkpointing, "ideal")
    stats = STATS / t if sp else STATS  # sequence parallelism splits the norms' statistics too
    assert got == pytest.approx(_formula(t, sp, checkpointing == "selective") + stats, abs=1e-6)


@pytest.mark.parametrize(("t", "sp"), [(1, False), (8, False), (8, True)])
def test_flash_attention_keeps_what_selective_recomputation_keeps(t: int, sp: bool) -> None:
    """Megatron-LM's FlashAttention keeps no ``s x s`` tensor: its layer costs what the
    selective formula says, with nothing recomputed."""
    got = _per_layer(t, sp, "off", "megatron-lm")
    stats = STATS / t if sp else STATS
    assert got == pytest.approx(_formula(t, sp, True) + stats, abs=1e-6)
