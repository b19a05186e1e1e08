"""Apply a pipeline plan (``autopar.pipeline/v1``) to a OneFlow module with ``nn.Graph``'s stages.

A :class:`~autopar.pipeline.plan.PipelinePlan` cuts the model's blocks into ``S`` contiguous
stages, each with its own ``autopar.plan/v1`` plan on its own sub-mesh.  OneFlow 0.9 runs
that as one ``nn.Graph`` whose modules carry a stage (``python/oneflow/nn/graph/graph_block.py``,
``ModuleBlock.set_stage(stage_id, placement)``; LiBai's ``dist.get_layer_placement`` and
``set_pipeline_stage_id`` do the same per layer):

1. :func:`apply_pipeline_plan` (before the graph is made) assigns every submodule a stage:
   the ``i``-th block (``h.3``, ``encoder.block.0``: :func:`autopar.bridges.oneflow.iteration.block_scopes`,
   in module order) goes to the stage whose block count covers it; a module outside the
   blocks goes to the stage whose plan owns its parameters (the embedding to the first
   stage, the final norm to the last).  Each stage's ranks form its placement, shaped as
   its plan's mesh (stage ``s`` holds ``ranks[s * n : (s + 1) * n]``, ``n = world / S``),
   and every parameter is laid out ``to_global(placement, sbp)`` with its stage plan's
   N-D SBP (as :func:`autopar.bridges.oneflow.apply_plan` lays out a one-stage plan);
2. :func:`configure_pipeline` (in the graph's ``__init__``) calls
   ``<module>.to(GraphModule).set_stage(s, placement)`` on those modules, sets the plan's
   ``K`` (``config.set_gradient_accumulation_steps``) and activation checkpointing on the
   blocks the plan recomputes.  ``set_stage`` makes every input of a staged module
   ``to_global(placement=...)`` (its SBP kept): the tensors crossing a boundary move onto
   the next stage's placement there, and their gradients back.

A tensor read in a stage other than the one of its module -- the tied word embedding, read
by the LM head on the last stage -- must be moved by the model code, as LiBai's
``LMLogits`` does (``word_embeddings.to_global(placement=input.placement)``; OneFlow refuses
an op whose inputs lie on two placements): :func:`to_stage` does that.  OneFlow then moves
the parameter every micro-batch and its gradient back, where autopar's plan holds a copy on
both stages and all-reduces the two gradients once per step.

:func:`count_boundary_traffic` reads the compiled job's cross-placement edges (producer
on one stage's placement, consumer on another's) and counts what each device sends and
receives for them from the two ends' N-D SBPs, to compare with
:func:`autopar.pipeline.evaluate.boundary_bytes_per_device`.

OneFlow is imported inside the functions.
"""

from __future__ import annotations

import math
import re
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from autopar.bridges.oneflow.apply import _variable_layouts, from_flow_sbp, to_flow_sbp
from autopar.bridges.oneflow.jobs import _require_oneflow
from autopar.errors import PlanError
from autopar.ir.blocks import layer_of
from autopar.ir.graph import Graph, Role
from autopar.ir.sbp import B, NdSbp
from autopar.pipeline.plan import PipelinePlan
from autopar.pipeline.split import RECV_SUFFIX, assign_stages, ordered_blocks

__all__ = [
    "GPT_NAMES",
    "PipelineApplyReport",
    "apply_pipeline_plan",
    "block_layouts",
    "configure_pipeline",
    "make_pipeline_train_graph",
    "stage_placements",
    "stage_ranks",
    "to_stage",
]

NameMap = Callable[[str], list[str]]
"""OneFlow parameter name -> the plan variables it holds (several for a fused weight)."""


def _rules(rules: Sequence[tuple[str, Sequence[str]]]) -> NameMap:
    compiled = [(re.compile(pattern), targets) for pattern, targets in rules]

    def names(param: str) -> list[str]:
        for pattern, targets in compiled:
            m = pattern.fullmatch(param)
            if m is not None:
                return [m.expand(t) for t in targets]
        return [param]

    return names


