"""The cost model against other systems' own numbers (issue 8), in one run.

    python -m benchmarks.model_truth [--models gpt2-medium,mt5-base] [--json out.json]
    python -m benchmarks.model_truth --inference-jobs /tmp/fid   # in the OneFlow venv

Prints, per model on 2x4 A100-40GB as mesh [4, 2]:

1. the ``megatron`` baseline's tensor-parallel bytes per device against the hand
   count of Megatron-LM's scheme (per transformer block 2 all-reduces of
   b*s*h forward and 2 backward; a T5 decoder block 3 + 3, plus 1 backward for
   the cross-attention keys/values; the vocab-parallel embedding one forward
   per use, the LM head one backward), ZeRO-0 (Megatron-DeepSpeed shards ZeRO
   over the data-parallel group only, so tensor-parallel traffic is ZeRO-0's).
   Sources, Megatron-LM ``megatron/core/tensor_parallel/mappings.py``:
   ``reduce_from_tensor_model_parallel_region`` (forward all-reduce after each
   row-parallel linear and the vocab-parallel embedding) and
   ``copy_to_tensor_model_parallel_region`` (backward all-reduce of the input
   gradient of each column-parallel linear: fused QKV, fc1 / the fused wi, the
   cross-attention ``key_value`` on the encoder output, the LM head).  T5's
   relative position bias adds no traffic: NeMo's Megatron T5 adds each
   rank's heads' slice of it (``CoreAttention.forward`` in NeMo's
   ``megatron/attention.py``), which the baseline lays out as the bias table
   split by heads.  For T5 a second count, ``hand (graph)``, applies the same
   rule to the graph's own linears: its cross-attention has separate ``k`` and
   ``v`` projections, so Megatron-LM's per-linear all-reduce is 2 per decoder
   layer there (the baseline all-reduces each column-parallel linear's input
   gradient at its producer, and sums partial sums only within one Megatron
   linear); Megatron-LM's fused ``key_value`` issues 1.  For T5 the baseline is
   also measured on the same model built with LiBai's fused, head-first
   cross-attention ``key_value`` (``fused_cross_kv=True``), against ``hand``;
   and its data-parallel bytes (ZeRO-0) against Megatron-LM's DDP count
   (:func:`hand_count_dp_bytes`: each gradient all-reduced once, in the compute
   dtype, once per parameter);
2. the modelled step time of ``inferred`` (OneFlow's SBP inference with the
   LiBai parameter layout) over ``megatron``, with each runtime profile;
3. the ``data-parallel`` baseline under ZeRO-2 and ZeRO-3: step time and memory;

and, once, the LiBai MT5 report replayed (:mod:`benchmarks.seed_replay`): the
report's cluster fitted on one GPU's 88 ms and Megatron's all-reduce share of its
357 ms (inputs, reproduced by construction), then what the fit did not use
predicted on it: LiBai's 1000 ms, the ratio, the step times and the
per-collective shares (mechanisms, what-ifs and the fit's sensitivity:
``python -m benchmarks.seed_replay``).

With ``--imported DIR`` (the output folder of ``benchmarks/oneflow_mt5.py``: a
real OneFlow MT5 job built on 8 CPU ranks and imported, fp32) it also prints the
``megatron`` baseline's tensor-parallel bytes on that imported job against the
same hand counts (a job built with ``--fused-cross-kv``: against ``hand`` only).
Bytes are counted as OneFlow boxes them, once per tensor and
destination layout (``evaluate(...)``; an imported job reads
one tensor from several consumers, e.g. ``rms_norm_grad`` and
``rms_norm_param_grad``, where the built-in graphs have one).

With ``--imported-gpt JOB.pb`` (OneFlow 0.9 needed) it prints only the
``megatron`` baseline's tensor-parallel bytes on an imported ``gpt-tiny`` job
(``tests/oneflow/_build_jobs.py``: batch 8, sequence 32, hidden 64, 2 layers,
fp32, mesh [2, 2], ZeRO-2 job planned at ZeRO-0, boxed as OneFlow groups) against
the hand count.  ``--imported-tiny-mt5 JOB.pb`` does the same for the imported
``mt5-tiny`` job (batch 8, sequences 32 / 16, hidden 64, 2 + 2 layers, fp32, mesh
[2, 2]), e.g. the one ``tests/oneflow/_build_jobs.py OUT fused-kv`` builds with
LiBai's fused cross-attention ``key_value``.

With ``--inference-jobs DIR`` (OneFlow 0.9 needed) it prints instead how many op
signatures :func:`autopar.baselines.oneflow_inference.infer_like_oneflow` picks as OneFlow
did in the jobs ``DIR/{model}_2x2_inference_built.pb`` (the LiBai-layout
inference jobs of ``benchmarks/fidelity.py``, ZeRO-2): cascaded (every op
decides from the emulation's own earlier choices) and per op (every op decides
from OneFlow's producer layouts).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autopar.baselines.plans import baseline_plan
from autopar.cost.evaluate import evaluate
from autopar.hardware.cluster import Cluster
from autopar.hardware.mesh import Mesh
from autopar.ir.graph import DTYPE_BYTES, Graph
from autopar.ir.sbp import Split
from autopar.models import build
from autopar.models.config import padded_vocab
from autopar.runtimes.megatron_lm.linears import megatron_parameter_layout
from benchmarks.seed_replay import print_replay, replay

GIB = 1024**3
SMALL_COUNT_BYTES = 10e6
"""Below this hand count, bytes are printed with 4 decimals of a megabyte instead of 1."""


MEGATRON_CROSS_KV_LINEARS = 1
"""Column-parallel linears per decoder layer on the encoder output in Megatron-LM's T5:
one fused ``key_value`` (legacy ``ParallelAttention``; ``linear_kv`` in megatron/core
``CrossAttention``; LiBai's ``MultiheadAttention.key_value``)."""
SEPARATE_CROSS_KV_LINEARS = 2
"""The same in a graph with separate ``k`` and ``v`` projections (HF T5, autopar's
built-in mt5, examples/oneflow/mt5.py)."""


def hand_count_tp_bytes(
    graph: Graph, mesh: Mesh, *, cross_kv_linears: int = MEGATRON_CROSS_KV_LINEARS
) -> float:
    """Megatron-LM's tensor-parallel bytes per device for one step of a built-in model graph
    (its ``meta``: family and config); see :func:`hand_count`."""
    meta = graph.meta or {}
    return hand_count(meta["family"], meta["config"], mesh, cross_kv_linears=cross_kv_linears)


def hand_count(
    family: str, cfg: Mapping[str, Any], mesh: Mesh, *, cross_kv_linears: int = MEGATRON_CROSS_KV_LINEARS
) -> float:
    """Megatron-LM's tensor-parallel bytes per device for one step (see the module docstring).

    ``cfg``: ``batch``, ``hidden``, ``dtype`` and, for ``family`` ``"t5"``,
    ``encoder_seq`` / ``decoder_seq`` / ``encoder_layers`` / ``decoder_layers``,
    else ``seq`` / ``layers``.  Bytes = ``2 (tp-1)/tp`` (ring all-reduce) x the
    bytes of every all-reduced activation ``b/dp x s x h x itemsize``.
    ``cross_kv_linears``: all-reduces per T5 decoder layer of the cross-attention's
    input gradient on the encoder output, one per column-parallel linear reading
    it (Megatron-LM: 1, the fused ``key_value``).
    """
    dp, tp = mesh.shape[0], mesh.shape[-1]
    itemsize = DTYPE_BYTES[cfg.get("dtype", "float16")]
    per_all_reduce = 2 * (tp - 1) / tp
    b = cfg["batch"] // dp
    h = cfg["hidden"]
    if family == "t5":
        enc = b * cfg["encoder_seq"] * h * itemsize
        dec = b * cfg["decoder_seq"] * h * itemsize
        cross = cross_kv_linears * cfg["decoder_layers"] * enc
        blocks = cfg["encoder_layers"] * 4 * enc + cfg["decoder_layers"] * 6 * dec + cross
        embedding = enc + dec  # the shared vocab-parallel embedding, once per stack
        head = dec  # LM head input gradient
        return per_all_reduce * (blocks + embedding + head)
    act = b * cfg["seq"] * h * itemsize
    return per_all_reduce * (cfg["layers"] * 4 * act + act + act)


def _linear(out: int, inp: int, *, bias: bool, style: str, tp: int) -> float:
    """Elements one tensor-parallel rank holds of an ``[out, in]`` linear (and its bias):
    Megatron-LM's ``ColumnParallelLinear`` splits weight and bias by ``out``
    (``style="col"``), ``RowParallelLinear`` the weight by ``in`` and keeps the bias whole
    (``"row"``); ``"none"`` is a replicated linear (BERT's LM-head transform)."""
    weight = out * inp / (tp if style in ("col", "row") else 1)
    if not bias:
        return weight
    return weight + (out / tp if style == "col" else out)


def _block_elements(cfg: Mapping[str, Any], tp: int, *, cross: bool) -> float:
    """One transformer block's elements per tensor-parallel rank (see :func:`megatron_parameter_elements`)."""
    h = cfg["hidden"]
    style = cfg.get("style", "gpt")
    gated = style in ("mt5", "llama")
    bias = style not in ("mt5", "llama")
    norm = h if style in ("mt5", "llama") else 2 * h  # RMSNorm: weight only; LayerNorm: weight and bias
    inner = cfg["heads"] * (cfg.get("d_kv") or h // cfg["heads"])
    ffn = cfg.get("ffn") or 4 * h
    attention = _linear(3 * inner, h, bias=bias, style="col", tp=tp) + _linear(
        h, inner, bias=bias, style="row", tp=tp
    )
    mlp = _linear((2 if gated else 1) * ffn, h, bias=bias, style="col", tp=tp)
    mlp += _linear(h, ffn, bias=bias, style="row", tp=tp)
    return (3 if cross else 2) * norm + (2 if cross else 1) * attention + mlp


def megatron_parameter_elements(family: str, cfg: Mapping[str, Any], tp: int) -> float:
    """Trainable elements one tensor-parallel rank holds under Megatron-LM's layout, from the
    model's configuration alone (not from any graph or baseline layout).

    Blocks (:func:`_block_elements`): q, k, v (``3 x heads x d_kv`` outputs; ``d_kv`` =
    ``hidden / heads`` unless given) and fc1 (two ``ffn``-wide halves when gated: T5 v1.1's
    ``wi_0`` / ``wi_1``, LLaMA's gate / up) column-parallel; o and fc2 row-parallel; biases
    except in ``mt5`` / ``llama`` style; norms whole (two per block, three with
    cross-attention).  Around them: the vocabulary table split by rows (``padded_vocab``,
    Megatron's ``VocabParallelEmbedding``); learned positions whole (``max_position`` rows;
    ``seq`` rows when unset; none for T5 v1.1 and LLaMA); final norms whole.  Per family: GPT ties
    the head to the
    table; BERT adds token types, the LM head's replicated transform and norm and its
    vocab-split bias (Megatron's ``BertLMHead``); Megatron T5 (``style="t5"``) an encoder
    and a decoder stack, a tied head with a vocab-split bias; MT5 (``style="mt5"``, HF T5
    v1.1) a relative-position table of ``buckets x heads`` in each stack's first block
    (in every self-attention with ``relative_bias_every_layer``) split by heads, and an
    untied head split by vocab; LLaMA an untied head split by vocab.
    Sources: Megatron-LM ``megatron/core/tensor_parallel/layers.py`` and the model
    definitions under ``megatron/legacy/model``; HF ``modeling_t5.py``, ``modeling_llama.py``.
    """
    if family == "vit":
        return _vit_elements(cfg, tp)
    h = cfg["hidden"]
    vocab = padded_vocab(cfg["vocab"], cfg.get("make_vocab_size_divisible_by", 1))
    table = vocab * h / tp
    style = cfg.get("style", family)
    norm = h if style in ("mt5", "llama") else 2 * h
    rows = cfg.get("max_position") or cfg.get("seq") or cfg.get("encoder_seq") or 0  # GPT: seq when unset
    positions = rows * h if style not in ("mt5", "llama") else 0
    if family == "t5":
        blocks = cfg["encoder_layers"] * _block_elements(cfg, tp, cross=False)
        blocks += cfg["decoder_layers"] * _block_elements(cfg, tp, cross=True)
        if style == "mt5":
            every = cfg.get("relative_bias_every_layer")
            tables = cfg["encoder_layers"] + cfg["decoder_layers"] if every else 2
            relative = tables * cfg["relative_attention_buckets"] * cfg["heads"] / tp
            return table + blocks + 2 * norm + relative + table  # untied lm_head
        return table + positions + blocks + 2 * norm + vocab / tp  # tied head, its bias
    body = (
        table + positions + cfg["layers"] * _block_elements({**cfg, "style": style}, tp, cross=False) + norm
    )
    if family == "bert" and cfg.get("nsp"):  # + pooler and the 2-class next-sentence head, replicated
        body += (h * h + h) + (2 * h + 2)
    if family == "bert":
        return body + cfg.get("type_vocab", 2) * h + (h * h + h) + 2 * h + vocab / tp
    if family == "llama":
        return body + table  # untied head
    return body  # GPT: tied head


def _vit_elements(cfg: Mapping[str, Any], tp: int) -> float:
    """ViT (Dosovitskiy et al. 2021): the patch projection (a ``Conv2d``, ``hidden x channels x
    patch^2`` and a bias), class token and learned positions (``patches + 1`` rows), pre-LN
    blocks (biased, GELU MLP), a final LayerNorm and the classifier head, all replicated but
    the blocks' linears (LiBai's ``VisionTransformer``)."""
    h = cfg["hidden"]
    tokens = (cfg["image_size"] // cfg["patch_size"]) ** 2 + 1
    patch = h * cfg["in_chans"] * cfg["patch_size"] ** 2 + h
    head = h * cfg["num_classes"] + cfg["num_classes"]
    blocks = cfg["layers"] * _block_elements({**cfg, "style": "vit"}, tp, cross=False)
    return patch + h + tokens * h + blocks + 2 * h + head


def hand_count_dp_bytes_config(family: str, cfg: Mapping[str, Any], mesh: Mesh) -> float:
    """Megatron-LM's data-parallel bytes per device for one step without ZeRO (DDP), from the
    configuration: each gradient all-reduced once over the data-parallel axes (all but the
    last), ring ``2 (dp-1)/dp`` x (:func:`megatron_parameter_elements` x the compute dtype's
    bytes: Megatron-LM's DDP reduces the ``main_grad`` buffer in the parameters' dtype
    unless ``--accumulate-allreduce-grads-in-fp32``; ``megatron/core/distributed``)."""
    dp = math.prod(mesh.shape[:-1])
    elements = megatron_parameter_elements(family, cfg, mesh.shape[-1])
    return 2 * (dp - 1) / dp * elements * DTYPE_BYTES[cfg.get("dtype", "float16")]


def hand_count_dp_bytes(graph: Graph, mesh: Mesh) -> float:
    """:func:`hand_count_dp_bytes_config` of a built-in model graph (its ``meta``: family and config)."""
    meta = graph.meta or {}
    return hand_count_dp_bytes_config(meta["family"], meta["config"], mesh)


def hand_count_dp_bytes_from_layout(graph: Graph, mesh: Mesh) -> float:
    """The former count, kept beside the configuration's as a cross-check: each trainable
    variable's gradient, its tensor-parallel shard under
    :func:`autopar.runtimes.megatron_lm.linears.megatron_parameter_layout` (the baseline's own layout, so
    agreement with the baseline here is circular), in the dtype the graph casts it to."""
    layout = megatron_parameter_layout(graph, mesh)
    dp = math.prod(mesh.shape[:-1])
    tp = mesh.shape[-1]
    total = 0.0
    for v in graph.variables:
        if v.grad is None:
            continue
        spec = graph.tensors[v.tensor]
        compute_dtype = next(
            (
                graph.tensors[out].dtype
                for c, _ in graph.consumers.get(v.tensor, [])
                if graph.op_by_name[c].type == "cast"
                for out in graph.op_by_name[c].outputs.values()
            ),
            spec.dtype,
        )
        shard = tp if isinstance(layout[v.op][-1], Split) else 1
        total += spec.numel / shard * DTYPE_BYTES[compute_dtype]
    return 2 * (dp - 1) / dp * total


RUNTIMES = ("oneflow-0.9", "ideal", "megatron-lm")
"""The runtime profiles every row is measured with."""


def megatron_tp_bytes(graph: Graph, mesh: Mesh, runtime: str) -> float:
    """The ``megatron`` baseline's tensor-parallel (last axis) bytes per device, ZeRO-0,
    boxed as OneFlow groups it (once per tensor and destination layout)."""
    plan = baseline_plan("megatron", graph, mesh, 0, runtime=runtime)
    return evaluate(graph, plan).comm_bytes_per_axis[len(mesh.shape) - 1]


def measure_fused_kv(model: str, mesh: Mesh) -> dict[str, Any]:
    """``megatron`` tensor-parallel bytes on T5 ``model`` built with LiBai's fused, head-first
    cross-attention ``key_value`` (one column-parallel linear per decoder layer on the
    encoder output, as Megatron-LM), against Megatron-LM's hand count."""
    graph = build(model, fused_cross_kv=True)
    hand = hand_count_tp_bytes(graph, mesh)
    return {
        "ops": len(graph.ops),
        "hand_tp_bytes": hand,
        "hand_tp_bytes_graph": hand,
        "runtimes": {runtime: megatron_tp_bytes(graph, mesh, runtime) for runtime in RUNTIMES},
    }


def measure(model: str) -> dict[str, Any]:
    graph = build(model)
    mesh = Mesh(Cluster.parse("2x4"), (4, 2))
    out: dict[str, Any] = {"model": model, "ops": len(graph.ops)}
    hand = hand_count_tp_bytes(graph, mesh)
    hand_graph = hand_count_tp_bytes(graph, mesh, cross_kv_linears=SEPARATE_CROSS_KV_LINEARS)
    rows = {}
    for runtime in RUNTIMES:  # megatron-lm: Megatron-LM as it runs
        meg0 = evaluate(graph, baseline_plan("megatron", graph, mesh, 0, runtime=runtime))
        meg = evaluate(graph, baseline_plan("megatron", graph, mesh, 2, runtime=runtime))
        inf = evaluate(graph, baseline_plan("inferred", graph, mesh, 2, runtime=runtime))
        rows[runtime] = {
            "megatron_tp_bytes_zero0": meg0.comm_bytes_per_axis[1],
            "megatron_dp_bytes_zero0": meg0.comm_bytes_per_axis[0],
            "megatron_tp_bytes_zero2": meg.comm_bytes_per_axis[1],
            "megatron_ms": meg.step_time_s * 1e3,
            "megatron_overlapped_ms": meg.step_time_overlapped_s * 1e3,
            "inferred_ms": inf.step_time_s * 1e3,
            "inferred_overlapped_ms": inf.step_time_overlapped_s * 1e3,
            "inferred_over_megatron": inf.step_time_s / meg.step_time_s,
        }
    z2 = evaluate(graph, baseline_plan("data-parallel", graph, mesh, 2))
    z3 = evaluate(graph, baseline_plan("data-parallel", graph, mesh, 3))
    hand_dp = hand_count_dp_bytes(graph, mesh)  # DDP's count has no graph-specific variant
    out.update(
        hand_tp_bytes=hand,
        hand_tp_bytes_graph=hand_graph,
        hand_dp_bytes=hand_dp,
        hand_dp_bytes_graph=hand_dp,
        runtimes=rows,
        zero={
            "zero2_ms": z2.step_time_s * 1e3,
            "zero3_ms": z3.step_time_s * 1e3,
            "zero2_gib": z2.memory.total / GIB,
            "zero3_gib": z3.memory.total / GIB,
        },
    )
    if (graph.meta or {}).get("family") == "t5":
        out["fused_kv"] = measure_fused_kv(model, mesh)
    return out


def measure_imported(folder: Path) -> dict[str, Any]:
    """``megatron`` tensor-parallel bytes on the imported OneFlow MT5 job of ``folder``."""
    result = json.loads((folder / "result.json").read_text())
    graph = Graph.load(str(folder / "graph.json"))
    mesh = Mesh(Cluster.parse(result["cluster"]), tuple(result["mesh"]))
    enc, dec = result["sequence"]
    config = {
        "batch": result["batch"],
        "hidden": 768,  # benchmarks/oneflow_mt5.py builds mt5-base
        "encoder_seq": enc,
        "decoder_seq": dec,
        "encoder_layers": result["layers"],
        "decoder_layers": result["layers"],
        "dtype": "float32",  # CPU jobs are fp32 (AMP is a no-op on CPU)
    }
    fused = bool(result.get("fused_cross_kv", False))
    linears = MEGATRON_CROSS_KV_LINEARS if fused else SEPARATE_CROSS_KV_LINEARS
    out: dict[str, Any] = {
        "ops": len(graph.ops),
        "layers": result["layers"],
        "vocab": result.get("vocab"),
        "fused_cross_kv": fused,
        "hand_tp_bytes": hand_count("t5", config, mesh),
        "hand_tp_bytes_graph": hand_count("t5", config, mesh, cross_kv_linears=linears),
        "runtimes": {},
    }
    for runtime in RUNTIMES:
        plan = baseline_plan("megatron", graph, mesh, 0, runtime=runtime)
        ev = evaluate(graph, plan)
        out["runtimes"][runtime] = ev.comm_bytes_per_axis[len(mesh.shape) - 1]
    return out


GPT_TINY = {"batch": 8, "seq": 32, "hidden": 64, "layers": 2, "dtype": "float32"}
"""examples/oneflow/zoo.py ``gpt-tiny`` (GPTConfig.tiny, batch 8, sequence 32); CPU jobs are fp32."""
GPT_TINY_MESH = ("1x4", (2, 2))
"""The mesh tests/oneflow/_build_jobs.py builds on: 4 CPU ranks as [2, 2]."""


MT5_TINY = {
    "batch": 8,
    "hidden": 64,
    "encoder_seq": 32,
    "decoder_seq": 16,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "dtype": "float32",
}
"""examples/oneflow/zoo.py ``mt5-tiny`` (MT5Config.tiny, batch 8, sequences 32 / 16); CPU jobs are fp32."""


def measure_imported_tiny_mt5(job: Path) -> dict[str, Any]:
    """``megatron`` tensor-parallel bytes (ZeRO-0, grouped boxing) on an imported ``mt5-tiny`` job,
    against Megatron-LM's count and, where the job has separate ``k`` and ``v`` linears
    (no ``key_value`` parameter), the per-linear count on them."""
    from autopar.bridges.oneflow import import_job

    graph = import_job(job, zero_stage=2)
    mesh = Mesh(Cluster.parse(GPT_TINY_MESH[0]), GPT_TINY_MESH[1])
    fused = any(v.op.endswith("key_value.weight") for v in graph.variables)
    linears = MEGATRON_CROSS_KV_LINEARS if fused else SEPARATE_CROSS_KV_LINEARS
    return {
        "ops": len(graph.ops),
        "fused_cross_kv": fused,
        "hand_tp_bytes": hand_count("t5", MT5_TINY, mesh),
        "hand_tp_bytes_graph": hand_count("t5", MT5_TINY, mesh, cross_kv_linears=linears),
        "runtimes": {runtime: megatron_tp_bytes(graph, mesh, runtime) for runtime in RUNTIMES},
    }


def measure_imported_gpt(job: Path) -> dict[str, Any]:
    """``megatron`` tensor-parallel bytes (ZeRO-0, grouped boxing) on an imported ``gpt-tiny`` job."""
    from autopar.bridges.oneflow import import_job

    graph = import_job(job, zero_stage=2)
    mesh = Mesh(Cluster.parse(GPT_TINY_MESH[0]), GPT_TINY_MESH[1])
    hand = hand_count("gpt", GPT_TINY, mesh)
    out: dict[str, Any] = {"ops": len(graph.ops), "hand_tp_bytes": hand, "hand_tp_bytes_graph": hand}
    out["runtimes"] = {
        runtime: evaluate(
            graph, baseline_plan("megatron", graph, mesh, 0, runtime=runtime)
        ).comm_bytes_per_axis[len(mesh.shape) - 1]
        for runtime in RUNTIMES
    }
    return out


INFERENCE_MODELS = ("mt5-tiny", "gpt-tiny", "bert-tiny")


def inference_agreement(jobs: Path) -> list[dict[str, Any]]:
    """Share of op signatures the emulated inference picks as OneFlow did, per inference job."""
    from autopar.baselines.oneflow_inference import agreement
    from autopar.bridges.oneflow import import_job, import_plan

    rows = []
    for model in INFERENCE_MODELS:
        for mesh in ("2x2", "4x2"):
            job = jobs / f"{model}_{mesh}_inference_built.pb"
            if not job.exists():
                continue  # benchmarks/fidelity.py built this model on other meshes only
            graph = import_job(job, zero_stage=2)
            plan = import_plan(job, graph=graph, zero_stage=2)
            cascaded = agreement(graph, plan)
            per_op = agreement(graph, plan, cascade=False)
            rows.append(
                {
                    "model": model,
                    "mesh": mesh,
                    "ops": cascaded.ops,
                    "cascaded": cascaded.share,
                    "per_op": per_op.share,
                }
            )
    if not rows:
        raise SystemExit(f"no *_inference_built.pb of {', '.join(INFERENCE_MODELS)} in {jobs}")
    return rows


def _tp_bytes_line(runtime: str, got: float, counts: dict[str, Any], axis: str = "tp") -> str:
    """One runtime's megatron bytes on the ``axis`` ("tp" or "dp") against ``counts``' hand
    count (and the graph's, where it differs)."""
    hand, hand_graph = counts[f"hand_{axis}_bytes"], counts[f"hand_{axis}_bytes_graph"]
    d = 1 if hand >= SMALL_COUNT_BYTES else 4  # a tiny job's megabytes with more digits
    line = f"    {runtime:<12} {got / 1e6:9.{d}f} MB  hand {hand / 1e6:9.{d}f} MB  ratio {got / hand:.3f}"
    if hand_graph != hand:
        line += f"  hand (graph) {hand_graph / 1e6:.{d}f} MB  ratio {got / hand_graph:.3f}"
    return line


def _print_tiny_job(title: str, counts: dict[str, Any], json_out: str | None) -> None:
    """An imported tiny job's megatron tp bytes against the hand count (fp32 CPU job, [2, 2])."""
    print(f"imported OneFlow {title}, fp32), mesh [2, 2]")
    print("  megatron tp bytes/device (ZeRO-0, boxed as OneFlow groups) vs Megatron-LM hand count:")
    for runtime, got in counts["runtimes"].items():
        print(_tp_bytes_line(runtime, got, counts))
    if json_out:
        Path(json_out).write_text(json.dumps(counts, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gpt2-medium,mt5-base")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument(
        "--imported", type=Path, help="also the megatron bytes on this oneflow_mt5.py output folder"
    )
    ap.add_argument(
        "--inference-jobs", type=Path, help="measure the inference emulation on these OneFlow jobs"
    )
    ap.add_argument("--imported-gpt", type=Path, help="only the megatron bytes on this gpt-tiny job")
    ap.add_argument("--imported-tiny-mt5", type=Path, help="only the megatron bytes on this mt5-tiny job")
    args = ap.parse_args()
    if args.imported_tiny_mt5 is not None:
        mt5 = measure_imported_tiny_mt5(args.imported_tiny_mt5)
        kv = "fused key_value" if mt5["fused_cross_kv"] else "separate k, v"
        _print_tiny_job(
            f"mt5-tiny job ({args.imported_tiny_mt5}: {mt5['ops']} ops, cross-attention {kv}", mt5, args.json
        )
        return
    if args.imported_gpt is not None:
        gpt = measure_imported_gpt(args.imported_gpt)
        _print_tiny_job(f"gpt-tiny job ({args.imported_gpt}: {gpt['ops']} ops", gpt, args.json)
        return
    if args.inference_jobs is not None:
        rows = inference_agreement(args.inference_jobs)
        print("OneFlow SBP inference emulated vs OneFlow's own choice (ZeRO-2, LiBai layout):")
        for row in rows:
            print(
                f"  {row['model']:<10} {row['mesh']}  {row['ops']:4d} ops  "
                f"cascaded {100 * row['cascaded']:5.1f} %  per op {100 * row['per_op']:5.1f} %"
            )
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
        return
    results = []
    for model in args.models.split(","):
        t0 = time.perf_counter()
        r = measure(model)
        r["wall_s"] = time.perf_counter() - t0
        results.append(r)
        print(f"\n{model} ({r['ops']} ops), mesh [4, 2] on 2x4 a100-40g")
        print("  megatron tp bytes/device (ZeRO-0) vs Megatron-LM hand count:")
        for runtime, row in r["runtimes"].items():
            print(_tp_bytes_line(runtime, row["megatron_tp_bytes_zero0"], r))
        print("  megatron tp bytes/device (ZeRO-2) vs Megatron-LM hand count:")
        for runtime, row in r["runtimes"].items():
            print(_tp_bytes_line(runtime, row["megatron_tp_bytes_zero2"], r))
        print("  megatron dp bytes/device (ZeRO-0) vs Megatron-LM's DDP hand count:")
        for runtime, row in r["runtimes"].items():
            print(_tp_bytes_line(runtime, row["megatron_dp_bytes_zero0"], r, axis="dp"))
        if "fused_kv" in r:
            fused = r["fused_kv"]
            print(
                f"  the same on the fused-KV build ({fused['ops']} ops; cross-attention key_value "
                "head-first, LiBai's layout):"
            )
            for runtime, got in fused["runtimes"].items():
                print(_tp_bytes_line(runtime, got, fused))
        print("  inferred / megatron modelled step time (ZeRO-2; serial, overlapped in brackets):")
        for runtime, row in r["runtimes"].items():
            print(
                f"    {runtime:<12} megatron {row['megatron_ms']:8.2f} ms "
                f"({row['megatron_overlapped_ms']:.2f})  "
                f"inferred {row['inferred_ms']:8.2f} ms ({row['inferred_overlapped_ms']:.2f})  "
                f"ratio {row['inferred_over_megatron']:.2f}x"
            )
        z = r["zero"]
        print(
            f"  data-parallel ZeRO-2 {z['zero2_ms']:.2f} ms {z['zero2_gib']:.2f} GiB; "
            f"ZeRO-3 {z['zero3_ms']:.2f} ms {z['zero3_gib']:.2f} GiB"
        )
    imported = None
    if args.imported is not None:
        imported = measure_imported(args.imported)
        kv = "fused key_value" if imported["fused_cross_kv"] else "separate k, v"
        print(
            f"\nimported OneFlow MT5 job ({args.imported}: {imported['ops']} ops, "
            f"{imported['layers']}+{imported['layers']} layers, vocab {imported['vocab']}, "
            f"cross-attention {kv}, fp32), mesh [4, 2]"
        )
        print("  megatron tp bytes/device (ZeRO-0, boxed as OneFlow groups) vs Megatron-LM hand count:")
        for runtime, got in imported["runtimes"].items():
            print(_tp_bytes_line(runtime, got, imported))
    seed = replay()
    print_replay(seed, detail=False)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"models": results, "imported": imported, "seed_replay": seed}, fh, indent=1)


if __name__ == "__main__":
    main()
