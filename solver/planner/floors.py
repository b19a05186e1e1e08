"""Stage 3: memory floors: the least memory any plan needs, and the infeasibility proof.

Every memory row (:mod:`.memory_rows`) is at least its terms at their smallest: a row
whose floor is over the budget proves that nothing fits, without a solve.  The largest
floor also picks the position constrained from the first memory round, and says whether
memory binds (then the rounds share the time).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import numpy as np

from autopar.cost.iteration import candidate_blocks
from autopar.cost.tables import CostTables
from autopar.cost.weighted_tables import training_of
from autopar.errors import InfeasibleError, TimeLimitError
from autopar.hardware.mesh import Mesh
from autopar.infra.progress import Deadline
from autopar.ir.graph import DTYPE_BYTES
from autopar_solver.options import SolverOptions
from autopar_solver.planner.memory_rows import build_problem, state_terms, zero3_buffer_bytes
from autopar_solver.planner.recompute import least_spans

__all__ = [
    "ROUND_SHARE_FLOOR",
    "SEED_ROW_FRACTION",
    "MemorySeed",
    "memory_floors",
    "memory_seed",
    "raise_infeasible",
    "remedies",
]

log = logging.getLogger("autopar.planner")

SEED_ROW_FRACTION = 0.8
"""With a budget, the position of the largest memory floor is constrained from the first
round when its floor is at least this fraction of the budget (it is usually the peak)."""
ROUND_SHARE_FLOOR = 0.5
"""Rounds share the time only when the largest memory floor is at least this fraction of
the budget; below it the first round's plan almost always fits and gets all the time."""


@dataclass
class MemorySeed:
    """What the floors decide before the first memory round."""

    positions: list[int] = field(default_factory=list)
    """Positions constrained from the first round (the likely peak, or none)."""
    binds: bool = False
    """True when memory floors come near the budget: then rounds share the time."""


def memory_seed(tables: CostTables, budget: int | None, mesh: Mesh, deadline: Deadline) -> MemorySeed:
    """The memory floors against ``budget``: :class:`InfeasibleError` when one is over it
    (proven), else the positions to constrain from the first round."""
    seed = MemorySeed()
    if budget is None:
        return seed
    floors = memory_floors(tables, deadline)
    worst = int(np.argmax(floors)) if len(floors) else 0
    if len(floors) and floors[worst] > budget:
        raise_infeasible(tables, budget, seed.positions, mesh, deadline, floors)
    if len(floors) and floors[worst] >= SEED_ROW_FRACTION * budget:
        seed.positions.append(worst)  # the likely peak: constrained from the first round
    seed.binds = bool(len(floors)) and floors[worst] >= ROUND_SHARE_FLOOR * budget
    return seed


def memory_floors(tables: CostTables, deadline: Deadline | None = None) -> np.ndarray:
    """Bytes per device that every plan needs at each topological position, at least.

    The memory row of position ``p`` (see :func:`build_problem`) is the ZeRO-3 gather
    buffer, plus every variable's model states, plus each activation live at ``p``, plus
    the boxed copies its op receives.  Each term is at least its smallest value over the
    choices (a boxed copy at least 0), so the row is at least the sum of those minima::

        floor[p] = sum_v min_a states_v(a) + sum_(t live at p) min_a bytes_t(a)

    (bytes).  A floor over the budget proves that no plan fits; the largest floor is the
    least budget worth trying.  Raises :class:`TimeLimitError` when ``deadline`` runs out
    first (a 100k-op graph takes seconds)."""
    order = tables.graph.topological_order
    index = {op.name: i for i, op in enumerate(order)}
    base = sum(float(t.min()) for t in state_terms(tables, index).values())
    if tables.zero_stage >= 3:
        base += zero3_buffer_bytes(tables)
    change = np.zeros(len(order) + 1)
    _check_floors(deadline, "model states")
    _add_least_activations(tables, change, deadline)
    return base + np.cumsum(change[:-1])


