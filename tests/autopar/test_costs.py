"""Cost tables: content keys shared across layers, memo reuse, relations, parallel == serial."""

import math

import numpy as np
import pytest

from autopar.cost.build_tables import build_cost_tables
from autopar.cost.compute import op_compute_time, rule_context
from autopar.cost.table_keys import op_key
from autopar.hardware.cluster import Cluster
from autopar.hardware.mesh import Mesh
from autopar.infra.store import MemoryStore
from autopar.ir.sbp import parse_signature
from autopar.rules import default_rules
from tests.graphs import mlp_graph

MESH = Mesh(Cluster.parse("2x4"), (4, 2))


def test_identical_layers_share_entries():
    g = mlp_graph(layers=3)
    tables = build_cost_tables(g, MESH, 2, workers=1)
    # layers 1 and 2 are identical: their ops share keys
    assert op_key(g, g.op_by_name["l1.fc1"], MESH, 2) == op_key(g, g.op_by_name["l2.fc1"], MESH, 2)
    assert tables.stats["unique_op_entries"] < len(g.ops) / 2
    assert tables.stats["unique_edge_entries"] < tables.stats["edges"] / 2


def test_second_graph_recomputes_only_new_keys():
    store = MemoryStore()
    g1 = mlp_graph(layers=2)
    t1 = build_cost_tables(g1, MESH, 2, store=store, workers=1)
    assert t1.stats["op_entries_computed"] == t1.stats["unique_op_entries"]
    again = build_cost_tables(g1, MESH, 2, store=store, workers=1)
    assert again.stats["op_entries_computed"] == 0 and again.stats["edge_entries_computed"] == 0
    # a graph differing in one layer's width: only that layer's keys are new
    g2 = mlp_graph(layers=3)
    t2 = build_cost_tables(g2, MESH, 2, store=store, workers=1)
    assert t2.stats["op_entries_computed"] == 0  # layer 3 is identical to the others
    g3 = mlp_graph(layers=2, ffn=2048)
    t3 = build_cost_tables(g3, MESH, 2, store=store, workers=1)
    assert 0 < t3.stats["op_entries_computed"] < t3.stats["unique_op_entries"] + 1
    for name, table in again.ops.items():
        np.testing.assert_array_equal(table.compute_s, t1.ops[name].compute_s)


def test_parallel_build_equals_serial():
    g = mlp_graph(layers=2)
    serial = build_cost_tables(g, MESH, 2, workers=1)
    seen = []
    parallel = build_cost_tables(g, MESH, 2, workers=2, parallel_threshold=1, progress=seen.append)
    assert [str(s) for s in serial.ops["l0.fc1"].signatures] == [
        str(s) for s in parallel.ops["l0.fc1"].signatures
    ]
    for a, b in zip(serial.edges, parallel.edges):
        np.testing.assert_array_equal(a.matrix, b.matrix)
    assert ("cost_tables:ops", 0, serial.stats["op_entries_computed"]) in [
        (p.phase, p.done, p.total) for p in seen
    ]
    assert seen[-1].phase == "cost_tables:edges" and seen[-1].done == seen[-1].total
    assert [p.percent for p in seen if p.phase == "cost_tables:edges"][-1] == 100.0


def test_edge_matrix_zero_on_matching_sbp():
    g = mlp_graph()
    tables = build_cost_tables(g, MESH, 2, workers=1)
    for e in tables.edges:
        for i, _ in enumerate(tables.ops[e.producer].signatures):
            src = tables.port_sbp(e.producer, i, e.out_port, output=True)
            for j in range(len(tables.ops[e.consumer].signatures)):
                dst = tables.port_sbp(e.consumer, j, e.in_port, output=False)
                if src == dst:
                    assert e.matrix[i, j] == 0
        break


def test_matmul_compute_divides_by_work_share():
    # rows of 8192 tokens: every shard below fills the device and is compute-bound, so the
    # time is the FLOPs over the device's large-GEMM throughput, divided by the work share
    g = mlp_graph(batch=8192)
    op = g.op_by_name["l0.fc1"]
    ctx = rule_context(g, op, MESH.shape, 2)
    rule = default_rules().get(op.type)
    full = op_compute_time(rule, ctx, parse_signature("((B, B), (B, B)) -> (B, B)"), MESH)
    dp = op_compute_time(rule, ctx, parse_signature("((S(0), B), (B, B)) -> (S(0), B)"), MESH)
    both = op_compute_time(rule, ctx, parse_signature("((S(0), B), (B, S(0))) -> (S(0), S(1))"), MESH)
    assert full == pytest.approx(4 * dp) and dp == pytest.approx(2 * both)
    flops = 2 * 8192 * 1024 * 4096
    dev = MESH.cluster.device
    assert full == pytest.approx(flops / (dev.peak_flops * dev.matmul_efficiency))


def test_thin_matmul_split_saves_less_than_its_work_share():
    # 16 tokens: the GEMM is thin (memory-bound: each device still reads the whole weight),
    # so splitting its rows 4 ways saves far less than 4x
    g = mlp_graph(batch=16)
    op = g.op_by_name["l0.fc1"]
    ctx = rule_context(g, op, MESH.shape, 2)
    rule = default_rules().get(op.type)
    full = op_compute_time(rule, ctx, parse_signature("((B, B), (B, B)) -> (B, B)"), MESH)
    dp = op_compute_time(rule, ctx, parse_signature("((S(0), B), (B, B)) -> (S(0), B)"), MESH)
    assert full / 4 < dp <= full


def test_uneven_matmul_is_timed_by_its_largest_shard():
    # 4098 rows over 4 devices: 1025, 1025, 1024, 1024 (OneFlow's BalancedSplitter); the device
    # with 1025 rows finishes last, so the time is that of 1025 rows (compute-bound shards)
    g = mlp_graph(batch=4098)
    op = g.op_by_name["l0.fc1"]
    ctx = rule_context(g, op, MESH.shape, 2)
    rule = default_rules().get(op.type)
    full = op_compute_time(rule, ctx, parse_signature("((B, B), (B, B)) -> (B, B)"), MESH)
    dp = op_compute_time(rule, ctx, parse_signature("((S(0), B), (B, B)) -> (S(0), B)"), MESH)
    assert dp == pytest.approx(full * 1025 / 4098)


def test_zero_stage_changes_only_optimizer_keys():
    g = mlp_graph()
    for op in g.ops:
        same = op_key(g, op, MESH, 0) == op_key(g, op, MESH, 2)
        assert same == (op.role.value != "optimizer")


def test_optimizer_zero_gather_costs_more_than_nothing():
    g = mlp_graph()
    t0 = build_cost_tables(g, MESH, 0, workers=1).ops["l0.w1_adam"]
    t2 = build_cost_tables(g, MESH, 2, workers=1).ops["l0.w1_adam"]
    assert len(t0.signatures) == len(t2.signatures)
    assert all(math.isfinite(x) for x in t2.compute_s)
