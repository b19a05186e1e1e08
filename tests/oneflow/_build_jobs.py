"""Build the tiny MT5, GPT and BERT training jobs the OneFlow tests import (4 ranks, mesh [2, 2]).

Run by ``conftest.py`` as ``python -m oneflow.distributed.launch --nproc_per_node 4
_build_jobs.py OUT``.  Parameters get LiBai's layout (2-D weights ``(B, S(0))``,
the rest ``B``), data ``(S(0), B)``; each model is built with and without ZeRO-2 (OneFlow's default settings).
GPT's fused QKV is laid out head-first, as Megatron-LM and LiBai lay it out
(``examples/oneflow/gpt.py``), so its column-parallel split is a split by heads;
an optional second argument ``hf`` builds Hugging Face's ``[q | k | v]`` instead
(``_build_jobs.py OUT hf``, for ``benchmarks/model_truth.py --imported-gpt``).
``_build_jobs.py OUT fused-kv`` builds only ``mt5-tiny`` with ZeRO-2, its
cross-attention key and value as one head-first ``key_value`` linear (LiBai's layout,
``examples/oneflow/mt5.py``), for ``test_megatron_imported.py`` and
``benchmarks/model_truth.py --imported-tiny-mt5``.
Rank 0 writes ``{model}_zero{stage}.pb`` and ``counts.json`` (OneFlow's own op and
blob counts, and its train_conf variables) into OUT.
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "oneflow"))

import numpy as np  # noqa: E402
import oneflow as flow  # noqa: E402
import zoo  # noqa: E402
from _libai_layout import global_inputs, libai_weights  # noqa: E402

from autopar.bridges.oneflow import export_job, make_train_graph  # noqa: E402

out = Path(sys.argv[1])
variant = sys.argv[2] if len(sys.argv) > 2 else "heads"
if variant not in ("heads", "hf", "fused-kv"):
    raise SystemExit(f"unknown variant {variant!r}; choose 'heads', 'hf' or 'fused-kv'")
fused_kv = variant == "fused-kv"
qkv_layout = "heads" if fused_kv else variant
models = ("mt5-tiny",) if fused_kv else ("mt5-tiny", "gpt-tiny", "bert-tiny")
stages = (2,) if fused_kv else (0, 2)
placement = flow.placement("cpu", ranks=np.arange(4).reshape(2, 2).tolist())
counts = {}
for name in models:
    for zero in stages:
        options: dict[str, str | bool] = {"qkv_layout": qkv_layout} if name == "gpt-tiny" else {}
        if fused_kv:
            options["fused_cross_kv"] = True
        module, arrays = zoo.build(name, seed=0, fused=True, **options)
        module = libai_weights(module, placement)
        inputs = global_inputs(arrays, placement)
        graph = make_train_graph(
            module, flow.optim.AdamW(module.parameters(), lr=1e-3), zero_stage=zero
        )  # OneFlow's default ZeRO settings (shard_min_size 1024)
        data = export_job(graph, *inputs)
        if flow.env.get_rank() == 0:
            key = f"{name}_zero{zero}"
            (out / f"{key}.pb").write_bytes(data)
            job = graph._full_job_proto
            counts[key] = {
                "ops": len(job.net.op),
                "blobs": len(job.helper.lbn2logical_blob_desc),
                "trainable": [v for c in job.job_conf.train_conf.optimizer_conf for v in c.variable_op_names],
                "parameters": [n for n, _ in module.named_parameters()],
            }
if flow.env.get_rank() == 0:
    (out / "counts.json").write_text(json.dumps(counts, indent=1))
