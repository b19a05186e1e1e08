"""OneFlow 0.9's per-hop transfer cost in the emulated greedy inference (``GetTransferCost()``).

Measured on the installed OneFlow 0.9.0 (synthetic ``[4, 2]`` job, 8 CPU ranks: a residual
``x + matmul(y, w)`` with ``x`` ``(S(0), B)`` and the row-parallel product ``(S(0), P)``):
its ``add_n`` takes ``(S(0), B)`` for float32 ``[8, 16, 32]`` (16 KiB) and ``(S(0), S(2))`` for
``[8, 32, 32]`` (32 KiB) and ViT's ``[8, 17, 64]``, as ``AUTO_PARALLEL_TRANSFER_COST`` = 1.65e4
prices them; with the variable set to 1.65e8 OneFlow takes ``(S(0), B)`` at every size.
"""

import pytest

from autopar.baselines.oneflow_inference import infer_like_oneflow
from autopar.ir.graph import Graph, Op, TensorSpec
from autopar.ir.sbp import B, NdSbp, P, Signature, Split

MESH = (4, 2)


def _residual(shape: tuple[int, ...]) -> Graph:
    tensors = [TensorSpec(n, shape, "float32") for n in ("x", "h", "z")]
    ops = [
        Op("x", "input", outputs={"out": "x"}),
        Op("h", "input", outputs={"out": "h"}),
        Op("add", "add_n", {"in_0": "x", "in_1": "h"}, {"out_0": "z"}),
    ]
    return Graph("residual", tensors, ops, []).validate()


def _add_n_output(shape: tuple[int, ...]) -> NdSbp:
    sources = {
        "x": Signature((), (NdSbp((Split(0), B)),)),
        "h": Signature((), (NdSbp((Split(0), P)),)),
    }
    return infer_like_oneflow(_residual(shape), MESH, sources)["add"].outputs[0]


ONEFLOW_090_DEFAULT = 1.65e4
"""``ParseFloatFromEnv("AUTO_PARALLEL_TRANSFER_COST", 1.65e4)`` in OneFlow 0.9.0's
``sbp_infer_util.cpp``; tests/oneflow/test_oneflow_transfer_cost.py checks the switch on the
installed OneFlow."""


def _by_hand(nbytes: int, transfer_cost: float) -> NdSbp:
    """OneFlow's greedy choice from its cost formula: ``(S(0), B)`` is one hop of ``h``
    (``T + 2 bytes``: an all-reduce), ``(S(0), S(2))`` two (``2 T + 1 + bytes``: a slice of
    ``x`` and a reduce-scatter of ``h``)."""
    one_hop = transfer_cost + 2 * nbytes
    two_hops = 2 * transfer_cost + 1 + nbytes
    return NdSbp((Split(0), B)) if one_hop < two_hops else NdSbp((Split(0), Split(2)))


@pytest.mark.parametrize("length", [1, 8, 15, 16, 17, 24, 32, 64])
def test_the_switch_between_one_and_two_hops_is_where_oneflows_formula_puts_it(length: int) -> None:
    """float32 ``[8, L, 32]`` is ``1024 L`` bytes: under OneFlow 0.9.0's default the formula
    switches between L = 16 (16,384 B < T + 1) and L = 17 (17,408 B > T + 1)."""
    nbytes = 8 * length * 32 * 4
    assert _add_n_output((8, length, 32)) == _by_hand(nbytes, ONEFLOW_090_DEFAULT)


def test_a_large_transfer_cost_keeps_the_one_hop_route_at_every_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``AUTO_PARALLEL_TRANSFER_COST=1.65e8`` OneFlow takes ``(S(0), B)`` at every size
    measured (module docstring); the formula agrees up to 165 MB."""
    import autopar.runtimes.oneflow_09.copy_cost as copy_cost
    from autopar.baselines.oneflow_inference import copy_cost_with_middle_nodes

    monkeypatch.setattr(copy_cost, "TRANSFER_COST", 1.65e8)
    copy_cost_with_middle_nodes.cache_clear()  # its costs were priced at the default
    try:
        for length in (16, 32, 17 * 4):
            assert _by_hand(8 * length * 32 * 4, 1.65e8) == NdSbp((Split(0), B))
            assert _add_n_output((8, length, 32)) == NdSbp((Split(0), B))
    finally:
        copy_cost_with_middle_nodes.cache_clear()


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        # 16 KiB: one all-reduce of h on axis 1 (T + 2 * 16384) beats a slice of x and a
        # reduce-scatter of h (2 T + 1 + 16384)
        ((8, 16, 32), NdSbp((Split(0), B))),
        # 32 KiB and ViT's residual (34 KiB): the two cheap hops win
        ((8, 32, 32), NdSbp((Split(0), Split(2)))),
        ((8, 17, 64), NdSbp((Split(0), Split(2)))),
    ],
)
def test_residual_add_of_a_partial_sum_follows_oneflow_by_size(
    shape: tuple[int, ...], expected: NdSbp
) -> None:
    assert _add_n_output(shape) == expected
