"""The report of a pipeline plan (``autopar.pipeline/v1``): one self-contained HTML page.

:func:`build_pipeline_report` renders the 1F1B headline (iteration, bubble, the slowest
stage's micro-batch, the largest stage's memory against the budget, the solver's figures)
beside baselines priced in the same stages (:func:`pipeline_baseline_beside`), the stages
table (:func:`stages_table`), and per stage the charts the one-stage report
(:mod:`autopar_service.report`) draws per plan, from :mod:`autopar_service.report_page`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from autopar.cost.breakdown import PricingMemo, layer_of
from autopar.cost.iteration import baseline_training
from autopar.errors import ConfigError
from autopar.ir.graph import Graph
from autopar.ir.training import micro_batches_text
from autopar.pipeline.plan import PipelinePlan
from autopar_service.report_page import (
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
)

__all__ = ["build_pipeline_report", "pipeline_baseline_beside", "stages_table"]


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
    system runs (:func:`autopar.baselines.megatron.pipeline.pipeline_baseline`); ``ConfigError`` when the
    blocks do not divide into the stages evenly or ``kind`` has no pipeline form."""
    from autopar.baselines.configs import BaselineConfig
    from autopar.baselines.megatron.pipeline import pipeline_baseline

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

    Everything is re-checked by :func:`autopar.pipeline.evaluate.evaluate_pipeline`: the headline (1F1B
    iteration, bubble, the slowest stage's micro-batch, the largest stage's memory against the
    budget, the solver's figures), the stages table (:func:`stages_table`), and per stage, as
    the one-stage report shows plans side by side, its micro-batch's compute and communication,
    collectives, memory over a micro-batch and time per layer.  ``compare`` names baselines
    priced in the same stages (:func:`pipeline_baseline_beside`), shown in the headline."""
    from autopar.pipeline.evaluate import evaluate_pipeline, priced, stage_link
    from autopar.pipeline.split import split_graph

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
