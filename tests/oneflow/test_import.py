"""Import real OneFlow training jobs: tiny MT5, GPT, BERT on 4 CPU ranks as [2, 2], with and without ZeRO."""

from __future__ import annotations

from collections import Counter

import pytest

from autopar.bridges.oneflow import import_job, load_job
from autopar.bridges.oneflow.job_rewrites import OPTIMIZER_MODEL_PORTS
from autopar.ir.graph import Graph, Role

pytestmark = pytest.mark.oneflow

JOBS = [f"{model}_zero{zero}" for model in ("mt5-tiny", "gpt-tiny", "bert-tiny") for zero in (0, 2)]


def _type(op) -> str:
    kind = op.WhichOneof("op_type")
    return op.user_conf.op_type_name if kind == "user_conf" else kind


@pytest.mark.parametrize("key", JOBS)
def test_import_validates_and_accounts_for_every_oneflow_op(mesh_jobs, key):
    out, counts = mesh_jobs
    job = load_job(out / f"{key}.pb")
    graph = import_job(job)
    assert graph.validate() is graph
    assert len(job.net.op) == counts[key]["ops"]  # the file is the job OneFlow built
    dropped = graph.meta["oneflow"]["dropped"]
    # every OneFlow op is either in the graph or dropped for a recorded reason
    assert len(graph.ops) + sum(len(v) for v in dropped.values()) == counts[key]["ops"]
    assert graph.meta["oneflow"]["op_count"] == counts[key]["ops"]
    assert graph.meta["oneflow"]["tensor_count"] == counts[key]["blobs"]

    names = {op.name for op in job.net.op}
    assert {op.name for op in graph.ops} <= names
    by_name = {op.name: op for op in job.net.op}
    # the reasons, checked against OneFlow's own ops
    assert all(
        n.endswith(("-m", "-v")) and _type(by_name[n]) == "variable_conf" for n in dropped["optimizer_state"]
    )
    assert len(dropped["optimizer_state"]) == 2 * len(counts[key]["trainable"])  # AdamW: m and v
    assert all(n.startswith("System-Train") or "adam_bias_correction" in n for n in dropped["system"])
    assert all(n.startswith("System-ZeRO-") for n in dropped["zero_cast"])
    assert all(
        _type(by_name[n]) not in ("variable_conf", "input_conf") for n in dropped.get("constant_input", [])
    )

    # op counts per type match OneFlow's for every type the import keeps as is
    theirs = Counter(
        _type(op) for op in job.net.op if op.name not in {n for v in dropped.values() for n in v}
    )
    ours = Counter(
        op.attrs.get("folded_type", op.type) for op in graph.ops
    )  # folded ops by their OneFlow type
    renamed = {"variable_conf": "variable", "input_conf": "input", "output_conf": "output"}
    assert sum(theirs.values()) == len(graph.ops)
    for kind, n in theirs.items():
        assert ours[renamed.get(kind, kind)] == n, kind

    # tensors: OneFlow's logical blobs with OneFlow's shapes
    descs = job.helper.lbn2logical_blob_desc
    kept = {op.name for op in graph.ops}
    assert set(graph.tensors) == {lbn for lbn in descs if lbn.split("/", 1)[0] in kept}
    for name, spec in graph.tensors.items():
        assert list(spec.shape) == list(descs[name].shape.dim), name


@pytest.mark.parametrize("key", JOBS)
def test_variables_link_parameter_gradient_and_optimizer(mesh_jobs, key):
    out, counts = mesh_jobs
    graph = import_job(out / f"{key}.pb")
    trainable = counts[key]["trainable"]
    assert sorted(v.op for v in graph.variables) == sorted(trainable)
    assert len(trainable) == len(counts[key]["parameters"])
    for v in graph.variables:
        update = graph.op_by_name[v.optimizer]
        assert update.type == "adam_update" and update.role is Role.OPTIMIZER
        assert list(update.inputs) == list(OPTIMIZER_MODEL_PORTS)  # m_0, v_0, learning rate ... dropped
        assert update.inputs["model_0"] == v.tensor
        assert update.inputs["model_diff_0"] == v.grad
        assert graph.tensors[v.grad].shape == graph.tensors[v.tensor].shape
        producer, _ = graph.producer[v.grad]
        assert graph.op_by_name[producer].role is Role.BACKWARD


