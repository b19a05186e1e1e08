"""The plan report: one self-contained HTML file a person reads at a glance.

::

    autopar report GRAPH PLAN [--compare megatron|inferred|LABEL=PLAN.json ...] [--budget 40GiB]
                   --out report.html

:func:`build_report` renders, for a plan and any plans to compare it with:

* the headline: the iteration (one optimizer step: K micro-batches plus the
  once-per-step work), one micro-batch at K = 1 (compute, communication per mesh
  axis), the planner's iteration and the same iteration under overlap when the
  plan carries them, memory per device
  against the budget, solver status, gap and time;
* per layer (module scope read from op names, :func:`autopar.cost.breakdown.layer_of`):
  compute and communication time, and per module the layout of its weight and
  of its output activation in ``(S(0), B)`` notation next to the Megatron
  layout, differences marked;
* communication by collective and mesh axis (bar chart) and the ten most
  expensive boxing edges with their tensor shapes;
* the memory timeline over one micro-batch (liveness along the topological order),
  stacked parameters / gradients / optimizer states / activations, with the
  budget line.

Charts are Plotly figures; plotly.js is inlined once, so the file needs no
network when viewed.  Every number is recomputed from the graph and the plan by
:func:`autopar.cost.evaluate.evaluate`, whose per-op and per-edge records and
activation profile :mod:`autopar.cost.breakdown` groups per layer and collective.

The report of a pipeline plan is :mod:`autopar_service.pipeline_report`; what both reports
share (the plan's view, the charts, the page) is :mod:`autopar_service.report_page`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from autopar.baselines.plans import baseline_plan
from autopar.baselines.problem import BASELINES
from autopar.cost.breakdown import PricingMemo, layer_of, module_of
from autopar.cost.iteration import baseline_training
from autopar.errors import ConfigError, PlanError
from autopar.ir.graph import Graph, Op, Role
from autopar.ir.plan import Plan
from autopar.ir.training import micro_batches_text
from autopar.pipeline.plan import FORMAT as PIPELINE_FORMAT
from autopar.pipeline.plan import PipelinePlan
from autopar_service.pipeline_report import build_pipeline_report, pipeline_baseline_beside, stages_table
from autopar_service.report_page import (
    MIB,
    TOP_EDGES,
    PlanView,
    _comm_chart,
    _edges_table,
    _esc,
    _figure_html,
    _gib,
    _layer_chart,
    _memory_chart,
    _ms,
    _page_head,
    _step_chart,
    check_plan_fits,
    format_bytes,
    plotly_js,
)

__all__ = [
    "PlanView",
    "baseline_beside",
    "build_pipeline_report",
    "build_report",
    "check_plan_fits",
    "cmd_report",
    "format_bytes",
    "load_any_plan",
    "pipeline_baseline_beside",
    "plotly_js",
    "stages_table",
]

Handler = Callable[[argparse.Namespace], int]


def _module_layouts(graph: Graph, plan: Plan) -> dict[str, tuple[str, str, str, str]]:
    """Variable op -> (weight shape, weight SBP, activation shape, activation SBP).

    The activation is the output of the first forward op that reads the
    variable (through its casts), e.g. the matmul of ``...q.weight``.
    """
    casts = ("cast", "amp_white_identity", "identity")
    out: dict[str, tuple[str, str, str, str]] = {}
    for v in graph.variables:
        if v.op not in plan.ports:
            continue
        wsbp = plan.output_sbp(v.op, next(iter(graph.op_by_name[v.op].outputs)))
        frontier = [v.tensor]
        user: Op | None = None
        for _ in range(4):
            nxt: list[str] = []
            for t in frontier:
                for cname, _port in graph.consumers.get(t, []):
                    cop = graph.op_by_name[cname]
                    if cop.role is not Role.FORWARD:
                        continue
                    if cop.type in casts:
                        nxt.extend(cop.outputs.values())
                    elif user is None:
                        user = cop
            if user is not None or not nxt:
                break
            frontier = nxt
        act_shape = act_sbp = ""
        if user is not None and user.outputs and user.name in plan.ports:
            port, tensor = next(iter(user.outputs.items()))
            act_shape = "x".join(map(str, graph.tensors[tensor].shape))
            act_sbp = str(plan.output_sbp(user.name, port))
        wshape = "x".join(map(str, graph.tensors[v.tensor].shape))
        out[v.op] = (wshape, str(wsbp), act_shape, act_sbp)
    return out


# ------------------------------------------------------------------ tables


def _solver_cell(v: PlanView) -> str:
    """``OPTIMAL, gap 0.00%, 1.2 s`` of a solved plan; its source for a baseline or imported plan."""
    s = v.plan.solver or {}
    if not s:
        return _esc(v.plan.source)
    gap = s.get("gap")
    wall = s.get("wall_s")
    return (
        f"{_esc(s.get('status', '?'))}, gap "
        f"{'n/a' if gap is None else f'{100 * float(gap):.2f}%'}, "
        f"{'n/a' if wall is None else f'{float(wall):.1f} s'}"
    )


def _predicted(view: PlanView, name: str) -> float | None:
    """A number the plan file predicts (None when it does not carry it)."""
    x = view.plan.predicted.get(name)
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def _configuration_cell(plan: Plan) -> str:
    """How a plan runs: a baseline's configuration in its users' words
    (``diagnostics.baseline_configuration``: ``tp=8, dp=32, pp=1, distributed optimizer``),
    else its mesh; with its ZeRO stage and runtime."""
    conf = plan.diagnostics.get("baseline_configuration")
    if isinstance(conf, dict) and conf.get("describe"):
        how = "named" if conf.get("named_by_user") else "its best"
        return f"{_esc(conf['describe'])} ({how}), runtime {_esc(plan.runtime)}"
    return f"mesh {list(plan.mesh.shape)}, ZeRO-{plan.zero_stage}, runtime {_esc(plan.runtime)}"


def _headline_table(views: Sequence[PlanView], budget: float) -> str:
    head = "".join(f"<th>{_esc(v.label)}</th>" for v in views)
    rows: list[tuple[str, list[str]]] = []

    def row(name: str, cells: list[str]) -> None:
        rows.append((name, cells))

    row("configuration", [_configuration_cell(v.plan) for v in views])
    row(
        "evaluated iteration (K micro-batches + once per step)",
        [f"<b>{_ms(v.iteration_time_s)}</b>" for v in views],
    )
    row(
        "&nbsp; micro-batches K, checkpointing",
        [f"{v.plan.training.micro_batches}, {_esc(v.plan.training.checkpointing)}" for v in views],
    )
    row(
        "&nbsp; blocks recomputed, time recomputing per step",
        [f"{v.recomputed_blocks}, {_ms(v.recompute_time_s)}" for v in views],
    )
    row(
        "evaluated at K = 1 (one micro-batch with its once-per-step work)",
        [f"<b>{_ms(v.step_time_s)}</b>" for v in views],
    )
    row("&nbsp; compute", [_ms(v.parts.compute_time_s) for v in views])
    axes = sorted({a for v in views for a in v.comm_time_s_per_axis})
    mesh_shape = views[0].plan.mesh.shape
    for a in axes:
        size = mesh_shape[a] if a < len(mesh_shape) else "?"
        row(
            f"&nbsp; communication, mesh axis {a} ({size} devices)",
            [
                f"{_ms(v.comm_time_s_per_axis.get(a, 0.0))} "
                f"({v.comm_bytes_per_axis.get(a, 0.0) / MIB:,.1f} MiB)"
                for v in views
            ],
        )
    row("planner: predicted iteration", [_ms(_predicted(v, "iteration_time_s")) for v in views])
    row(
        "planner: the same iteration, gradient reduction overlapping backward",
        [_ms(_predicted(v, "iteration_time_overlapped_s")) for v in views],
    )
    cells = []
    for v in views:
        total = v.timeline.peak
        fits = total <= budget
        cls = "ok" if fits else "bad"
        cells.append(
            f"<b class='{cls}'>{_gib(total)}</b> ({100 * total / budget:.0f}% of budget, "
            f"{'fits' if fits else 'OVER BUDGET'})"
        )
    row(f"memory per device (budget {_gib(budget)})", cells)
    row("&nbsp; parameters", [_gib(v.timeline.params) for v in views])
    row("&nbsp; gradients", [_gib(v.timeline.grads) for v in views])
    row("&nbsp; optimizer states", [_gib(v.timeline.optimizer) for v in views])
    row("&nbsp; activation peak", [_gib(v.timeline.activation_peak) for v in views])
    row("boxed edges", [str(v.parts.boxed_edges) for v in views])
    row(
        "valid",
        ["yes" if v.parts.valid else f"<b class='bad'>no</b>: {_esc(v.parts.errors[0])}" for v in views],
    )
    row("solver (status, gap, time)", [_solver_cell(v) for v in views])
    body = "".join(
        f"<tr><th>{name}</th>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>" for name, cells in rows
    )
    return f"<table class='headline'><thead><tr><th></th>{head}</tr></thead><tbody>{body}</tbody></table>"


def _layer_tables(graph: Graph, main: PlanView, megatron: Plan, views: Sequence[PlanView]) -> str:
    mine = _module_layouts(graph, main.plan)
    ref = _module_layouts(graph, megatron)
    by_layer: dict[str, list[str]] = {}
    for v in graph.variables:
        by_layer.setdefault(layer_of(v.op), []).append(v.op)
    ops_by_layer: dict[str, list[str]] = {}
    for op in graph.ops:
        ops_by_layer.setdefault(layer_of(op.name), []).append(op.name)
    out = []
    for layer, op_names in ops_by_layer.items():
        differ = sum(
            1
            for name in op_names
            if name in megatron.signatures and main.plan.signatures.get(name) != megatron.signatures[name]
        )
        costs = " &middot; ".join(
            f"{_esc(v.label)}: {_ms(v.parts.layer_compute_s.get(layer, 0.0))} compute + "
            f"{_ms(v.parts.layer_comm_s.get(layer, 0.0))} comm"
            for v in views
        )
        rows = []
        for var in by_layer.get(layer, []):
            if var not in mine:
                continue
            wshape, wsbp, ashape, asbp = mine[var]
            _, rw, _, ra = ref.get(var, ("", "", "", ""))
            wcls = " class='diff'" if rw and rw != wsbp else ""
            acls = " class='diff'" if ra and ra != asbp else ""
            module = module_of(var)
            short = module[len(layer) + 1 :] if module.startswith(layer + ".") else module
            rows.append(
                f"<tr><td><code>{_esc(short or module)}</code></td><td>{wshape}</td>"
                f"<td{wcls}><code>{_esc(wsbp)}</code></td><td><code>{_esc(rw)}</code></td>"
                f"<td>{ashape}</td><td{acls}><code>{_esc(asbp)}</code></td><td><code>{_esc(ra)}</code></td></tr>"
            )
        table = (
            "<table class='layer'><thead><tr><th>module</th><th>weight shape</th><th>weight layout</th>"
            "<th>Megatron</th><th>output shape</th><th>output layout</th><th>Megatron</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>"
            if rows
            else ""
        )
        out.append(
            f"<details{' open' if differ and rows else ''}><summary><b>{_esc(layer)}</b>: "
            f"{len(op_names)} ops, {differ} differ from Megatron &middot; {costs}</summary>{table}</details>"
        )
    return "".join(out)


# ------------------------------------------------------------------ report


def build_report(
    graph: Graph,
    plan: Plan,
    compare: Sequence[tuple[str, Plan]] = (),
    budget_bytes: float | None = None,
    *,
    label: str | None = None,
    title: str | None = None,
) -> str:
    """One self-contained HTML page about ``plan`` on ``graph``, with ``compare`` plans side by side.

    ``budget_bytes`` defaults to the plan's budget, else the device's memory.
    The Megatron layout column comes from a ``megatron`` plan among the plans
    (label or source) or from :func:`autopar.baselines.plans.baseline_plan` on the
    plan's mesh and ZeRO stage.  Raises :class:`PlanError` when a plan does not
    fit the graph.
    """
    budget = float(budget_bytes or plan.memory_budget_bytes or plan.mesh.cluster.device.memory_bytes)
    memo = PricingMemo()
    main = PlanView.of(label or plan.source, graph, plan, memo)
    views = [main] + [PlanView.of(lbl, graph, p, memo) for lbl, p in compare]
    megatron = next(
        (v.plan for v in views if v.label == "megatron" or v.plan.source == "baseline:megatron"),
        None,
    ) or baseline_plan("megatron", graph, plan.mesh, plan.zero_stage)
    order_names = [op.name for op in graph.topological_order]
    layers = list(dict.fromkeys(layer_of(op.name) for op in graph.ops))
    charts = {
        "chart-step": _step_chart(views),
        "chart-comm": _comm_chart(views),
        "chart-layers": _layer_chart(views, layers),
        "chart-memory": _memory_chart(views, budget, order_names),
    }
    rendered = {k: _figure_html(fig, k) for k, fig in charts.items()}
    mesh = plan.mesh
    heading = title or f"autopar plan report: {plan.graph_name or graph.name}"
    compared = ", ".join(_esc(v.label) for v in views[1:]) or "nothing"
    peak = main.timeline.peak_position
    peak_op = order_names[peak] if peak < len(order_names) else "n/a"
    return f"""{_page_head(heading)}
