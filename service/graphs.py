"""Graphs from request bodies: parsed, validated and checked against the rules before a job exists.

:func:`parse_graph` turns *any* failure of the graph reader into a
:class:`GraphError` (422), caps the graph's size (413), refuses tensor sizes
that would overflow the cost model; :func:`check_rules` runs every op's sharding rule once on
a two-device mesh before a solve starts, so an op whose rule cannot read it (a renamed port, an
attribute of the wrong type) is refused up front instead of failing inside a
solve.  :func:`shared_graph_data` is the graph as stored for the workers: its
name and metadata belong to the request, not to the content-addressed record.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from autopar.errors import AutoparError, GraphError
from autopar.graph import Graph, Op
from autopar.rules.registry import RuleContext, default_rules, nd_signatures
from autopar_service.problems import ApiError
from autopar_service.schemas import GraphDoc
from autopar_service.settings import Settings

__all__ = ["MAX_TENSOR_BYTES", "check_rules", "parse_graph", "shared_graph_data"]

MAX_TENSOR_BYTES = 2**50
"""Largest logical tensor, bytes (1 PiB): far above any real model's tensor, far below
where float64 byte and FLOP counts lose integer precision (2**53)."""

_PROBE_MESH = (2,)
"""Mesh the rules are tried on: the smallest mesh on which a rule must split something."""


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 200 else text[:197] + "..."


def _check_counts(data: Any, settings: Settings) -> None:
    if not isinstance(data, dict):
        raise GraphError("bad_format", "the graph must be a JSON object")
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


def _op_shape(graph: Graph, op: Op) -> tuple[Any, ...]:
    """What a rule's outcome depends on: type, ports with their tensors' shapes and dtypes, attrs."""
    ports = tuple(
        (port, graph.tensors[t].shape, graph.tensors[t].dtype)
        for port, t in (*op.inputs.items(), ("->", ""), *op.outputs.items())
        if t
    )
    return op.type, ports, json.dumps(op.attrs, sort_keys=True, default=repr)


def check_rules(graph: Graph) -> None:
    """Run every op's sharding rule once on a two-device mesh; 422 naming the first op it fails on.

    Ops alike (same type, ports, shapes and attributes: every layer of a transformer)
    are checked once.
    """
    rules = default_rules()
    seen: set[tuple[Any, ...]] = set()
    for op in graph.ops:
        rule = rules.get(op.type)
        if rule is None:
            continue  # unknown op types are replicated, which always works
        shape = _op_shape(graph, op)
        if shape in seen:
            continue
        seen.add(shape)
        ctx = RuleContext(
            op=op,
            inputs=tuple(graph.tensors[t] for t in op.inputs.values()),
            outputs=tuple(graph.tensors[t] for t in op.outputs.values()),
            mesh_shape=_PROBE_MESH,
        )
        try:
            nd_signatures(rule, ctx)
            if rule.flops is not None:
                rule.flops(ctx)
        except Exception as exc:  # any failure of a rule on this op is a property of the graph
            raise GraphError(
                "op_unsupported",
                f"op {op.name!r} ({op.type}): its sharding rule cannot read it ({_short(exc)}); "
                "check its ports and attributes against the graph format",
                op=op.name,
            ) from None


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


def parse_graph(data: Any, settings: Settings) -> Graph:
    """The validated graph of a request body; 413 when too large, 422 naming the first problem.

    Call :func:`check_rules` as well before a solve is started for it.
    """
    _check_counts(data, settings)
    _check_types(data)
    try:
        graph = Graph.from_dict(data).validate()
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


def shared_graph_data(data: dict[str, Any], content_hash: str) -> dict[str, Any]:
    """The graph as stored under its content hash: a neutral name, no metadata."""
    shared = {k: v for k, v in data.items() if k != "meta"}
    shared["name"] = f"graph-{content_hash[:12]}"
    return shared
