"""The service's graph checks accept every bundled model and refuse what the solver cannot use."""

from __future__ import annotations

import pytest

from autopar.errors import GraphError
from autopar.models import MODEL_NAMES, build
from autopar_service.body import json_depth
from autopar_service.graphs import check_rules, parse_graph, request_graph_name, shared_graph_data
from autopar_service.settings import Settings


@pytest.mark.parametrize("name", sorted(MODEL_NAMES))
def test_every_bundled_model_passes_the_request_checks(name: str, tmp_path) -> None:
    data = build(name).to_dict()
    graph = parse_graph(data, Settings(cache_dir=tmp_path))
    if len(graph.ops) < 1000:
        check_rules(graph)
    shared = shared_graph_data(data, graph.content_hash())
    assert "meta" not in shared and shared["name"] == name  # the plan keeps the display name
    assert parse_graph(shared, Settings(cache_dir=tmp_path)).content_hash() == graph.content_hash()


@pytest.mark.parametrize("name", [None, "graph", "client-a-private-model", "mt5-base"])
def test_a_graph_of_no_bundled_model_is_stored_under_its_hash(tmp_path, name) -> None:
    """Issue 43: whatever it is called (a bundled model's name included), content that is no
    bundled model's is stored as ``graph-{hash}``; its own name is its request's alone."""
    data = build("tiny-gpt").to_dict()
    data["ops"][5].setdefault("attrs", {})["note"] = "another model"
    if name is None:
        del data["name"]
    else:
        data["name"] = name
    graph = parse_graph(data, Settings(cache_dir=tmp_path))
    content = graph.content_hash()
    assert shared_graph_data(data, content)["name"] == f"graph-{content[:12]}"
    shown = request_graph_name(data, content)
    assert shown == (name if name in ("graph", "client-a-private-model") else None)


@pytest.mark.parametrize("name", [None, "my-gpt", "mt5-base"])
def test_a_bundled_model_keeps_its_name_for_its_content_alone(tmp_path, name) -> None:
    """tiny-gpt's content under any name is stored as ``tiny-gpt``; a request cannot give it
    another bundled model's name (``mt5-base``), for itself or for anyone."""
    data = build("tiny-gpt").to_dict()
    if name is None:
        del data["name"]
    else:
        data["name"] = name
    graph = parse_graph(data, Settings(cache_dir=tmp_path))
    assert shared_graph_data(data, graph.content_hash())["name"] == "tiny-gpt"
    assert request_graph_name(data, graph.content_hash()) is None


def test_a_bundled_model_name_is_its_graph(tmp_path) -> None:
    settings = Settings(cache_dir=tmp_path)
    graph = parse_graph("tiny-gpt", settings)
    assert graph.content_hash() == build("tiny-gpt").content_hash()
    assert shared_graph_data("tiny-gpt", graph.content_hash())["name"] == "tiny-gpt"
    with pytest.raises(GraphError) as err:
        parse_graph("tiny-gtp", settings)
    assert err.value.code == "unknown_model" and "did you mean 'tiny-gpt'" in err.value.message


def test_wire_types_are_strict(tmp_path) -> None:
    data = build("tiny-gpt").to_dict()
    data["ops"][0]["type"] = {}
    with pytest.raises(GraphError) as err:
        parse_graph(data, Settings(cache_dir=tmp_path))
    assert err.value.code == "bad_format" and "ops.0.type" in err.value.message


def test_json_depth_skips_strings_and_does_not_recurse() -> None:
    assert json_depth(b'{"a": [1, {"b": "[[[["}]}') == 3
    assert json_depth(b'"\\"[[["') == 0
    assert json_depth(b"[" * 100_000 + b"]" * 100_000) == 100_000


def _reference_depth(raw: bytes) -> tuple[int, bool]:
    """Deepest nesting by a plain character loop; True when a backslash outside a string ends it."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in raw.decode("latin-1"):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == "\\":
            return deepest, True
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest, False


def test_json_shape_agrees_with_a_character_loop_across_chunk_boundaries(monkeypatch) -> None:
    import random

    from autopar_service import body

    rng = random.Random(24)
    for chunk in (1, 2, 3, 7, 64):
        monkeypatch.setattr(body, "_SCAN_CHUNK", chunk)
        for _ in range(500):
            raw = bytes(rng.choice(b'[]{}"\\\\ab') for _ in range(rng.randint(1, 60)))
            deepest, stopped = _reference_depth(raw)
            got = body.json_shape(raw)[0]
            # past a backslash outside a string the parser stops: the scan may only say more
            assert got == deepest if not stopped else got >= deepest, (chunk, raw)


def test_json_shape_counts_graph_items() -> None:
    from autopar_service.body import json_shape

    raw = (
        b'{"graph": {"tensors": {"t": {"shape": [1]}}, "ops": [{"name": "{"}, {}], "variables": []}, "x": {}}'
    )
    assert json_shape(raw) == (5, 3)
