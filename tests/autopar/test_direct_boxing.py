"""Boxing within fixed process groups (the ``direct`` lowering of runtime ``megatron-lm``).

Hand counts (ring collectives, ``T`` = the bytes a group holds): Megatron-LM's DDP
all-reduces a gradient replicated on the tensor-parallel axis within the data-parallel
group, ``2 (dp-1)/dp x T`` on the dp axis and nothing on tp; the ideal search may instead
reduce halves over dp and all-gather over tp (cheaper, not what Megatron-LM runs).
"""

from __future__ import annotations

import pytest

from autopar.hardware.cluster import Cluster
from autopar.hardware.mesh import Mesh
from autopar.ir.sbp import parse_nd_sbp
from autopar.runtimes.megatron_lm.boxing import DirectBoxing
from autopar.runtimes.profile import Lowering
from autopar.runtimes.registry import boxing_plan, boxing_search, runtime_profile

MESH = Mesh(Cluster.parse("2x4"), (4, 2))
SHAPE, ITEMSIZE = (1024, 256), 2
T = 1024 * 256 * ITEMSIZE


def _axis_bytes(lowering: str, src: str, dst: str) -> dict[int, float]:
    plan = boxing_plan(SHAPE, ITEMSIZE, parse_nd_sbp(src), parse_nd_sbp(dst), MESH, lowering)
    out: dict[int, float] = {}
    for step in plan.steps:
        out[step.axis] = out.get(step.axis, 0.0) + step.bytes_per_device
    return out


def test_megatron_lm_boxes_within_fixed_groups() -> None:
    assert runtime_profile("megatron-lm").lowering is Lowering.DIRECT
    assert isinstance(boxing_search(SHAPE, ITEMSIZE, MESH, "direct"), DirectBoxing)


def test_a_tp_replicated_gradient_is_all_reduced_within_the_dp_group() -> None:
    assert _axis_bytes("direct", "(P, B)", "(B, B)") == {0: pytest.approx(2 * 3 / 4 * T)}
    ideal = _axis_bytes("ideal", "(P, B)", "(B, B)")
    assert ideal.get(1, 0.0) > 0 and ideal[0] < 2 * 3 / 4 * T  # the detour the direct lowering forbids


@pytest.mark.parametrize(
    ("src", "dst", "hand"),
    [
        ("(S(0), P)", "(S(0), B)", {1: 2 * 1 / 2 * T / 4}),  # tp all-reduce of a batch shard
        ("(P, S(0))", "(S(0), S(0))", {0: 3 / 4 * T / 2}),  # distributed optimizer reduce-scatter
        ("(S(0), S(0))", "(B, S(0))", {0: 3 / 4 * T / 2}),  # its all-gather
        ("(P, P)", "(B, B)", {0: 2 * 3 / 4 * T, 1: 2 * 1 / 2 * T}),  # each axis on its own
    ],
)
def test_each_changed_axis_runs_its_own_collective(src: str, dst: str, hand: dict[int, float]) -> None:
    got = _axis_bytes("direct", src, dst)
    assert set(got) == set(hand)
    for axis, nbytes in hand.items():
        assert got[axis] == pytest.approx(nbytes), axis
