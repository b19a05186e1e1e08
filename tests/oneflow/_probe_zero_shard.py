"""Which variables OneFlow 0.9's ZeRO (``distributed_split``) shards, and which keep a cast, on [4, 2].

Run by ``test_oneflow_zero_shard.py`` (and by hand) as ``python -m oneflow.distributed.launch
--nproc_per_node 8 _probe_zero_shard.py OUT JOB [JOB ...]``; each JOB is ``name=use;use;...``,
a use ``param:kind:d0xd1x...[:BB]`` (in forward order).  A parameter is declared ``(B, S(0))``
on the mesh ``[4, 2]`` (``(B, B)`` with ``:BB``); ``kind`` says what reads it forward:

* ``conv``: ``conv2d`` of the images ``[8, C, 16, 16]`` (``C`` the weight's dim 1, the
  images ``(S(0), B)``), kernel = stride = the weight's last two dims;
* ``conv2x``: two such ``conv2d`` (two readers);
* ``matmul``: ``x @ w.T`` with ``x`` ``[8, K]`` (``K`` = the product of the weight's dims 1..;
  a weight of more than 2 dims is reshaped to ``[N, K]`` first).

A ``g`` suffix (``convg``, ``matmulg``) scales the images by a 3-element parameter first, so
the input needs a gradient and the backward reads the weight too (``conv_data_grad``, a
second ``matmul``).  The job is trained with AdamW and OneFlow's default ZeRO-2
(``shard_min_size`` 1024).  Rank 0 writes ``OUT/{name}.pb``, the job as built
(``_full_job_proto``), and ``OUT/{name}.json``: per parameter its stored N-D SBP
(``variable_conf.nd_sbp`` after the ZeRO pass).
"""

import json
import math
import sys
from pathlib import Path

import numpy as np
import oneflow as flow

PLACEMENT = flow.placement("cpu", ranks=np.arange(8).reshape(4, 2).tolist())
S0, B = flow.sbp.split(0), flow.sbp.broadcast

Use = tuple[str, str, list[int], str]


def laid_out(tensor: flow.Tensor, sbp: list) -> flow.Tensor:
    return tensor.to_global(PLACEMENT, [B, B]).to_global(PLACEMENT, sbp)


def parse(spec: str) -> tuple[str, list[Use]]:
    name, _, body = spec.partition("=")
    uses = []
    for use in body.split(";"):
        param, kind, dims, *layout = use.split(":")
        uses.append((param, kind, [int(d) for d in dims.split("x")], layout[0] if layout else "BS0"))
    return name, uses


def read(kind: str, w: flow.Tensor, images: flow.Tensor) -> flow.Tensor:
    shape = list(w.shape)
    if kind in ("conv", "conv2x"):
        x = flow.cat([images] * (shape[1] // 3), dim=1) if shape[1] > 3 else images
        y = flow.nn.functional.conv2d(x, w, stride=shape[2:]).sum()
        if kind == "conv2x":
            y = y + flow.nn.functional.conv2d(2 * x, w, stride=shape[2:]).sum()
        return y
    k = math.prod(shape[1:])
    x = flow.cat([images.flatten(1)] * (k // 768 + 1), dim=1)[:, :k]
    return flow.matmul(x, w if len(shape) == 2 else w.reshape(shape[0], k), transpose_b=True).sum()


def build(uses: list[Use]) -> bytes:
    class Probe(flow.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            for param, _, shape, layout in uses:
                sbp = [B, S0] if layout == "BS0" else [B, B]
                setattr(self, param, flow.nn.Parameter(laid_out(flow.randn(*shape), sbp)))
            self.scale = flow.nn.Parameter(laid_out(flow.ones(3, 1, 1), [B, B]))

        def forward(self, images: flow.Tensor) -> flow.Tensor:
            loss = None
            for param, kind, _, _ in uses:
                x = images * self.scale if kind.endswith("g") else images
                term = read(kind.removesuffix("g"), getattr(self, param), x)
                loss = term if loss is None else loss + term
            return loss

    module = Probe()

    class Train(flow.nn.Graph):
        def __init__(self) -> None:
            super().__init__()
            self.m = module
            self.add_optimizer(flow.optim.AdamW(module.parameters(), lr=1e-3))
            self.config.enable_zero(True, stage=2)

        def build(self, images: flow.Tensor) -> flow.Tensor:
            loss = self.m(images)
            loss.backward()
            return loss

    graph = Train()
    graph.build_graph(laid_out(flow.randn(8, 3, 16, 16), [S0, B]))
    return bytes(graph._full_job_proto.SerializeToString())


def stored(job_bytes: bytes, params: list[str]) -> dict[str, list[str]]:
    from oneflow.core.job import job_pb2

    job = job_pb2.Job()
    job.ParseFromString(job_bytes)
    return {
        op.name.removeprefix("m."): list(op.variable_conf.nd_sbp)
        for op in job.net.op
        if op.HasField("variable_conf") and op.name.removeprefix("m.") in params
    }


out_dir = Path(sys.argv[1])
for spec in sys.argv[2:]:
    job_name, job_uses = parse(spec)
    data = build(job_uses)
    if flow.env.get_rank() == 0:
        result = stored(data, [use[0] for use in job_uses])
        (out_dir / f"{job_name}.json").write_text(json.dumps(result, indent=1))
        (out_dir / f"{job_name}.pb").write_bytes(data)
        print(job_name, json.dumps(result), flush=True)
