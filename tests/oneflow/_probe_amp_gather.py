"""The dtype of OneFlow 0.9's ZeRO parameter gather and gradient reduction under mixed precision.

Run by ``test_amp_gather.py`` (and by hand) as ``python -m oneflow.distributed.launch
--nproc_per_node 4 _probe_amp_gather.py OUT K``: 4 CPU ranks as ``[2, 2]``, ZeRO-2 with the
default ``shard_min_size`` (1024), ``K`` micro-batches per step.  OneFlow's
``AutoMixedPrecision`` pass only rewrites ops placed on CUDA devices
(``auto_mixed_precision.cpp`` ``MakePredicatorIsAllowedToRunWithHalf``: ``device_type() !=
kCUDA`` returns), so on CPU ranks the model writes the cast the pass would insert: each
weight is read once through ``w.to(float16)`` (one ``cast`` per blob, every reader reading
it: ``InsertCastOpImpl``'s ``edges_group_by_lbn``), the activations too, and the loss is
cast back to float32.  Two 64 x 64 weights: ``w`` laid out ``(B, S(0))`` (column-parallel)
and ``w2`` ``(B, S(1))`` (row-parallel).  Rank 0 writes ``OUT/amp.pb`` (the built job,
``_full_job_proto``).
"""

import sys
from pathlib import Path

import numpy as np
import oneflow as flow

from autopar.bridges.oneflow import make_train_graph

PLACEMENT = flow.placement("cpu", ranks=np.arange(4).reshape(2, 2).tolist())
B, S0, S1 = flow.sbp.broadcast, flow.sbp.split(0), flow.sbp.split(1)
HALF = flow.float16


def weight(sbp: list) -> flow.nn.Parameter:
    return flow.nn.Parameter(flow.randn(64, 64).to_global(PLACEMENT, [B, B]).to_global(PLACEMENT, sbp))


class TwoLinears(flow.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = weight([B, S0])
        self.w2 = weight([B, S1])

    def forward(self, x: flow.Tensor) -> flow.Tensor:
        h = flow.matmul(x.to(HALF), self.w.to(HALF), transpose_b=True)
        y = flow.matmul(h, self.w2.to(HALF), transpose_b=True)
        return y.to(flow.float32).sum()


out, k = Path(sys.argv[1]), int(sys.argv[2])
flow.manual_seed(0)
module = TwoLinears()
x = flow.randn(8 * k, 64).to_global(PLACEMENT, [B, B]).to_global(PLACEMENT, [S0, B])
optimizer = flow.optim.AdamW(module.parameters(), lr=1e-3)
graph = make_train_graph(module, optimizer, zero_stage=2, micro_batches=k)
graph.build_graph(x)
if flow.env.get_rank() == 0:
    (out / "amp.pb").write_bytes(graph._full_job_proto.SerializeToString())
