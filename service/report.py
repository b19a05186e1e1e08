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
* per layer (module scope read from op names, :func:`autopar.breakdown.layer_of`):
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
:func:`autopar.evaluate.evaluate`, whose per-op and per-edge records and
activation profile :mod:`autopar.breakdown` groups per layer and collective.
"""

from __future__ import annotations

import argparse
import html
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from autopar.baselines import BASELINES, baseline_plan
from autopar.breakdown import (
    EdgeCost,
    MemoryTimeline,
    PlanBreakdown,
    PricingMemo,
    breakdown,
    layer_of,
    memory_timeline,
    module_of,
)
from autopar.errors import ConfigError, PlanError
from autopar.evaluate import evaluate
from autopar.graph import Graph, Op, Role
from autopar.iteration import baseline_training, checkpoint_blocks, micro_batches_text
from autopar.pipeline import FORMAT as PIPELINE_FORMAT
from autopar.pipeline import PipelinePlan
from autopar.plan import Plan

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

MIB = 1024**2
GIB = 1024**3
TOP_EDGES = 10
"""How many of the most expensive boxing edges the report lists per plan."""
TIMELINE_POINTS = 1500
"""Most points of a memory timeline; longer ones keep each bucket's maximum (the peak survives)."""
BUDGET_SCALE = 3.0
"""The memory chart's y axis stops short of the budget line when the budget exceeds every peak this much."""
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
STATE_COLORS = {
    "parameters": "#4c78a8",
    "gradients": "#f58518",
    "optimizer states": "#54a24b",
    "activations": "#b279a2",
}
_PLOT_CONFIG = {"displaylogo": False, "responsive": True}


def plotly_js() -> str:
    """The plotly.js bundle shipped with the Python package (no network)."""
    return str(get_plotlyjs())


def check_plan_fits(graph: Graph, plan: Plan) -> None:
    """Raise :class:`PlanError` ``plan_mismatch`` naming the first op the plan lacks or whose ports differ."""
    for op in graph.ops:
        ports = plan.ports.get(op.name)
        if ports is None:
            raise PlanError(
                "plan_mismatch",
                f"the plan has no signature for op {op.name!r}: is it a plan for this graph "
                f"({graph.name})? it was made for {plan.graph_name!r}",
                op=op.name,
            )
        if list(op.inputs) != ports[0] or list(op.outputs) != ports[1]:
            raise PlanError(
                "plan_mismatch",
                f"op {op.name!r}: the plan's ports {ports} differ from the graph's "
                f"({list(op.inputs)}, {list(op.outputs)})",
                op=op.name,
            )


# ------------------------------------------------------------------ analysis


@dataclass
class PlanView:
    """A plan with everything the report shows about it."""

    label: str
    plan: Plan
    parts: PlanBreakdown
    timeline: MemoryTimeline
    iteration_time_s: float
    """One optimizer step at the plan's ``training`` (K micro-batches and once-per-step work)."""
    recomputed_blocks: int = 0
    """Blocks the plan recomputes (:func:`autopar.iteration.checkpoint_blocks`)."""
    recompute_time_s: float = 0.0
    """Seconds per optimizer step spent recomputing them."""

    @classmethod
    def of(cls, label: str, graph: Graph, plan: Plan, memo: PricingMemo | None = None) -> PlanView:
        check_plan_fits(graph, plan)
        ev = evaluate(graph, plan, memo=memo)
        return cls(
            label,
            plan,
            breakdown(graph, plan, evaluation=ev),
            memory_timeline(graph, plan, evaluation=ev),
            ev.iteration_time_s,
            len(checkpoint_blocks(graph, ev.training)),
            ev.recompute_time_s,
        )

    @property
    def step_time_s(self) -> float:
        """One micro-batch with its once-per-step work (the iteration at K = 1): compute plus
        communication, serial (the evaluator's sum)."""
        return self.parts.compute_time_s + self.parts.comm_time_s

    @property
    def comm_time_s_per_axis(self) -> dict[int, float]:
        return self.parts.comm_time_s_per_axis(self.plan.mesh.ndim)

    @property
    def comm_bytes_per_axis(self) -> dict[int, float]:
        return self.parts.comm_bytes_per_axis(self.plan.mesh.ndim)


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _ms(seconds: float | None) -> str:
    """``12.34 ms``; ``5.6 us`` below 10 microseconds."""
    if seconds is None or not math.isfinite(seconds):
        return "n/a"
    return f"{seconds * 1e3:,.2f} ms" if seconds == 0 or seconds >= 1e-5 else f"{seconds * 1e6:.1f} us"