GPT_NAMES: NameMap = _rules(
    [
        (r"wte\.weight", ["embedding.word_embeddings.weight"]),
        (r"wpe\.weight", ["embedding.position_embeddings.weight"]),
        (r"h\.(\d+)\.ln_1\.(\w+)", [r"layers.\1.self_attn_norm.\2"]),
        (
            r"h\.(\d+)\.attn\.c_attn\.(\w+)",
            [r"layers.\1.self_attn.q.\2", r"layers.\1.self_attn.k.\2", r"layers.\1.self_attn.v.\2"],
        ),
        (r"h\.(\d+)\.attn\.c_proj\.(\w+)", [r"layers.\1.self_attn.o.\2"]),
        (r"h\.(\d+)\.ln_2\.(\w+)", [r"layers.\1.mlp_norm.\2"]),
        (r"h\.(\d+)\.mlp\.c_fc\.(\w+)", [r"layers.\1.mlp.fc1.\2"]),
        (r"h\.(\d+)\.mlp\.c_proj\.(\w+)", [r"layers.\1.mlp.fc2.\2"]),
        (r"ln_f\.(\w+)", [r"final_norm.\1"]),
    ]
)
"""``examples/oneflow/gpt.py``'s parameters -> ``autopar model tiny-gpt`` / ``gpt2-medium``'s
variables (its fused ``c_attn`` holds the plan's ``q``, ``k`` and ``v``, head-first: a
split of their output dimension is a split of ``c_attn``'s)."""


# ------------------------------------------------------------------ placements


def stage_ranks(plan: PipelinePlan, ranks: Sequence[int] | None = None) -> list[Any]:
    """Per stage, its ranks as a nested list shaped as its plan's mesh (``ranks`` default
    ``0 .. world - 1``; stage ``s`` holds the ``s``-th ``world / S`` of them)."""
    import numpy as np

    world = plan.cluster.world_size
    ranks = list(range(world)) if ranks is None else list(ranks)
    sizes = [math.prod(p.mesh.shape) for p in plan.stages]
    if sum(sizes) != len(ranks):
        raise PlanError(
            "mesh_mismatch",
            f"the stages' meshes {[list(p.mesh.shape) for p in plan.stages]} hold {sum(sizes)} devices "
            f"but {len(ranks)} ranks were given",
        )
    out, start = [], 0
    for p, n in zip(plan.stages, sizes):
        out.append(np.array(ranks[start : start + n]).reshape(p.mesh.shape).tolist())
        start += n
    return out


def stage_placements(
    plan: PipelinePlan, ranks: Sequence[int] | None = None, device: str = "cpu"
) -> list[Any]:
    """``flow.placement(device, ranks=...)`` of every stage (:func:`stage_ranks`)."""
    flow = _require_oneflow()
    return [flow.placement(device, ranks=r) for r in stage_ranks(plan, ranks)]


def to_stage(tensor: Any, like: Any) -> Any:
    """``tensor`` on ``like``'s placement (its SBP kept), when both are global and the
    placements differ: what model code does with a tensor of another stage (LiBai's
    ``LMLogits``); a no-op on one placement and for local tensors."""
    both_global = getattr(tensor, "is_global", False) and getattr(like, "is_global", False)
    if both_global and tensor.placement != like.placement:
        return tensor.to_global(placement=like.placement)
    return tensor


# ------------------------------------------------------------------ report


@dataclass
class PipelineApplyReport:
    """What :func:`apply_pipeline_plan` did; :func:`configure_pipeline` reads it."""

    placements: list[Any]
    """``flow.placement`` per stage"""
    ranks: list[Any]
    """per stage, its ranks shaped as its mesh"""
    modules: dict[str, int]
    """module path -> stage, for every module ``set_stage`` is called on"""
    blocks: list[list[str]]
    """per stage, its block modules (``h.0``)"""
    parameters: dict[str, dict[str, Any]]
    """parameter -> ``{"stage", "sbp", "variables"}``"""
    unplanned: list[str]
    """parameters with no plan variable (laid out ``B`` on their module's stage)"""
    micro_batches: int = 1
    checkpointing: list[str] = field(default_factory=list)
    """the block modules the plan recomputes"""
    notes: list[str] = field(default_factory=list)
    """layouts chosen where the plan's variables of a fused weight disagree, blocks not hinted"""
    block_layouts: dict[str, tuple[str, str]] = field(default_factory=dict)
    """block module -> the planned layouts of its input and output (:func:`block_layouts`)"""
    hints: list[str] = field(default_factory=list)
    """``h.1: input (B, B) -> (S(0), S(0))`` for every layout hint added while the graph built"""

    def to_dict(self) -> dict[str, Any]:
        return {
            "ranks": self.ranks,
            "modules": self.modules,
            "blocks": self.blocks,
            "parameters": self.parameters,
            "unplanned": self.unplanned,
            "micro_batches": self.micro_batches,
            "checkpointing": self.checkpointing,
            "notes": self.notes,
            "block_layouts": self.block_layouts,
            "hints": self.hints,
        }


# ------------------------------------------------------------------ apply


