"""The evaluator in a child process, stopped at a time limit.

The re-check of a plan lifted onto the requested mesh (:mod:`.squeeze`) must not run
past the deadline, and :func:`autopar.cost.evaluate.evaluate` cannot be interrupted: it runs
in a forked child, killed when the time is up.
"""

from __future__ import annotations

import math
from typing import Any

from autopar.cost.evaluate import evaluate
from autopar.ir.graph import Graph
from autopar.ir.plan import Plan

__all__ = ["RECHECK_MIN_S", "evaluate_within"]

RECHECK_MIN_S = 0.5
"""Fewest seconds worth starting the re-check on the requested mesh with."""


def evaluate_within(graph: Graph, plan_obj: Plan, seconds: float) -> Any:
    """``evaluate(graph, plan_obj)``, or None when it does not finish within ``seconds``
    (then it runs in a forked child that is killed at the limit)."""
    if math.isinf(seconds):
        return evaluate(graph, plan_obj)
    if seconds < RECHECK_MIN_S:
        return None
    import multiprocessing

    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_evaluate_child, args=(graph, plan_obj, send), daemon=True)
    child.start()
    send.close()
    try:
        if not receive.poll(seconds):
            return None
        try:
            ok, value = receive.recv()
        except EOFError:  # the child was killed (e.g. out of memory): no re-check
            return None
        if not ok:
            raise value
        return value
    finally:
        receive.close()
        if child.is_alive():
            child.kill()
        child.join()


def _evaluate_child(graph: Graph, plan_obj: Plan, send: Any) -> None:
    try:
        send.send((True, evaluate(graph, plan_obj)))
    except Exception as exc:  # the parent raises it
        send.send((False, exc))
    send.close()
