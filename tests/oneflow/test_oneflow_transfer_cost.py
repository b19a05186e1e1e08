"""OneFlow 0.9.0's per-hop transfer cost, measured on the installed OneFlow (8 CPU ranks, [4, 2]).

A residual ``x + matmul(y, w)``: ``x`` ``(S(0), B)``, the row-parallel product ``(S(0), P)``
(``_probe_transfer_cost.py``).  OneFlow's greedy inference (``GreedilyFindMinCopyCostNdSbp``)
prices the ``add_n``'s candidates with ``GetTransferCost()`` per hop plus bytes
(``sbp_infer_util.cpp``): ``(S(0), B)`` is one hop of ``h`` (``T + 2 bytes``), ``(S(0), S(2))``
two (``2 T + 1 + bytes``).  With the default, OneFlow switches between 16 and 32 KiB, which
puts ``T`` at 1.65e4 (:data:`autopar.runtimes.oneflow_09.copy_cost.TRANSFER_COST`), not 1.65e8; the
emulation then agrees op for op.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autopar.ir.graph import Role
from autopar.ir.sbp import B, NdSbp, Split

pytestmark = pytest.mark.oneflow

SIZES = {(16, 32): NdSbp((Split(0), B)), (32, 32): NdSbp((Split(0), Split(2)))}
"""(L, D) of a float32 [8, L, D] residual -> the add_n output OneFlow 0.9.0 picks (16 / 32 KiB)."""


@pytest.fixture(scope="module")
def residual_jobs(tmp_path_factory: pytest.TempPathFactory, flow: Any) -> Path:
    from tests.oneflow.conftest import launch

    out = tmp_path_factory.mktemp("transfer_cost")
    specs = [f"{length},{width}" for length, width in SIZES]
    launch(8, Path(__file__).with_name("_probe_transfer_cost.py"), str(out), *specs)
    return out


@pytest.mark.parametrize(("length", "width"), list(SIZES))
def test_residual_add_n_follows_oneflows_transfer_cost(residual_jobs: Path, length: int, width: int) -> None:
    from autopar.baselines.oneflow_inference import agreement
    from autopar.bridges.oneflow import import_job, import_plan

    job = residual_jobs / f"residual_{length}x{width}.pb"
    graph = import_job(job)
    plan = import_plan(job, graph=graph)
    add_n = next(op for op in graph.ops if op.type == "add_n" and op.role is Role.FORWARD)
    assert plan.signatures[add_n.name].outputs[0] == SIZES[(length, width)]
    result = agreement(graph, plan, cascade=False)
    assert result.share == 1.0, result.examples
