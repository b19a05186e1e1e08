"""OneFlow runs the plan's iteration: K micro-batches per step and the blocks it recomputes.

The jobs (``_build_iteration.py``, 4 CPU ranks as [2, 2], ZeRO-2, K = 4), compiled by
``compile_with_plan`` from OneFlow's own plan of the job of ONE micro-batch: tiny GPT with
``full`` checkpointing, and a one-block tiny MT5 recomputing its encoder block only
(standing for ``auto``).  ``$AUTOPAR_ITERATION_JOBS=all`` builds both variants of both
models (the table in docs/oneflow.md).  The tests read the compiled jobs: what
``compile_with_plan`` configured, what the importer reads back, where OneFlow's ZeRO gather
and gradient reduction run under accumulation (the evidence for
``ACCUMULATION["oneflow-0.9"]``), and the fidelity by phase.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import launch, skip_without_solver

from autopar.bridges.oneflow.iteration import (
    ACCUMULATION_OP_TYPES,
    block_scopes,
    checkpoint_modules,
    graph_blocks,
    is_recompute_op,
    job_micro_batches,
    job_recomputed_scopes,
)
from autopar.cost.iteration import ACCUMULATION, checkpoint_blocks, run_counts
from autopar.errors import PlanError
from autopar.ir.graph import Graph
from autopar.ir.plan import Plan
from autopar.ir.training import TrainingConfig
from autopar.runtimes.registry import RUNTIMES

pytestmark = pytest.mark.oneflow

MODELS = ("gpt-tiny", "mt5-tiny")
BLOCKS = {
    "gpt-tiny": ["model.h.0", "model.h.1"],
    "mt5-tiny": ["model.decoder.block.0", "model.encoder.block.0"],
}
FIRST = {"gpt-tiny": ["model.h.0"], "mt5-tiny": ["model.encoder.block.0"]}
JOBS = (("gpt-tiny", "full"), ("mt5-tiny", "subset"))


@pytest.fixture(scope="session")
def iteration_jobs(tmp_path_factory: pytest.TempPathFactory, flow: Any) -> Path:
    """The compiled jobs of ``_build_iteration.py``; in ``$AUTOPAR_ONEFLOW_JOBS/iteration``
    when that is set, built once."""
    cached = os.environ.get("AUTOPAR_ONEFLOW_JOBS")
    out = Path(cached) / "iteration" if cached else tmp_path_factory.mktemp("iteration-jobs")
    if not (out / "reports.json").exists():
        out.mkdir(parents=True, exist_ok=True)
        chosen = os.environ.get("AUTOPAR_ITERATION_JOBS", ",".join(f"{m}:{v}" for m, v in JOBS))
        launch(4, Path(__file__).with_name("_build_iteration.py"), str(out), chosen)
    return out


def _variants(out: Path, model: str) -> list[str]:
    """The variants of ``model`` built in ``out`` (at least one)."""
    keys = json.loads((out / "reports.json").read_text())
    found = [key.rsplit("_", 1)[1] for key in keys if key.rsplit("_", 1)[0] == model]
    assert found, f"no {model} job in {out}"
    return found


def _job(path: Path) -> Any:
    from autopar.bridges.oneflow.jobs import load_job

    return load_job(path)


@pytest.mark.parametrize("model", MODELS)
def test_compile_with_plan_sets_k_and_checkpoints_the_planned_blocks(
    iteration_jobs: Path, model: str
) -> None:
    reports = json.loads((iteration_jobs / "reports.json").read_text())
    for variant in _variants(iteration_jobs, model):
        blocks = BLOCKS[model] if variant == "full" else FIRST[model]
        report = reports[f"{model}_{variant}"]
        assert report["micro_batches"] == 4
        assert sorted(report["recomputed"]) == blocks
        assert report["recomputed"][blocks[0]] == blocks[0].removeprefix("model.")
        job = _job(iteration_jobs / f"{model}_{variant}.pb")
        assert job_micro_batches(job) == 4
        assert job_recomputed_scopes(job) == blocks  # OneFlow's recompute copies, read back


@pytest.mark.parametrize("model", MODELS)
def test_the_import_reads_the_iteration_back_and_is_the_graph_of_one_micro_batch(
    iteration_jobs: Path, model: str
) -> None:
    from autopar.bridges.oneflow import import_job
    from autopar.bridges.oneflow.convert import op_keys
    from autopar.bridges.oneflow.plans import imported_training

    one = Graph.load(str(iteration_jobs / f"{model}_graph.json"))  # built with K = 1, batch 2
    assert one.meta["training"] == {"micro_batches": 1, "checkpointing": "off", "recomputed_blocks": []}
    assert sorted(graph_blocks(one)) == BLOCKS[model]
    # the core's blocks also take nn.Graph's input/output ops (a numeric component, no module)
    assert {b for b in checkpoint_blocks(one, TrainingConfig(1, "full")) if not b.startswith("_")} == set(
        BLOCKS[model]
    )
    for variant in _variants(iteration_jobs, model):
        mode, blocks = ("full", BLOCKS[model]) if variant == "full" else ("auto", FIRST[model])
        graph = import_job(iteration_jobs / f"{model}_{variant}.pb")  # batch 8 = 4 x 2
        assert graph.meta["training"] == {
            "micro_batches": 4,
            "checkpointing": mode,
            "recomputed_blocks": blocks,
        }
        assert imported_training(graph).micro_batches == 4  # import_plan's plan.training
        if mode == "full":
            assert imported_training(graph) == TrainingConfig(4, "full")
        assert not [
            op.name for op in graph.ops if op.type in ACCUMULATION_OP_TYPES or is_recompute_op(op.name)
        ]
        dropped = graph.meta["oneflow"]["dropped"]
        assert dropped["accumulation"] and dropped["recompute"]
        mine = {k: n for n, k in op_keys([op.name for op in graph.ops]).items()}
        same = 0
        for name, key in op_keys([op.name for op in one.ops]).items():
            if key not in mine:
                continue
            a, b = one.op_by_name[name], graph.op_by_name[mine[key]]
            shapes = [one.tensors[t].shape for t in a.outputs.values()]
            assert [graph.tensors[t].shape for t in b.outputs.values()] == shapes, name
            assert (a.type, a.role) == (b.type, b.role), name
            same += 1
        assert same >= 0.9 * len(one.ops), (same, len(one.ops))
        inputs = [t for op in graph.ops if op.type == "input" for t in op.outputs.values()]
        assert inputs and all(graph.tensors[t].shape[0] == 2 for t in inputs)  # one micro-batch


@pytest.mark.parametrize("model", MODELS)
def test_oneflow_gathers_zero_parameters_every_micro_batch_and_reduces_gradients_once_per_step(
    iteration_jobs: Path, model: str
) -> None:
    """The evidence for ``ACCUMULATION["oneflow-0.9"]`` (docs/runtime-profiles.md): in the
    compiled job every ``System-ZeRO-ParallelCast`` reads its variable through the ``repeat``
    (variable -> repeat -> [boxing identity] -> cast), so the gather runs once per
    micro-batch; each gradient accumulates in its ``acc`` op in the backward's partial
    layout (a ``P``: the full-size local gradient) and is reduced into ZeRO's shard after the
    ``acc``, once per step.  A recomputed block's copy of a cast reads the same repeated
    variable in the same layout: OneFlow boxes it once for both (no second gather)."""
    from autopar.bridges.oneflow.convert import input_bns, nd_sbp_from_proto
    from autopar.bridges.oneflow.iteration import op_phases
    from autopar.bridges.oneflow.traffic import count_job_traffic

    job = _job(iteration_jobs / f"{model}_{_variants(iteration_jobs, model)[0]}.pb")
    ops = {op.name: op for op in job.net.op}
    phases = op_phases(job)
    casts = [n for n in ops if n.startswith("System-ZeRO-ParallelCast-")]
    assert casts and all(phases[n] == "micro" for n in casts)
    lbns = job.helper.lbn2logical_blob_desc
    for name in casts:  # walk back to the variable: a repeat on the way
        seen, current = [], name
        while not ops[current].HasField("variable_conf"):
            (port,) = input_bns(ops[current], lbns)
            current = port[1].split("/", 1)[0]
            op = ops[current]
            seen.append(op.user_conf.op_type_name if op.HasField("user_conf") else "")
        assert "repeat" in seen, (name, seen)
    conf = job.job_parallel_view_conf.op_name2nd_sbp_signature_conf
    accs = [n for n, op in ops.items() if op.HasField("user_conf") and op.user_conf.op_type_name == "acc"]
    assert accs and all(phases[n] == "step" for n in accs)
    assert all(nd_sbp_from_proto(conf[n].bn_in_op2nd_sbp["in_0"], 2).has_partial for n in accs)

    traffic = count_job_traffic(job, keep_edges=10**6)
    gathers = [e for e in traffic.edges if e["zero_gather"]]
    assert gathers and {e["phase"] for e in gathers} == {"per_micro_batch"}
    reductions = [e for e in traffic.edges if e["producer"] in accs]
    assert reductions and {e["phase"] for e in reductions} == {"once_per_step"}
    # the copies exist, and their gather is the forward's (with the CPU-only identity reads
    # of zoo.build(identity_reads=True) the copied identity made OneFlow gather again)
    assert any(n.startswith("Sys-Checkpointing-Fake-Fw-Op_System-ZeRO-ParallelCast-") for n in ops)
    assert sum(traffic.recompute_zero_cast_bytes.values()) == 0

    acc = ACCUMULATION["oneflow-0.9"]
    assert acc.reduce_per_micro_batch_from is None and acc.full_size_buffer
    counts = run_counts(
        Graph.load(str(iteration_jobs / f"{model}_graph.json")),
        TrainingConfig(4, "off"),
        RUNTIMES["oneflow-0.9"],
        2,
    )
    assert counts.gather_per_micro_batch and not counts.gradient_per_micro_batch


def _fidelity(iteration_jobs: Path, model: str, variant: str) -> Any:
    from autopar.bridges.oneflow.fidelity import check_fidelity

    plan_file = "full_plan" if variant == "full" else "off_plan"
    return check_fidelity(
        iteration_jobs / f"{model}_{variant}.pb",
        Plan.load(str(iteration_jobs / f"{model}_{plan_file}.json")),
        plan_graph=Graph.load(str(iteration_jobs / f"{model}_graph.json")),
        recompute=None if variant == "full" else FIRST[model],
    )


@pytest.mark.parametrize("model", MODELS)
def test_fidelity_counts_recompute_and_once_per_step_bytes_next_to_the_prediction(
    iteration_jobs: Path, model: str
) -> None:
    for variant in _variants(iteration_jobs, model):
        _check_fidelity_by_phase(iteration_jobs, model, variant)


def _check_fidelity_by_phase(iteration_jobs: Path, model: str, variant: str) -> None:
    report = _fidelity(iteration_jobs, model, variant)
    assert report.recomputed == (BLOCKS[model] if variant == "full" else FIRST[model])
    rows = {(r["axis"], r["phase"]): r for r in report.phase_rows()}
    assert {p for _, p in rows} == {"per_micro_batch", "recompute", "once_per_step", "per_step"}
    for axis in (0, 1):
        for side in ("predicted", "counted"):
            step = rows[axis, "per_step"][side]
            parts = [rows[axis, p][side] for p in ("per_micro_batch", "recompute", "once_per_step")]
            assert step == pytest.approx(4 * (parts[0] + parts[1]) + parts[2])
    for side in ("predicted", "counted"):
        assert sum(rows[a, "recompute"][side] for a in (0, 1)) > 0
        assert sum(rows[a, "once_per_step"][side] for a in (0, 1)) > 0
    for axis in (0, 1):
        # measured: per micro-batch within 0.6 %, once per step within 0.7 %, per step within
        # 0.5 % (the jobs follow the plan on 93-95 % of its boxing bytes)
        for phase in ("per_micro_batch", "once_per_step", "per_step"):
            assert rows[axis, phase]["predicted"] == pytest.approx(rows[axis, phase]["counted"], rel=0.05)
        # recompute: boxed again only between ops of OneFlow's recomputed copy (ZeRO casts
        # included), autopar.cost.iteration.boxed_again_in_recompute; measured: GPT +0.0 % (first
        # block) and +5.0 % (both), MT5 -9.1 % (encoder block) and -6.0 % (both); 0.0 % on axis 0
        assert rows[axis, "recompute"]["predicted"] == pytest.approx(
            rows[axis, "recompute"]["counted"], rel=0.12, abs=1e-9
        )
    table = report.phase_table()
    assert "K = 4" in table and "recompute" in table and "once_per_step" in table


def test_a_plan_scope_without_a_module_is_refused_with_a_stable_code(flow: Any) -> None:
    class Block(flow.nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.fc = flow.nn.Linear(4, 4)

    class Net(flow.nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.h = flow.nn.ModuleList([Block(), Block()])
            self.head = flow.nn.Linear(4, 2)

    net = Net()
    assert block_scopes(net) == {"model.h.0": "h.0", "model.h.1": "h.1"}
    assert checkpoint_modules(net, ["model.h.1", "h.0"]) == {"model.h.1": "h.1", "h.0": "h.0"}
    with pytest.raises(PlanError) as err:
        checkpoint_modules(net, ["model.h.0", "model.h.7", "encoder.layers.3"])
    assert err.value.code == "checkpoint_scope_unmatched"
    assert err.value.details["scopes"] == ["encoder.layers.3", "model.h.7"]


def test_make_train_graph_sets_k_and_checkpointing_on_the_named_modules(flow: Any) -> None:
    from autopar.bridges.oneflow import make_train_graph

    class Block(flow.nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.fc = flow.nn.Linear(8, 8)

        def forward(self, x: Any) -> Any:
            return flow.relu(self.fc(x)) + x

    class Net(flow.nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.h = flow.nn.ModuleList([Block(), Block()])

        def forward(self, x: Any) -> Any:
            for block in self.h:
                x = block(x)
            return x.sum()

    net = Net()
    graph = make_train_graph(
        net, flow.optim.SGD(net.parameters(), lr=0.1), micro_batches=4, checkpointing=["h.1"]
    )
    graph.build_graph(flow.ones(8, 8))
    job = graph._full_job_proto
    assert job_micro_batches(job) == 4
    assert job_recomputed_scopes(job) == ["model.h.1"]


def test_request_plan_solves_for_the_iteration_compile_with_plan_runs(
    iteration_jobs: Path, tmp_path: Path
) -> None:
    from autopar.bridges.oneflow.planning import request_plan

    python = skip_without_solver()
    model = _variants_models(iteration_jobs)[0]
    plan = request_plan(
        str(iteration_jobs / f"{model}_graph.json"),
        str(tmp_path / "plan.json"),
        mesh_shape=(2, 2),
        cluster="1x4",
        zero_stage=2,
        planner="data-parallel",
        micro_batches=4,
        checkpointing="full",
        python=python,
        timeout_s=300,
    )
    assert plan.training == TrainingConfig(4, "full")


def test_a_solver_auto_plan_compiles_with_the_blocks_it_recomputes(
    iteration_jobs: Path, tmp_path: Path
) -> None:
    """The solver's ``auto`` plan of tiny GPT at a budget under the floor of ``off`` (some
    block must recompute), compiled by ``compile_with_plan``: the blocks OneFlow recomputes,
    read back from the compiled job, are the plan's ``recomputed_blocks``."""
    from autopar.bridges.oneflow.planning import request_plan

    python = skip_without_solver()
    graph_path = str(iteration_jobs / "gpt-tiny_graph.json")
    common = {"mesh_shape": (2, 2), "cluster": "1x4", "zero_stage": 2, "micro_batches": 4, "python": python}
    with pytest.raises(PlanError) as refused:  # off at 1 KiB: refused with its memory floor
        request_plan(graph_path, str(tmp_path / "off.json"), memory="1KiB", checkpointing="off", **common)
    floor_kib = float(re.search(r"smallest memory found feasible is ([\d.]+) KiB", str(refused.value))[1])
    budget = int(0.964 * floor_kib * 1024)  # under the floor of off, above auto's
    plan = request_plan(
        graph_path,
        str(tmp_path / "auto.json"),
        memory=f"{budget}B",
        checkpointing="auto",
        time_limit_s=120,
        timeout_s=600,
        **common,
    )
    assert plan.training.checkpointing == "auto" and plan.training.recomputed
    launch(
        4,
        Path(__file__).with_name("_build_iteration.py"),
        str(tmp_path),
        f"gpt-tiny:auto={tmp_path / 'auto.json'}",
    )
    assert job_recomputed_scopes(_job(tmp_path / "gpt-tiny_auto.pb")) == list(plan.training.recomputed)


def _variants_models(out: Path) -> list[str]:
    keys = json.loads((out / "reports.json").read_text())
    return sorted({key.rsplit("_", 1)[0] for key in keys})