@pytest.mark.parametrize("key", JOBS)
def test_roles_and_ports_follow_oneflow(mesh_jobs, key):
    out, _ = mesh_jobs
    job = load_job(out / f"{key}.pb")
    graph = import_job(job)
    roles = Counter(op.role for op in graph.ops)
    assert roles[Role.FORWARD] and roles[Role.BACKWARD] and roles[Role.OPTIMIZER] == len(graph.variables)
    (seed_lbn,) = job.job_conf.train_conf.loss_grad_lbn
    seed = graph.op_by_name[graph.producer[seed_lbn][0]]
    assert seed.role is Role.BACKWARD
    # ports are OneFlow's bn names with the blob's index, in OneFlow's arg order
    by_name = {op.name: op for op in job.net.op}
    for op in graph.ops:
        conf = by_name[op.name]
        if conf.WhichOneof("op_type") != "user_conf" or op.type in ("adam_update", "constant"):
            continue
        expected = [
            f"{arg}_{i}"
            for arg in conf.user_conf.input_order
            for i in range(len(conf.user_conf.input[arg].s))
        ]
        assert list(op.inputs) == expected, op.name
        for port, lbn in op.outputs.items():
            arg, index = port.rsplit("_", 1)
            assert conf.user_conf.output[arg].s[int(index)] == lbn


@pytest.mark.parametrize("model", ["mt5-tiny", "gpt-tiny", "bert-tiny"])
def test_zero2_job_imports_to_the_same_graph_as_without_zero(mesh_jobs, model):
    out, _ = mesh_jobs
    plain = import_job(out / f"{model}_zero0.pb")
    zero = import_job(out / f"{model}_zero2.pb")
    assert plain.meta["zero_stage"] == 0 and zero.meta["zero_stage"] == 2
    assert zero.meta["oneflow"]["dropped"]["zero_cast"], "OneFlow pinned no parameter layout under ZeRO"
    assert not any(op.name.startswith("System-ZeRO-") for op in zero.ops)
    # ZeRO only rewrites how parameters are stored: the planned graph is the same
    assert Counter(op.type for op in plain.ops) == Counter(op.type for op in zero.ops)
    assert len(plain.tensors) == len(zero.tensors)
    assert zero.meta["oneflow"]["zero_layouts"], "the ZeRO cast targets are kept"


def test_graph_json_round_trip(mesh_jobs):
    out, _ = mesh_jobs
    graph = import_job(out / "mt5-tiny_zero2.pb")
    again = Graph.from_json(graph.to_json()).validate()
    assert again.content_hash() == graph.content_hash()
    assert again.meta == graph.meta


def test_import_errors_name_the_problem(tmp_path, flow):
    from autopar.errors import GraphError

    bad = tmp_path / "bad.pb"
    bad.write_bytes(b"\x00\x01not a job")
    with pytest.raises(GraphError):
        import_job(bad)
    with pytest.raises(GraphError, match="cannot read"):
        import_job(tmp_path / "missing.pb")


def test_an_imported_graph_is_named_after_the_job_or_its_file(mesh_jobs, tmp_path):
    """Issue 43: ``make_train_graph``'s job is ``TrainGraph_<n>`` for every model, so a job read
    from a file is named after the file; ``autopar oneflow import`` prints the name it gave."""
    import subprocess
    import sys

    from tests.oneflow.conftest import ROOT, oneflow_env

    out, _ = mesh_jobs
    path = out / "gpt-tiny_zero0.pb"
    job_name = load_job(path).job_conf.job_name
    assert job_name.startswith("TrainGraph_")
    assert import_job(path).name == "gpt-tiny_zero0"
    assert import_job(str(path), name="mine").name == "mine"
    assert import_job(path.read_bytes()).name == job_name  # no file: the job's own name
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "autopar.cli",
            "oneflow",
            "import",
            str(path),
            "--out",
            str(tmp_path / "g.json"),
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**oneflow_env(), "PYTHONPATH": str(ROOT)},
    )
    assert f"graph 'gpt-tiny_zero0' (job {job_name!r})" in done.stdout
    assert Graph.load(str(tmp_path / "g.json")).name == "gpt-tiny_zero0"