def _block_paths(module: Any) -> list[str]:
    """The block modules (a path ending at its first numeric component) in module order."""
    out = []
    for path, _ in module.named_modules():
        parts = path.split(".") if path else []
        numeric = [i for i, p in enumerate(parts) if p.isdigit()]
        if numeric and numeric[0] == len(parts) - 1:
            out.append(path)
    return out


def _owner_stage(variables: list[str], owners: dict[str, int]) -> int | None:
    stages = {owners[v] for v in variables if v in owners}
    return min(stages) if stages else None


def _stage_blocks(plan: PipelinePlan, blocks: list[str]) -> tuple[list[list[str]], dict[str, int]]:
    """Cut ``blocks`` (in module order) into the plan's stages: each stage's block paths and
    every block path's stage (``plan_mismatch`` when the counts do not add up)."""
    if len(blocks) != sum(plan.counts):
        raise PlanError(
            "plan_mismatch",
            f"the plan's stages hold {sum(plan.counts)} blocks ({list(plan.counts)}) but the module has "
            f"{len(blocks)} ({', '.join(blocks[:4])}{' ...' if len(blocks) > 4 else ''})",
        )
    block_stage: dict[str, int] = {}
    it = iter(blocks)
    stage_blocks: list[list[str]] = []
    for s, c in enumerate(plan.counts):
        stage_blocks.append([next(it) for _ in range(c)])
        block_stage.update(dict.fromkeys(stage_blocks[-1], s))
    return stage_blocks, block_stage


def _variable_owners(layouts: list[dict[str, NdSbp]]) -> dict[str, int]:
    """A variable's owner: the first stage whose plan holds it (a tied copy is held later too)."""
    owners: dict[str, int] = {}
    for s, lay in enumerate(layouts):
        for v in lay:
            owners.setdefault(v, s)
    return owners


def _parameter_layout(
    name: str, layout: dict[str, NdSbp], ndim: int, names: NameMap, unplanned: list[str], notes: list[str]
) -> tuple[list[str], NdSbp]:
    """The plan variables parameter ``name`` holds in its stage's ``layout`` and the N-D SBP
    it is laid out with (broadcast where the plan has none of them: noted in ``unplanned``;
    the first variable's where they disagree: noted in ``notes``)."""
    variables = [v for v in names(name) if v in layout]
    sbps = {layout[v] for v in variables}
    if not variables:
        unplanned.append(name)
        sbp = NdSbp((B,) * ndim)
    else:
        sbp = layout[variables[0]]
        if len(sbps) > 1:
            disagree = sorted(map(str, sbps))
            notes.append(f"{name}: variables {variables} disagree ({disagree}); laid out {sbp}")
    return variables, sbp


def _claim_module(modules: dict[str, int], block_stage: dict[str, int], owner_path: str, s: int) -> None:
    """Put ``owner_path`` (a module outside the blocks) on stage ``s``; ``plan_mismatch``
    where it already holds parameters of another stage."""
    if owner_path not in block_stage and not any(owner_path.startswith(b + ".") for b in block_stage):
        modules.setdefault(owner_path, s)
        if modules[owner_path] != s:
            raise PlanError(
                "plan_mismatch",
                f"module {owner_path!r} holds parameters of stages {modules[owner_path]} and {s}",
            )


def _relayout_parameter(
    flow: Any, module: Any, name: str, param: Any, placement: Any, sbp: NdSbp, ndim: int
) -> None:
    """Replace parameter ``name`` of ``module`` by its value ``to_global(placement, sbp)``
    (from the broadcast local value where it is not global yet)."""
    owner_path, _, attr = name.rpartition(".")
    with flow.no_grad():
        data = param.data
        if not data.is_global:
            data = data.to_global(placement, [flow.sbp.broadcast] * ndim)
        new = data.to_global(placement, to_flow_sbp(sbp))
    setattr(_submodule(module, owner_path), attr, flow.nn.Parameter(new, requires_grad=param.requires_grad))


def _hint_blocks(
    module: Any, graph: Graph, plan: PipelinePlan, blocks: list[str], report: PipelineApplyReport
) -> None:
    """Wrap every block's forward to lay its input and output out as ``plan`` does on
    ``graph`` (:func:`block_layouts`); a block with no single input and output is noted."""
    layouts_of = block_layouts(graph, plan)
    for path, scope in zip(blocks, ordered_blocks(graph)):
        if scope not in layouts_of:
            report.notes.append(f"{path}: block {scope} has no single input and output; not hinted")
            continue
        report.block_layouts[path] = tuple(str(x) for x in layouts_of[scope])  # type: ignore[assignment]
        _hint_block(_submodule(module, path), *layouts_of[scope], report.hints, path)


