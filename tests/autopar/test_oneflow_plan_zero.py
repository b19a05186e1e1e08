"""import_plan's ZeRO layouts (:func:`autopar.bridges.oneflow.plans.zero_update_layouts`), without OneFlow.

OneFlow 0.9's ZeRO (``optimizer_placement_optimization_pass.cpp``) shards a variable
only when every shard keeps ``shard_min_size`` (default 1024) elements, and then
restores its layout for the forward pass with a ``System-ZeRO-ParallelCast``.  A
variable it leaves alone is stored, and updated, in its own declared layout.
"""

from autopar.baselines.plans import baseline_plan
from autopar.bridges.oneflow.plans import zero_update_layouts
from autopar.cost.evaluate import evaluate
from autopar.hardware.cluster import Cluster
from autopar.hardware.mesh import Mesh
from autopar.ir.graph import Graph
from autopar.ir.plan import Plan
from autopar.ir.sbp import NdSbp, Signature, parse_nd_sbp
from autopar.rules.families.optimizer import oneflow_zero_shard
from tests.graphs import mlp_graph

MESH = Mesh(Cluster.parse("1x4"), (2, 2))
BB, BS0 = parse_nd_sbp("(B, B)"), parse_nd_sbp("(B, S(0))")


def _megatron_ports(g: Graph) -> dict[str, dict[str, NdSbp]]:
    """Each op's ports in Megatron's plan of ``g`` on :data:`MESH`, by port name."""
    plan = baseline_plan("megatron", g, MESH, 2)
    chosen: dict[str, dict[str, NdSbp]] = {}
    for op in g.ops:
        sig = plan.signatures[op.name]
        chosen[op.name] = {**dict(zip(op.inputs, sig.inputs)), **dict(zip(op.outputs, sig.outputs))}
    return chosen


def _chosen() -> tuple:
    """A tiny MLP (every weight under 1024 elements: OneFlow's ZeRO shards none) as a OneFlow
    job holds it: Megatron's signatures, ``l0.w1`` stored ``(B, B)`` and read ``(B, S(0))``
    by its forward cast (a local slice), its update reading ``(B, B)``."""
    g = mlp_graph(batch=8, hidden=16, ffn=32, layers=1)
    chosen = _megatron_ports(g)
    chosen["l0.w1"]["out"] = BB
    chosen["l0.w1_cast"]["in_0"] = BS0
    chosen["l0.w1_adam"].update(model_0=BB, model_diff_0=BB)
    return g, chosen


def test_unsharded_variable_keeps_its_stored_layout():
    g, chosen = _chosen()
    normalized = zero_update_layouts(g, chosen, MESH, 2, "oneflow-0.9", pinned={})
    assert chosen["l0.w1"]["out"] == BB  # not its forward consumer's (B, S(0))
    assert chosen["l0.w1_adam"]["model_0"] == BB
    assert chosen["l0.w1_adam"]["model_diff_0"] == BB
    assert "l0.w1_adam" not in normalized


def test_unsharded_variable_update_is_one_the_rules_offer_and_pays_the_gather():
    """The plan evaluates without errors, and the gradient's boxing into the update ends in
    ``(B, B)`` (the axis-1 gather OneFlow runs), not in the forward read ``(B, S(0))``."""
    g, chosen = _chosen()
    zero_update_layouts(g, chosen, MESH, 2, "oneflow-0.9", pinned={})
    sigs = {
        op.name: Signature(
            tuple(chosen[op.name][p] for p in op.inputs), tuple(chosen[op.name][p] for p in op.outputs)
        )
        for op in g.ops
    }
    plan = Plan.from_assignment(g, MESH, 2, sigs, source="test", runtime="oneflow-0.9")
    ev = evaluate(g, plan)
    assert ev.valid, ev.errors
    (grad,) = [e for e in ev.edges if e.consumer == "l0.w1_adam" and e.port == "model_diff_0"]
    assert grad.dst == BB
    assert grad.bytes_per_device > 0


def test_sharded_variable_takes_the_layout_its_zero_cast_restores():
    g, chosen = _chosen()
    chosen["l0.w2"]["out"] = parse_nd_sbp("(S(1), S(1))")  # as a ZeRO-sharded variable is stored
    zero_update_layouts(g, chosen, MESH, 2, "oneflow-0.9", pinned={"l0.w2": "(B, S(1))"})
    assert str(chosen["l0.w2"]["out"]) == "(B, S(1))"
    assert str(chosen["l0.w2_adam"]["model_0"]) == "(B, S(1))"


def _sharded_without_cast(read: NdSbp) -> tuple:
    """An MLP whose ``l0.w1`` (``[256, 64]``: 8192 elements per ``(B, S(0))`` shard) OneFlow's
    ZeRO stored ``(B, S(0))`` (:func:`oneflow_zero_shard` of ``(B, B)``) with no
    ``System-ZeRO-ParallelCast`` (OneFlow drops the cast when its one consumer reads it in
    the cast's layout, ``tests/oneflow/_probe_zero_shard.py``), its forward reader reading
    ``read`` and its update ``(B, S(0))``, model and gradient alike."""
    g = mlp_graph(batch=8, hidden=64, ffn=256, layers=1)
    chosen = _megatron_ports(g)
    assert oneflow_zero_shard((256, 64), BB, MESH.shape) == BS0
    chosen["l0.w1"]["out"] = BS0
    chosen["l0.w1_cast"].update(in_0=read, out_0=read)
    chosen["l0.w1_adam"].update(model_0=BS0, model_diff_0=BS0)
    return g, chosen


def test_sharded_variable_without_cast_takes_its_readers_layout():
    """ViT's ``patch_embed.weight`` case: replicated, sharded ``(B, S(0))`` by ZeRO, its one
    reader (a conv whose input needs no gradient) reading ``(B, B)``, no cast.  The plan
    models it as a ``(B, B)`` variable whose update's gradient is the ``(B, S(0))`` shard,
    and evaluates without errors (taken as a ``(B, S(0))`` variable the rules shard it
    ``(S(0), S(0))`` and reject OneFlow's ``(B, S(0))`` update)."""
    g, chosen = _sharded_without_cast(BB)
    zero_update_layouts(g, chosen, MESH, 2, "oneflow-0.9", pinned={})
    assert chosen["l0.w1"]["out"] == BB
    assert chosen["l0.w1_adam"]["model_0"] == BB
    assert chosen["l0.w1_adam"]["model_diff_0"] == BS0
    sigs = {
        op.name: Signature(
            tuple(chosen[op.name][p] for p in op.inputs), tuple(chosen[op.name][p] for p in op.outputs)
        )
        for op in g.ops
    }
    ev = evaluate(g, Plan.from_assignment(g, MESH, 2, sigs, source="test", runtime="oneflow-0.9"))
    assert ev.valid, ev.errors


def test_sharded_variable_without_cast_keeps_a_read_that_zero_does_not_lead_to():
    """A reader whose layout ZeRO would not shard into the stored one is no evidence of a
    dropped cast: the variable keeps its stored layout (the evaluator reports the mismatch)."""
    g, chosen = _sharded_without_cast(BS0)
    zero_update_layouts(g, chosen, MESH, 2, "oneflow-0.9", pinned={})
    assert chosen["l0.w1"]["out"] == BS0
