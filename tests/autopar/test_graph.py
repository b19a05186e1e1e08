import json

import pytest

from autopar.errors import GraphError
from autopar.ir.graph import FORMAT, Graph, Op, Role, TensorSpec, Variable


def small() -> Graph:
    tensors = [
        TensorSpec("x", (8, 16), "float16"),
        TensorSpec("w", (16, 32), "float32"),
        TensorSpec("w16", (16, 32), "float16"),
        TensorSpec("y", (8, 32), "float16"),
        TensorSpec("gw", (16, 32), "float32"),
    ]
    ops = [
        Op("x", "input", outputs={"out": "x"}),
        Op("w", "variable", outputs={"out": "w"}),
        Op("cast", "cast", {"in_0": "w"}, {"out_0": "w16"}, {"dtype": "float16"}),
        Op("mm", "matmul", {"a_0": "x", "b_0": "w16"}, {"out_0": "y"}, {"transpose_a": False}),
        Op(
            "mm_grad",
            "matmul",
            {"a_0": "x", "b_0": "y"},
            {"out_0": "gw"},
            {"transpose_a": True},
            role=Role.BACKWARD,
        ),
        Op("adam", "adam_update", {"model_0": "w", "model_diff_0": "gw"}, {}, role=Role.OPTIMIZER),
    ]
    return Graph("small", tensors, ops, [Variable("w", "w", "gw", "adam")])


def test_validate_and_topological_order():
    g = small().validate()
    names = [op.name for op in g.topological_order]
    assert names.index("mm") < names.index("mm_grad") < names.index("adam")
    assert g.producer["y"] == ("mm", "out_0")
    assert ("mm_grad", "b_0") in g.consumers["y"]


def test_round_trip_is_lossless():
    g = small()
    text = g.to_json()
    g2 = Graph.from_json(text)
    assert g2.to_dict() == g.to_dict()
    assert json.loads(text)["format"] == FORMAT
    assert g2.ops[3].inputs == {"a_0": "x", "b_0": "w16"}  # port names and order kept


def test_content_hash_ignores_op_order_and_whitespace():
    g = small()
    d = g.to_dict()
    d["ops"] = list(reversed(d["ops"]))
    g2 = Graph.from_json(json.dumps(d, indent=4))
    assert g2.content_hash() == g.content_hash()
    d["ops"][0]["attrs"] = {"changed": 1}
    assert Graph.from_dict(d).content_hash() != g.content_hash()


def test_cycle_names_an_op():
    g = small()
    g.ops[0] = Op("x", "relu", {"x_0": "y"}, {"out": "x"})
    with pytest.raises(GraphError, match="cycle") as e:
        g.validate()
    assert e.value.code == "cycle" and e.value.details["op"] in {"x", "mm", "mm_grad", "adam"}


def test_dangling_tensor_names_the_op():
    d = small().to_dict()
    d["ops"][3]["inputs"]["a_0"] = "nope"
    with pytest.raises(GraphError, match=r"'mm' port 'a_0'.*'nope'") as e:
        Graph.from_dict(d).validate()
    assert e.value.code == "dangling_tensor" and e.value.details["op"] == "mm"


def test_unknown_dtype():
    d = small().to_dict()
    d["tensors"]["x"]["dtype"] = "float7"
    with pytest.raises(GraphError, match="unknown dtype 'float7'"):
        Graph.from_dict(d).validate()


def test_grad_shape_mismatch():
    d = small().to_dict()
    d["tensors"]["gw"]["shape"] = [32, 16]
    with pytest.raises(GraphError, match="gradient 'gw' has shape") as e:
        Graph.from_dict(d).validate()
    assert e.value.code == "shape_mismatch"


def test_two_producers():
    g = small()
    g.ops.append(Op("dup", "relu", {"x_0": "x"}, {"y_0": "y"}))
    with pytest.raises(GraphError, match="produced by both"):
        g.validate()


@pytest.mark.parametrize(
    "payload,code",
    [
        ("not json", "bad_json"),
        ("[]", "bad_format"),
        ('{"format": "autopar.graph/v0"}', "bad_format"),
        (
            '{"format": "autopar.graph/v1", "tensors": {"x": {"shape": "big", "dtype": "float16"}}, '
            '"ops": []}',
            "bad_shape",
        ),
        ('{"format": "autopar.graph/v1", "tensors": {}, "ops": [{"name": "a"}]}', "bad_format"),
        (
            '{"format": "autopar.graph/v1", "tensors": {}, '
            '"ops": [{"name": "a", "type": "relu", "role": "sideways"}]}',
            "bad_role",
        ),
    ],
)
def test_malformed_json_gets_a_code(payload, code):
    with pytest.raises(GraphError) as e:
        Graph.from_json(payload).validate()
    assert e.value.code == code