def apply_pipeline_plan(
    module: Any,
    plan: PipelinePlan | dict[str, Any],
    ranks: Sequence[int] | None = None,
    *,
    device: str = "cpu",
    names: NameMap | None = None,
    graph: Graph | None = None,
) -> PipelineApplyReport:
    """Lay ``module``'s parameters out stage by stage as ``plan`` says (module docstring).

    ``names`` maps a OneFlow parameter name to the plan variables it holds (default: the
    same name; :data:`GPT_NAMES` for ``examples/oneflow/gpt.py`` planned as ``tiny-gpt``).
    Parameter values are kept (``to_global`` from the broadcast local value): every rank
    must build the module with the same values, as the example models do from their seed.

    ``graph``: the graph the plan was solved on.  With it, every block module's forward is
    wrapped to lay its input and its output out as the plan does (``to_global(sbp=...)``
    in the built job, where OneFlow's own inference differs; :func:`block_layouts`):
    OneFlow infers each op's SBP from its inputs, so a block fed as planned computes as
    planned, and the tensors crossing a boundary leave and arrive as the plan says.
    """
    flow = _require_oneflow()
    if isinstance(plan, dict):
        plan = PipelinePlan.from_dict(plan)
    names = names or (lambda n: [n])
    ranks_per_stage = stage_ranks(plan, ranks)
    placements = [flow.placement(device, ranks=r) for r in ranks_per_stage]
    blocks = _block_paths(module)
    stage_blocks, block_stage = _stage_blocks(plan, blocks)
    layouts = [_variable_layouts(p) for p in plan.stages]
    owners = _variable_owners(layouts)

    def stage_of(param: str) -> int | None:
        for b, bs in block_stage.items():
            if param.startswith(b + "."):
                return bs
        return _owner_stage(names(param), owners)

    modules: dict[str, int] = dict(block_stage)
    parameters: dict[str, dict[str, Any]] = {}
    unplanned: list[str] = []
    notes: list[str] = []
    for name, param in list(module.named_parameters()):
        found = stage_of(name)
        if found is None:
            raise PlanError(
                "plan_mismatch",
                f"parameter {name!r} is in no block and the plan has no variable {names(name)} for it; "
                "pass names= mapping module parameters to plan variables",
            )
        s = found
        ndim = len(plan.stages[s].mesh.shape)
        variables, sbp = _parameter_layout(name, layouts[s], ndim, names, unplanned, notes)
        _claim_module(modules, block_stage, name.rpartition(".")[0], s)
        _relayout_parameter(flow, module, name, param, placements[s], sbp, ndim)
        parameters[name] = {"stage": s, "sbp": str(sbp), "variables": variables}
    report = PipelineApplyReport(
        placements, ranks_per_stage, modules, stage_blocks, parameters, unplanned,
        plan.training.micro_batches, _recomputed_blocks(plan, stage_blocks), notes,
    )  # fmt: skip
    if graph is not None:
        _hint_blocks(module, graph, plan, blocks, report)
    return report


def block_layouts(graph: Graph, plan: PipelinePlan) -> dict[str, tuple[NdSbp, NdSbp]]:
    """Block scope -> (its input's layout, its output's layout) as ``plan`` lays them out,
    for every block with one forward tensor entering it from another block or component
    (not a parameter or a graph input) and one leaving it (a transformer block's residual
    stream): the layout the tensor is produced in, in the block's stage (its ``.recv`` op
    where it comes from an earlier stage)."""
    stage_of = assign_stages(graph, plan.counts)
    producer = graph.producer
    consumers = graph.consumers
    out: dict[str, tuple[NdSbp, NdSbp]] = {}
    for scope in ordered_blocks(graph):
        members = [
            op for op in graph.topological_order if op.role is Role.FORWARD and layer_of(op.name) == scope
        ]
        names = {op.name for op in members}
        s = stage_of[members[0].name]
        entering, leaving = set(), set()
        for op in members:
            for t in op.inputs.values():
                p = graph.op_by_name[producer[t][0]]
                # not a parameter, a graph input (the mask) or a constant (no inputs)
                data = p.type not in ("variable", "input") and bool(p.inputs)
                if p.name not in names and p.role is Role.FORWARD and data:
                    entering.add(t)
            for t in op.outputs.values():
                readers = [c for c, _ in consumers.get(t, []) if c not in names]
                if any(graph.op_by_name[c].role is Role.FORWARD for c in readers):
                    leaving.add(t)
        entering = {t for t in entering if layer_of(producer[t][0]) != scope}
        if len(entering) != 1 or len(leaving) != 1:
            continue
        (tin,), (tout,) = entering, leaving
        stage_plan = plan.stages[s]
        src = stage_of[producer[tin][0]]
        if src == s:
            sbp_in = stage_plan.output_sbp(*producer[tin])
        else:
            sbp_in = stage_plan.output_sbp(f"{tin}{RECV_SUFFIX}", "out")
        out[scope] = (sbp_in, stage_plan.output_sbp(*producer[tout]))
    return out


