"""Graph loading refuses what a solve cannot use, and the content hash is canonical over numbers.

Issue 24, items 8 and 9: duplicate variables, an out-of-range dim attr, zero-size or rank-0
tensors where an op's rule cannot take them are refused by :meth:`Graph.validate` (so the
command line, the API and the workers refuse them alike); ``1.0`` and ``1`` (how JavaScript
re-encodes a graph) give one content hash, hence one plan key.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

import autopar.rules  # noqa: F401  (every planning path loads the rules, which registers their check)
from autopar.cli.main import main
from autopar.errors import GraphError
from autopar.ir.content_key import canonical_numbers
from autopar.ir.graph import Graph
from autopar.models import build


@pytest.fixture(scope="module")
def tiny() -> dict[str, Any]:
    return build("tiny-gpt").to_dict()


def _copy(data: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(data))


def _first(data: dict[str, Any], op_type: str) -> dict[str, Any]:
    return next(op for op in data["ops"] if op["type"] == op_type)


def _refused(data: dict[str, Any]) -> GraphError:
    with pytest.raises(GraphError) as err:
        Graph.from_json(json.dumps(data)).validate()
    return err.value


# ------------------------------------------------------------------ item 8: invalid graphs


def test_a_variable_listed_twice_is_refused(tiny: dict[str, Any]) -> None:
    data = _copy(tiny)
    data["variables"].append(dict(data["variables"][3]))
    err = _refused(data)
    assert err.code == "duplicate_variable" and "variables[36]" in err.message
    assert err.details["op"] == data["variables"][3]["op"]


def test_two_variable_entries_for_one_tensor_are_refused(tiny: dict[str, Any]) -> None:
    data = _copy(tiny)
    twin = dict(data["variables"][0])
    twin["op"] = data["variables"][1]["op"]  # another op, the same parameter tensor
    data["variables"].append(twin)
    assert _refused(data).code in ("duplicate_variable", "bad_variable")
    data["variables"][-1] = dict(data["variables"][0], grad=None, optimizer=None)
    assert _refused(data).code == "duplicate_variable"


@pytest.mark.parametrize("axis", [1e308, 3, -4, 0.5, "0", True, [0, 7]])
def test_a_dim_attr_outside_the_ops_tensors_is_refused(tiny: dict[str, Any], axis: Any) -> None:
    data = _copy(tiny)
    _first(data, "gather")["attrs"]["axis"] = axis
    err = _refused(data)
    assert err.code == "bad_attr" and "'axis'" in err.message and "from -3 to 2" in err.message


@pytest.mark.parametrize("axis", [0, 0.0, -1, 2.0])
def test_an_integer_valued_dim_attr_is_accepted(tiny: dict[str, Any], axis: Any) -> None:
    data = _copy(tiny)
    _first(data, "gather")["attrs"]["axis"] = axis
    graph = Graph.from_json(json.dumps(data)).validate()
    gather = next(op for op in graph.ops if op.type == "gather")
    assert gather.attrs["axis"] == axis  # kept as given: 2.0 == 2


def test_a_rank_0_tensor_where_a_matmul_needs_dims_is_refused(tiny: dict[str, Any]) -> None:
    data = _copy(tiny)
    a = _first(data, "broadcast_matmul")["inputs"]["a_0"]
    data["tensors"][a]["shape"] = []
    err = _refused(data)
    assert err.code == "op_unsupported" and "broadcast_matmul" in err.message


def test_a_zero_size_matmul_input_or_parameter_is_refused(tiny: dict[str, Any]) -> None:
    data = _copy(tiny)
    a = _first(data, "broadcast_matmul")["inputs"]["a_0"]
    data["tensors"][a]["shape"] = [0, 0, 0]
    err = _refused(data)
    assert err.code == "bad_shape" and err.details["tensor"] == a
    data = _copy(tiny)
    v = data["variables"][0]
    data["tensors"][v["tensor"]]["shape"][0] = 0
    data["tensors"][v["grad"]]["shape"][0] = 0
    err = _refused(data)
    assert err.code == "bad_shape" and "parameter" in err.message


def test_the_command_line_refuses_it_in_one_line(
    tiny: dict[str, Any], tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _copy(tiny)
    data["tensors"][_first(data, "broadcast_matmul")["inputs"]["a_0"]]["shape"] = []
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(data))
    argv = ["plan", str(path), "--cluster", "1x4", "--mesh-shape", "2,2", "--out", str(tmp_path / "p.json")]
    assert main(argv) == 2  # was a traceback from a cost-table worker process
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("autopar: error: [op_unsupported] op "), err


def test_every_bundled_model_still_validates() -> None:
    for name in ("tiny-gpt", "tiny-t5", "tiny-bert", "tiny-mt5"):
        built = build(name)
        again = Graph.from_json(built.to_json()).validate()
        assert again.to_json() == built.to_json()  # the round trip keeps every op and tensor
        assert len(again.ops) == len(built.ops) > 0


# ------------------------------------------------------------------ item 9: canonical numbers


def _as_javascript(text: str) -> str:
    """What ``JSON.stringify(JSON.parse(text))`` writes: an integer-valued float loses its ``.0``."""
    return re.sub(r"(?<=[:\[,])(-?\d+)\.0(?=[,\]}])", r"\1", text)


def test_integer_valued_floats_hash_as_ints(tiny: dict[str, Any]) -> None:
    text = json.dumps(tiny, separators=(",", ":"))
    js = _as_javascript(text)
    assert ":1.0," in text and ":1.0," not in js  # tiny-gpt has alpha 1.0, adam's l1 0.0 ...
    assert Graph.from_json(js).content_hash() == Graph.from_json(text).content_hash()


def test_number_spellings_hash_alike(tiny: dict[str, Any]) -> None:
    base = _copy(tiny)
    _first(base, "gather")["attrs"]["axis"] = 0
    _first(base, "adam_update")["attrs"]["epsilon"] = 0.01
    text = json.dumps(base)
    other = text.replace('"axis": 0}', '"axis": 0.0}', 1).replace('"epsilon": 0.01', '"epsilon": 1e-2', 1)
    assert other != text
    assert Graph.from_json(other).content_hash() == Graph.from_json(text).content_hash()
    changed = text.replace('"epsilon": 0.01', '"epsilon": 0.02', 1)
    assert Graph.from_json(changed).content_hash() != Graph.from_json(text).content_hash()


def test_canonical_numbers_keeps_booleans_and_non_integers() -> None:
    value = {"a": [1.0, -0.0, 2.5, True, None, float("inf")], "b": {"c": 3.0}}
    assert canonical_numbers(value) == {"a": [1, 0, 2.5, True, None, float("inf")], "b": {"c": 3}}
    out = canonical_numbers(value)
    assert type(out["a"][0]) is int and type(out["a"][3]) is bool and type(out["b"]["c"]) is int


def test_the_hash_ignores_name_and_meta_but_not_values(tiny: dict[str, Any]) -> None:
    h = Graph.from_dict(tiny).content_hash()
    renamed = dict(tiny, name="another", meta={"note": "x"})
    assert Graph.from_dict(renamed).content_hash() == h
    data = _copy(tiny)
    _first(data, "broadcast_matmul")["attrs"]["alpha"] = 0.5
    assert Graph.from_dict(data).content_hash() != h


# ------------------------------------------------------------------ issue 34: shapes and numbers


def _op_with(data: dict[str, Any], op_type: str, **ports: list[int]) -> dict[str, Any]:
    """The first ``op_type`` op; its ports' tensors reshaped as given (``a_0=[8, 32, 63]``)."""
    op = _first(data, op_type)
    for port, shape in ports.items():
        tensor = {**op["inputs"], **op["outputs"]}[port]
        data["tensors"][tensor]["shape"] = shape
    return op


