"""Truth figures on development and held-out (evaluation) OneFlow jobs, side by side (issue 26).

Run in the OneFlow venv, on the jobs ``tests/oneflow/_build_heldout_families.py`` builds
(8 CPU ranks as ``[4, 2]``, LiBai's parameter layout, OneFlow's default ZeRO-2)::

    python -m oneflow.distributed.launch --nproc_per_node 8 tests/oneflow/_build_heldout_families.py OUT \\
        --compile llama bert vit mt5-tiny gpt-tiny bert-tiny
    python -m oneflow.distributed.launch --nproc_per_node 8 tests/oneflow/_build_heldout.py OUT build \\
        hf-t5-tiny hf-gpt2-tiny
    python -m benchmarks.heldout_truth OUT [--json out.json]

Per job (``OUT/{family}_zero2.pb``), as built by OneFlow's own SBP inference:

* OneFlow's plan imported (``import_plan``) and evaluated: evaluator errors, and the
  (op type, signature) pairs the rules do not offer;
* ``inferred`` agreement with OneFlow's choice (:func:`autopar.baselines.oneflow_inference.agreement`),
  cascaded and per op;
* the ``megatron`` baseline (ZeRO-0, boxed as OneFlow groups) on the imported graph:
  tensor-parallel bytes against Megatron-LM's hand count (:func:`hand_count_family`),
  data-parallel bytes against the DDP count from the configuration
  (:func:`benchmarks.model_truth.hand_count_dp_bytes_config`);
* the same tensor-parallel bytes per runtime and ZeRO stage (:data:`HAND_COUNT_PRICINGS`,
  :func:`hand_count_table`): Megatron-LM as it runs (runtime ``megatron-lm``, which
  all-reduces a fused linear's input gradient once) at ZeRO-0 and ZeRO-2 beside OneFlow 0.9's;
* fidelity of OneFlow's plan: predicted (``evaluate(...)`` of the plan
  imported from the built job) against counted (:func:`autopar.bridges.oneflow.traffic.count_job_traffic`
  on the *compiled* job, ``{family}_zero2_compiled.pb`` / ``{family}_min1024_compiled.pb``)
  with ``lower_hop`` and with the formula of its own (``kernel_bytes_per_axis``), per mesh axis.
  The compiled job is the one to count: it holds the ``System-Boxing-Middle-Identity`` ops
  OneFlow's ``BoxingCollector`` inserted (``boxing_with_middle_nodes.cpp``) and one boxing
  per (tensor, destination N-D SBP) (``group_boxing_by_dst_parallel.cpp``), as the prediction
  prices them.  The built job has neither: a multi-step transition such as ZeRO's
  ``(P, P) -> (B, S(0))`` gradient into ``adam_update`` is one edge there, which
  ``lower_hop`` can only price as one 2-D send/recv (56 KiB per device for a 64 x 64
  fp32 weight, where OneFlow runs a reduce-scatter on axis 1 then an all-reduce on axis 0,
  20 KiB), and each consumer of a tensor is its own
  edge.  Counting the built job put the dev jobs' axis 0 at -20 % to -65 % and the HF jobs'
  at +50 %; a row whose compiled job is missing is counted on the built one and says so.

Development jobs are ``examples/oneflow/zoo.py``'s tiny MT5, GPT and BERT; evaluation
jobs those of ``examples/oneflow/heldout/families.py``.  CPU jobs are fp32.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Any

from autopar.hardware.mesh import Mesh
from autopar.ir.graph import DTYPE_BYTES
from benchmarks.model_truth import MT5_TINY, hand_count, hand_count_dp_bytes_config

ROOT = Path(__file__).resolve().parents[1]
DEVELOPMENT = ("mt5-tiny", "gpt-tiny", "bert-tiny")
EVALUATION = ("hf-t5-tiny", "hf-gpt2-tiny", "llama", "bert", "vit")
BATCH, SEQ = 8, 32
"""The batch and sequence every tiny job is built with (``build()`` defaults; zoo's tiny jobs)."""


def family_config(family: str) -> tuple[str, dict[str, Any]]:
    """(hand-count family, configuration) of a job, read from the model's own config class."""
    sys.path.insert(0, str(ROOT / "examples" / "oneflow"))
    common = {"batch": BATCH, "seq": SEQ, "dtype": "float32"}
    if family == "mt5-tiny":
        import mt5

        c = mt5.MT5Config.tiny()
        cfg = {**MT5_TINY, "style": "mt5", "heads": c.num_heads, "d_kv": c.d_kv, "ffn": c.d_ff}
        return "t5", {
            **cfg,
            "vocab": c.vocab_size,
            "relative_attention_buckets": c.relative_attention_num_buckets,
        }
    if family in ("gpt-tiny", "bert-tiny"):
        import bert
        import gpt

        g = gpt.GPTConfig.tiny() if family == "gpt-tiny" else bert.BertConfig.tiny()
        cfg = {**common, "hidden": g.hidden, "heads": g.heads, "layers": g.layers, "vocab": g.vocab_size}
        cfg.update(
            ffn=getattr(g, "intermediate", None) or getattr(g, "ffn", None), max_position=g.max_positions
        )
        return family.split("-")[0], {**cfg, "type_vocab": getattr(g, "type_vocab_size", 2)}
    if family.startswith("hf-"):
        return _hf_config(family, common)
    from heldout import bert as hbert
    from heldout import llama, vit

    if family == "llama":
        c = llama.LlamaConfig()
        return "llama", {
            **common,
            "style": "llama",
            "hidden": c.hidden_size,
            "heads": c.num_attention_heads,
            "layers": c.num_hidden_layers,
            "ffn": c.intermediate_size,
            "vocab": c.vocab_size,
        }
    if family == "bert":
        b = hbert.BertConfig()
        return "bert", {
            **common,
            "hidden": b.hidden_size,
            "heads": b.num_attention_heads,
            "nsp": True,
            "layers": b.num_hidden_layers,
            "ffn": b.intermediate_size,
            "vocab": b.vocab_size,
            "max_position": b.max_position_embeddings,
            "type_vocab": b.type_vocab_size,
        }
    v = dataclasses.asdict(vit.ViTConfig())
    return "vit", {
        **common,
        **v,
        "hidden": v["embed_dim"],
        "heads": v["num_heads"],
        "layers": v["depth"],
        "ffn": v["mlp_ratio"] * v["embed_dim"],
        "batch": BATCH,
    }


def _hf_config(family: str, common: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """HF-style T5 (MT5: gated GELU, untied head, a relative-position table in every
    self-attention) and GPT-2 (tied head, learned positions), at the batch and sequences of
    their ``example_inputs`` defaults (``examples/oneflow/heldout/hf_*.py``)."""
    import inspect

    from heldout import hf_gpt2, hf_t5

    if family == "hf-gpt2-tiny":
        g = hf_gpt2.HFGPT2Config.tiny()
        seq = inspect.signature(hf_gpt2.example_inputs).parameters["seq"].default
        return "gpt", {
            **common,
            "seq": seq,
            "hidden": g.n_embd,
            "heads": g.n_head,
            "layers": g.n_layer,
            "vocab": g.vocab_size,
            "ffn": 4 * g.n_embd,
            "max_position": g.n_positions,
        }
    t = hf_t5.HFT5Config.tiny()
    defaults = inspect.signature(hf_t5.example_inputs).parameters
    return "t5", {
        **common,
        "style": "mt5",
        "hidden": t.d_model,
        "heads": t.num_heads,
        "d_kv": t.d_kv,
        "ffn": t.d_ff,
        "vocab": t.vocab_size,
        "encoder_seq": defaults["seq"].default,
        "decoder_seq": defaults["decoder_seq"].default,
        "encoder_layers": t.num_layers,
        "decoder_layers": t.num_decoder_layers,
        "relative_attention_buckets": t.relative_attention_num_buckets,
        "relative_bias_every_layer": True,
    }


def hand_count_family(family: str, cfg: dict[str, Any], mesh: Mesh) -> float:
    """Megatron-LM's tensor-parallel bytes per device for one step (``model_truth.hand_count``'s
    scheme): per block 2 forward all-reduces (after o and fc2) and 2 backward (the input
    gradients of the q/k/v and fc1 linears, however split), ``b/dp x s x h``; a vocab-parallel
    embedding 1 forward, a vocab-split head 1 backward (LLaMA, BERT's tied decoder).  A ViT has
    neither (patch projection and classifier head replicated, LiBai); its sequence is the
    patches plus the class token.  The parallel cross-entropy's ``[b, s]`` all-reduces are
    left out (``s x h`` times smaller)."""
    if family in ("t5", "gpt"):
        return hand_count(family, cfg, mesh)
    dp, tp = mesh.shape[0], mesh.shape[-1]
    seq = (cfg["image_size"] // cfg["patch_size"]) ** 2 + 1 if family == "vit" else cfg["seq"]
    act = cfg["batch"] // dp * seq * cfg["hidden"] * DTYPE_BYTES[cfg["dtype"]]
    ends = 0 if family == "vit" else 2
    return 2 * (tp - 1) / tp * act * (4 * cfg["layers"] + ends)


def _missing_signatures(errors: list[str]) -> dict[str, int]:
    """'op type: signature' -> how many ops the evaluator refused with it."""
    found: collections.Counter[str] = collections.Counter()
    for e in errors:
        m = re.match(r"op '[^']*' \(([^)]*)\): signature (.*) is not one its rule offers", e)
        found[f"{m.group(1)}: {m.group(2)}" if m else e[:120]] += 1
    return dict(found.most_common())


def measure(job: Path, family: str, compiled: Path | None = None) -> dict[str, Any]:
    """One row of the table for the built ``job``; bytes counted on ``compiled`` (the job
    nn.Graph compiled from it) when given, else on ``job`` (see the module doc)."""
    from autopar.baselines.oneflow_inference import agreement
    from autopar.baselines.plans import baseline_plan
    from autopar.bridges.oneflow import import_job, import_plan
    from autopar.bridges.oneflow.traffic import count_job_traffic
    from autopar.cost.evaluate import evaluate

    graph = import_job(job, zero_stage=2)
    plan = import_plan(job, graph=graph, zero_stage=2)
    ev = evaluate(graph, plan)
    hand_family, cfg = family_config(family)
    mesh = plan.mesh
    megatron = {
        f"{runtime}, ZeRO-{stage}": evaluate(
            graph, baseline_plan("megatron", graph, mesh, stage, runtime=runtime)
        )
        for runtime, stage in HAND_COUNT_PRICINGS
    }
    meg = megatron["oneflow-0.9, ZeRO-0"]  # the main table's megatron: OneFlow 0.9 as it runs, ZeRO-0
    counted = count_job_traffic(compiled or job)
    return {
        "family": family,
        "split": "evaluation" if family in EVALUATION else "development",
        "ops": len(graph.ops),
        "valid": ev.valid,
        "errors": len(ev.errors),
        "missing": _missing_signatures(ev.errors),
        "agreement_cascaded": agreement(graph, plan).share,
        "agreement_per_op": agreement(graph, plan, cascade=False).share,
        "megatron_tp": meg.comm_bytes_per_axis[1],
        "megatron_tp_by_pricing": {name: ev.comm_bytes_per_axis[1] for name, ev in megatron.items()},
        "hand_tp": hand_count_family(hand_family, cfg, mesh),
        "megatron_dp": meg.comm_bytes_per_axis[0],
        "hand_dp": hand_count_dp_bytes_config(hand_family, cfg, mesh),
        "predicted": [ev.comm_bytes_per_axis[a] for a in range(2)],
        "counted": [counted.bytes_per_axis[a] for a in range(2)],
        "counted_kernel": [counted.kernel_bytes_per_axis[a] for a in range(2)],
        "counted_on": "compiled" if counted.compiled else "built",
    }


def _pct(got: float, ref: float) -> str:
    return f"{100 * (got - ref) / ref:+.1f} %" if ref else ("0" if got == 0 else "inf")


def table(rows: list[dict[str, Any]]) -> str:
    kib = 1024
    lines = [
        "| job | split | ops | OneFlow plan errors | inferred agreement (cascaded / per op) | "
        "megatron tp / hand (KiB) | megatron dp / hand (KiB) | "
        "axis 0 predicted / counted lower_hop / counted kernel, compiled job (KiB) | axis 1 same |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        axes = []
        for a in (0, 1):
            pred, lower, kernel = r["predicted"][a], r["counted"][a], r["counted_kernel"][a]
            built = "" if r["counted_on"] == "compiled" else " (built job)"
            axes.append(
                f"{pred / kib:.1f} / {lower / kib:.1f} ({_pct(pred, lower)}) / "
                f"{kernel / kib:.1f} ({_pct(pred, kernel)}){built}"
            )
        tp_ratio, dp_ratio = r["megatron_tp"] / r["hand_tp"], r["megatron_dp"] / r["hand_dp"]
        lines.append(
            f"| {r['family']} | {r['split']} | {r['ops']} | {r['errors']} | "
            f"{100 * r['agreement_cascaded']:.1f} % / {100 * r['agreement_per_op']:.1f} % | "
            f"{r['megatron_tp'] / kib:.1f} / {r['hand_tp'] / kib:.1f} ({tp_ratio:.3f}) | "
            f"{r['megatron_dp'] / kib:.1f} / {r['hand_dp'] / kib:.1f} ({dp_ratio:.3f}) | "
            + " | ".join(axes)
            + " |"
        )
    return "\n".join(lines)


HAND_COUNT_PRICINGS = (("oneflow-0.9", 0), ("megatron-lm", 0), ("megatron-lm", 2))
"""(runtime, ZeRO stage) pairs :func:`hand_count_table` prices the ``megatron`` baseline with."""


def hand_count_table(rows: list[dict[str, Any]]) -> str:
    """``megatron``'s tensor-parallel bytes per device over Megatron-LM's hand count, per
    job and per (runtime, ZeRO stage) of :data:`HAND_COUNT_PRICINGS`."""
    names = [f"{runtime}, ZeRO-{stage}" for runtime, stage in HAND_COUNT_PRICINGS]
    lines = [
        "| job | split | hand count (KiB) | " + " | ".join(f"megatron tp / hand, {n}" for n in names) + " |",
        "|---|---|---:|" + "---:|" * len(names),
    ]
    for r in rows:
        hand = r["hand_tp"]
        ratios = " | ".join(f"{r['megatron_tp_by_pricing'][n] / hand:.4f}" for n in names)
        lines.append(f"| {r['family']} | {r['split']} | {hand / 1024:.1f} | {ratios} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("jobs", type=Path, help="the OUT folder of _build_heldout_families.py")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    rows = []
    for family in (*DEVELOPMENT, *EVALUATION):
        # _build_heldout_families.py writes {family}_zero2[_compiled].pb; _build_heldout.py (hf-*)
        # {family}_min1024[_compiled].pb
        stem = next(
            (st for st in (f"{family}_zero2", f"{family}_min1024") if (args.jobs / f"{st}.pb").exists()),
            None,
        )
        if stem is not None:
            compiled = args.jobs / f"{stem}_compiled.pb"
            rows.append(measure(args.jobs / f"{stem}.pb", family, compiled if compiled.exists() else None))
    print(table(rows))
    print("\nmegatron tensor-parallel bytes / Megatron-LM's hand count, per runtime and ZeRO stage:")
    print(hand_count_table(rows))
    for r in rows:
        if r["missing"]:
            print(f"\n{r['family']}: signatures the rules lack (ops refused):")
            for sig, n in r["missing"].items():
                print(f"  {n:3d} x {sig}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
