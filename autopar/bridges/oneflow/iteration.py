"""The training iteration of a OneFlow job: micro-batches per step and recomputed blocks.

A plan records the iteration it was solved for (``plan.training``: ``K`` micro-batches per
optimizer step, checkpointing ``off`` / ``full`` / ``auto``; see :mod:`autopar.cost.iteration`).
OneFlow 0.9's ``nn.Graph`` runs it when

* ``graph.config.set_gradient_accumulation_steps(K)``: the job conf's
  ``num_gradient_accumulation_steps``.  Building the job then inserts a ``repeat`` op after
  every variable (and every source's tick), an ``unpack`` after every input (the input holds
  ``K`` micro-batches), an ``acc`` op on every variable's gradient (``max_acc_num = K``)
  and a ``pack`` before every output (``GradAccTryInsertRepeatAfterVar`` and friends in the
  lazy op interpreter; ``gradient_accumulation_rewrite_pass.cpp`` does the same for jobs
  built elsewhere).  Ops downstream of a ``repeat`` / ``unpack`` run once per micro-batch;
  an ``acc`` output and what reads it (the gradient reduction into ZeRO's shard, the
  update) run once per step;
* ``graph.<module path>.to(GraphModule).activation_checkpointing = True`` on a block: the
  block's forward ops get the scope attribute ``checkpointing``; ``checkpointing_pass.cpp``
  copies each connected forward subgraph of such ops as
  ``Sys-Checkpointing-Fake-Fw-Op_<op>`` ops (``OneFlow-System-Checkpointing-Fake-Fw-Op_`` in
  later sources) in the backward pass and points the backward consumers at the copies.

This module maps a plan's recomputed layer scopes (:func:`autopar.ir.blocks.layer_of`
names, e.g. ``model.h.0`` for ops OneFlow names ``model.h.0.attn-...`` in a graph that holds
the module as ``model``) to modules, configures a graph, and reads both back from a built
or compiled job.  OneFlow is imported only where a graph is configured.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import Any

from autopar.bridges.oneflow.convert import input_bns
from autopar.cost.iteration import checkpoint_blocks
from autopar.errors import PlanError
from autopar.ir.blocks import layer_of
from autopar.ir.graph import Graph
from autopar.ir.plan import Plan
from autopar.ir.training import TrainingConfig

__all__ = [
    "ACCUMULATION_OP_TYPES",
    "FAKE_FORWARD_PREFIXES",
    "block_scopes",
    "checkpoint_modules",
    "configure_iteration",
    "graph_blocks",
    "is_recompute_op",
    "job_micro_batches",
    "job_recomputed_scopes",
    "job_training",
    "op_phases",
    "original_name",
    "plan_graph_recomputed",
    "plan_recomputed_scopes",
    "predicted_phases",
    "recompute_ops",
    "recomputed_scopes",
    "zero_gather_ops",
]

FAKE_FORWARD_PREFIXES = ("Sys-Checkpointing-Fake-Fw-Op_", "OneFlow-System-Checkpointing-Fake-Fw-Op_")
"""Name prefixes of the recompute copies ``checkpointing_pass.cpp`` makes (OneFlow 0.9, later)."""

ACCUMULATION_OP_TYPES = ("repeat", "acc", "unpack", "pack")
"""Op types gradient accumulation inserts: one micro-batch's graph has none of them."""

_BOXING_PREFIXES = ("System-Boxing-Middle-Identity", "Sys-Boxing-GroupIdentity")


def is_recompute_op(name: str) -> bool:
    """A recompute copy of a forward op (named by ``checkpointing_pass.cpp``)."""
    return name.startswith(FAKE_FORWARD_PREFIXES)


def original_name(name: str) -> str:
    """The forward op a recompute copy copies (``name`` itself for any other op)."""
    for prefix in FAKE_FORWARD_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


# ------------------------------------------------------------------ scopes <-> modules


