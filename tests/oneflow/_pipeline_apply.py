"""Rank script of test_pipeline_apply: tiny GPT trained under a pipeline plan, or on one rank.

    python -m oneflow.distributed.launch --nproc_per_node 8 _pipeline_apply.py PLAN OUT pipeline
    python -m oneflow.distributed.launch --nproc_per_node 1 _pipeline_apply.py PLAN OUT reference

Both train ``STEPS`` steps of examples/oneflow/gpt.py's tiny GPT (seed 0) with AdamW, the
plan's ``K`` micro-batches per step (``batch = 8 K`` rows of ``gpt.example_inputs``, seed 1:
each micro-batch its own 8 rows) and its checkpointing.  ``pipeline``:
:func:`autopar.bridges.oneflow.pipeline_apply.apply_pipeline_plan` on 8 ranks; ``reference``: the
same graph on rank 0 alone.  The first rank of the last stage writes ``OUT/<mode>.json``
(losses, what was applied) and, for ``pipeline``, the compiled job ``OUT/pipeline_job.pb``.
The plan's graph (``autopar model tiny-gpt``, float32) gives the blocks' planned layouts.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "oneflow"))

import gpt  # noqa: E402
import numpy as np  # noqa: E402
import oneflow as flow  # noqa: E402
from oflayers import arange, read_param  # noqa: E402

from autopar.bridges.oneflow.apply import to_flow_sbp  # noqa: E402
from autopar.bridges.oneflow.jobs import make_train_graph  # noqa: E402
from autopar.bridges.oneflow.pipeline_apply import (  # noqa: E402
    GPT_NAMES,
    apply_pipeline_plan,
    make_pipeline_train_graph,
    to_stage,
)
from autopar.models import build  # noqa: E402
from autopar.pipeline.plan import PipelinePlan  # noqa: E402

STEPS = 3
LEARNING_RATE = 1e-3


class StagedGPT(gpt.GPTLMHeadModel):
    """gpt.py's model with its tied LM head reading ``wte`` on the stage of its input
    (:func:`to_stage`, as LiBai's ``LMLogits``); the same model on one placement."""

    def forward(self, input_ids: flow.Tensor, labels: flow.Tensor) -> flow.Tensor:
        s = input_ids.shape[1]
        x = self.wte(input_ids) + self.wpe(arange(s, input_ids))
        for block in self.h:
            x = block(x)
        h = self.ln_f(x)
        weight = to_stage(read_param(self, self.wte.weight), h)
        logits = flow._C.matmul(h, weight, transpose_a=False, transpose_b=True)
        loss = flow._C.sparse_softmax_cross_entropy(
            logits.reshape(-1, self.config.vocab_size), to_stage(labels, h).reshape(-1)
        )
        return loss.mean()


def main() -> None:
    plan_path, out, mode = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    plan = PipelinePlan.from_dict(json.loads(plan_path.read_text()))
    k = plan.training.micro_batches
    config = gpt.GPTConfig.tiny()
    module = StagedGPT(config, seed=0)
    for sub in module.modules():
        sub.identity_reads = True  # CPU boxing of a variable's own buffer aborts (oflayers)
    ids, labels = gpt.example_inputs(config, 8 * k, 32)
    result: dict = {"mode": mode, "micro_batches": k}
    if mode == "pipeline":
        graph_of_plan = build("tiny-gpt", dtype="float32")
        report = apply_pipeline_plan(module, plan, names=GPT_NAMES, graph=graph_of_plan)
        first, last = report.placements[0], report.placements[-1]
        # the graph inputs as the stage plans lay them out: token ids on the first stage,
        # labels on the last
        ids_sbp = to_flow_sbp(plan.stages[0].output_sbp("input_ids", "out"))
        labels_sbp = to_flow_sbp(plan.stages[-1].output_sbp("labels", "out"))
        bb = [flow.sbp.broadcast] * len(ids_sbp)
        inputs = [
            flow.tensor(ids).to_global(first, bb).to_global(first, ids_sbp),
            flow.tensor(labels).to_global(last, bb).to_global(last, labels_sbp),
        ]
        optimizer = flow.optim.AdamW(module.parameters(), lr=LEARNING_RATE)
        graph = make_pipeline_train_graph(module, optimizer, report)
        result["applied"] = report.to_dict()
    else:
        placement = flow.placement("cpu", ranks=[0])
        module = module.to_global(placement, flow.sbp.broadcast)
        inputs = [flow.tensor(a).to_global(placement, flow.sbp.broadcast) for a in (ids, labels)]
        optimizer = flow.optim.AdamW(module.parameters(), lr=LEARNING_RATE)
        blocks = [f"h.{i}" for i in range(config.layers)] if plan.training.checkpointing == "full" else []
        graph = make_train_graph(module, optimizer, micro_batches=k, checkpointing=blocks)
    graph.build_graph(*inputs)
    graph.finish_complie_and_init_runtime()
    losses, per_micro_batch = [], []
    for _ in range(STEPS):
        loss = graph(*inputs)
        values = loss.to_global(loss.placement, [flow.sbp.broadcast] * len(loss.sbp)).to_local().numpy()
        losses.append(float(np.mean(values)))
        per_micro_batch.append([float(v) for v in np.ravel(values)])
    result.update(losses=losses, per_micro_batch=per_micro_batch)
    # the loss lies on the last stage: its first rank writes
    if flow.env.get_rank() == int(np.min(loss.placement.ranks)):
        if mode == "pipeline":
            (out / "pipeline_job.pb").write_bytes(graph._compiled_job_proto.SerializeToString())
        (out / f"{mode}.json").write_text(json.dumps(result, indent=1))
        print(f"[{mode}] losses {losses}")


if __name__ == "__main__":
    main()
