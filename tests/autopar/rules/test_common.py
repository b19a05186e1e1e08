"""Port lookup shared by the families: OneFlow names, importer order, positional fallback."""

from __future__ import annotations

from autopar.ir.sbp import B, P, S
from autopar.rules.families._common import base_name, port_map, sig
from tests.autopar.rules.helpers import make_ctx, printed


def test_base_names():
    assert base_name("a_0") == "a"
    assert base_name("model_diff_0") == "model_diff"
    assert base_name("bias_correction1_0") == "bias_correction1"
    assert base_name("in_12") == "in"
    assert base_name("out") == "out"
    assert base_name("_add_to_output_0") == "_add_to_output"


def test_sig_writes_values_in_the_ops_port_order():
    ctx = make_ctx("matmul", {"b_0": (16, 4), "a_0": (8, 16)}, {"out_0": (8, 4)}, mesh=(2,))
    pm = port_map(ctx, ("a", "b"), ("out",))
    assert pm.inputs == ("b", "a")
    assert sig(pm, {"a": S(1), "b": S(0)}, {"out": P}) == ((S(0), S(1)), (P,))
    assert sig(pm, {"a": S(0)}, {}) == ((B, S(0)), (B,))  # unnamed ports default to B


def test_variadic_ports_share_their_base_name_unless_named_in_full():
    ctx = make_ctx("add_n", {"in_0": (4,), "in_1": (4,)}, {"out_0": (4,)}, mesh=(2,))
    pm = port_map(ctx)
    assert sig(pm, {"in": P}, {"out": P}) == ((P, P), (P,))
    assert sig(pm, {"in": B, "in_1": P}, {}) == ((B, P), (B,))


def test_unknown_port_names_fall_back_to_oneflow_order():
    # A hand-built graph calling matmul's ports x and y: matched by position to (a, b).
    ctx = make_ctx("matmul", {"x": (8, 16), "y": (16, 4)}, {"z": (8, 4)}, mesh=(2,))
    assert printed(ctx) >= {"(S(0), B) -> S(0)", "(S(1), S(0)) -> P", "(B, S(1)) -> S(1)"}
