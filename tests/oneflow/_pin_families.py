"""Pin autopar's plans into every development and evaluation job and compile them, on 8 CPU ranks as [4, 2].

Run as ``python -m oneflow.distributed.launch --nproc_per_node 8 _pin_families.py OUT``:
for every ``OUT/{job}.plan.json`` (a plan autopar made for the job ``OUT/{job}.pb`` of
``_build_heldout_families.py`` or ``_build_heldout.py``), the job's module is built again
as its builder built it, laid out as the plan says (:func:`apply_plan`, inputs by
:func:`plan_input_sbps`: what ``examples/oneflow/train_with_plan.py`` does), and
:func:`compile_with_plan` pins the plan into the training graph at OneFlow's default
ZeRO-2 (``shard_min_size`` 1024, as the job was built) and compiles it.  Rank 0 writes
``OUT/{job}.pinned.json``: attempts, ops pinned, refused op types, and the share of the
compiled job's ops whose signature is the plan's.

Job names: ``{family}_zero2`` (``_build_heldout_families.py``: the zoo's development jobs
and the evaluation families) or ``{name}_min1024`` (``_build_heldout.py``: the HF jobs).
"""

import functools
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "oneflow"))
sys.path.insert(0, str(ROOT))

import heldout  # noqa: E402
import numpy as np  # noqa: E402
import oneflow as flow  # noqa: E402
import zoo  # noqa: E402
from heldout import families  # noqa: E402

from autopar.bridges.oneflow import apply_plan, make_train_graph  # noqa: E402
from autopar.bridges.oneflow.apply import plan_input_sbps, to_flow_sbp  # noqa: E402
from autopar.bridges.oneflow.compile import compile_with_plan  # noqa: E402
from autopar.ir.plan import Plan  # noqa: E402

out = Path(sys.argv[1])
placement = flow.placement("cpu", ranks=np.arange(8).reshape(4, 2).tolist())
broadcast = [flow.sbp.broadcast] * 2
rank0 = flow.env.get_rank() == 0


def module_of(job: str) -> tuple:
    """The module and input arrays of ``job``, built as its builder built them."""
    flow.manual_seed(0)
    if job.endswith("_min1024"):
        module, arrays, _ = heldout.build(job.removesuffix("_min1024"), seed=0)
        return module, arrays
    family = job.removesuffix("_zero2")
    if family in zoo.KNOWN:
        # as _build_heldout_families.py: fused layer norms, MT5's RMSNorm as its CPU composite
        return zoo.build(family, seed=0, fused=family != "mt5-tiny", identity_reads=False)
    return families.builder(family)()


def train_graph(module):
    """A fresh training graph (each attempt of :func:`compile_with_plan` builds one)."""
    return make_train_graph(module, flow.optim.AdamW(module.parameters(), lr=1e-3), zero_stage=2)


for plan_path in sorted(out.glob("*.plan.json")):
    t0 = time.perf_counter()
    job = plan_path.name[: -len(".plan.json")]
    plan = Plan.load(str(plan_path))
    module, arrays = module_of(job)
    apply_plan(module, plan, placement)
    inputs = [
        flow.tensor(a).to_global(placement, broadcast).to_global(placement, to_flow_sbp(sbp))
        for a, sbp in zip(arrays, plan_input_sbps(plan))
    ]
    make = functools.partial(train_graph, module)
    try:
        _, report = compile_with_plan(make, plan, *inputs)
    except RuntimeError as exc:  # e.g. a kernel OneFlow 0.9 lacks on CPU (fused rms_norm)
        reason = next((line.strip() for line in str(exc).splitlines() if "op_type_name" in line), "")
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if rank0:
            (out / f"{job}.pinned.json").write_text(json.dumps({"error": f"{first} {reason}".strip()}))
        continue
    if rank0:
        (out / f"{job}.pinned.json").write_text(json.dumps(report.summary(), indent=1))
        print(f"{job}: pinned and compiled in {time.perf_counter() - t0:.1f} s", flush=True)
