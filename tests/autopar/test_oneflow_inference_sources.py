"""The emulated OneFlow inference and ops without inputs (arange, constant-like ops)."""

from autopar.baselines.oneflow_inference import infer_like_oneflow
from autopar.cost.compute import op_signatures, rule_context
from autopar.ir.graph import Graph, Op, TensorSpec
from autopar.ir.sbp import B, NdSbp, Signature, Split
from autopar.rules.registry import default_rules


def _graph() -> Graph:
    tensors = [
        TensorSpec("x", (8, 16), "float32"),
        TensorSpec("pos", (16,), "int64"),
        TensorSpec("posf", (16,), "float32"),
        TensorSpec("y", (8, 16), "float32"),
    ]
    ops = [
        Op("x", "input", outputs={"out": "x"}),
        Op("pos", "arange", outputs={"out_0": "pos"}, attrs={"start": 0, "delta": 1, "limit": 16}),
        Op("cast", "cast", {"in_0": "pos"}, {"out_0": "posf"}, {"dtype": "float32"}),
        Op("add", "broadcast_add", {"x_0": "x", "y_0": "posf"}, {"z_0": "y"}),
    ]
    return Graph("positions", tensors, ops, [])


def test_an_op_without_inputs_is_created_broadcast_not_inferred():
    # OneFlow gives a global tensor the program creates (position ids from arange) the
    # nd_sbp it is created with, broadcast in LiBai; nothing is inferred for it.  With no
    # input to match, the greedy rule would take its last candidate (here a split), and
    # every op downstream would follow it (GPT on [4, 2]: 17.6 % of ops as OneFlow).
    graph = _graph().validate()
    mesh = (4, 2)
    offered, _ = op_signatures(default_rules(), rule_context(graph, graph.op_by_name["pos"], mesh, 2))
    assert any(isinstance(v, Split) for s in offered for o in s.outputs for v in o)  # a split is offered
    data = Signature((), (NdSbp((Split(0), B)),))
    chosen = infer_like_oneflow(graph, mesh, {"x": data}, zero_stage=2)
    assert chosen["pos"].outputs == (NdSbp((B, B)),)
