"""Structure of every model graph: validity, variables, backward wiring, AMP, op-count relations."""

from __future__ import annotations

import functools
from collections import Counter

import pytest

from autopar.ir.graph import Graph, Role
from autopar.models import MODEL_NAMES, build

MATMUL_TYPES = {"matmul", "batch_matmul", "broadcast_matmul", "broadcast_matmul_grad_b"}


@functools.cache
def graph_of(name: str) -> Graph:
    return build(name)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_builds_and_validates(name: str) -> None:
    g = graph_of(name)
    assert g.validate() is g
    roles = Counter(op.role for op in g.ops)
    assert set(roles) == set(Role)
    assert g.meta["model"] == name
    # every tensor has exactly one producer and is declared
    assert set(g.producer) == set(g.tensors)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_variable_has_a_backward_grad_consumed_by_its_adam_update(name: str) -> None:
    g = graph_of(name)
    variable_ops = [op for op in g.ops if op.type == "variable"]
    assert len(variable_ops) == len(g.variables) > 0
    assert {v.op for v in g.variables} == {op.name for op in variable_ops}
    for v in g.variables:
        param = g.tensors[v.tensor]
        assert param.dtype == "float32"
        assert v.grad is not None and v.optimizer is not None
        grad = g.tensors[v.grad]
        assert grad.shape == param.shape and grad.dtype == "float32"
        producer = g.op_by_name[g.producer[v.grad][0]]
        assert producer.role is Role.BACKWARD, f"{v.grad} produced by {producer.role}"
        opt = g.op_by_name[v.optimizer]
        assert opt.type == "adam_update" and opt.role is Role.OPTIMIZER
        assert opt.inputs == {"model_0": v.tensor, "model_diff_0": v.grad}
        assert opt.outputs == {}
        assert (v.optimizer, "model_diff_0") in g.consumers[v.grad]


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_backward_ops_read_existing_tensors_and_chain_from_the_seed(name: str) -> None:
    g = graph_of(name)
    roles = {op.name: op.role for op in g.ops}
    seeds = [op for op in g.ops if op.type == "ones_like"]
    assert len(seeds) == 1 and seeds[0].role is Role.BACKWARD
    assert seeds[0].inputs["like_0"] == g.meta["loss"]
    assert g.tensors[g.meta["loss"]].shape == ()
    for op in g.ops:
        if op.role is not Role.BACKWARD:
            continue
        for port, t in op.inputs.items():
            assert t in g.tensors and t in g.producer, f"{op.name} port {port} reads missing {t}"
        if op is seeds[0]:
            continue
        # a backward op depends on at least one gradient (a backward-produced tensor)
        assert any(roles[g.producer[t][0]] is Role.BACKWARD for t in op.inputs.values()), op.name


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_forward_ops_never_read_backward_tensors(name: str) -> None:
    g = graph_of(name)
    roles = {op.name: op.role for op in g.ops}
    for op in g.ops:
        if op.role is Role.FORWARD:
            assert all(roles[g.producer[t][0]] is Role.FORWARD for t in op.inputs.values()), op.name


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_amp_one_cast_per_parameter(name: str) -> None:
    """OneFlow AMP casts each blob once (``InsertCastOpImpl`` groups the edges by blob):
    one ``cast`` per parameter, which every forward use reads."""
    g = graph_of(name)
    for v in g.variables:
        consumers = [g.op_by_name[c] for c, _ in g.consumers[v.tensor]]
        casts = [c for c in consumers if c.type == "cast"]
        others = [c for c in consumers if c.type != "cast"]
        assert [c.name for c in others] == [v.optimizer]
        assert len(casts) == 1, f"{v.op} is cast {len(casts)} times"
        (cast,) = casts
        assert cast.role is Role.FORWARD and cast.attrs["dtype"] == "float16"
        (out,) = cast.outputs.values()
        assert any(g.op_by_name[c].role is Role.FORWARD for c, _ in g.consumers[out]), cast.name


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_dtypes_follow_oneflow_amp(name: str) -> None:
    g = graph_of(name)
    for op in g.ops:
        ins = [g.tensors[t] for t in op.inputs.values()]
        outs = [g.tensors[t] for t in op.outputs.values()]
        if op.type in MATMUL_TYPES or op.type in {"add_n", "broadcast_add", "broadcast_mul"}:
            assert len({t.dtype for t in ins + outs}) == 1, f"{op.name}: mixed dtypes"
        if op.type in MATMUL_TYPES:
            assert outs[0].dtype == "float16", op.name
        if op.type == "cast":
            assert outs[0].dtype == op.attrs["dtype"] != ins[0].dtype
        if op.type == "dropout":
            assert g.tensors[op.outputs["mask_0"]].dtype == "bool"
        if op.type in {"gather", "unsorted_segment_sum_like"}:
            ids = op.inputs.get("indices_0") or op.inputs["segment_ids_0"]
            assert g.tensors[ids].dtype == "int64"


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_each_forward_op_has_its_oneflow_grad_ops(name: str) -> None:
    g = graph_of(name)
    n = Counter(op.type for op in g.ops)
    pairs = [
        ("softmax", "softmax_grad"),
        ("dropout", "dropout_grad"),
        ("gelu", "gelu_grad"),
        ("fast_gelu", "fast_gelu_grad"),
        ("rms_norm", "rms_norm_grad"),
        ("rms_norm", "rms_norm_param_grad"),
        ("layer_norm", "layer_norm_grad"),
        ("layer_norm", "layer_norm_param_grad"),
        ("gather", "unsorted_segment_sum_like"),
        ("sparse_softmax_cross_entropy", "sparse_softmax_cross_entropy_grad"),
        ("reduce_sum", "broadcast_like"),
    ]
    for fwd, bwd in pairs:
        assert n[fwd] == n[bwd], f"{fwd}: {n[fwd]}, {bwd}: {n[bwd]}"
    # every weight matmul (b is a cast parameter) has a weight-gradient op
    weight_matmuls = [
        op
        for op in g.ops
        if op.type == "broadcast_matmul"
        and op.role is Role.FORWARD
        and g.op_by_name[g.producer[op.inputs["b_0"]][0]].type == "cast"
    ]
    assert n["broadcast_matmul_grad_b"] == len(weight_matmuls)
    # forward batch_matmuls (scores, context) get two grad batch_matmuls each
    fwd_bmm = sum(1 for op in g.ops if op.type == "batch_matmul" and op.role is Role.FORWARD)
    assert n["batch_matmul"] == 3 * fwd_bmm
    # weight decay: weights and embeddings decayed, biases and norms not
    for v in g.variables:
        assert v.optimizer is not None
        wd = g.op_by_name[v.optimizer].attrs["weight_decay"]
        no_decay = v.op.endswith(".bias") or "norm" in v.op
        assert wd == (0.0 if no_decay else 0.01), v.op


