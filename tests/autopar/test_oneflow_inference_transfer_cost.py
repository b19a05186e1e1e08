"""OneFlow 0.9's per-hop transfer cost in the emulated greedy inference (``GetTransferCost()``).

Measured on the installed OneFlow 0.9.0 (synthetic ``[4, 2]`` job, 8 CPU ranks: a residual
``x + matmul(y, w)`` with ``x`` ``(S(0), B)`` and the row-parallel product ``(S(0), P)``):
its ``add_n`` takes ``(S(0), B)`` for float32 ``[8, 16, 32]`` (16 KiB) and ``(S(0), S(2))`` for
``[8, 32, 32]`` (32 KiB) and ViT's ``[8, 17, 64]``, as ``AUTO_PARALLEL_TRANSFER_COST`` = 1.65e4
prices them; with the variable set to 1.65e8 OneFlow takes ``(S(0), B)`` at every size.
"""

import pytest

from autopar.graph import Graph, Op, TensorSpec
from autopar.oneflow_inference import TRANSFER_COST, infer_like_oneflow
from autopar.sbp import B, NdSbp, P, Signature, Split

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


def test_transfer_cost_is_oneflow_090s_default() -> None:
    assert TRANSFER_COST == 1.65e4


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
