"""Solve memo: the best verified plan of a problem and the best bound proven on it.

The cost-table memo makes a repeated request's tables cheap (section Cost
tables of ``benchmarks/README.md``); the solve itself -- reductions, heuristic,
the sweeps that prove the bound -- would still take seconds.  This memo keeps,
per problem, what a solve found:

* the plan with the least objective (the iteration time: K micro-batches plus once
  per step) that the evaluator verified (one signature
  index per op, in the op's cost-table order),
* the greatest lower bound any solve proved for the problem (a bound proven
  with some of the memory rows is a bound of the problem with all of them: it
  bounds a relaxation),
* the memory rows (activation positions) the plan was solved with.

An entry without memory rows also serves other budgets: its bound is one of the
problem without memory rows, a relaxation of the problem under any budget, so
a request under a budget its plan fits is answered from it (the planner keeps
such an entry under the key without a budget).

A problem is keyed by what determines its numbers: the graph's content hash and
its ops in topological order (memory liveness follows it), the mesh and cluster,
the ZeRO stage, the runtime profile, the cost model (its version and the digest
of its source files, as every cost-table key), the memory budget and the
iteration priced (micro-batches and checkpointing, in the solver options the
planner passes: ``solver/planner/recall.py``); and by the
solver options that choose how it is solved (seed, hint, reductions, model
size), so a request that tries another way is not answered with the default
way's plan.  The time limit and the requested gap are not in the key: they say
how long to solve, not what.  A caller that asks for a new solve (the
service's ``refresh``) starts from the entry instead of being answered by it.  A recalled plan is
never trusted: the planner re-checks it with the evaluator, iteration time and
memory, like any solver result, and drops the entry when it does not verify.
When the recalled gap is within the requested one the solve is skipped;
otherwise the solve starts from the recalled plan, its memory rows and its
bound, and what it proves is stored back, merged with what is stored by then:
with a store that can compare and set (every store here), two solves of one
problem that finish together each keep what they proved.

Values are zlib-compressed JSON (never pickle), as every value in the store.
"""

from __future__ import annotations

import hashlib
import json
import math
import zlib
from dataclasses import dataclass
from typing import Any

from autopar.cost.model_version import COST_MODEL_VERSION, model_digest
from autopar.cost.tables import CostTables
from autopar.infra.store import KeyValueStore, SwappableStore

__all__ = ["MEMO_VERSION", "REMEMBER_ATTEMPTS", "MemoEntry", "memo_keys", "merged", "remember"]

MEMO_VERSION = 1
"""Bumped when an entry's meaning changes (old entries are then never looked up)."""


@dataclass(frozen=True)
class MemoEntry:
    """What solves proved about one problem."""

    choices: dict[str, int]
    """Op name -> index of its signature in the op's cost table: the best verified plan."""
    positions: list[int]
    """Topological positions whose memory rows the plan was solved with."""
    objective: float
    """The plan's objective, its iteration time (K micro-batches plus once per step), seconds."""
    bound: float
    """Greatest proven lower bound on the problem's optimum, seconds."""

    @property
    def gap(self) -> float:
        """``(objective - bound) / objective`` (0 when the objective is 0)."""
        if self.objective <= 0:
            return 0.0
        return max(0.0, (self.objective - self.bound) / self.objective)

    def to_bytes(self) -> bytes:
        data = {
            "version": MEMO_VERSION,
            "choices": self.choices,
            "positions": self.positions,
            "objective": self.objective,
            "bound": self.bound,
        }
        return zlib.compress(json.dumps(data, sort_keys=True).encode(), 1)

    @classmethod
    def from_bytes(cls, raw: bytes) -> MemoEntry | None:
        """The entry, or None when ``raw`` is not one (another version, damaged)."""
        try:
            data = json.loads(zlib.decompress(raw))
        except (zlib.error, ValueError, UnicodeDecodeError):
            return None
        if not isinstance(data, dict) or data.get("version") != MEMO_VERSION:
            return None
        choices, positions = data.get("choices"), data.get("positions")
        objective, bound = _number(data.get("objective")), _number(data.get("bound"))
        if not (
            isinstance(choices, dict)
            and all(isinstance(k, str) and type(v) is int and v >= 0 for k, v in choices.items())
            and isinstance(positions, list)
            and all(type(p) is int and p >= 0 for p in positions)
            and objective is not None
            and bound is not None
            and bound <= objective
        ):
            return None
        return cls(dict(choices), list(positions), objective, bound)


