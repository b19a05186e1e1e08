"""The ``megatron`` baseline on imported OneFlow MT5 and GPT jobs reproduces Megatron-LM's traffic."""

from __future__ import annotations

import pytest

from autopar.baselines.plans import baseline_plan
from autopar.bridges.oneflow import import_job
from autopar.cost.evaluate import evaluate
from autopar.hardware.cluster import Cluster
from autopar.hardware.mesh import Mesh
from autopar.runtimes.megatron_lm.linears import megatron_parameter_layout
from benchmarks.model_truth import (
    GPT_TINY,
    MT5_TINY,
    SEPARATE_CROSS_KV_LINEARS,
    hand_count,
    megatron_tp_bytes,
)

pytestmark = pytest.mark.oneflow

MESH = Mesh(Cluster.parse("1x4"), (2, 2))
TOLERANCE = 0.05
"""Issue 8, item 4: within 5 % of the hand count per axis."""
NEAR = 0.01
"""What a head-first GPT job or an MT5 job moves beyond Megatron-LM's all-reduces, at most
(measured 0.8 %, 0.35 % with a fused key_value, 0.35 % with separate k and v)."""


def _megatron_tp_bytes(graph, mesh: Mesh = MESH) -> float:
    ev = evaluate(graph, baseline_plan("megatron", graph, mesh, 0))
    return ev.comm_bytes_per_axis[len(mesh.shape) - 1]


def test_megatron_on_an_imported_mt5_job_all_reduces_once_per_linear(mesh_jobs):
    """OneFlow splits the model-split cross entropy into softmax stages and ``nll``: the LM
    head still reaches the loss, so it is column-parallel (vocab split), and the vocab-parallel
    cross entropy's reductions stay partial sums (Megatron all-reduces only their [b, s]
    sums).  The decoder's cross-attention k and v (separate linears, one Megatron
    ``key_value`` per layer) read the encoder output; OneFlow's autograd sums their input
    gradients in an ``add_n`` tree that mixes the layers (layer 0's v with layer 1's k and v,
    then layer 0's k).  A partial sum completes at most one Megatron linear before its
    all-reduce, so the encoder output's gradient is all-reduced once per decoder layer, as
    Megatron-LM's ``key_value`` does: the hand count, not the per-k/v count (2 per layer,
    1.11x, before the baseline let a sum mix linears)."""
    out, _ = mesh_jobs
    graph = import_job(out / "mt5-tiny_zero2.pb", zero_stage=2)
    layout = megatron_parameter_layout(graph, MESH)
    head = next(name for name in layout if name.endswith("lm_head.weight"))
    assert str(layout[head]) == "(B, S(0))"  # [vocab, d_model] split by vocabulary
    got, hand = _megatron_tp_bytes(graph), hand_count("t5", MT5_TINY, MESH)
    assert got == pytest.approx(hand, rel=TOLERANCE)
    assert got == pytest.approx(hand, rel=NEAR)
    per_linear = hand_count("t5", MT5_TINY, MESH, cross_kv_linears=SEPARATE_CROSS_KV_LINEARS)
    assert got < per_linear * (1 - NEAR)


@pytest.mark.parametrize("stage", [0, 2])
def test_megatron_lm_on_an_imported_mt5_job_moves_the_hand_count(mesh_jobs, stage: int):
    """Issue 33 on a job OneFlow built (separate cross-attention k and v): priced as
    Megatron-LM runs (runtime ``megatron-lm``, whose ``key_value`` is one GEMM), the
    ``megatron`` baseline's tensor-parallel bytes are the hand count within 2 % at ZeRO-0
    and ZeRO-2."""
    out, _ = mesh_jobs
    graph = import_job(out / "mt5-tiny_zero2.pb", zero_stage=2)
    plan = baseline_plan("megatron", graph, MESH, stage, runtime="megatron-lm")
    got = evaluate(graph, plan).comm_bytes_per_axis[1]
    assert got == pytest.approx(hand_count("t5", MT5_TINY, MESH), rel=0.02)


def test_megatron_on_an_imported_gpt_job_with_head_first_qkv_moves_megatrons_bytes(mesh_jobs):
    """The GPT job's fused QKV is laid out head-first ([b, s, heads, 3 * head_dim], as
    Megatron-LM and LiBai): the column-parallel c_attn split is a split by heads, so the
    attention runs on each rank's heads with no communication until c_proj's all-reduce.
    Tensor-parallel bytes then match Megatron-LM's count (4 all-reduces of b*s*h per block,
    the vocab-parallel embedding's forward one, the tied LM head's backward one)."""
    out, _ = mesh_jobs
    graph = import_job(out / "gpt-tiny_zero2.pb", zero_stage=2)
    layout = megatron_parameter_layout(graph, MESH)
    c_attn = [name for name in layout if name.endswith("attn.c_attn.weight")]
    assert c_attn and all(str(layout[name]) == "(B, S(0))" for name in c_attn)  # [3h, h] by output
    hand = hand_count("gpt", GPT_TINY, MESH)
    assert _megatron_tp_bytes(graph) == pytest.approx(hand, rel=TOLERANCE)
    # the rest is the vocab-parallel cross entropy's [b, s] reductions and the norms' weight
    # gradients (0.8 %): no gathered constants, split weight gradients or all-to-alls
    assert _megatron_tp_bytes(graph) == pytest.approx(hand, rel=NEAR)


@pytest.mark.parametrize("runtime", ["oneflow-0.9", "ideal"])
def test_megatron_on_an_imported_mt5_job_with_libai_key_value_moves_megatron_lms_bytes(
    fused_kv_jobs, runtime
):
    """The MT5 job built with LiBai's cross-attention (``fused_cross_kv``: one ``key_value``
    linear per decoder layer, laid out head-first ``[b, s, heads, 2 * d_kv]`` and cut by
    ``flow.chunk``) gets one encoder-output all-reduce per decoder layer, as Megatron-LM's
    ``key_value``: its tensor-parallel bytes are Megatron-LM's hand count, not the
    separate-k/v per-linear count."""
    graph = import_job(fused_kv_jobs / "mt5-tiny_zero2.pb", zero_stage=2)
    layout = megatron_parameter_layout(graph, MESH)
    key_value = [name for name in layout if name.endswith("EncDecAttention.key_value.weight")]
    assert len(key_value) == MT5_TINY["decoder_layers"]
    assert all(str(layout[name]) == "(B, S(0))" for name in key_value)  # split by heads
    got = megatron_tp_bytes(graph, MESH, runtime)
    hand = hand_count("t5", MT5_TINY, MESH)
    assert got == pytest.approx(hand, rel=TOLERANCE)
    assert got == pytest.approx(hand, rel=NEAR)
    per_linear = hand_count("t5", MT5_TINY, MESH, cross_kv_linears=SEPARATE_CROSS_KV_LINEARS)
    assert got < per_linear * (1 - NEAR)