def _submodule(module: Any, path: str) -> Any:
    for part in path.split(".") if path else []:
        module = module[int(part)] if part.isdigit() else getattr(module, part)
    return module


def _hint_block(module: Any, sbp_in: NdSbp, sbp_out: NdSbp, hints: list[str], path: str) -> None:
    """Wrap ``module.forward``: in a lazy build, its first tensor input and its output
    ``to_global(sbp=...)`` the planned layouts where OneFlow's inference differs."""
    flow = _require_oneflow()
    original = type(module).forward

    def laid_out(t: Any, sbp: NdSbp, what: str) -> Any:
        want = to_flow_sbp(sbp)
        if not flow.is_tensor(t) or not t.is_global or tuple(t.sbp) == tuple(want):
            return t
        hints.append(f"{path}: {what} {from_flow_sbp(t.sbp)} -> {sbp}")
        return t.to_global(placement=t.placement, sbp=want)

    def forward(self: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
        if not flow._oneflow_internal.lazy_mode.is_enabled():
            return original(self, x, *args, **kwargs)
        return laid_out(original(self, laid_out(x, sbp_in, "input"), *args, **kwargs), sbp_out, "output")

    module.forward = types.MethodType(forward, module)


def _recomputed_blocks(plan: PipelinePlan, stage_blocks: list[list[str]]) -> list[str]:
    """The block modules the plan recomputes: every block (``full``), none (``off``), or
    (``auto``) block ``i`` of the module for each recomputed scope of a stage plan whose
    name ends at block number ``i`` (``layers.3`` -> the fourth block, ``h.3``)."""
    mode = plan.training.checkpointing
    blocks = [b for stage in stage_blocks for b in stage]
    if mode == "off":
        return []
    if mode == "full":
        return blocks
    chosen: set[int] = set()
    for sp in plan.stages:
        for scope in sp.training.recomputed:
            last = scope.rsplit(".", 1)[-1]
            if not last.isdigit() or int(last) >= len(blocks):
                raise PlanError("plan_mismatch", f"recomputed scope {scope!r} names no block of the module")
            chosen.add(int(last))
    return [b for i, b in enumerate(blocks) if i in chosen]


def _natural(text: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]


# ------------------------------------------------------------------ the graph


def _proxy(graph: Any, graph_attr: str, path: str) -> Any:
    proxy = getattr(graph, graph_attr)
    for part in path.split(".") if path else []:
        proxy = proxy[int(part)] if part.isdigit() else getattr(proxy, part)
    return proxy


def configure_pipeline(graph: Any, report: PipelineApplyReport, graph_attr: str = "model") -> None:
    """On an unbuilt ``nn.Graph`` holding the module as ``graph_attr``: ``set_stage`` on
    every staged module, the plan's ``K``, checkpointing on the recomputed blocks."""
    from oneflow.nn.graph import GraphModule

    for path, s in sorted(report.modules.items(), key=lambda kv: (kv[1], _natural(kv[0]))):
        _proxy(graph, graph_attr, path).to(GraphModule).set_stage(s, report.placements[s])
    if report.micro_batches > 1:
        graph.config.set_gradient_accumulation_steps(report.micro_batches)
    for path in report.checkpointing:
        _proxy(graph, graph_attr, path).to(GraphModule).activation_checkpointing = True


def make_pipeline_train_graph(module: Any, optimizer: Any, report: PipelineApplyReport) -> Any:
    """An ``nn.Graph`` running ``loss = module(*inputs); loss.backward()`` and ``optimizer``
    in the stages of ``report`` (:func:`configure_pipeline`)."""
    flow = _require_oneflow()

    class PipelineTrainGraph(flow.nn.Graph):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.model = module
            self.add_optimizer(optimizer)
            configure_pipeline(self, report, "model")

        def build(self, *inputs: Any) -> Any:
            loss = self.model(*inputs)
            loss.backward()
            return loss

    return PipelineTrainGraph()