def test_mt5_structure() -> None:
    g = graph_of("mt5-base")
    n = Counter(op.type for op in g.ops)
    layers = 12 + 12
    attentions = 12 + 2 * 12
    assert n["rms_norm"] == 12 * 2 + 12 * 3 + 2  # + final norms
    assert n["softmax"] == attentions
    assert n["fast_gelu"] == layers and n["gelu"] == 0
    assert n["layer_norm"] == 0
    # no biases in MT5: broadcast_adds are the 2 position biases and the cross-attention masks
    assert n["broadcast_add"] == 2 + 12
    # one relative-bias gather per stack + the shared embedding for encoder and decoder inputs
    assert n["gather"] == 4
    # softmax in float32: cast in and out around every attention softmax
    for op in g.ops:
        if op.type == "softmax":
            assert g.tensors[op.inputs["in_0"]].dtype == "float32"
    names = {v.op for v in g.variables}
    assert "lm_head.weight" in names and "shared.weight" in names  # untied
    assert "encoder.layers.0.self_attn.relative_attention_bias.weight" in names
    assert "decoder.layers.0.self_attn.relative_attention_bias.weight" in names
    assert not any("relative_attention_bias" in v for v in names if ".layers.1." in v)
    # the encoder output feeds the k and v projections of every decoder layer
    final = next(op for op in g.ops if op.name == "encoder.final_dropout")
    out = final.outputs["out_0"]
    readers = {c for c, _ in g.consumers[out] if g.op_by_name[c].role is Role.FORWARD}
    assert len(readers) == 2 * 12


