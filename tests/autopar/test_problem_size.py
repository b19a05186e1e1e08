"""benchmarks/problem_size.py counts, without pricing, what the cost tables build."""

import pytest

from autopar.cost.build_tables import build_cost_tables
from autopar.hardware.cluster import Cluster
from autopar.hardware.mesh import Mesh
from autopar.models import build
from benchmarks.problem_size import problem_size


@pytest.mark.parametrize("shape", [(2, 2), (4,)])
def test_the_count_is_what_the_cost_tables_hold(shape: tuple[int, ...]) -> None:
    graph = build("tiny-gpt")
    tables = build_cost_tables(graph, Mesh(Cluster.parse("1x4", "a100-40g"), shape), 2)
    size = problem_size(graph, shape, 2)
    assert size["ops"] == len(graph.ops)
    assert size["choices"] == sum(len(t.signatures) for t in tables.ops.values())
    assert size["most_choices"] == max(len(t.signatures) for t in tables.ops.values())
    assert size["edges"] == len(tables.edges)
    assert size["edge_entries"] == sum(e.matrix.size for e in tables.edges)