<p class="meta">{len(graph.ops)} ops, {len(graph.variables)} variables &middot; mesh {list(mesh.shape)} over
{_esc(mesh.cluster)} &middot; ZeRO-{plan.zero_stage} &middot;
K = {micro_batches_text(plan.training.micro_batches)} per step,
checkpointing {_esc(plan.training.checkpointing)} &middot;
budget {_gib(budget)} per device &middot;
plan <b>{_esc(main.label)}</b> compared with {compared}</p>
<h2 id="headline">Headline</h2>
{_headline_table(views, budget)}
<p class="note">Evaluated figures are recomputed from the graph and the plan with the evaluator's
cost functions (compute plus communication, no overlap); "planner" rows are what the plan file
itself predicts.</p>
{rendered["chart-step"]}
<h2 id="communication">Communication</h2>
{rendered["chart-comm"]}
<h3>The {TOP_EDGES} most expensive boxing edges</h3>
{"".join(_edges_table(v) for v in views)}
<h2 id="memory">Memory over a micro-batch</h2>
<p class="note">Model states are held for the whole optimizer step; activations are live from their producer
to
their last consumer. Peak of <b>{_esc(main.label)}</b>: {_gib(main.timeline.peak)} at op
<code>{_esc(peak_op)}</code>.</p>
{rendered["chart-memory"]}
<h2 id="layers">Per layer</h2>
{rendered["chart-layers"]}
<p class="note">Layouts of <b>{_esc(main.label)}</b> next to the Megatron layout on the same mesh;
cells that differ are highlighted. The output is the first forward op that reads the weight.</p>
{_layer_tables(graph, main, megatron, views)}
</body></html>
"""


# ------------------------------------------------------------------ CLI


def load_any_plan(spec: str) -> Plan | PipelinePlan:
    """A plan file: ``autopar.plan/v1`` or ``autopar.pipeline/v1``."""
    import json

    try:
        with open(spec, encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as exc:
        raise ConfigError("bad_plan_arg", f"cannot read plan {spec!r}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ConfigError("bad_plan_arg", f"plan {spec!r} is not JSON: {exc}") from None
    if isinstance(data, dict) and data.get("format") == PIPELINE_FORMAT:
        return PipelinePlan.from_dict(data)
    return _load_plan_arg(spec)


def _load_graph_arg(spec: str) -> Graph:
    from pathlib import Path

    if Path(spec).is_file():
        return Graph.load(spec).validate()
    from autopar.models import build

    try:
        return build(spec).validate()
    except (KeyError, ValueError) as exc:
        raise ConfigError(
            "bad_graph_arg", f"{spec!r} is neither a graph file nor a bundled model ({exc})"
        ) from None


def _load_plan_arg(spec: str) -> Plan:
    try:
        return Plan.load(spec)
    except OSError as exc:
        raise ConfigError("bad_plan_arg", f"cannot read plan {spec!r}: {exc.strerror or exc}") from None


def baseline_beside(kind: str, graph: Graph, plan: Plan) -> Plan:
    """Baseline ``kind`` as ``autopar plan --compare`` prices it: at its own best one-stage
    configuration on ``plan``'s cluster and budget (:func:`autopar.baselines.search.search_baseline`;
    Megatron-LM with ``pp=1``, since a one-stage report shows one mesh per plan), at ``plan``'s
    micro-batches with the least recomputation that fits; ``single-device`` on ``plan``'s mesh.
    The configuration is in ``diagnostics["baseline_configuration"]`` (the report prints it)."""
    from autopar.baselines.search import configured_plan, search_baseline

    if kind == "single-device":
        other = baseline_plan(kind, graph, plan.mesh, plan.zero_stage)
        other.training = baseline_training(kind, plan.training)
        return other
    cluster = plan.mesh.cluster
    budget = plan.memory_budget_bytes or cluster.device.memory_bytes
    chosen, priced = search_baseline(
        kind,
        graph,
        cluster,
        plan.training,
        budget,
        zero_stage=plan.zero_stage,
        runtime=plan.runtime,
        named="pp=1" if kind == "megatron" else None,
    )
    found = configured_plan(chosen, priced, budget, False) if chosen.plan is not None else None
    if not isinstance(found, Plan):
        raise PlanError(
            "baseline_failed", f"baseline {kind!r} has no one-stage configuration here: {chosen.error}"
        )
    return found


def _compare_arg(spec: str, graph: Graph, plan: Plan) -> tuple[str, Plan]:
    """``megatron`` / ``inferred`` / ... (a baseline on the plan's mesh), ``LABEL=PATH`` or ``PATH``.

    All are priced at ``plan.training``'s K; a baseline with the checkpointing its real
    system runs (:func:`autopar.cost.iteration.baseline_training`), a plan file with the plan's."""
    if spec in BASELINES:
        return spec, baseline_beside(spec, graph, plan)
    label, sep, path = spec.partition("=")
    if not sep:
        label, path = spec, spec
    other = _load_plan_arg(path)
    other.training = plan.training
    return label, other


def cmd_report(args: argparse.Namespace) -> int:
    """``autopar report``: write the HTML report of a plan (one stage or a pipeline)."""
    from autopar.cli.args import parse_bytes, training_from_args

    graph = _load_graph_arg(args.graph)
    loaded = load_any_plan(args.plan)
    budget = parse_bytes(args.budget) if args.budget else None
    if isinstance(loaded, PipelinePlan):
        unknown = [s for s in args.compare if s not in BASELINES]
        if unknown:
            raise ConfigError(
                "bad_compare",
                f"a pipeline plan is compared with baselines in its stages only, not {unknown[0]!r}",
            )
        text = build_pipeline_report(graph, loaded, list(args.compare), budget, label=args.label)
        compared = len(args.compare)
    else:
        plan = loaded
        plan.training = training_from_args(args, plan.training)  # default: the plan's own
        compare = [_compare_arg(s, graph, plan) for s in args.compare]
        text = build_report(graph, plan, compare, budget, label=args.label)
        compared = len(compare)
    try:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        raise ConfigError("bad_out", f"cannot write {args.out!r}: {exc.strerror or exc}") from None
    sys.stdout.write(f"report of {compared + 1} plan(s) -> {args.out} ({len(text.encode()):,} bytes)\n")
    return 0