def block_scopes(module: Any, graph_attr: str = "model") -> dict[str, str]:
    """Layer scope -> module path of every block of ``module`` (as the job names its ops).

    A block is a named submodule whose path ends at its first numeric component
    (``h.0``, ``encoder.block.3``: an element of a top-level ``ModuleList``); its scope is
    ``{graph_attr}.{path}``, what :func:`autopar.ir.blocks.layer_of` gives the ops inside
    it.  These are the scopes ``full`` checkpointing recomputes
    (:func:`autopar.cost.iteration.checkpoint_blocks` on the job's graph)."""
    out: dict[str, str] = {}
    for path, _ in module.named_modules():
        parts = path.split(".") if path else []
        numeric = [i for i, p in enumerate(parts) if p.isdigit()]
        if numeric and numeric[0] == len(parts) - 1:
            out[f"{graph_attr}.{path}" if graph_attr else path] = path
    return out


def checkpoint_modules(module: Any, scopes: Iterable[str], graph_attr: str = "model") -> dict[str, str]:
    """Scope -> module path for each recomputed layer scope of a plan.

    A scope names a module by its path with or without the graph's ``graph_attr`` prefix
    (``model.h.0`` or ``h.0``).  Raises :class:`PlanError` ``checkpoint_scope_unmatched``
    naming every scope that is no submodule of ``module`` (a plan for another model, or a
    scope that is no module such as ``(top level)``)."""
    paths = {path for path, _ in module.named_modules() if path}
    prefix = f"{graph_attr}." if graph_attr else ""
    found: dict[str, str] = {}
    missing: list[str] = []
    for scope in sorted(set(scopes)):
        path = scope[len(prefix) :] if prefix and scope.startswith(prefix) else scope
        if path in paths:
            found[scope] = path
        else:
            missing.append(scope)
    if missing:
        raise PlanError(
            "checkpoint_scope_unmatched",
            f"the plan recomputes {len(missing)} layer scope(s) with no module in the model: "
            f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''} (module paths are "
            f"named relative to the graph attribute {graph_attr!r}, e.g. {sorted(paths)[:3]})",
            scopes=missing,
        )
    return found


def recomputed_scopes(
    plan: Plan, every_block: Callable[[], Collection[str]], recompute: Collection[str] | None = None
) -> frozenset[str]:
    """The layer scopes ``plan`` recomputes: ``recompute`` when given, whatever the plan
    says; else none (``off``), ``every_block()`` (``full``) or the plan's own list
    (``auto``, :attr:`autopar.ir.training.TrainingConfig.recomputed`)."""
    if recompute is not None:
        return frozenset(recompute)
    mode = plan.training.checkpointing
    if mode == "off":
        return frozenset()
    if mode == "full":
        return frozenset(every_block())
    return frozenset(plan.training.recomputed)


def plan_recomputed_scopes(
    plan: Plan, module: Any, graph_attr: str = "model", recompute: Collection[str] | None = None
) -> frozenset[str]:
    """:func:`recomputed_scopes` of a model: ``full`` is every block module (:func:`block_scopes`)."""
    return recomputed_scopes(plan, lambda: block_scopes(module, graph_attr), recompute)


def configure_iteration(
    graph: Any, micro_batches: int, module_paths: Iterable[str], graph_attr: str = "model"
) -> None:
    """Set ``K`` and activation checkpointing on an unbuilt ``nn.Graph`` (OneFlow 0.9).

    ``graph.config.set_gradient_accumulation_steps(K)`` when ``K > 1``; for each module
    path (relative to the module the graph holds as ``graph_attr``)
    ``<its GraphModule>.activation_checkpointing = True``."""
    from oneflow.nn.graph import GraphModule

    if micro_batches > 1:
        graph.config.set_gradient_accumulation_steps(micro_batches)
    for path in module_paths:
        proxy = getattr(graph, graph_attr)
        for part in path.split("."):
            proxy = proxy[int(part)] if part.isdigit() else getattr(proxy, part)
        proxy.to(GraphModule).activation_checkpointing = True


# ------------------------------------------------------------------ reading a job back


def job_micro_batches(job: Any) -> int:
    """``K``: the job conf's ``num_gradient_accumulation_steps`` (1 when unset)."""
    conf = job.job_conf
    return (
        max(1, int(conf.num_gradient_accumulation_steps))
        if conf.HasField("num_gradient_accumulation_steps")
        else 1
    )


