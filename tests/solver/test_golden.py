"""Golden plans: on a tensor-parallel-only mesh the solver finds Megatron's column/row split."""

import pytest

from autopar.baselines.plans import baseline_plan
from autopar.cost.evaluate import evaluate
from autopar.hardware.cluster import Cluster
from autopar.hardware.mesh import Mesh
from autopar.models import build
from autopar.runtimes.megatron_lm.linears import megatron_parameter_layout
from autopar_solver.options import SolverOptions
from autopar_solver.planner import PlanRequest, plan
from tests.graphs import mlp_graph

TP2 = Cluster.parse("1x2", "a100-40g")
# Megatron's layout is optimal under ideal collectives; OneFlow 0.9's lowering prices
# some of its all-reduces as send/recv and may prefer another layout
OPTIONS = SolverOptions(time_limit_s=30, deterministic=True, runtime="ideal")


def _solve(graph):
    p = plan(PlanRequest(graph, TP2, (1, 2), None, 2, OPTIONS))
    ev = evaluate(graph, p)
    assert ev.valid
    assert p.solver["objective"] == pytest.approx(ev.per_edge_iteration_time_s, rel=1e-3)
    return p


def test_mlp_gets_column_then_row_split():
    g = mlp_graph(batch=2048, hidden=1024, ffn=4096, layers=2)
    p = _solve(g)
    for layer in range(2):
        assert p.variables[f"l{layer}.w1"]["sbp"] == "(B, S(0))"  # [ffn, hidden]: output dim
        assert p.variables[f"l{layer}.w2"]["sbp"] == "(B, S(1))"  # [hidden, ffn]: input dim
    assert p.signatures["l0.fc1"].outputs[0][1].__str__() == "S(1)"  # activations split on ffn
    assert str(p.signatures["l0.fc2"].outputs[0][1]) == "P"  # row-parallel gives partial sums


def test_tiny_gpt_matrices_follow_megatron():
    """Weights large next to the activations (tensor parallelism wins over data parallelism with
    bucketed gradients): the solver proves Megatron's column/row split optimal.  The attention
    output projection may equally be column-split (two all-gathers of b*s*h cost what Megatron's
    one all-reduce costs), so for it only the step time is compared."""
    g = build("tiny-gpt", hidden=512, batch=2, seq=32)
    p = _solve(g)
    mesh = Mesh(TP2, (1, 2))
    layout = megatron_parameter_layout(g, mesh)
    matrices = [v for v in g.variables if len(g.tensors[v.tensor].shape) == 2 and v.op.startswith("layers.")]
    assert len(matrices) >= 8
    for v in matrices:
        if ".self_attn.o." not in v.op:
            assert p.variables[v.op]["sbp"] == str(layout[v.op]), v.op
    megatron = evaluate(g, baseline_plan("megatron", g, mesh, 2, runtime=OPTIONS.runtime))
    assert p.step_time_s <= megatron.step_time_s * (1 + 1e-9)
    assert p.solver["status"] == "optimal"
