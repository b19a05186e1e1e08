"""Build a residual ``x + matmul(y, w)`` per size on 8 CPU ranks as [4, 2] and write each job.

Run by ``test_oneflow_transfer_cost.py`` (and by hand) as ``python -m
oneflow.distributed.launch --nproc_per_node 8 _probe_transfer_cost.py OUT L,D [L,D ...]``.
``x`` is ``(S(0), B)``, ``y`` ``(S(0), S(2))``, ``w`` ``(B, S(0))``, so the product is
``(S(0), P)``; OneFlow's greedy inference then picks the ``add_n``'s signature, which depends
on ``AUTO_PARALLEL_TRANSFER_COST`` (``GetTransferCost()``) against the tensor's bytes.  The
variable is removed from the environment first, so OneFlow uses its default.  Rank 0 writes
``OUT/residual_{L}x{D}.pb`` (float32 ``[8, L, D]``; a training job, SGD, no ZeRO).
"""

import os
import sys
from pathlib import Path

os.environ.pop("AUTO_PARALLEL_TRANSFER_COST", None)

import numpy as np
import oneflow as flow

PLACEMENT = flow.placement("cpu", ranks=np.arange(8).reshape(4, 2).tolist())
S0, S2, B = flow.sbp.split(0), flow.sbp.split(2), flow.sbp.broadcast


def build(length: int, width: int) -> bytes:
    def laid_out(tensor: flow.Tensor, sbp: list) -> flow.Tensor:
        return tensor.to_global(PLACEMENT, [B, B]).to_global(PLACEMENT, sbp)

    class Residual(flow.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = flow.nn.Parameter(laid_out(flow.randn(width, width), [B, S0]))

        def forward(self, x: flow.Tensor, y: flow.Tensor) -> flow.Tensor:
            return (x + flow.matmul(y, self.w)).sum()

    module = Residual()

    class Train(flow.nn.Graph):
        def __init__(self) -> None:
            super().__init__()
            self.m = module
            self.add_optimizer(flow.optim.SGD(module.parameters(), lr=0.1))

        def build(self, x: flow.Tensor, y: flow.Tensor) -> flow.Tensor:
            loss = self.m(x, y)
            loss.backward()
            return loss

    x = laid_out(flow.randn(8, length, width), [S0, B])
    y = laid_out(flow.randn(8, length, width), [S0, S2])
    graph = Train()
    graph.build_graph(x, y)
    return bytes(graph._full_job_proto.SerializeToString())


out = Path(sys.argv[1])
for spec in sys.argv[2:]:
    length, width = (int(v) for v in spec.split(","))
    data = build(length, width)
    if flow.env.get_rank() == 0:
        (out / f"residual_{length}x{width}.pb").write_bytes(data)
