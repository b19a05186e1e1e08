"""Build, and compile or pin, the held-out jobs (``examples/oneflow/heldout``) on 8 CPU ranks as [4, 2].

Run by ``test_heldout.py`` as ``python -m oneflow.distributed.launch --nproc_per_node 8
_build_heldout.py OUT MODE``.  Every job: parameters in LiBai's layout
(``heldout.build``'s ``layout``), data ``(S(0), B)``, AdamW with ZeRO-2 at OneFlow's
default settings (``shard_min_size`` 1024) or, as a second case, ``shard_min_size=1``.

* ``MODE=build``: for each held-out job and both ZeRO settings, rank 0 writes the built
  job ``{job}_min{N}.pb`` (what autopar plans); the default-settings jobs are also
  compiled with OneFlow's own SBP inference (``{job}_min1024_compiled.pb``).
* ``MODE=pin``: for every ``{job}_min{N}[_{tag}].plan.json`` in OUT,
  the parameters and inputs are laid out as the plan says (:func:`apply_plan`,
  :func:`plan_input_sbps`, as ``examples/oneflow/train_with_plan.py`` does), and
  :func:`compile_with_plan` pins the plan into the job built with ``shard_min_size=N``
  and compiles it; rank 0 writes ``{stem}.pinned.json`` (attempts,
  ops pinned, refused types, op share) and the compiled job ``{stem}_pinned.pb``.
"""

import functools
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "oneflow"))

import heldout  # noqa: E402
import numpy as np  # noqa: E402
import oneflow as flow  # noqa: E402
from _libai_layout import global_inputs  # noqa: E402

from autopar.bridges.oneflow import apply_plan, export_job, make_train_graph  # noqa: E402
from autopar.bridges.oneflow.apply import plan_input_sbps, to_flow_sbp  # noqa: E402
from autopar.bridges.oneflow.compile import compile_with_plan  # noqa: E402
from autopar.ir.plan import Plan  # noqa: E402
from autopar.ir.sbp import parse_nd_sbp  # noqa: E402

out = Path(sys.argv[1])
mode = sys.argv[2]
MIN_SIZES = (1024, 1)  # OneFlow's default shard_min_size first; 1 is the second case
placement = flow.placement("cpu", ranks=np.arange(8).reshape(4, 2).tolist())
broadcast = [flow.sbp.broadcast] * 2
rank0 = flow.env.get_rank() == 0


def setup(name: str) -> tuple:
    """The job's module in LiBai's layout and its inputs ``(S(0), B)``."""
    module, arrays, layout = heldout.build(name, seed=0)
    module = module.to_global(placement, broadcast)
    for pname, param in module.named_parameters():
        param.data = param.data.to_global(placement, to_flow_sbp(parse_nd_sbp(layout(pname, param.ndim))))
    return module, global_inputs(arrays, placement)


def train_graph(module, min_size: int):
    optimizer = flow.optim.AdamW(module.parameters(), lr=1e-3)
    return make_train_graph(module, optimizer, zero_stage=2, zero_min_size=min_size)


def build_all() -> None:
    for name in sys.argv[3:] or heldout.EVALUATION:
        for min_size in MIN_SIZES:
            module, inputs = setup(name)
            graph = train_graph(module, min_size)
            data = export_job(graph, *inputs)
            if rank0:
                (out / f"{name}_min{min_size}.pb").write_bytes(data)
            if min_size == MIN_SIZES[0]:
                graph.finish_complie_and_init_runtime()
                if rank0:
                    compiled = graph._compiled_job_proto.SerializeToString()
                    (out / f"{name}_min{min_size}_compiled.pb").write_bytes(compiled)


def pin_all() -> None:
    for plan_path in sorted(out.glob("*.plan.json")):
        key = plan_path.name[: -len(".plan.json")]
        name, rest = key.rsplit("_min", 1)
        min_size = rest.split("_", 1)[0]
        plan = Plan.load(str(plan_path))
        module, arrays, _ = heldout.build(name, seed=0)
        # the launcher's flow (examples/oneflow/train_with_plan.py): parameters and inputs as planned
        apply_plan(module, plan, placement)
        inputs = [
            flow.tensor(a).to_global(placement, broadcast).to_global(placement, to_flow_sbp(sbp))
            for a, sbp in zip(arrays, plan_input_sbps(plan))
        ]
        make = functools.partial(train_graph, module, int(min_size))
        graph, report = compile_with_plan(make, plan, *inputs)
        if rank0:
            (out / f"{key}.pinned.json").write_text(json.dumps(report.summary(), indent=1))
            (out / f"{key}_pinned.pb").write_bytes(graph._compiled_job_proto.SerializeToString())


if mode == "build":
    build_all()
    if rank0:
        (out / "built.json").write_text(json.dumps(sorted(p.name for p in out.glob("*.pb"))))
elif mode == "pin":
    pin_all()
else:
    raise SystemExit(f"unknown mode {mode!r}; choose build or pin")