def format_bytes(nbytes: float | None) -> str:
    """``3.00 GiB`` from 1 GiB up, else ``12.5 MiB`` (tiny models stay readable)."""
    if nbytes is None or not math.isfinite(nbytes):
        return "n/a"
    return f"{nbytes / GIB:,.2f} GiB" if nbytes >= GIB else f"{nbytes / MIB:,.1f} MiB"


_gib = format_bytes


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


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


# ------------------------------------------------------------------ charts


def _figure_html(fig: go.Figure, div_id: str) -> str:
    fig.update_layout(
        margin={"l": 60, "r": 20, "t": 50, "b": 50},
        template="plotly_white",
        font={"family": "system-ui, sans-serif", "size": 12},
    )
    return str(fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=_PLOT_CONFIG))


def _step_chart(views: Sequence[PlanView]) -> go.Figure:
    labels = [v.label for v in views]
    fig = go.Figure()
    fig.add_bar(
        name="compute",
        x=labels,
        y=[_finite(v.parts.compute_time_s * 1e3) for v in views],
        marker_color="#7f7f7f",
    )
    axes = sorted({a for v in views for a in v.comm_time_s_per_axis})
    for a in axes:
        fig.add_bar(
            name=f"communication, mesh axis {a}",
            x=labels,
            y=[_finite(v.comm_time_s_per_axis.get(a, 0.0) * 1e3) for v in views],
            marker_color=COLORS[(a + 2) % len(COLORS)],
        )
    fig.update_layout(
        barmode="stack",
        title="One micro-batch with its once-per-step work (K = 1): compute and communication, serial",
        yaxis_title="ms",
        height=360,
    )
    return fig


def _comm_chart(views: Sequence[PlanView]) -> go.Figure:
    keys = sorted({k for v in views for k in v.parts.comm_s if v.parts.comm_s[k] > 0})
    names = [f"{c} @ axis {a}" for c, a in keys]
    fig = go.Figure()
    for i, v in enumerate(views):
        fig.add_bar(
            name=v.label,
            x=names,
            y=[_finite(v.parts.comm_s.get(k, 0.0) * 1e3) for k in keys],
            customdata=[v.parts.comm_bytes.get(k, 0.0) / MIB for k in keys],
            hovertemplate="%{x}: %{y:.2f} ms, %{customdata:.1f} MiB per device<extra>" + v.label + "</extra>",
            marker_color=COLORS[i % len(COLORS)],
        )
    fig.update_layout(
        barmode="group",
        title="Communication by collective and mesh axis (one micro-batch with its once-per-step work)",
        yaxis_title="ms at K = 1",
        height=360,
    )
    return fig


def _layer_chart(views: Sequence[PlanView], layers: list[str]) -> go.Figure:
    fig = go.Figure()
    for i, v in enumerate(views):
        fig.add_bar(
            name=v.label,
            x=layers,
            y=[
                _finite((v.parts.layer_compute_s.get(name, 0.0) + v.parts.layer_comm_s.get(name, 0.0)) * 1e3)
                for name in layers
            ],
            marker_color=COLORS[i % len(COLORS)],
        )
    fig.update_layout(
        barmode="group",
        title="Time per layer (compute + communication into its ops)",
        yaxis_title="ms",
        height=380,
    )
    return fig


