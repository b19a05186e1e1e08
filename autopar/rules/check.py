"""Every op's sharding rule tried once on a graph, so a graph no rule can read is refused on loading.

:func:`check_graph_rules` runs each op's rule (signatures and FLOPs) on a two-device mesh:
an op its rule cannot read (a rank-0 tensor where it needs dims, a renamed port, an attr of
the wrong type) is :class:`GraphError` ``op_unsupported`` naming it, a zero-size tensor of a
matmul-like op or a zero-size parameter ``bad_shape``, shapes its family's check refuses
(:mod:`autopar.rules.shapes`: matmul dims, reshape element counts, broadcasts, a ``shape``
attr its output does not have)
``shape_mismatch``, instead of a failure inside a solve or a plan of a graph that cannot run.
Importing :mod:`autopar.rules` registers it with :func:`autopar.ir.graph.register_validator`,
so :meth:`Graph.validate` runs it wherever the rules are loaded (every planning path: the
planner, the cost tables, the evaluator); the command line
(:func:`autopar.cli.args.graph_from_arg`) and the service (``autopar_service.graphs``)
call it as well.  A graph is checked once (``Graph.rules_checked``).  It lives beside the
rules, registered, rather than imported by the graph module: the rules import that module.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from autopar.errors import GraphError
from autopar.infra.collector import collector_paused
from autopar.ir.graph import Graph, Op, TensorSpec, register_validator
from autopar.rules.registry import CostKind, Rule, RuleContext, default_rules, nd_signatures
from autopar.rules.shapes import SHAPE_ATTR, shape_attr_problem, shape_problem

__all__ = ["check_graph_rules"]

_PROBE_MESH = (2,)
"""Mesh the rules are tried on: the smallest one on which a rule splits something."""


def check_graph_rules(graph: Graph) -> Graph:
    """Raise :class:`GraphError` when an op's rule cannot read ``graph`` (see the module); return it."""
    if not graph.rules_checked:
        with collector_paused():
            _probe_rules(graph)
        graph.rules_checked = True
    return graph


def _check_not_empty(op: Op, specs: Iterable[TensorSpec], what: str) -> None:
    """Refuse a zero-size tensor (a 0 in its shape) where ``what`` cannot have one."""
    for spec in specs:
        if 0 in spec.shape:
            raise GraphError(
                "bad_shape",
                f"op {op.name!r} ({op.type}): tensor {spec.name!r} has shape {list(spec.shape)}, with no "
                f"elements, which {what} cannot have; check the exported shapes",
                op=op.name,
                tensor=spec.name,
            )


def _op_signature_key(graph: Graph, op: Op) -> tuple[Any, ...]:
    """What a rule's outcome depends on: type, ports with their tensors' shapes and dtypes, attrs."""
    ports = tuple(
        (port, graph.tensors[t].shape, graph.tensors[t].dtype)
        for port, t in (*op.inputs.items(), ("->", ""), *op.outputs.items())
        if t
    )
    return op.type, ports, json.dumps(op.attrs, sort_keys=True, default=repr)


def _check_shapes(ctx: RuleContext) -> None:
    """The op's family's shape check (:mod:`autopar.rules.shapes`): ``shape_mismatch`` naming the dims."""
    try:
        problem = shape_problem(ctx)
    except Exception:  # a check that cannot read the op: the rule's probe below says why
        problem = None
    if problem is not None:
        raise GraphError(
            "shape_mismatch",
            f"op {ctx.op.name!r} ({ctx.op.type}) {problem}; check the exported shapes",
            op=ctx.op.name,
        )


def _check_shape_attr(graph: Graph, op: Op) -> None:
    """``shape_mismatch`` naming the op and its ``shape`` attr when the attr is not its output's
    shape (:func:`autopar.rules.shapes.shape_attr_problem`): a reshape to ``[8, 32, 4, 16]``
    whose output tensor is ``[8, 32, 64]`` was planned on the tensor's shape, silently."""
    problem = shape_attr_problem(op, tuple(graph.output_specs(op)))
    if problem is not None:
        raise GraphError(
            "shape_mismatch",
            f"op {op.name!r} ({op.type}) {problem}; export the attr and the tensor alike",
            op=op.name,
            attr=SHAPE_ATTR,
        )


def _probe_rules(graph: Graph) -> None:
    """Run every op's sharding rule once on a two-device mesh: an op its rule cannot read (a
    rank-0 tensor where it needs dims, a renamed port, an attr of the wrong type) is refused
    here with ``op_unsupported`` instead of failing inside a solve.  Ops alike (every layer
    of a transformer) are tried once; op types without a rule are replicated, which works."""
    for v in graph.variables:
        _check_not_empty(graph.op_by_name[v.op], (graph.tensors[v.tensor],), "a parameter")
    rules = default_rules()
    seen: set[tuple[Any, ...]] = set()
    for op in graph.ops:
        rule = rules.get(op.type)
        if rule is not None:
            _probe_op(graph, op, rule, seen)
        _check_shape_attr(graph, op)


def _probe_op(graph: Graph, op: Op, rule: Rule, seen: set[tuple[Any, ...]]) -> None:
    """``op``'s rule and its family's shape check, unless an op alike was probed (``seen``)."""
    key = _op_signature_key(graph, op)
    if key in seen:
        return
    seen.add(key)
    ctx = RuleContext(op, tuple(graph.input_specs(op)), tuple(graph.output_specs(op)), _PROBE_MESH)
    if rule.cost is CostKind.MATMUL:
        _check_not_empty(op, (*ctx.inputs, *ctx.outputs), "a matmul-like op")
    try:
        nd_signatures(rule, ctx)
        if rule.flops is not None:
            rule.flops(ctx)
    except Exception as exc:  # any failure of a rule on this op is a property of the graph
        text = f"{type(exc).__name__}: {exc}"
        raise GraphError(
            "op_unsupported",
            f"op {op.name!r} ({op.type}): its sharding rule cannot read it "
            f"({text if len(text) <= 200 else text[:197] + '...'}); "
            "check its ports, shapes and attributes against the graph format",
            op=op.name,
        ) from None
    _check_shapes(ctx)


register_validator(check_graph_rules)