@pytest.mark.parametrize(
    ("op_type", "ports", "words"),
    [
        ("broadcast_matmul", {"a_0": [8, 32, 63]}, "contracts a's dim of 63 with b's of 64"),
        ("broadcast_matmul", {"out_0": [8, 32, 65]}, "expected [8, 32, 64]"),
        ("batch_matmul", {"out_0": [8, 4, 32, 31]}, "gives [8, 4, 32, 31]"),
        ("broadcast_matmul_grad_b", {"out_0": [64, 63]}, "the output [a.last, b.last]"),
        ("reshape", {"out_0": [8, 32, 4, 17]}, "(17408 elements)"),
        ("broadcast_add", {"z_0": [8, 32, 63]}, "which broadcast to [8, 32, 64]"),
        ("gelu", {"out_0": [8, 32, 255]}, "where one shape belongs"),
    ],
)
def test_shapes_that_disagree_are_refused(
    tiny: dict[str, Any], op_type: str, ports: dict[str, list[int]], words: str
) -> None:
    data = _copy(tiny)
    op = _op_with(data, op_type, **ports)
    err = _refused(data)
    assert err.code == "shape_mismatch", err
    assert err.details["op"] == op["name"] and words in str(err), str(err)


def test_every_bundled_model_passes_the_shape_checks() -> None:
    from autopar.models import MODEL_NAMES
    from autopar.rules.check import check_graph_rules

    for name in MODEL_NAMES:
        graph = build(name)
        assert check_graph_rules(graph) is graph  # no shape_mismatch on any op
        assert graph.rules_checked


