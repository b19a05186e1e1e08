"""Plan tiny GPT (float32, as examples/oneflow/gpt.py) as 2 stages x [2, 2] on 1x8 and
write the plan and autopar's boundary bytes.  Runs in the main venv (the solver):

    python _pipeline_plan.py OUT_DIR [MICRO_BATCHES]

``OUT_DIR/plan.json``: the ``autopar.pipeline/v1`` plan; ``OUT_DIR/boundaries.json``: per
boundary of :func:`autopar.pipeline.split.split_graph` (``StageSlice.receives``) its tensor,
stages, when it crosses, shape, the sender's and receiver's layouts and
:func:`autopar.pipeline.evaluate.boundary_bytes_per_device`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from autopar.cost.compute import boundary_bytes_per_device
from autopar.hardware.cluster import Cluster
from autopar.infra.progress import Deadline
from autopar.models import build
from autopar.pipeline.split import RECV_SUFFIX, split_graph
from autopar_solver.options import SolverOptions
from autopar_solver.planner import PlanRequest
from autopar_solver.planner.pipeline_search import solve_pipeline


def main() -> None:
    out = Path(sys.argv[1])
    k = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    graph = build("tiny-gpt", dtype="float32")
    options = SolverOptions(time_limit_s=30, micro_batches=k, checkpointing="full")
    request = PlanRequest(graph, Cluster.parse("1x8"), None, None, 2, options)
    plan = solve_pipeline(request, 2, Deadline(30), stage_mesh_shape=(2, 2))
    (out / "plan.json").write_text(plan.to_json(indent=1))
    graph.save(str(out / "graph.json"))  # for autopar oneflow fidelity --graph
    rows = []
    for sl in split_graph(graph, plan.counts):
        for b in sl.receives:
            spec = graph.tensors[b.tensor]
            src_plan, dst_plan = plan.stages[b.src], plan.stages[b.dst]
            producer, port = graph.producer[b.tensor]
            received = dst_plan.output_sbp(f"{b.tensor}{RECV_SUFFIX}", "out")
            rows.append(
                {
                    "tensor": b.tensor,
                    "src": b.src,
                    "dst": b.dst,
                    "per": b.per,
                    "tied_gradient": b.tied_gradient,
                    "shape": list(spec.shape),
                    "dtype": spec.dtype,
                    "sender_sbp": str(src_plan.output_sbp(producer, port)),
                    "receiver_sbp": str(received),
                    "bytes_per_device": boundary_bytes_per_device(
                        spec.numel, spec.dtype, received, dst_plan.mesh.shape
                    ),
                }
            )
    (out / "boundaries.json").write_text(json.dumps(rows, indent=1))
    print(plan.summary())


if __name__ == "__main__":
    main()
