"""Graphs from request bodies: parsed, validated and checked against the rules before a job exists.

:func:`parse_graph` turns *any* failure of the graph reader into a
:class:`GraphError` (422), caps the graph's size (413), refuses tensor sizes
that would overflow the cost model; the core's checks (:meth:`Graph.validate`: dim attrs,
variables listed once; :func:`autopar.rules.check.check_graph_rules`: every op's sharding
rule tried once on a two-device mesh) refuse a
graph a solve could not use before a job exists.  A request's ``graph`` may also name a
bundled model (:func:`graph_data`).  :func:`shared_graph_data` is the graph as stored for
the workers: its metadata and a private name belong to the request, not to the
content-addressed record; a bundled model's name travels with it, so the plan says
``mt5-base`` (the plan key ignores names).
"""

from __future__ import annotations

import difflib
import json
import threading
from typing import Any

from pydantic import ValidationError

from autopar.errors import AutoparError, GraphError
from autopar.graph import Graph
from autopar.rules.check import check_graph_rules
from autopar_service.problems import ApiError
from autopar_service.schemas import GraphDoc
from autopar_service.settings import Settings

__all__ = [
    "MAX_TENSOR_BYTES",
    "check_rules",
    "graph_data",
    "model_json",
    "parse_graph",
    "shared_graph_data",
]

MAX_TENSOR_BYTES = 2**50
"""Largest logical tensor, bytes (1 PiB): far above any real model's tensor, far below
where float64 byte and FLOP counts lose integer precision (2**53)."""


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 200 else text[:197] + "..."


def _check_counts(data: Any, settings: Settings) -> None:
    if not isinstance(data, dict):
        raise GraphError("bad_format", "the graph must be a JSON object or a bundled model's name")
    ops, tensors = data.get("ops"), data.get("tensors")
    if isinstance(ops, list) and len(ops) > settings.max_graph_ops:
        raise ApiError(
            413,
            "graph_too_large",
            f"the graph has {len(ops)} ops; this server plans at most {settings.max_graph_ops}",
            limit=settings.max_graph_ops,
        )
    if isinstance(tensors, dict) and len(tensors) > settings.max_graph_tensors:
        raise ApiError(
            413,
            "graph_too_large",
            f"the graph has {len(tensors)} tensors; this server plans at most {settings.max_graph_tensors}",
            limit=settings.max_graph_tensors,
        )
    for field, kind in (("tensors", dict), ("ops", list), ("variables", list), ("meta", dict), ("name", str)):
        value = data.get(field)
        if value is not None and not isinstance(value, kind):
            what = "an object" if kind is dict else "a list" if kind is list else "a string"
            raise GraphError("bad_format", f"graph {field} must be {what}, got {type(value).__name__}")


def _check_sizes(graph: Graph) -> None:
    for t in graph.tensors.values():
        if t.nbytes > MAX_TENSOR_BYTES:
            raise GraphError(
                "tensor_too_large",
                f"tensor {t.name!r} ({len(t.shape)} dims) has more than {MAX_TENSOR_BYTES} bytes; "
                "check its dims",
                tensor=t.name,
            )


def check_rules(graph: Graph) -> None:
    """Every op's sharding rule reads the graph; 422 naming the first op it fails on.

    :func:`parse_graph` ran it already (:func:`autopar.rules.check.check_graph_rules`, once
    per graph), so this call is then free.
    """
    check_graph_rules(graph)


def _check_types(data: dict[str, Any]) -> None:
    """Every field of the wire format has its documented JSON type (the OpenAPI ``GraphDoc``, strictly)."""
    try:
        GraphDoc.model_validate(data, strict=True)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise GraphError(
            "bad_format", f"graph.{where}: {first.get('msg', 'invalid')}", errors=exc.error_count()
        ) from None


_MODEL_JSON: dict[str, bytes] = {}
_MODEL_LOCK = threading.Lock()


def model_json(name: str) -> bytes:
    """A bundled model's graph as JSON bytes, built once per process and kept for every model.

    The bundled models are a fixed, small set (:data:`autopar.models.MODEL_NAMES`), so the
    cache has room for all of them: a client cycling through models never forces a rebuild.
    Built under a lock: concurrent first requests for one model build it once.
    """
    cached = _MODEL_JSON.get(name)
    if cached is not None:
        return cached
    with _MODEL_LOCK:
        cached = _MODEL_JSON.get(name)
        if cached is None:
            from autopar.models import build

            cached = _MODEL_JSON[name] = build(name).to_json().encode()
    return cached


def graph_data(data: Any) -> Any:
    """A request's ``graph`` as a document: a bundled model's name (``"tiny-gpt"``) is its graph."""
    if not isinstance(data, str):
        return data
    from autopar.models import MODEL_NAMES

    if data not in MODEL_NAMES:
        close = difflib.get_close_matches(data, MODEL_NAMES, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise GraphError(
            "unknown_model",
            f"graph {data[:80]!r} is not a bundled model; {hint}send a graph object or one of "
            f"{', '.join(MODEL_NAMES)}",
        )
    return json.loads(model_json(data))


def parse_graph(data: Any, settings: Settings) -> Graph:
    """The validated graph of a request body's ``graph`` (a document, or a bundled model's name);
    413 when too large, 422 naming the first problem (every op's rule is tried on it too:
    :meth:`Graph.validate`)."""
    data = graph_data(data)
    _check_counts(data, settings)
    _check_types(data)
    try:
        graph = check_graph_rules(Graph.from_dict(data).validate())
    except AutoparError:
        raise
    except Exception as exc:  # the reader's own checks missed it: still the client's graph
        raise GraphError("bad_format", f"malformed graph: {_short(exc)}") from None
    if not graph.ops:
        raise GraphError("empty_graph", "the graph has no ops; send a training-step graph")
    try:
        _check_sizes(graph)
    except (OverflowError, TypeError, ValueError) as exc:
        if isinstance(exc, AutoparError):
            raise
        raise GraphError("bad_shape", f"a tensor shape is not a list of sizes: {_short(exc)}") from None
    return graph


def shared_graph_data(data: dict[str, Any] | str, content_hash: str) -> dict[str, Any]:
    """The graph as stored under its content hash for the workers: no metadata, and a name.

    A bundled model's name (``mt5-base``: public) is kept, so the plan, its summary and its
    report say it; any other name belongs to the request (another client sending the same
    content must not read it) and the graph is named ``graph-{hash[:12]}``.  Names are not
    part of the plan key.
    """
    from autopar.models import MODEL_NAMES

    document = graph_data(data)
    shared = {k: v for k, v in document.items() if k != "meta"}
    name = document.get("name")
    shared["name"] = name if name in MODEL_NAMES else f"graph-{content_hash[:12]}"
    return shared