def test_the_shape_checks_cover_the_families_of_the_issue() -> None:
    from autopar.rules.shapes import SHAPE_CHECKS, broadcast_shape

    for op_type in ("matmul", "batch_matmul", "broadcast_matmul", "reshape", "broadcast_add", "relu"):
        assert op_type in SHAPE_CHECKS
    assert broadcast_shape([8, 1, 64], [32, 1]) == (8, 32, 64)
    assert broadcast_shape([8, 32, 63], [64]) is None


@pytest.mark.parametrize("value", [float("nan"), float("-inf"), [1.0, float("inf")], {"a": float("nan")}])
def test_attrs_hold_finite_numbers_only(tiny: dict[str, Any], value: Any) -> None:
    data = _copy(tiny)
    op = data["ops"][5]
    op["attrs"]["alpha"] = value
    graph = Graph.from_dict(data)
    with pytest.raises(GraphError) as err:
        graph.validate()
    assert err.value.code == "non_finite_number" and err.value.details["op"] == op["name"]


@pytest.mark.parametrize(
    ("attr", "words"),
    [
        ([8, 32, 4, 8], "attr 'shape' [8, 32, 4, 8] disagrees with its output"),
        ([8, 32, 64], "attr 'shape' [8, 32, 64] disagrees with its output"),
        ("8x32", "not a list of integer dims"),
    ],
)
def test_a_shape_attr_its_output_lacks_is_refused(tiny: dict[str, Any], attr: Any, words: str) -> None:
    """Issue 43: a reshape whose ``attrs.shape`` is not its output tensor's shape was planned on the
    tensor's shape, silently; any op that states its output's shape (a reshape, a variable, an
    input) is held to it."""
    data = _copy(tiny)
    op = _first(data, "reshape")
    assert op["attrs"]["shape"] == data["tensors"][op["outputs"]["out_0"]]["shape"]
    op["attrs"]["shape"] = attr
    err = _refused(data)
    assert err.code == "shape_mismatch", err
    assert err.details["op"] == op["name"] and err.details["attr"] == "shape" and words in str(err), str(err)


def test_a_shape_attr_may_leave_a_dim_to_infer(tiny: dict[str, Any]) -> None:
    data = _copy(tiny)
    op = _first(data, "reshape")
    op["attrs"]["shape"] = [-1, *op["attrs"]["shape"][1:]]
    assert Graph.from_json(json.dumps(data)).validate().rules_checked
