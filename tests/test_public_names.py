"""The names users import (docs/architecture.md, "Public names") keep working."""

from __future__ import annotations

import importlib

import pytest

import autopar

FACADE = {
    "Cluster": "autopar.hardware.cluster",
    "Graph": "autopar.ir.graph",
    "Mesh": "autopar.hardware.mesh",
    "PipelinePlan": "autopar.pipeline.plan",
    "Plan": "autopar.ir.plan",
    "PlanClient": "autopar.client",
    "build_model": "autopar.models",
    "evaluate": "autopar.cost.evaluate",
}


def test_all_is_explicit_and_complete() -> None:
    assert sorted(autopar.__all__) == sorted([*FACADE, "__version__"])
    assert dir(autopar) == sorted(autopar.__all__)


@pytest.mark.parametrize("name", sorted(FACADE))
def test_each_public_name_is_the_object_of_its_module(name: str) -> None:
    attribute = "build" if name == "build_model" else name
    assert getattr(autopar, name) is getattr(importlib.import_module(FACADE[name]), attribute)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Grpah'"):
        autopar.Grpah  # noqa: B018


def test_the_facade_builds_and_evaluates_a_model() -> None:
    graph = autopar.build_model("tiny-gpt")
    assert isinstance(graph, autopar.Graph)
    assert autopar.__version__ == importlib.import_module("autopar.version").__version__


def test_the_oneflow_bridge_keeps_its_names() -> None:
    bridge = importlib.import_module("autopar.bridges.oneflow")
    for name in bridge.__all__:
        module = bridge._LAZY[name]
        assert hasattr(importlib.import_module(module), name), (name, module)
