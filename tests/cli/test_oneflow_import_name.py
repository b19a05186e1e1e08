"""The name of a graph imported from a OneFlow job (issue 43): the job's, unless it is the
generic name of autopar's training wrapper, then the file's stem (no OneFlow needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from autopar.bridges.oneflow.importer import graph_name_of


@pytest.mark.parametrize(
    ("job_name", "source", "name"),
    [
        ("TrainGraph_0", "jobs/gpt-13b.pb", "gpt-13b"),  # make_train_graph's job: the file says more
        ("PipelineTrainGraph_3", Path("/x/mt5.pb"), "mt5"),
        ("GPTPretrainGraph_0", "jobs/run.pb", "GPTPretrainGraph_0"),  # a job the user named
        ("TrainGraph_0", None, "TrainGraph_0"),  # from bytes: nothing better
        ("", "jobs/bert.pb", "bert"),
        ("", None, "oneflow-job"),
    ],
)
def test_graph_name_of(job_name: str, source: str | Path | None, name: str) -> None:
    assert graph_name_of(job_name, source) == name
