"""What the plan report and the pipeline report share: a plan's view, the charts, the page.

:class:`PlanView` is a plan with everything a report shows about it (its breakdown per layer
and collective, its memory timeline, its iteration), recomputed by
:func:`autopar.cost.evaluate.evaluate`; the charts (a micro-batch's compute and communication,
communication by collective, time per layer, memory over a micro-batch) take views side by
side, the plans of :mod:`autopar_service.report` or the stages of
:mod:`autopar_service.pipeline_report`; :func:`_page_head` opens a page with its styles and
plotly.js inlined once, so the file needs no network when viewed.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from autopar.cost.breakdown import (
    EdgeCost,
    MemoryTimeline,
    PlanBreakdown,
    PricingMemo,
    breakdown,
    memory_timeline,
)
from autopar.cost.evaluate import evaluate
from autopar.cost.iteration import checkpoint_blocks
from autopar.errors import PlanError
from autopar.ir.graph import Graph
from autopar.ir.plan import Plan

__all__ = ["PlanView", "check_plan_fits", "format_bytes", "plotly_js"]

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
    """Blocks the plan recomputes (:func:`autopar.cost.iteration.checkpoint_blocks`)."""
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


# ------------------------------------------------------------------ page

_CSS = """
body{font-family:system-ui,sans-serif;margin:24px auto;max-width:1400px;padding:0 16px;color:#222}
h1{font-size:1.5em;margin-bottom:4px} h2{margin-top:32px;border-bottom:1px solid #ddd;padding-bottom:4px}
.meta{color:#555} table{border-collapse:collapse;margin:8px 0;font-size:13px}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
thead th{background:#f4f4f4} td.num{text-align:right} .ok{color:#1a7f37} .bad{color:#cf222e}
td.diff{background:#fff3cd} details{margin:4px 0} summary{cursor:pointer;padding:2px 0}
code{font-family:ui-monospace,monospace;font-size:12px} .note{color:#555;font-size:13px}
"""


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
