"""The dtype of the ZeRO parameter gather (issue 33, item 4): the forward's copy.

Hand counts from the systems' own rules, not from autopar's output:

* OneFlow 0.9 puts ``System-ZeRO-ParallelCast`` after the last node of the sequence
  "variable -> sole reader with one input and one output" (AMP's fp32 -> fp16 ``cast``), so
  the gather moves 2 bytes per element; a variable read by two ops is gathered as it is
  (``optimizer_placement_optimization_pass.cpp`` L92-129, L161-198; compiled on CPU ranks in
  ``tests/oneflow/test_amp_gather.py``);
* Megatron-LM's distributed optimizer all-gathers the bf16 / fp16 model parameters.

ZeRO-2 over ``N`` devices all-gathers each parameter once per step: ``(N-1)/N x Psi x 2``
bytes per device in half precision (ZeRO paper section 7, in elements ``Psi``).
"""

from __future__ import annotations

import math

import pytest

from autopar.baselines.plans import baseline_plan
from autopar.cost.compute import rule_context
from autopar.cost.evaluate import evaluate
from autopar.cost.zero_gathers import zero_gather_dtype
from autopar.hardware.cluster import Cluster
from autopar.hardware.mesh import Mesh
from autopar.ir.graph import Graph, Op, Role, TensorSpec, Variable
from autopar.models import build

MESH_8 = Mesh(Cluster.parse("2x4"), (8,))


def _two_reader_graph(second_reader: str) -> Graph:
    """A fp32 variable read by a cast to fp16 (and, with ``second_reader`` 'mul', by a fp32
    ``scalar_mul`` too), its fp32 gradient, and its Adam update."""
    tensors = [
        TensorSpec("w", (64, 64), "float32"),
        TensorSpec("w16", (64, 64), "float16"),
        TensorSpec("w2", (64, 64), "float32"),
        TensorSpec("dw", (64, 64), "float32"),
    ]
    ops = [
        Op("w", "variable", {}, {"out": "w"}, {}, Role.FORWARD),
        Op("w.cast", "cast", {"in_0": "w"}, {"out_0": "w16"}, {"dtype": "float16"}, Role.FORWARD),
        Op("grad", "ones_like", {"like_0": "w16"}, {"out_0": "dw"}, {}, Role.BACKWARD),
        Op("w.adam", "adam_update", {"model_0": "w", "model_diff_0": "dw"}, {}, {}, Role.OPTIMIZER),
    ]
    if second_reader == "mul":
        ops.insert(2, Op("w.mul", "scalar_mul", {"in_0": "w"}, {"out_0": "w2"}, {"float_operand": 2.0}))
    return Graph("two-readers", tensors, ops, [Variable("w", "w", "dw", "w.adam")])


def test_a_parameter_read_through_one_cast_is_gathered_in_the_cast_dtype() -> None:
    g = _two_reader_graph("none")
    assert zero_gather_dtype(g, g.op_by_name["w.adam"]) == "float16"
    assert zero_gather_dtype(g, g.op_by_name["w.cast"]) is None  # not an optimizer op


def test_a_parameter_read_by_two_ops_is_gathered_in_its_own_dtype() -> None:
    # OneFlow's sequence stops at a node with two out edges (``cur_node->out_edges().size() == 1``)
    g = _two_reader_graph("mul")
    assert zero_gather_dtype(g, g.op_by_name["w.adam"]) == "float32"


@pytest.mark.parametrize("runtime", ["ideal", "megatron-lm", "oneflow-0.9-shard-min-1"])
def test_zero2_gather_bytes_are_half_precision_parameters(runtime: str) -> None:
    """Data-parallel ZeRO-2 over [8] on tiny-gpt in bf16: every parameter is sharded and
    all-gathered once per step, ``7/8 x Psi x 2`` bytes per device in all."""
    g = build("tiny-gpt", dtype="bfloat16")
    psi = sum(math.prod(g.tensors[v.tensor].shape) for v in g.variables)
    ev = evaluate(g, baseline_plan("data-parallel", g, MESH_8, 2, runtime=runtime))
    gathers = [e for e in ev.edges if e.zero_gather]
    assert {e.dtype for e in gathers} == {"bfloat16"}
    moved = sum(s.bytes_per_device for e in gathers for s in e.steps)
    assert moved == pytest.approx(7 / 8 * psi * 2, rel=1e-9)


def test_the_rule_context_carries_the_gather_dtype_into_the_cost_tables() -> None:
    g = build("tiny-gpt", dtype="bfloat16")
    op = next(o for o in g.ops if o.type == "adam_update")
    assert rule_context(g, op, (8,), 2).gather_dtype == "bfloat16"
    assert rule_context(g, g.ops[0], (8,), 2).gather_dtype is None
