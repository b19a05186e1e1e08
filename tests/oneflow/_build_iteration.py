"""Compile tiny GPT and MT5 jobs with gradient accumulation and activation checkpointing.

Run by ``test_iteration.py`` as ``python -m oneflow.distributed.launch --nproc_per_node 4
_build_iteration.py OUT [JOBS]`` (4 CPU ranks as [2, 2], ZeRO-2 with OneFlow's default
``shard_min_size``, LiBai's parameter layout as ``_build_jobs.py``: 2-D weights
``(B, S(0))``, data ``(S(0), B)``).  ``JOBS``: comma-separated ``model:variant`` (default
``gpt-tiny:full,mt5-tiny:subset``; ``all``: both variants of both models), models
``gpt-tiny`` (two blocks) and ``mt5-tiny`` with one encoder and one decoder block.  Per model:

1. **the plan**: build the job of ONE micro-batch (batch 2, ``K = 1``, no checkpointing),
   import it (``{model}_graph.json``) and read OneFlow's own N-D SBP as the plan
   (``import_plan``); write it for ``K = 4`` with ``full`` checkpointing
   (``{model}_full_plan.json``) and with ``off`` (``{model}_off_plan.json``);
2. ``full``: ``compile_with_plan`` builds the job at batch 8 (= 4 micro-batches of 2) and
   sets ``K = 4`` and checkpointing on every block from the plan (``{model}_full.pb``, the
   compiled job);
3. ``subset`` (standing for ``auto``): the ``off`` plan with ``recompute=`` the first
   block's scope only (``{model}_subset.pb``);
4. ``auto=PLAN``: the plan file ``PLAN`` (a solver's ``auto`` plan of ``{model}_graph.json``)
   compiled as it is (``{model}_auto.pb``).

Rank 0 writes the files and ``reports.json`` (each compile's ``CompileReport``: ``K`` and
the modules it checkpointed).  The fidelity is checked by the test, in one process.
"""

import json
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "oneflow"))

import numpy as np  # noqa: E402
import oneflow as flow  # noqa: E402
import zoo  # noqa: E402
from _libai_layout import global_inputs, libai_weights  # noqa: E402

from autopar.bridges.oneflow import compile_with_plan, import_job, import_plan, make_train_graph  # noqa: E402
from autopar.ir.plan import Plan  # noqa: E402
from autopar.ir.training import TrainingConfig  # noqa: E402

MICRO_BATCH, K = 2, 4
IDENTITY_READS = False  # compiled, never run: the variables may feed their consumers directly
FIRST_BLOCK = {"gpt-tiny": ["model.h.0"], "mt5-tiny": ["model.encoder.block.0"]}

out = Path(sys.argv[1])
chosen = sys.argv[2] if len(sys.argv) > 2 else "gpt-tiny:full,mt5-tiny:subset"
if chosen == "all":
    chosen = "gpt-tiny:full,gpt-tiny:subset,mt5-tiny:full,mt5-tiny:subset"
jobs = [tuple(item.split(":")) for item in chosen.split(",")]
models = list(dict.fromkeys(model for model, _ in jobs))
placement = flow.placement("cpu", ranks=np.arange(4).reshape(2, 2).tolist())
rank0 = flow.env.get_rank() == 0


def build(name: str, batch: int) -> tuple:
    layers = {"layers": 1} if name == "mt5-tiny" else {}
    module, arrays = zoo.build(name, seed=0, batch=batch, identity_reads=IDENTITY_READS, **layers)
    return libai_weights(module, placement), global_inputs(arrays, placement)


reports = {}
for name in models:
    module, inputs = build(name, MICRO_BATCH)
    graph = make_train_graph(module, flow.optim.AdamW(module.parameters(), lr=1e-3), zero_stage=2)
    graph.build_graph(*inputs)
    one = import_job(graph._full_job_proto)
    plan = import_plan(graph._full_job_proto, graph=one)
    plans = {
        "full": replace(plan, training=TrainingConfig(K, "full")),
        "subset": replace(plan, training=TrainingConfig(K, "off")),
    }
    if rank0:
        one.save(str(out / f"{name}_graph.json"))
        plans["full"].save(str(out / f"{name}_full_plan.json"))
        plans["subset"].save(str(out / f"{name}_off_plan.json"))
    for model, variant in jobs:
        if model == name and variant.startswith("auto="):
            plans["auto"] = Plan.load(variant.removeprefix("auto="))
            jobs.append((name, "auto"))
    for variant, recompute in (("full", None), ("subset", FIRST_BLOCK[name]), ("auto", None)):
        if (name, variant) not in jobs:
            continue
        module, inputs = build(name, MICRO_BATCH * K)
        optimizer = flow.optim.AdamW(module.parameters(), lr=1e-3)
        compiled, report = compile_with_plan(
            lambda module=module, optimizer=optimizer: make_train_graph(module, optimizer, zero_stage=2),
            plans[variant],
            *inputs,
            recompute=recompute,
            check=False,
        )
        if rank0:
            (out / f"{name}_{variant}.pb").write_bytes(compiled._compiled_job_proto.SerializeToString())
            reports[f"{name}_{variant}"] = {
                "micro_batches": report.micro_batches,
                "recomputed": report.recomputed,
                "pinned_ops": report.pinned_ops,
                "rejected": report.rejected,
            }
if rank0:
    (out / "reports.json").write_text(json.dumps(reports, indent=1))
