"""Pin a plan whose cross entropy is OneFlow's ``_ms`` variant into a build that chose the plain op.

Run by ``test_pin_variant.py`` as ``python -m oneflow.distributed.launch --nproc_per_node 4
_pin_variant.py OUT`` (4 CPU ranks as [2, 2]).  A linear layer with 32 classes and
``flow._C.sparse_softmax_cross_entropy``:

* build A: weight ``(B, S(0))`` (split over the classes), so OneFlow builds
  ``sparse_softmax_cross_entropy_ms`` and splits it into a softmax of ten ops;
  the plan is OneFlow's own for that job, with the ``_ms`` gradient laid out
  ``(B, S(0))`` (batch split on mesh axis 1);
* build B: weight ``(B, B)``, so OneFlow builds the plain ``sparse_softmax_cross_entropy``
  and ``sparse_softmax_cross_entropy_grad``; ``compile_with_plan`` pins the plan into it.

Rank 0 writes ``result.json``: the compiled N-D SBP of the plain ops' ports and the
plan ops ``check_fidelity`` found no counterpart for.
"""

import json
import sys
from pathlib import Path

import numpy as np
import oneflow as flow

from autopar.bridges.oneflow import compile_with_plan, import_plan, make_train_graph
from autopar.bridges.oneflow.convert import nd_sbp_from_proto
from autopar.ir.sbp import Signature, parse_nd_sbp

out = Path(sys.argv[1])
placement = flow.placement("cpu", ranks=np.arange(4).reshape(2, 2).tolist())
S0, S1, B = flow.sbp.split(0), flow.sbp.split(1), flow.sbp.broadcast


class Tiny(flow.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = flow.nn.Linear(16, 32, bias=False)

    def forward(self, x: flow.Tensor, labels: flow.Tensor) -> flow.Tensor:
        return flow._C.sparse_softmax_cross_entropy(self.fc(x), labels).mean()


def build(weight_sbp: list) -> tuple[Tiny, list]:
    flow.manual_seed(0)
    module = Tiny().to_global(placement, [B, B])
    module.fc.weight.data = module.fc.weight.data.to_global(placement, weight_sbp)
    rng = np.random.default_rng(0)
    x = flow.tensor(rng.standard_normal((8, 16)).astype(np.float32))
    labels = flow.tensor(rng.integers(0, 32, 8).astype(np.int32))
    inputs = [t.to_global(placement, [B, B]).to_global(placement, [S0, B]) for t in (x, labels)]
    return module, inputs


# build A: the plan, from the _ms job
module, inputs = build([B, S0])
graph = make_train_graph(module, flow.optim.SGD(module.parameters(), lr=0.1))
graph.build_graph(*inputs)
plan = import_plan(graph._full_job_proto)
(grad,) = [n for n in plan.signatures if "sparse_softmax_cross_entropy_ms_grad" in n]
batch = parse_nd_sbp("(B, S(0))")
n_in, n_out = (len(p) for p in plan.ports[grad])
plan.signatures[grad] = Signature((batch,) * n_in, (batch,) * n_out)
# the weight stays replicated (build B's parameter), so that build B keeps the plain op
replicated = parse_nd_sbp("(B, B)")
for name, sig in plan.signatures.items():
    if name.startswith("model.fc.weight"):
        plan.signatures[name] = Signature((replicated,) * len(sig.inputs), (replicated,) * len(sig.outputs))
plan.variables["model.fc.weight"]["sbp"] = str(replicated)

# build B: the plain op, pinned with plan A
module, inputs = build([B, B])
optimizer = flow.optim.SGD(module.parameters(), lr=0.1)
compiled, report = compile_with_plan(lambda: make_train_graph(module, optimizer), plan, *inputs)
job = compiled._compiled_job_proto
conf = job.job_parallel_view_conf.op_name2nd_sbp_signature_conf
layouts: dict[str, dict[str, str]] = {}
for op in job.net.op:
    kind = op.user_conf.op_type_name if op.HasField("user_conf") else ""
    if kind in ("sparse_softmax_cross_entropy", "sparse_softmax_cross_entropy_grad"):
        layouts[kind] = {
            port: str(nd_sbp_from_proto(sbp, 2)) for port, sbp in conf[op.name].bn_in_op2nd_sbp.items()
        }
if flow.env.get_rank() == 0:
    fidelity = report.fidelity
    assert fidelity is not None
    result = {
        "plan_grad": grad,
        "layouts": layouts,
        "missing": fidelity.missing,
        "mismatched_ops": sorted({m["op"] for m in fidelity.mismatches}),
        "rejected": report.rejected,
    }
    (out / "result.json").write_text(json.dumps(result, indent=1))