def _downsample(values: list[float], points: int) -> tuple[list[int], list[float]]:
    """(positions, values) with at most ``points`` points, each the maximum of its bucket."""
    n = len(values)
    if n <= points:
        return list(range(n)), list(values)
    size = math.ceil(n / points)
    xs, ys = [], []
    for start in range(0, n, size):
        bucket = values[start : start + size]
        j = max(range(len(bucket)), key=bucket.__getitem__)
        xs.append(start + j)
        ys.append(bucket[j])
    return xs, ys


def _memory_chart(
    views: Sequence[PlanView], budget: float, order_names: list[str] | Sequence[list[str]]
) -> go.Figure:
    """``order_names``: the op names along the topological order, one list for every view (one
    graph), or one list per view (a pipeline's stages)."""
    peak = max((v.timeline.peak for v in views), default=0.0)
    cut = budget > BUDGET_SCALE * peak > 0
    unit, scale = ("GiB", GIB) if (peak if cut else max(peak, budget)) >= GIB else ("MiB", MIB)
    fig = make_subplots(
        rows=1,
        cols=len(views),
        shared_yaxes=True,
        subplot_titles=[v.label for v in views],
        horizontal_spacing=0.04,
    )
    for col, v in enumerate(views, start=1):
        t = v.timeline
        xs, acts = _downsample(t.activations, TIMELINE_POINTS)
        if not xs:
            xs, acts = [0], [0.0]
        layers = [
            ("parameters", [t.params / scale] * len(xs)),
            ("gradients", [t.grads / scale] * len(xs)),
            ("optimizer states", [t.optimizer / scale] * len(xs)),
            ("activations", [a / scale for a in acts]),
        ]
        per_view = bool(order_names) and isinstance(order_names[0], list)
        own: Sequence[str] = order_names[col - 1] if per_view else order_names  # type: ignore[assignment]
        names = [own[x] if x < len(own) else "" for x in xs]
        for name, ys in layers:
            fig.add_trace(
                go.Scatter(
                    x=xs,
                    y=ys,
                    name=name,
                    legendgroup=name,
                    showlegend=col == 1,
                    stackgroup=f"mem{col}",
                    mode="lines",
                    line={"width": 0.5, "color": STATE_COLORS[name]},
                    customdata=names,
                    hovertemplate=name + ": %{y:.2f} " + unit + " at %{customdata}<extra></extra>",
                ),
                row=1,
                col=col,
            )
        fig.add_trace(
            go.Scatter(
                x=[xs[0], xs[-1]],
                y=[budget / scale, budget / scale],
                name="budget",
                legendgroup="budget",
                showlegend=col == 1,
                mode="lines",
                line={"color": "black", "dash": "dash", "width": 1.5},
                hovertemplate="budget %{y:.2f} " + unit + "<extra></extra>",
            ),
            row=1,
            col=col,
        )
        fig.update_xaxes(title_text="position in the micro-batch (topological order)", row=1, col=col)
    if cut:
        # a budget far above every plan's peak would flatten the timelines: cut the axis, say so
        fig.update_yaxes(range=[0, 1.3 * peak / scale])
        fig.add_annotation(
            text=f"budget {format_bytes(budget)} is above the scale",
            xref="paper",
            yref="paper",
            x=0.01,
            y=0.97,
            showarrow=False,
            xanchor="left",
            yanchor="top",
        )
    fig.update_yaxes(title_text=f"{unit} per device", row=1, col=1)
    fig.update_layout(title="Memory per device over a micro-batch", height=420)
    return fig


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