def _add_least_activations(tables: CostTables, change: np.ndarray, deadline: Deadline | None) -> None:
    """Each activation at its least bytes (its output's largest split), added to ``change``
    where it becomes live and taken off after its last use."""
    graph = tables.graph
    # checkpointing: recomputed tensors twice; under auto each tensor's least spans
    spans = least_spans(tables)
    # identical layers share op tables: the largest split of an output port, once per table
    most_split: dict[tuple[int, int], int] = {}
    mesh_shape = tables.mesh.shape
    for n, (tname, start, end) in enumerate(spans):
        if n % 4096 == 4095:
            _check_floors(deadline, f"{n} of {len(spans)} activations")
        pname, out_port = graph.producer[tname]
        k = list(graph.op_by_name[pname].outputs).index(out_port)
        table = tables.ops[pname]
        split = most_split.get((id(table), k))
        if split is None:
            split = most_split[(id(table), k)] = max(
                s.outputs[k].split_factor(mesh_shape) for s in table.signatures
            )
        spec = graph.tensors[tname]
        least = spec.numel * DTYPE_BYTES[spec.dtype] / split
        change[start] += least
        change[end + 1] -= least


def _check_floors(deadline: Deadline | None, done: str) -> None:
    if deadline is not None and deadline.expired():
        raise TimeLimitError(
            "time_limit",
            f"the time limit ({round(deadline.limit_s, 2):g} s) ran out while computing the memory floors "
            f"after the cost tables ({done} done); raise the time limit",
            phase="memory_floors",
        )


def raise_infeasible(
    tables: CostTables,
    budget: int | None,
    positions: list[int],
    mesh: Mesh,
    deadline: Deadline,
    floors: np.ndarray | None = None,
) -> None:
    """Raise :class:`InfeasibleError` with the least memory needed: the largest memory
    floor when it is over the budget (proven at once), else CP-SAT's least peak over the
    constrained positions, searched for the time left."""
    from autopar_solver.cpsat import min_feasible_memory

    floors = memory_floors(tables) if floors is None else floors
    floor = float(floors.max()) if len(floors) else 0.0
    if budget is not None and floor > budget:
        min_bytes, proven, how = floor, True, "(proven: at least that at one liveness point)"
    else:
        left = deadline.left()
        built = build_problem(tables, budget, positions or [int(np.argmax(floors)) if len(floors) else 0])
        try:
            min_bytes, proven = min_feasible_memory(
                built.problem, SolverOptions(time_limit_s=min(10.0, max(0.2, left)), workers=1)
            )
        except Exception as exc:
            log.warning("could not compute the smallest feasible memory: %s", exc)
            min_bytes, proven = float("nan"), False
        how = "(proven)" if proven else "(lower bound at the constrained liveness points)"
    raise InfeasibleError(
        None,
        f"no plan on mesh {list(mesh.shape)} fits {human_bytes(budget or 0)} per device; "
        f"the smallest memory found feasible is {human_bytes(min_bytes)} {how}; try {remedies(tables)}",
        min_feasible_bytes=math.ceil(min_bytes) if math.isfinite(min_bytes) else None,
        proven=proven,
        mesh_shape=list(mesh.shape),
    )


def remedies(tables: CostTables) -> str:
    """What may make a plan fit, where it applies: a larger budget; a higher ZeRO stage (below
    3); recomputation (``--checkpointing auto`` or ``full``, when the graph has blocks and the
    request recomputes none or only attention cores); pipeline stages (``--stages``, when the
    graph has two blocks or more to cut over several devices); more devices."""
    ways = ["--memory"]
    if tables.zero_stage < 3:
        ways.append(f"--zero {tables.zero_stage + 1}")
    blocks = candidate_blocks(tables.graph)
    if blocks and training_of(tables).checkpointing in ("off", "selective"):
        ways.append("--checkpointing auto (or full)")
    cluster = tables.mesh.cluster
    if len(blocks) >= 2 and cluster.world_size > 1:  # --stages auto on one node plans one stage
        ways.append(f"--stages {'auto' if cluster.nodes > 1 else 2}")
    ways.append("more devices")
    return ", ".join(ways[:-1]) + f", or {ways[-1]}"


def human_bytes(n: float) -> str:
    """``1.50 GiB`` / ``12.3 MiB`` / ``512 B``: sizes in error messages."""
    if not math.isfinite(n):
        return "unknown"
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"
