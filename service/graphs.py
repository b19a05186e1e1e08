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
import math
import threading
from typing import Any

from pydantic import ValidationError

from autopar.errors import AutoparError, GraphError
from autopar.ir.graph import Graph
from autopar.rules.check import check_graph_rules
from autopar_service.problems import ApiError
from autopar_service.schemas import GraphDoc
from autopar_service.settings import Settings

__all__ = [
    "MAX_TENSOR_BYTES",
    "bundled_model_of",
    "check_rules",
    "graph_data",
    "model_json",
    "neutral_graph_name",
    "parse_graph",
    "request_graph_name",
    "shared_graph_data",
    "shown_name",
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


ATTR_DEPTH = 4
"""Deepest nesting of one attr's value (``[[1, 2], [3, 4]]`` is 2)."""


def _attr_problem(value: Any, settings: Settings, depth: int = 1) -> str | None:
    """What makes one attr value too large (or not finite), else None."""
    if depth > ATTR_DEPTH:
        return f"nests deeper than {ATTR_DEPTH} levels, the most this server reads"
    if isinstance(value, float) and not math.isfinite(value):
        return "is not a finite number"
    if isinstance(value, str | list | dict) and len(value) > settings.max_attr_elements:
        return (
            f"has {len(value)} elements; this server reads at most {settings.max_attr_elements} "
            "(AUTOPAR_MAX_ATTR_ELEMENTS)"
        )
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    for child in children:
        problem = _attr_problem(child, settings, depth + 1)
        if problem is not None:
            return problem
    return None


def _check_attrs(data: dict[str, Any], settings: Settings) -> None:
    """Attrs and meta within the server's limits (422 ``attrs_too_large``, 413 ``meta_too_large``)."""
    for op in data.get("ops") or ():
        attrs = op.get("attrs") if isinstance(op, dict) else None
        if not isinstance(attrs, dict):
            continue
        name = str(op.get("name"))[:80]
        if len(attrs) > settings.max_attrs_per_op:
            raise GraphError(
                "attrs_too_large",
                f"op {name!r} has {len(attrs)} attrs; this server reads at most "
                f"{settings.max_attrs_per_op} (AUTOPAR_MAX_ATTRS_PER_OP)",
                op=name,
                limit=settings.max_attrs_per_op,
            )
        for attr, value in attrs.items():
            problem = _attr_problem(value, settings)
            if problem is not None:
                code = "non_finite_number" if "finite" in problem else "attrs_too_large"
                raise GraphError(code, f"op {name!r} attr {attr[:80]!r} {problem}", op=name)
    meta = data.get("meta")
    if meta:
        size = len(json.dumps(meta, separators=(",", ":")))
        if size > settings.max_meta_bytes:
            raise ApiError(
                413,
                "meta_too_large",
                f"the graph's meta has {size} bytes of JSON; this server reads at most "
                f"{settings.max_meta_bytes} (AUTOPAR_MAX_META_BYTES)",
                limit=settings.max_meta_bytes,
            )


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
_MODEL_LOCK = threading.RLock()


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
        return _model_bytes_locked(name)


def _model_bytes_locked(name: str) -> bytes:
    """:func:`model_json` under :data:`_MODEL_LOCK` (held by the caller)."""
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
    _check_attrs(data, settings)
    try:
        graph = Graph.from_dict(data).validate()
        graph = check_graph_rules(graph)
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


MAX_NAME_CHARS = 200
"""Longest graph name shown in an answer."""

_BUNDLED: dict[str, str] = {}
"""Content hash -> bundled model name, filled once per process (:func:`bundled_model_of`)."""


def neutral_graph_name(content_hash: str) -> str:
    """The name a stored graph (and its plan) carries when it is no bundled model's."""
    return f"graph-{content_hash[:12]}"


def bundled_model_of(content_hash: str) -> str | None:
    """The bundled model whose graph has this content hash, or None.

    Every bundled model is built and hashed once per process (all of them in 0.8 s), under the
    lock of :func:`model_json`."""
    if not _BUNDLED:
        from autopar.models import MODEL_NAMES

        with _MODEL_LOCK:
            if not _BUNDLED:
                table = {}
                for name in MODEL_NAMES:
                    table[Graph.from_json(_model_bytes_locked(name)).content_hash()] = name
                _BUNDLED.update(table)
    return _BUNDLED.get(content_hash)


def shared_graph_data(data: dict[str, Any] | str, content_hash: str) -> dict[str, Any]:
    """The graph as stored under its content hash for the workers: no metadata, and a name.

    A bundled model's name (``mt5-base``: public) is kept only for that model's content: a
    request naming the bundled model, or sending its graph under any name.  Any other graph is
    named ``graph-{hash[:12]}``: its name belongs to the request (another client sending the same
    content must not read it, nor get a bundled model's name for it), and each request's answer
    shows its own (:func:`request_graph_name`).  Names are not part of the plan key.
    """
    document = graph_data(data)
    shared = {k: v for k, v in document.items() if k != "meta"}
    if isinstance(data, str):
        shared["name"] = data  # the bundled model itself
    else:
        shared["name"] = bundled_model_of(content_hash) or neutral_graph_name(content_hash)
    return shared


def request_graph_name(data: Any, content_hash: str) -> str | None:
    """The name a request gives its graph, for its own answer; None: the stored name stands (a
    bundled model's content keeps the model's name; a bundled model's name on other content is
    not shown; a graph without a name is ``graph-{hash}``)."""
    from autopar.models import MODEL_NAMES

    if not isinstance(data, dict):
        return None
    name = data.get("name")
    if not isinstance(name, str) or not name.strip() or name in MODEL_NAMES:
        return None
    if bundled_model_of(content_hash) is not None:
        return None
    return name[:MAX_NAME_CHARS]


def shown_name(name: str | None) -> str | None:
    """A name a client asks to see on a plan's answer (``?name=``), or None when it may not be
    shown: a bundled model's name is its model's alone."""
    from autopar.models import MODEL_NAMES

    if not name or not name.strip() or name in MODEL_NAMES:
        return None
    return name[:MAX_NAME_CHARS]