def _number(value: Any) -> float | None:
    """``value`` as a finite float, or None when it is not a finite number."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def memo_keys(
    tables: CostTables, budget_bytes: int | None, solver: dict[str, Any] | None = None
) -> tuple[str, str]:
    """Content keys of the problem ``tables`` and ``budget_bytes`` define and of the same
    problem without a budget (see the module doc), both also of ``solver``: the options that
    choose how it is solved (not how long).  The graph is hashed once for both."""
    graph = tables.graph
    base = hashlib.sha256()
    head = {
        "memo": MEMO_VERSION,
        "cost_model": COST_MODEL_VERSION,
        "model": model_digest(),
        "graph": graph.content_hash(),
        "mesh": tables.mesh.key(),
        "zero": tables.zero_stage,
        "runtime": tables.runtime.key(),
        "solver": solver,
    }
    base.update(json.dumps(head, sort_keys=True, default=str).encode())
    for op in graph.topological_order:  # memory liveness follows this order
        base.update(b"\0" + op.name.encode())

    def under(budget: int | None) -> str:
        h = base.copy()
        h.update(f"\0budget={budget}".encode())
        return "solve:" + h.hexdigest()[:40]

    return under(budget_bytes), under(None)


def merged(entry: MemoEntry, before: MemoEntry | None) -> MemoEntry:
    """What ``entry`` and ``before`` (both of one problem) prove together: the plan with
    the smaller iteration time, the greater of the two bounds (at most that plan's)."""
    if before is None:
        return entry
    plan = entry if entry.objective <= before.objective else before
    return MemoEntry(
        plan.choices, plan.positions, plan.objective, min(plan.objective, max(entry.bound, before.bound))
    )


REMEMBER_ATTEMPTS = 5
"""How often :func:`remember` reads again and merges when another writer got in between."""


def remember(
    store: KeyValueStore, key: str, entry: MemoEntry, read: bytes | None, *, rejected: bool = False
) -> bool:
    """Store what is now known at ``key``: ``entry`` merged (:func:`merged`) with the value
    there, ``read`` as the caller read it (None: absent).  True when written; False when
    ``entry`` proves nothing new, or when the store kept changing under every attempt.

    With a :class:`~autopar.infra.store.SwappableStore` the merged value replaces exactly the value
    read; when another writer stored something in between, that value is read and merged in
    turn (at most :data:`REMEMBER_ATTEMPTS` times), so neither writer's plan or bound is
    lost.  ``rejected``: the caller found ``read`` wrong (its plan did not verify), so it is
    replaced, not merged; a value written since is trusted like any entry (it is re-checked
    when recalled).  Other stores are simply overwritten with the merge.
    """
    swap = store if isinstance(store, SwappableStore) else None
    current = read
    for _ in range(REMEMBER_ATTEMPTS):
        before = None if rejected and current == read else _entry_or_none(current)
        value = merged(entry, before)
        if before is not None and value == before:
            return False
        if swap is None:
            store.put_many({key: value.to_bytes()})
            return True
        if swap.compare_and_set(key, current, value.to_bytes()):
            return True
        current = store.get_many([key]).get(key)
    return False


def _entry_or_none(raw: bytes | None) -> MemoEntry | None:
    return None if raw is None else MemoEntry.from_bytes(raw)
