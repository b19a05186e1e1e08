"""OneFlow <-> autopar translations that need no OneFlow (they run in the main suite too)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from autopar.bridges.oneflow.convert import (
    dtype_name,
    nd_sbp_from_proto,
    nd_sbp_from_strings,
    normalize_nd_sbp,
    op_key_parts,
    op_keys,
    parallel_size,
    parse_nd_sbp_text,
    sbp_from_proto,
    sbp_strings,
)
from autopar.errors import GraphError, PlanError
from autopar.ir.sbp import B, P, S, nd, parse_nd_sbp

# ------------------------------------------------------------------ duck-typed protobuf stand-ins


@dataclass
class _Split:
    axis: int


@dataclass
class FakeSbpParallel:
    """What OneFlow's ``SbpParallel`` message offers the converter."""

    kind: str | None
    axis: int = 0

    @property
    def split_parallel(self) -> _Split:
        return _Split(self.axis)

    def WhichOneof(self, name: str) -> str | None:
        assert name == "parallel_type"
        return self.kind


@dataclass
class FakeNdSbp:
    sbp_parallel: list[FakeSbpParallel] = field(default_factory=list)


def split(axis: int) -> FakeSbpParallel:
    return FakeSbpParallel("split_parallel", axis)


BCAST = FakeSbpParallel("broadcast_parallel")
PSUM = FakeSbpParallel("partial_sum_parallel")


# ------------------------------------------------------------------ SBP


def test_sbp_values_from_proto():
    assert sbp_from_proto(split(2)) == S(2)
    assert sbp_from_proto(BCAST) == B
    assert sbp_from_proto(PSUM) == P
    with pytest.raises(PlanError):
        sbp_from_proto(FakeSbpParallel(None))


def test_nd_sbp_keeps_one_value_per_axis():
    got = nd_sbp_from_proto(FakeNdSbp([split(0), BCAST]), ndim=2)
    assert str(got) == "(S(0), B)"


@pytest.mark.parametrize(
    ("values", "expected"),
    [([BCAST], "(B, B)"), ([split(1)], "(S(1), S(1))"), ([PSUM], "(P, P)")],
)
def test_one_value_on_a_2d_mesh_stands_for_every_axis(values, expected):
    # OneFlow writes (B, B) as B (and a 1-D placement over all devices as one value)
    assert str(nd_sbp_from_proto(FakeNdSbp(values), ndim=2)) == expected


def test_wrong_number_of_axes_is_an_error():
    with pytest.raises(PlanError, match="has 2 axes but the mesh has 3"):
        normalize_nd_sbp([B, S(0)], 3)


def test_string_forms_round_trip():
    layout = nd_sbp_from_strings(["B", "S(0)"], 2)
    assert layout == nd(B, S(0))
    assert sbp_strings(layout) == ["B", "S(0)"]
    assert nd_sbp_from_strings([], 2) == nd(B, B)
    assert parse_nd_sbp_text("B", 2) == nd(B, B)
    assert parse_nd_sbp_text("(S(1), P)", 2) == parse_nd_sbp("(S(1), P)")


def test_dtypes():
    assert dtype_name("kFloat") == "float32"
    assert dtype_name("kFloat16") == "float16"
    assert dtype_name("kInt64") == "int64"
    with pytest.raises(GraphError, match="kOFRecord"):
        dtype_name("kOFRecord", "blob 'x/out'")


def test_parallel_size_reads_device_ranges():
    assert parallel_size(["@0:0-3"]) == 4
    assert parallel_size(["@0:0", "@1:1", "@2:2"]) == 3
    assert parallel_size(["0:0"]) == 1
    with pytest.raises(GraphError):
        parallel_size(["gpu0"])


# ------------------------------------------------------------------ op keys


def test_op_key_parts():
    assert op_key_parts("model.l1-matmul-7") == ("model.l1", "matmul")
    assert op_key_parts("ones_like-331") == ("", "ones_like")
    assert op_key_parts("model.l1.weight") is None
    assert op_key_parts("System-ZeRO-ParallelCast-model.l2.weight-21") is None
    assert op_key_parts("System-Train-TrainStep-ScalarAdd") is None


def test_op_keys_survive_inserted_ops():
    """A hint cast renumbers every later op in OneFlow's names, not their keys."""
    plain = ["m.l1-matmul-0", "m-gelu-1", "m.l2-matmul-2", "m.l1-matmul-3", "m.l1.weight"]
    hinted = [
        "m.l1-matmul-0",
        "m.l1-hierarchical_parallel_cast-1",
        "m-gelu-2",
        "m.l2-matmul-3",
        "m.l1-matmul-4",
        "m.l1.weight",
    ]
    a, b = op_keys(plain), op_keys(hinted)
    assert [a[n] for n in plain] == [b[n] for n in hinted if "cast" not in n]
    assert a["m.l1-matmul-3"] == "m.l1-matmul#1"
    assert b["m.l1-hierarchical_parallel_cast-1"] == "m.l1-hierarchical_parallel_cast#0"


def test_op_keys_skip_and_interface_ops():
    names = ["_TrainGraph_0_input.0.1_3", "m-identity-0", "m-identity-1", "_TrainGraph_0_output.0.0_2"]
    keys = op_keys(names, skip=["m-identity-0"])
    assert "m-identity-0" not in keys
    assert keys["m-identity-1"] == "m-identity#0"
    assert keys["_TrainGraph_0_input.0.1_3"] == "input:0.1"
    # the same argument of another graph has the same key
    assert op_keys(["_TrainGraph_3_input.0.1_7"])["_TrainGraph_3_input.0.1_7"] == "input:0.1"
    assert keys["_TrainGraph_0_output.0.0_2"] == "output:0.0"
