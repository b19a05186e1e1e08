"""OneFlow 0.9's boxing lowering (autopar/runtimes/oneflow_09/lowering.py): pure Python, runs
without OneFlow."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from autopar.ir.sbp import parse_nd_sbp
from autopar.runtimes.oneflow_09.lowering import Hop, balanced_range, device_slices, lower_hop, observed_table

TABLE = Path(__file__).resolve().parents[2] / "autopar" / "runtimes" / "oneflow_09" / "boxing_observed.json"
SHAPE = [8, 16]
T = 8 * 16 * 4


def hop(src: str, dst: str, mesh: tuple[int, ...] = (2, 2), shape: list[int] = SHAPE) -> Hop:
    return lower_hop(shape, 4, parse_nd_sbp(src), parse_nd_sbp(dst), mesh)


def test_balanced_splitter_gives_the_first_parts_one_more_row() -> None:
    assert [balanced_range(10, 4, i) for i in range(4)] == [(0, 3), (3, 6), (6, 8), (8, 10)]


def test_device_slices_split_the_same_dim_in_mesh_axis_order() -> None:
    sbp = parse_nd_sbp("(S(0), S(0))")
    assert device_slices([8, 2], sbp, [2, 2], (1, 0)) == ((4, 6), (0, 2))


@pytest.mark.parametrize(
    ("src", "dst", "kind", "scope", "axis0", "axis1"),
    [
        ("(S(0), P)", "(S(0), B)", "all_reduce", "axis 1", 0.0, 0.5),  # group holds T/2
        ("(B, P)", "(B, B)", "all_reduce", "axis 1", 0.0, 1.0),
        ("(P, B)", "(B, B)", "all_reduce", "axis 0", 1.0, 0.0),
        ("(S(0), S(1))", "(S(0), B)", "all_gather", "axis 1", 0.0, 0.25),
        ("(B, S(0))", "(B, S(1))", "all_to_all", "axis 1", 0.0, 0.25),
        # axis-0 changes other than P -> B are send/recv (TryBuildNcclBy2DHierarchyOthers)
        ("(S(0), S(1))", "(B, S(1))", "send_recv", "2-D", 0.25, 0.0),
        ("(S(1), B)", "(S(0), B)", "send_recv", "2-D", 0.25, 0.0),
        # (*, P) -> (*, S) is not among SameDim0's collectives
        ("(S(0), P)", "(S(0), S(1))", "send_recv", "2-D", 0.0, 0.25),
        # B -> S: a local slice
        ("(S(0), B)", "(S(0), S(1))", "send_recv", "2-D", 0.0, 0.0),
        ("(B, P)", "(S(0), P)", "local", "2-D", 0.0, 0.0),
    ],
)
def test_each_hop_is_lowered_as_oneflow_does(
    src: str, dst: str, kind: str, scope: str, axis0: float, axis1: float
) -> None:
    h = hop(src, dst)
    assert (h.kind, h.scope) == (kind, scope)
    assert h.bytes_per_axis[0] / T == pytest.approx(axis0)
    assert h.bytes_per_axis[1] / T == pytest.approx(axis1)


@pytest.mark.parametrize(
    ("src", "dst", "flat"),
    [
        ("(S(0), S(0))", "(B, B)", 7 / 8),  # all-gather over 8 devices
        ("(P, P)", "(B, B)", 2 * 7 / 8),  # all-reduce over 8 devices
        ("(S(0), S(0))", "(S(1), S(1))", 7 / 64),  # all-to-all over 8 devices
    ],
)
def test_flat_collectives_split_per_axis_add_up_to_the_flat_ring_volume(
    src: str, dst: str, flat: float
) -> None:
    h = hop(src, dst, (4, 2))
    assert h.scope == "flat"
    assert h.total_bytes / T == pytest.approx(flat)
    assert h.bytes_per_axis[0] > h.bytes_per_axis[1] > 0


def test_send_recv_counts_what_each_device_lacks() -> None:
    # (S(0), B) -> (B, B) on [4, 2]: each device holds 1/4 of the rows and needs the other 3/4
    h = hop("(S(0), B)", "(B, B)", (4, 2))
    assert h.kind == "send_recv"
    assert h.bytes_per_axis == {0: pytest.approx(0.75 * T), 1: 0.0}


def test_a_partial_source_sends_every_addend() -> None:
    # (P, S(1)) -> (S(0), S(1)): each device receives the addends of its row block from the other row
    h = hop("(P, S(1))", "(S(0), S(1))")
    assert h.kind == "send_recv"
    assert h.bytes_per_axis[0] / T == pytest.approx(0.25)


def test_same_sbp_moves_nothing() -> None:
    h = hop("(S(0), B)", "(S(0), B)")
    assert h.kind == "local" and h.total_bytes == 0


def test_the_stored_table_is_what_the_lowering_gives_for_the_observed_middle_nodes() -> None:
    stored = json.loads(TABLE.read_text())
    for table in stored["tables"]:
        probe = {
            "hierarchy": table["hierarchy"],
            "oneflow": table["oneflow"],
            "transitions": [
                {
                    "src": r["src"],
                    "dst": r["dst"],
                    "shape": r["shape"],
                    "middle": r["middle"],
                    "compiled": r["compiled"],
                }
                for r in table["transitions"]
            ],
        }
        again = observed_table(probe, table["itemsize"])
        assert again == table
        assert all(r["compiled"] for r in table["transitions"])
        assert math.isfinite(sum(r["total_over_T"] for r in table["transitions"]))