def job_recomputed_scopes(job: Any) -> list[str]:
    """Sorted layer scopes (:func:`autopar.ir.blocks.layer_of`) of the forward ops a job
    recomputes: those its recompute copies (:data:`FAKE_FORWARD_PREFIXES`) copy, less
    OneFlow's own ``System-`` ops (a ZeRO cast inside a recomputed block is copied too),
    the blocks only (scopes with a numeric component, as
    :func:`autopar.cost.iteration.checkpoint_blocks` keeps)."""
    scopes = set()
    for op in job.net.op:
        if is_recompute_op(op.name):
            original = original_name(op.name)
            if not original.startswith(("System-", "Sys-")):
                scopes.add(layer_of(original))
    return sorted(s for s in scopes if any(p.isdigit() for p in s.split(".")))


def graph_blocks(graph: Graph) -> frozenset[str]:
    """The blocks ``full`` checkpointing recomputes in an imported job's graph:
    :func:`autopar.cost.iteration.checkpoint_blocks`, less the scopes of ``nn.Graph``'s own input
    and output ops (``_TrainGraph_0_input.0.0_2`` has a numeric component but is no module:
    OneFlow never recomputes it) and of OneFlow's system ops (a compiled job's
    ``Sys-Boxing-GroupIdentity-...``)."""
    every = checkpoint_blocks(graph, TrainingConfig(1, "full"))
    return frozenset(b for b in every if not b.startswith(("_", "Sys-", "System-")))


def job_training(job: Any, graph: Graph | None = None) -> dict[str, Any]:
    """The iteration a built or compiled job runs: ``micro_batches``, ``checkpointing`` and
    ``recomputed_blocks``.  The mode is ``off`` when nothing is recomputed, ``full`` when
    every block of ``graph`` (:func:`graph_blocks`, the job's imported graph) is, else
    ``auto`` (a subset: the recomputed list says which)."""
    blocks = job_recomputed_scopes(job)
    mode = "off"
    if blocks:
        every = graph_blocks(graph) if graph is not None else None
        mode = "full" if every is not None and set(blocks) == set(every) else "auto"
    return {"micro_batches": job_micro_batches(job), "checkpointing": mode, "recomputed_blocks": blocks}


def _data_inputs(op: Any, lbns: Any) -> list[str]:
    return [lbn.split("/", 1)[0] for _, lbn in input_bns(op, lbns)]


def op_phases(job: Any) -> dict[str, str]:
    """Op name -> ``micro`` (runs once per micro-batch) or ``step`` (once per optimizer step).

    As OneFlow's time shapes: variables, inputs and other sources run once per step; a
    ``repeat`` or ``unpack`` output once per micro-batch, an ``acc`` or ``pack`` output
    once per step; any other op once per micro-batch when one of its inputs is.  A job
    without accumulation (``K = 1``) runs everything once per micro-batch (= step)."""
    if job_micro_batches(job) <= 1:
        return {op.name: "micro" for op in job.net.op}
    lbns = job.helper.lbn2logical_blob_desc
    ops = {op.name: op for op in job.net.op}
    inputs = {name: _data_inputs(op, lbns) for name, op in ops.items()}
    phase: dict[str, str] = {}

    def type_of(op: Any) -> str:
        return op.user_conf.op_type_name if op.WhichOneof("op_type") == "user_conf" else ""

    def visit(name: str) -> str:
        stack = [name]
        while stack:
            top = stack[-1]
            if top in phase:
                stack.pop()
                continue
            pending = [p for p in inputs.get(top, []) if p in ops and p not in phase and p != top]
            if pending:
                stack.extend(pending)
                continue
            kind = type_of(ops[top])
            if kind in ("repeat", "unpack"):
                phase[top] = "micro"
            elif kind in ("acc", "pack") or not inputs.get(top):
                phase[top] = "step"
            else:
                phase[top] = "micro" if any(phase.get(p) == "micro" for p in inputs[top]) else "step"
            stack.pop()
        return phase[name]

    for name in ops:
        visit(name)
    return phase


