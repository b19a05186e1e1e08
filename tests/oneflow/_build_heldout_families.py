"""Build the held-out evaluation jobs (``examples/oneflow/heldout/families.py``) on 8 CPU ranks as [4, 2].

Run as ``python -m oneflow.distributed.launch --nproc_per_node 8 _build_heldout_families.py OUT
[--compile] [FAMILY ...]``.
A FAMILY of ``examples/oneflow/zoo.py`` (``mt5-tiny``, ``gpt-tiny``, ``bert-tiny``: the
development jobs) is built the same way, laid out by ``benchmarks/fidelity.py``'s
``libai_layout``, for the development rows beside the evaluation ones (MT5's RMSNorm as
its CPU composite, the layer norms fused); with a
``+identity`` suffix its parameters are read through ``identity`` ops.
Parameters get LiBai's layout (:func:`families.place_libai`), data ``(S(0), B)``,
AdamW with OneFlow's default ZeRO-2 (``shard_min_size`` 1024).  Rank 0 writes
``{family}_zero2.pb`` (the job as OneFlow's SBP inference built it) into OUT; with
``--compile`` also ``{family}_zero2_compiled.pb``, the job nn.Graph compiled
(``finish_complie_and_init_runtime``): it holds the middle nodes OneFlow's
``BoxingCollector`` inserted, so each of its edges is one hop as OneFlow runs it
(what ``benchmarks/heldout_truth.py`` counts bytes on).
"""

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "oneflow"))

import numpy as np  # noqa: E402
import oneflow as flow  # noqa: E402
import zoo  # noqa: E402
from heldout import families  # noqa: E402

sys.path.insert(0, str(ROOT))
from autopar.bridges.oneflow import export_job, make_train_graph  # noqa: E402
from benchmarks.fidelity import libai_layout  # noqa: E402

out = Path(sys.argv[1])
compile_jobs = "--compile" in sys.argv[2:]
chosen = [a for a in sys.argv[2:] if a != "--compile"] or sorted(families.SPLIT)
placement = flow.placement("cpu", ranks=np.arange(8).reshape(4, 2).tolist())
broadcast = [flow.sbp.broadcast] * 2
for family in chosen:
    t0 = time.perf_counter()
    flow.manual_seed(0)
    if family.removesuffix("+identity") in zoo.KNOWN:
        # "+identity": parameters read through identity ops (examples/oneflow/oflayers.py)
        name = family.removesuffix("+identity")
        # fused layer norms (they have CPU kernels); MT5's RMSNorm as its CPU composite:
        # OneFlow 0.9's fused rms_norm has CUDA kernels only, and --compile needs CPU ones
        fused = name != "mt5-tiny"
        module, arrays = zoo.build(name, seed=0, fused=fused, identity_reads=family.endswith("+identity"))
        module = module.to_global(placement, broadcast)
        for pname, param in module.named_parameters():
            sbp = [
                flow.sbp.split(int(v[2])) if v.startswith("S") else flow.sbp.broadcast
                for v in libai_layout(pname, 2)
            ]
            param.data = param.data.to_global(placement, sbp)
    else:
        module, arrays = families.builder(family)()
        module = families.place_libai(family, module, placement)
    inputs = [
        flow.tensor(a)
        .to_global(placement, broadcast)
        .to_global(placement, [flow.sbp.split(0), flow.sbp.broadcast])
        for a in arrays
    ]
    graph = make_train_graph(module, flow.optim.AdamW(module.parameters(), lr=1e-3), zero_stage=2)
    data = export_job(graph, *inputs)
    if flow.env.get_rank() == 0:
        (out / f"{family}_zero2.pb").write_bytes(data)
        print(
            f"{family}: {len(graph._full_job_proto.net.op)} ops in {time.perf_counter() - t0:.1f} s",
            flush=True,
        )
    if compile_jobs:
        graph.finish_complie_and_init_runtime()
        if flow.env.get_rank() == 0:
            compiled = graph._compiled_job_proto.SerializeToString()
            (out / f"{family}_zero2_compiled.pb").write_bytes(compiled)