def _edges_table(view: PlanView) -> str:
    edges: list[EdgeCost] = view.parts.most_expensive_edges(TOP_EDGES)
    if not edges:
        return f"<p>{_esc(view.label)}: no boxing.</p>"
    rows = []
    for e in edges:
        what = (
            f"ZeRO gather in <code>{_esc(e.consumer)}</code>"
            if e.zero_gather
            else f"<code>{_esc(e.producer)}</code> &rarr; <code>{_esc(e.consumer)}</code>:{_esc(e.port)}"
        )
        rows.append(
            "<tr>"
            f"<td>{what}</td>"
            f"<td>{'x'.join(map(str, e.shape))} {_esc(e.dtype)}</td>"
            f"<td><code>{_esc(e.src)}</code> &rarr; <code>{_esc(e.dst)}</code></td>"
            f"<td>{_esc(e.collectives)}</td>"
            f"<td class='num'>{e.bytes_per_device / MIB:,.2f}</td>"
            f"<td class='num'>{_ms(e.time_s)}</td>"
            "</tr>"
        )
    return (
        f"<h3>{_esc(view.label)}</h3><table class='edges'><thead><tr><th>edge</th><th>tensor</th>"
        "<th>layout change</th><th>collectives @ mesh axis</th><th>MiB / device</th><th>time</th>"
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


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

_CSS = """
body{font-family:system-ui,sans-serif;margin:24px auto;max-width:1400px;padding:0 16px;color:#222}
h1{font-size:1.5em;margin-bottom:4px} h2{margin-top:32px;border-bottom:1px solid #ddd;padding-bottom:4px}
.meta{color:#555} table{border-collapse:collapse;margin:8px 0;font-size:13px}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
thead th{background:#f4f4f4} td.num{text-align:right} .ok{color:#1a7f37} .bad{color:#cf222e}
td.diff{background:#fff3cd} details{margin:4px 0} summary{cursor:pointer;padding:2px 0}
code{font-family:ui-monospace,monospace;font-size:12px} .note{color:#555;font-size:13px}
"""


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
    (label or source) or from :func:`autopar.baselines.baseline_plan` on the
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


# ------------------------------------------------------------------ pipeline plans


def stages_table(rows: Sequence[dict[str, Any]], table_id: str = "stages-table") -> str:
    """The stages of a pipeline plan (``predicted["stages"]`` rows of ``autopar.pipeline/v1``):
    stage, blocks (first-last), devices, mesh, time per micro-batch, receives, once-per-step
    work, memory per device, stash per micro-batch, micro-batches in flight."""
    body = []
    for r in rows:
        first, last = r.get("first_block"), r.get("last_block")
        span = _esc(first) if first == last else f"{_esc(first)}&ndash;{_esc(last)}"
        body.append(
            "<tr>"
            f"<td class='num'>{_esc(r.get('stage'))}</td>"
            f"<td>{_esc(r.get('blocks'))}: <code>{span}</code></td>"
            f"<td class='num'>{_esc(r.get('devices'))}</td>"
            f"<td>{_esc(r.get('mesh_shape'))}</td>"
            f"<td class='num'>{_ms(_number(r.get('micro_batch_time_s')))}</td>"
            f"<td class='num'>{_ms(_number(r.get('receive_time_s')))}</td>"
            f"<td class='num'>{_ms(_number(r.get('once_per_step_time_s')))}</td>"
            f"<td class='num'>{_gib(_number(r.get('memory_per_device_bytes')))}</td>"
            f"<td class='num'>{_gib(_number(r.get('stash_bytes')))}</td>"
            f"<td class='num'>{_esc(r.get('in_flight'))}</td>"
            "</tr>"
        )
    return (
        f"<table class='stages' id='{_esc(table_id)}'><thead><tr><th>stage</th><th>blocks</th>"
        "<th>devices</th><th>mesh</th><th>per micro-batch</th><th>receives</th><th>once per step</th>"
        "<th>memory / device</th><th>stash / micro-batch</th><th>micro-batches in flight</th>"
        f"</tr></thead><tbody>{''.join(body)}</tbody></table>"
    )


def _number(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def pipeline_baseline_beside(kind: str, graph: Graph, plan: PipelinePlan) -> PipelinePlan:
    """Baseline ``kind`` in ``plan``'s stages (equal block counts, as Megatron-LM's PTD-P cuts
    them) on its stage mesh and ZeRO stage, at ``plan``'s K with the checkpointing its real
    system runs (:func:`autopar.baseline_pipeline.pipeline_baseline`); ``ConfigError`` when the
    blocks do not divide into the stages evenly or ``kind`` has no pipeline form."""
    from autopar.baseline_configs import BaselineConfig
    from autopar.baseline_pipeline import pipeline_baseline

    if kind == "single-device":
        raise ConfigError("bad_baseline_config", "single-device has no pipeline form")
    first = plan.stages[0]
    config = BaselineConfig(kind, first.mesh.shape, first.zero_stage, first.runtime, plan.num_stages)
    return pipeline_baseline(
        graph, plan.cluster, config, baseline_training(kind, plan.training), plan.memory_budget_bytes
    )


def build_pipeline_report(
    graph: Graph,
    plan: PipelinePlan,
    compare: Sequence[str] = (),
    budget_bytes: float | None = None,
    *,
    label: str | None = None,
    title: str | None = None,
) -> str:
    """One self-contained HTML page about an ``autopar.pipeline/v1`` plan on ``graph``.

    Everything is re-checked by :func:`autopar.pipeline.evaluate_pipeline`: the headline (1F1B
    iteration, bubble, the slowest stage's micro-batch, the largest stage's memory against the
    budget, the solver's figures), the stages table (:func:`stages_table`), and per stage, as
    the one-stage report shows plans side by side, its micro-batch's compute and communication,
    collectives, memory over a micro-batch and time per layer.  ``compare`` names baselines
    priced in the same stages (:func:`pipeline_baseline_beside`), shown in the headline."""
    from autopar.pipeline import evaluate_pipeline, priced, stage_link
    from autopar.pipeline_split import split_graph

    budget = float(budget_bytes or plan.memory_budget_bytes or plan.cluster.device.memory_bytes)
    ev = evaluate_pipeline(graph, plan)
    rows = priced(PipelinePlan.from_dict(plan.to_dict()), ev).predicted["stages"]
    slices = split_graph(graph, plan.counts, stage_link(plan.cluster, plan.num_stages).crosses_nodes)
    memo = PricingMemo()
    views = [
        PlanView.of(f"stage {sl.index}", sl.graph, sp, memo)
        for sl, sp in zip(slices, plan.stages, strict=True)
    ]
    columns = _pipeline_columns(graph, plan, compare, label)
    rendered = _pipeline_charts(views, [sl.graph for sl in slices], budget)
    first = plan.stages[0]
    heading = title or f"autopar pipeline plan report: {plan.graph_name or graph.name}"
    compared = ", ".join(_esc(k) for k in compare) or "nothing"
    return f"""{_page_head(heading)}
<p class="meta">{len(graph.ops)} ops, {len(graph.variables)} variables &middot;
<b>{plan.num_stages} pipeline stages</b> x mesh {list(first.mesh.shape)} over {_esc(plan.cluster)} &middot;
ZeRO-{first.zero_stage} &middot; K = {micro_batches_text(plan.training.micro_batches)} per step,
checkpointing {_esc(plan.training.checkpointing)}, 1F1B schedule &middot;
budget {_gib(budget)} per device &middot; compared with {compared} (in the same stages)</p>
<h2 id="headline">Headline</h2>
{_pipeline_headline(columns, ev, budget)}
<h2 id="stages">Stages</h2>
{stages_table(rows)}
<p class="note">Each stage runs its blocks on its own devices with its own layouts; the iteration is
1F1B (PipeDream-flush): every stage's micro-batch once through the fill and drain, K - 1 more at the
slowest stage's pace, then the largest once-per-step work. A stage's memory holds the activations of
the micro-batches in flight (min(S - s, K)); "receives" is the boundary traffic it waits for per
micro-batch (part of its micro-batch time).</p>
{rendered["chart-step"]}
<h2 id="communication">Communication per stage</h2>
{rendered["chart-comm"]}
<h3>The {TOP_EDGES} most expensive boxing edges of each stage</h3>
{"".join(_edges_table(v) for v in views)}
<h2 id="memory">Memory over a micro-batch, per stage</h2>
<p class="note">One micro-batch's liveness on each stage's graph (the stages table adds the stash of
the other micro-batches in flight).</p>
{rendered["chart-memory"]}
<h2 id="layers">Per layer</h2>
{rendered["chart-layers"]}
</body></html>
"""


def _pipeline_columns(
    graph: Graph, plan: PipelinePlan, compare: Sequence[str], label: str | None
) -> list[tuple[str, PipelinePlan | str]]:
    """The headline's columns: the plan, then each baseline of ``compare`` in its stages (or
    why it has none)."""
    columns: list[tuple[str, PipelinePlan | str]] = [(label or plan.source, plan)]
    for kind in compare:
        try:
            columns.append((kind, pipeline_baseline_beside(kind, graph, plan)))
        except ConfigError as exc:
            columns.append((kind, exc.message))
    return columns


def _pipeline_charts(views: Sequence[PlanView], graphs: Sequence[Graph], budget: float) -> dict[str, str]:
    """The pipeline report's charts (per stage: its micro-batch, communication, time per layer
    and memory), rendered as HTML by their element id."""
    order_names = [[op.name for op in g.topological_order] for g in graphs]
    layers = list(dict.fromkeys(layer_of(op.name) for g in graphs for op in g.ops))
    charts = {
        "chart-step": _step_chart(views),
        "chart-comm": _comm_chart(views),
        "chart-layers": _layer_chart(views, layers),
        "chart-memory": _memory_chart(views, budget, order_names),
    }
    return {k: _figure_html(fig, k) for k, fig in charts.items()}


def _headline_blocks(p: PipelinePlan, i: int) -> str:
    """A headline cell: the blocks of each stage."""
    return " + ".join(str(c) for c in p.counts)


def _headline_configuration(p: PipelinePlan, i: int) -> str:
    """A headline cell: stages, stage mesh, ZeRO stage and runtime."""
    first = p.stages[0]
    return (
        f"{p.num_stages} stages x mesh {list(first.mesh.shape)}, ZeRO-{first.zero_stage}, "
        f"runtime {_esc(first.runtime)}"
    )


def _headline_solver(p: PipelinePlan, i: int) -> str:
    """A headline cell: the solver's bound, gap and wall time (or the plan's source)."""
    s = p.solver or {}
    if not s:
        return _esc(p.source)
    gap, bound, wall = s.get("gap"), _number(s.get("bound")), _number(s.get("wall_s"))
    return (
        f"bound {_ms(bound)}, gap {'n/a' if gap is None else f'{100 * float(gap):.2f}%'} "
        f"(the bubble included), {'n/a' if wall is None else f'{wall:.1f} s'}"
    )


def _pipeline_headline_table(
    columns: Sequence[tuple[str, PipelinePlan | str]], rows: list[tuple[str, list[str]]]
) -> str:
    """The headline's HTML table of ``rows``; a column without a plan says why in its first row."""
    head = "".join(f"<th>{_esc(name)}</th>" for name, _ in columns)
    for col, (_, p) in enumerate(columns):
        if isinstance(p, str):
            rows[0][1][col] = f"n/a: {_esc(p)}"
    body = "".join(
        f"<tr><th>{name}</th>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for name, row in rows
    )
    return f"<table class='headline'><thead><tr><th></th>{head}</tr></thead><tbody>{body}</tbody></table>"


def _pipeline_headline(columns: Sequence[tuple[str, PipelinePlan | str]], ev: Any, budget: float) -> str:
    """The headline of a pipeline report: the plan (re-checked figures) and each baseline in the
    same stages (its own re-checked prediction), or why it has none."""
    rows: list[tuple[str, list[str]]] = []

    def cells(fn: Callable[[PipelinePlan, int], str]) -> list[str]:
        return [fn(p, i) if isinstance(p, PipelinePlan) else "n/a" for i, (_, p) in enumerate(columns)]

    def fig(p: PipelinePlan, i: int, name: str) -> float | None:
        """The plan's re-checked figure (column 0), a baseline's prediction (priced as checked)."""
        return _number(getattr(ev, name) if i == 0 else p.predicted.get(name))

    def slowest(p: PipelinePlan, i: int) -> str:
        if i == 0:
            return _ms(max((c.micro_batch_time_s for c in ev.stages), default=None))
        times = [_number(r.get("micro_batch_time_s")) for r in p.predicted.get("stages") or []]
        return _ms(max((t for t in times if t is not None), default=None))

    def memory(p: PipelinePlan, i: int) -> str:
        total = fig(p, i, "memory_per_device_bytes")
        if total is None:
            return "n/a"
        fits = total <= budget
        return (
            f"<b class='{'ok' if fits else 'bad'}'>{_gib(total)}</b> ({100 * total / budget:.0f}% of budget, "
            f"{'fits' if fits else 'OVER BUDGET'})"
        )

    def bubble(p: PipelinePlan, i: int) -> str:
        b = fig(p, i, "bubble_fraction")
        return "n/a" if b is None else f"{100 * b:.1f} %"

    rows.append(("configuration", cells(_headline_configuration)))
    rows.append(
        (
            "evaluated iteration (1F1B, K micro-batches + once per step)",
            cells(lambda p, i: f"<b>{_ms(fig(p, i, 'iteration_time_s'))}</b>"),
        )
    )
    rows.append(("&nbsp; bubble (fill and drain)", cells(bubble)))
    rows.append(("&nbsp; slowest stage, per micro-batch", cells(slowest)))
    rows.append(
        (
            "&nbsp; micro-batches K, checkpointing",
            cells(lambda p, i: f"{p.training.micro_batches}, {_esc(p.training.checkpointing)}"),
        )
    )
    rows.append(("blocks per stage", cells(_headline_blocks)))
    rows.append((f"memory per device, largest stage (budget {_gib(budget)})", cells(memory)))
    rows.append(
        (
            "planner: predicted iteration",
            cells(lambda p, i: _ms(_number(p.predicted.get("iteration_time_s")))),
        )
    )
    rows.append(
        (
            "valid",
            cells(
                lambda p, i: (
                    "yes"
                    if i or ev.valid
                    else f"<b class='bad'>no</b>: {_esc(ev.errors[0] if ev.errors else '')}"
                )
            ),
        )
    )
    rows.append(("solver", cells(_headline_solver)))
    return _pipeline_headline_table(columns, rows)


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


# ------------------------------------------------------------------ CLI


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
    """Baseline ``kind`` on ``plan``'s mesh and ZeRO stage, priced at ``plan``'s micro-batches
    with the checkpointing its real system runs (:func:`autopar.iteration.baseline_training`)."""
    other = baseline_plan(kind, graph, plan.mesh, plan.zero_stage)
    other.training = baseline_training(kind, plan.training)
    return other


def _compare_arg(spec: str, graph: Graph, plan: Plan) -> tuple[str, Plan]:
    """``megatron`` / ``inferred`` / ... (a baseline on the plan's mesh), ``LABEL=PATH`` or ``PATH``.

    All are priced at ``plan.training``'s K; a baseline with the checkpointing its real
    system runs (:func:`autopar.iteration.baseline_training`), a plan file with the plan's."""
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
    from autopar.cli_args import parse_bytes, training_from_args

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


def _page_head(heading: str) -> str:
    """A report page's head (its styles and plotly inline) and its title line."""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>{_esc(heading)}</title>
<style>{_CSS}</style>
<script type="text/javascript">{plotly_js()}</script>
</head><body>
<h1>{_esc(heading)}</h1>"""