def test_tied_embeddings_sum_both_gradients() -> None:
    """A table read several times (T5: 2 gathers + LM head; GPT: gather + LM head) has one
    compute-dtype copy; the uses' gradients meet in one ``add_n`` in the compute dtype,
    before the one cast back to ``float32``."""
    param = "embedding.word_embeddings.weight"
    for name in ("tiny-t5", "tiny-gpt"):
        g = graph_of(name)
        v = next(v for v in g.variables if v.op == param)
        (cast,) = [c for c, _ in g.consumers[v.tensor] if g.op_by_name[c].type == "cast"]
        (copy,) = g.op_by_name[cast].outputs.values()
        uses = 3 if name == "tiny-t5" else 2
        forward = [c for c, _ in g.consumers[copy] if g.op_by_name[c].role is Role.FORWARD]
        assert len(forward) == uses, forward
        clip = g.op_by_name[g.producer[v.grad][0]] if v.grad else None
        assert clip is not None and clip.type == "scalar_mul_by_tensor"
        back = g.op_by_name[g.producer[clip.inputs["x_0"]][0]]
        assert back.type == "cast" and g.tensors[next(iter(back.outputs.values()))].dtype == "float32"
        summed = g.op_by_name[g.producer[next(iter(back.inputs.values()))][0]]
        assert summed.type == "add_n" and len(summed.inputs) == uses
        assert {g.tensors[t].dtype for t in summed.inputs.values()} == {"float16"}


def test_mt5_fused_cross_kv_structure() -> None:
    """``fused_cross_kv``: each decoder layer's cross-attention reads the encoder output with
    one ``key_value`` linear ``[2 * inner, hidden]``, laid out head-first ``[B, Se, heads,
    2 * d_kv]``, transposed, and cut into key and value (``narrow``, ``narrow_grad`` back);
    the rest of the graph is the separate-k/v graph's."""
    layers = 12
    separate = graph_of("mt5-base")
    fused = build("mt5-base", fused_cross_kv=True)
    assert fused.validate() is fused
    cfg = fused.meta["config"]
    heads, d_kv, hidden = cfg["heads"], cfg["d_kv"], cfg["hidden"]
    batch, enc_seq = cfg["batch"], cfg["encoder_seq"]
    n_sep = Counter(op.type for op in separate.ops)
    n = Counter(op.type for op in fused.ops)
    assert n_sep["narrow"] == n_sep["narrow_grad"] == 0
    assert n["narrow"] == n["narrow_grad"] == 2 * layers
    # per decoder layer: one projection (matmul, its input- and weight-gradient matmuls and
    # its AMP cast) fewer; the cut adds the narrows, and the grads meet in one add_n
    assert n["broadcast_matmul"] == n_sep["broadcast_matmul"] - 2 * layers
    assert n["broadcast_matmul_grad_b"] == n_sep["broadcast_matmul_grad_b"] - layers
    assert len(fused.variables) == len(separate.variables) - layers
    names = {v.op for v in fused.variables}
    for i in range(layers):
        cross = f"decoder.layers.{i}.cross_attn"
        assert f"{cross}.k.weight" not in names and f"{cross}.v.weight" not in names
        kv = fused.tensors[next(v.tensor for v in fused.variables if v.op == f"{cross}.key_value.weight")]
        assert kv.shape == (2 * heads * d_kv, hidden)
        assert fused.tensors[f"{cross}.key_value.reshape/out_0"].shape == (batch, enc_seq, heads, 2 * d_kv)
        for j, part in enumerate(("k", "v")):
            op = fused.op_by_name[f"{cross}.key_value.{part}"]
            assert op.attrs == {"dim": 3, "start": j * d_kv, "length": d_kv}
            assert fused.tensors[op.outputs["out_0"]].shape == (batch, heads, enc_seq, d_kv)
    # the encoder output feeds one key_value projection per decoder layer
    final = next(op for op in fused.ops if op.name == "encoder.final_dropout")
    readers = {
        c for c, _ in fused.consumers[final.outputs["out_0"]] if fused.op_by_name[c].role is Role.FORWARD
    }
    assert len(readers) == layers
    # the parameters are the same size, and the separate graph is the default
    assert fused.meta["parameters"] == separate.meta["parameters"]
    assert separate.meta["config"]["fused_cross_kv"] is False
    # outside the cross-attentions, the same ops but one node fewer in the gradient-norm sum
    # tree (it sums one gradient per parameter)
    outside = {op.name: op.type for op in separate.ops if ".cross_attn." not in op.name}
    fused_outside = {op.name: op.type for op in fused.ops if ".cross_attn." not in op.name}
    missing = set(outside) - set(fused_outside)
    assert set(fused_outside) < set(outside) and all(
        m.startswith("clip_grad.global_norm_add") for m in missing
    )
    assert all(outside[name] == kind for name, kind in fused_outside.items())
