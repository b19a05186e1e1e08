"""A ``like`` port's boxing: free under the ideal lowering, priced as any input under OneFlow 0.9.

OneFlow gives a ``like`` input an SBP of its own in the op's signature
(``oneflow/user/ops/split_like_op.cpp`` ``GetSbp``) and boxes it as any other
input blob; the compiled LLaMA job of ``benchmarks/heldout_truth.py`` carries
those boxings into ``split_like``'s ``like`` ports.
"""

import dataclasses

import pytest

from autopar.baselines.plans import baseline_plan
from autopar.cost.build_tables import build_cost_tables
from autopar.cost.edges import EdgeKind, edge_kind
from autopar.cost.evaluate import evaluate
from autopar.hardware.cluster import Cluster
from autopar.hardware.mesh import Mesh
from autopar.ir.graph import DTYPE_BYTES
from autopar.ir.sbp import parse_signature
from autopar.runtimes.oneflow_09.lowering import lower_hop
from tests.graphs import mlp_graph

MESH = Mesh(Cluster.parse("1x4"), (2, 2))


def _graph_and_plan(runtime: str):
    """tiny MLP, Megatron's plan; the loss seed's ``like`` port reads the row-parallel output
    ``(S(0), P)`` as ``(S(0), B)`` (a signature ``ones_like``'s rule offers)."""
    g = mlp_graph(batch=8, hidden=64, ffn=128, layers=1)
    plan = baseline_plan("megatron", g, MESH, 0)
    plan = dataclasses.replace(plan, runtime=runtime)
    assert str(plan.signatures["l0.fc2"].outputs[0]) == "(S(0), P)"
    plan.signatures["seed"] = parse_signature("((S(0), B)) -> (S(0), B)")
    return g, plan


def test_like_port_is_shape_only_under_the_ideal_lowering_only():
    seed = mlp_graph(layers=1).op_by_name["seed"]
    assert edge_kind(seed, "like_0") is EdgeKind.SHAPE_ONLY
    assert edge_kind(seed, "like_0", lowering="ideal") is EdgeKind.SHAPE_ONLY
    assert edge_kind(seed, "like_0", lowering="oneflow-0.9") is EdgeKind.BOXING


def test_evaluate_prices_the_like_boxing_as_oneflow_lowers_it():
    g, plan = _graph_and_plan("oneflow-0.9")
    ev = evaluate(g, plan)
    assert ev.valid, ev.errors
    (edge,) = [e for e in ev.edges if e.consumer == "seed"]
    assert (edge.port, str(edge.src), str(edge.dst)) == ("like_0", "(S(0), P)", "(S(0), B)")
    spec = g.tensors[edge.tensor]
    hop = lower_hop(spec.shape, DTYPE_BYTES[spec.dtype], edge.src, edge.dst, MESH.shape)
    assert hop.kind == "all_reduce" and hop.bytes_per_axis[1] > 0
    assert edge.bytes_per_device == pytest.approx(hop.total_bytes)


def test_ideal_lowering_leaves_the_like_port_free():
    g, plan = _graph_and_plan("ideal")
    ev = evaluate(g, plan)
    assert ev.valid, ev.errors
    assert not [e for e in ev.edges if e.consumer == "seed"]


def test_cost_tables_hold_the_like_edge_under_oneflow_only():
    g = mlp_graph(batch=8, hidden=64, ffn=128, layers=1)
    ports = {}
    for runtime in ("ideal", "oneflow-0.9"):
        tables = build_cost_tables(g, MESH, 0, workers=1, runtime=runtime)
        ports[runtime] = {(e.consumer, e.in_port) for e in tables.edges}
    assert ("seed", "like_0") in ports["oneflow-0.9"]
    assert ("seed", "like_0") not in ports["ideal"]
    assert ports["oneflow-0.9"] - ports["ideal"] == {("seed", "like_0")}