def recompute_ops(job: Any) -> set[str]:
    """The recompute copies, the boxing ops OneFlow inserted that only feed them, and the
    boxing ops that read a copy's output (they box a recomputed tensor: a backward op that
    shares such a boxing with a copy reads it in place of the forward's)."""
    copies = _with_feeding_boxing(job, {op.name for op in job.net.op if is_recompute_op(op.name)})
    lbns = job.helper.lbn2logical_blob_desc
    boxing = [op for op in job.net.op if op.name.startswith(_BOXING_PREFIXES)]
    changed = True
    while changed:
        changed = False
        for op in boxing:
            if op.name not in copies and any(p in copies for p in _data_inputs(op, lbns)):
                copies.add(op.name)
                changed = True
    return copies


def zero_gather_ops(job: Any) -> set[str]:
    """ZeRO's parameter casts (``System-ZeRO-ParallelCast``, and their recompute copies), and
    the boxing ops that only feed them: a hop into one of these is a ZeRO parameter gather."""
    casts = {op.name for op in job.net.op if original_name(op.name).startswith("System-ZeRO-")}
    return _with_feeding_boxing(job, casts)


def _with_feeding_boxing(job: Any, targets: set[str]) -> set[str]:
    """``targets`` and every boxing op (middle node, group identity) whose readers all are in
    the result (the hops of a multi-step boxing into a target)."""
    lbns = job.helper.lbn2logical_blob_desc
    consumers: dict[str, set[str]] = {}
    for op in job.net.op:
        for producer in _data_inputs(op, lbns):
            consumers.setdefault(producer, set()).add(op.name)
    out = set(targets)
    boxing = [op.name for op in job.net.op if op.name.startswith(_BOXING_PREFIXES)]
    changed = True
    while changed:
        changed = False
        for name in boxing:
            readers = consumers.get(name, set())
            if name not in out and readers and readers <= out:
                out.add(name)
                changed = True
    return out


# ------------------------------------------------------------------ predicted bytes per phase


def plan_graph_recomputed(
    plan: Plan, graph: Graph, recompute: Collection[str] | None = None
) -> frozenset[str]:
    """:func:`recomputed_scopes` on the plan's own graph: ``full`` is every block of
    ``graph`` (:func:`graph_blocks`)."""
    return recomputed_scopes(plan, lambda: graph_blocks(graph), recompute)


def predicted_phases(
    graph: Graph, plan: Plan, recomputed: Collection[str], micro_batches: int
) -> dict[str, dict[int, float]]:
    """Bytes per device per mesh axis that autopar predicts for ``plan`` on ``graph``, by
    phase (:data:`autopar.bridges.oneflow.traffic.PHASES`), for ``K = micro_batches``.

    From :func:`autopar.cost.evaluate.evaluate` at ``K`` with ``recomputed`` as the recomputed
    blocks, priced as OneFlow runs it (one boxing per tensor and destination layout): an edge (or ZeRO gather)
    that runs every micro-batch adds its bytes to ``per_micro_batch``, and again to
    ``recompute`` when it runs twice per micro-batch (the iteration model's rule,
    :meth:`autopar.cost.iteration.RunCounts.edge`: an edge whose producer and consumer are both
    recomputed, :func:`autopar.cost.iteration.boxed_again_in_recompute`; ZeRO gathers once); one
    that runs once per step (:data:`autopar.cost.iteration.ACCUMULATION`, the update's inputs) to
    ``once_per_step``.  With ``K = 1`` once-per-step bytes count as ``per_micro_batch`` (a
    job without accumulation has no step apart from its one micro-batch).  Units: bytes per
    device, each hop once (per step: ``K x (per_micro_batch + recompute) + once_per_step``)."""
    from autopar.cost.evaluate import evaluate

    training = TrainingConfig(micro_batches, "auto", tuple(recomputed))
    ev = evaluate(graph, plan, training=training)
    phases = ("per_micro_batch", "recompute", "once_per_step")
    out: dict[str, dict[int, float]] = {ph: dict.fromkeys(range(plan.mesh.ndim), 0.0) for ph in phases}
    for e in ev.edges:
        for step in e.steps:
            if e.per_micro_batch > 0:
                out["per_micro_batch"][step.axis] += step.bytes_per_device
                if e.per_micro_batch > 1:
                    out["recompute"][step.axis] += step.bytes_per_device
            if e.per_step > 0:
                phase = "once_per_step" if micro_batches > 1 else "per_micro_batch"
                out[phase][step.axis] += step.bytes_per_device
    return out
