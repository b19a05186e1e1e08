"""Baseline plans of the bundled tiny models, built once per test session (they are slow to build)."""

from __future__ import annotations

import functools

from autopar.baselines.plans import baseline_plan
from autopar.hardware.cluster import Cluster
from autopar.hardware.mesh import Mesh
from autopar.ir.graph import Graph
from autopar.ir.plan import Plan
from autopar.models import build

MESH = Mesh(Cluster.parse("2x4"), (4, 2))


@functools.cache
def model(name: str) -> Graph:
    return build(name)


@functools.cache
def _baseline_dict(name: str, kind: str, zero: int) -> str:
    return baseline_plan(kind, model(name), MESH, zero).to_json()


def baseline(name: str, kind: str, zero: int) -> Plan:
    """A fresh copy (tests may edit it) of the ``kind`` baseline of model ``name`` on ``MESH``."""
    return Plan.from_json(_baseline_dict(name, kind, zero))
