"""OneFlow's own N-D SBP choices read as autopar plans, and fidelity checks against them."""

from __future__ import annotations

import dataclasses
import math

import pytest

from autopar.bridges.oneflow import check_fidelity, import_job, import_plan, load_job
from autopar.bridges.oneflow.convert import nd_sbp_from_proto
from autopar.cost.compute import op_signatures, rule_context
from autopar.cost.evaluate import evaluate
from autopar.hardware.cluster import Cluster
from autopar.ir.plan import Plan
from autopar.ir.sbp import P, Signature, nd
from autopar.rules import default_rules

pytestmark = pytest.mark.oneflow


def test_plan_reads_oneflow_signatures_port_by_port(mesh_jobs):
    out, _ = mesh_jobs
    job = load_job(out / "gpt-tiny_zero0.pb")
    graph = import_job(job)
    plan = import_plan(job, graph=graph, cluster=Cluster.parse("1x4"))
    assert plan.mesh.shape == (2, 2) and plan.source == "oneflow-inference"
    conf = job.job_parallel_view_conf.op_name2nd_sbp_signature_conf
    assert set(plan.signatures) == {op.name for op in graph.ops}
    for op in graph.ops:
        for port in op.inputs:
            assert plan.input_sbp(op.name, port) == nd_sbp_from_proto(conf[op.name].bn_in_op2nd_sbp[port], 2)
        for port in op.outputs:
            assert plan.output_sbp(op.name, port) == nd_sbp_from_proto(conf[op.name].bn_in_op2nd_sbp[port], 2)
    # LiBai's layout as the builder set it: 2-D weights (B, S(0)), the rest B
    for name, info in plan.variables.items():
        rank = len(graph.tensors[info["tensor"]].shape)
        assert info["sbp"] == ("(B, S(0))" if rank == 2 else "(B, B)"), name
    # the plan survives its wire format
    again = Plan.from_json(plan.to_json())
    assert again.signatures == plan.signatures and again.ports == plan.ports


def test_zero_plan_uses_the_layout_the_forward_reads(mesh_jobs):
    out, _ = mesh_jobs
    job = load_job(out / "mt5-tiny_zero2.pb")
    graph = import_job(job)
    plan = import_plan(job, graph=graph, cluster=Cluster.parse("1x4"))
    assert plan.zero_stage == 2
    pinned = graph.meta["oneflow"]["zero_layouts"]
    rules = default_rules()
    for v in graph.variables:
        layout = plan.output_sbp(v.op, "out")
        if v.op in pinned:
            assert str(layout) == pinned[v.op]
        # OneFlow stores the variable split for ZeRO; the plan keeps the compute layout,
        # and its optimizer reads parameter and gradient as the oneflow-0.9 runtime's
        # ZeRO rule (one axis) offers
        update = graph.op_by_name[v.optimizer]
        assert plan.input_sbp(v.optimizer, "model_0") == layout
        ctx = rule_context(graph, update, plan.mesh.shape, 2, "one_axis")
        offered = op_signatures(rules, ctx)[0]
        ports = list(update.inputs)
        choice = plan.signatures[v.optimizer]
        assert any(s == choice for s in offered) or not any(
            s.inputs[ports.index("model_0")] == layout for s in offered
        ), v.op
    # OneFlow's own gradient layout is the one the rule offers: nothing was normalised
    assert not plan.diagnostics.get("zero_gradient_layout_normalized")


def test_evaluator_scores_oneflow_plans(mesh_jobs):
    out, _ = mesh_jobs
    graph = import_job(out / "bert-tiny_zero2.pb")
    plan = import_plan(out / "bert-tiny_zero2.pb", graph=graph, cluster=Cluster.parse("1x4"))
    ev = evaluate(graph, plan)
    assert math.isfinite(ev.step_time_s) and ev.step_time_s > 0
    assert ev.memory.total > 0
    assert set(ev.comm_bytes_per_axis) <= {0, 1}


def test_fidelity_of_a_job_against_its_own_plan_and_a_changed_one(mesh_jobs):
    out, _ = mesh_jobs
    job = load_job(out / "mt5-tiny_zero0.pb")
    plan = import_plan(job, cluster=Cluster.parse("1x4"))
    same = check_fidelity(job, plan)
    assert same.op_share == 1.0 and not same.mismatches and not same.missing

    # plan another output for one matmul: exactly that op disagrees, and the boxing the
    # changed plan schedules after it (P -> what its consumer reads) was not compiled
    name = next(n for n in plan.signatures if "-broadcast_matmul-" in n and ".wo-" in n)
    sig = plan.signatures[name]
    assert sig.outputs[0] != nd(P, P)
    other = dataclasses.replace(
        plan, signatures={**plan.signatures, name: Signature(sig.inputs, (nd(P, P),))}
    )
    report = check_fidelity(job, other)
    assert report.ops_total == same.ops_total
    assert report.ops_matched == same.ops_matched - 1
    assert [m["op"] for m in report.mismatches] == [name]
    assert (report.mismatches[0]["planned"], report.mismatches[0]["compiled"]) == (
        "(P, P)",
        str(sig.outputs[0]),
    )
    assert report.boxing_bytes_matched <= same.boxing_bytes_total
    assert report.boxing_bytes_total > report.boxing_bytes_matched  # the new P -> ... boxing is unmatched


def test_one_value_sbp_on_the_2d_mesh_is_normalised(mesh_jobs):
    out, _ = mesh_jobs
    job = load_job(out / "gpt-tiny_zero0.pb")
    conf = job.job_parallel_view_conf.op_name2nd_sbp_signature_conf
    one_value = [
        n for n, sig in conf.items() if any(len(v.sbp_parallel) == 1 for v in sig.bn_in_op2nd_sbp.values())
    ]
    assert one_value, "OneFlow wrote no 1-D SBP on the [2, 2] job (its system ops do)"
    plan = import_plan(job, cluster=Cluster.parse("1x4"))
    assert all(len(s) == 2 for sig in plan.signatures.values() for s in (*sig.inputs, *sig.outputs))
