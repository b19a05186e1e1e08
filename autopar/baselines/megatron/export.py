"""A plan as Megatron-LM's command-line arguments, when Megatron-LM can run it.

:func:`megatron_arguments` reads a plan (``autopar.plan/v1`` or ``autopar.pipeline/v1``) and
its graph and either returns the arguments of ``pretrain_gpt.py`` (Megatron-Core's names,
megatron/training/arguments.py) that run it, or raises ``[not_megatron_expressible]``
naming why not.  What is read, and from where:

=============================================  ============================================
Megatron-LM                                    the plan
=============================================  ============================================
``--tensor-model-parallel-size T``             the mesh's last axis, when every weight is
                                               laid out there as Megatron's column-, row- and
                                               vocab-parallel linears are
                                               (:func:`~autopar.runtimes.megatron_lm.linears.
                                               megatron_parameter_layout`); ``T = 1`` when every
                                               weight is whole there (a data-parallel axis)
data parallelism (the rest of the GPUs)        the other axes: every weight whole, the data
                                               split on its batch
``--pipeline-model-parallel-size P``           a pipeline plan's stages (each on one stage
                                               mesh); uneven block counts as
                                               ``--decoder-first/last-pipeline-num-layers``
                                               (only the first and last differ) or
                                               ``--pipeline-model-parallel-layout``
``--num-layers-per-virtual-pipeline-stage``    ``virtual_stages`` (even counts only)
``--sequence-parallel``                        the blocks' norms and dropouts split on the
                                               sequence on the tensor-parallel axis
``--use-distributed-optimizer``                ZeRO stage 1 or 2
``--recompute-granularity full ...``           whole blocks: every block (``uniform``, 1), or
                                               the first N of each stage or chunk (``block``)
``--recompute-granularity selective ...``      the same op groups in every block
                                               (``core_attn``, ``layernorm``)
``--micro-batch-size``, ``--global-batch-size``  the graph's batch over the data-parallel
                                               ranks, times the plan's micro-batches
=============================================  ============================================

The activations between the weights are not compared with Megatron's: Megatron-LM lays them
out itself from the weights, the data and ``--sequence-parallel``.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field
from typing import Any

from autopar.baselines.configs import MEGATRON_RUNTIME
from autopar.baselines.greedy_walk import _hidden_size
from autopar.baselines.megatron.configs import RECOMPUTE_MODULES
from autopar.errors import ConfigError, PlanError
from autopar.ir.batch import batch_shape
from autopar.ir.blocks import op_groups, split_unit
from autopar.ir.graph import Graph
from autopar.ir.plan import Plan
from autopar.ir.sbp import B, S
from autopar.pipeline.evaluate import stage_link
from autopar.pipeline.plan import PipelinePlan
from autopar.pipeline.split import ordered_blocks, split_graph
from autopar.runtimes.megatron_lm.linears import megatron_parameter_layout

__all__ = ["NOT_EXPRESSIBLE", "MegatronArguments", "megatron_arguments"]

NOT_EXPRESSIBLE = "not_megatron_expressible"
"""The error code of a plan Megatron-LM's arguments cannot run."""

_EVERY_LAYER = (
    "--recompute-granularity",
    "full",
    "--recompute-method",
    "uniform",
    "--recompute-num-layers",
    "1",
)
"""Every layer recomputed: Megatron-LM's full recomputation, one layer per checkpoint."""
_MODULE_OF_GROUP = {group: module for module, group in RECOMPUTE_MODULES.items()}
"""autopar's op group -> Megatron-Core's ``--recompute-modules`` name."""


@dataclass(frozen=True)
class MegatronArguments:
    """The arguments that run a plan in Megatron-LM, and what it derives from them."""

    arguments: tuple[str, ...]
    tensor_parallel: int
    data_parallel: int
    pipeline_parallel: int
    virtual_stages: int
    world_size: int
    notes: tuple[str, ...] = ()

    def command_line(self) -> str:
        """The arguments as one shell-quoted line."""
        return shlex.join(self.arguments)

    def to_dict(self) -> dict[str, Any]:
        return {
            "arguments": list(self.arguments),
            "command_line": self.command_line(),
            "tensor_parallel": self.tensor_parallel,
            "data_parallel": self.data_parallel,
            "pipeline_parallel": self.pipeline_parallel,
            "virtual_stages": self.virtual_stages,
            "world_size": self.world_size,
            "notes": list(self.notes),
        }


@dataclass
class _Stage:
    """One stage of the plan (the whole plan when it has one): its graph, plan and blocks."""

    index: int
    graph: Graph
    plan: Plan
    blocks: tuple[str, ...]
    label: str = ""
    """``stage 1: `` in a pipeline's reasons, else empty."""


@dataclass
class _Findings:
    """What the checks found: the reasons Megatron-LM cannot run the plan, and notes."""

    why: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def megatron_arguments(graph: Graph, plan: Plan | PipelinePlan) -> MegatronArguments:
    """The Megatron-LM arguments that run ``plan`` (a plan of ``graph``), module docstring.

    Raises :class:`ConfigError` ``[not_megatron_expressible]`` naming every reason it is not
    expressible, and :class:`PlanError` ``[plan_graph_mismatch]`` when ``plan`` is another
    graph's."""
    if plan.graph_hash and plan.graph_hash != graph.content_hash():
        raise PlanError(
            "plan_graph_mismatch",
            f"the plan was made for graph {plan.graph_name!r} ({plan.graph_hash[:12]}), not for "
            f"{graph.name!r} ({graph.content_hash()[:12]}): give the graph the plan was made for",
        )
    found = _Findings()
    stages = _stages(graph, plan)
    parallel = [_parallelism(s, found) for s in stages]
    shapes = {tuple(s.plan.mesh.shape) for s in stages}
    if len(shapes) > 1:
        found.why.append(f"its stages run on different meshes {sorted(shapes)}; Megatron-LM's are all one")
    tps = {p[0] for p in parallel if p is not None}
    if len(tps) > 1:
        found.why.append(f"its stages differ in tensor-parallel size ({sorted(tps)}); Megatron-LM's is one")
    tp, dp = next((p for p in parallel if p is not None), (1, 1))
    pp = len(stages)
    virtual = plan.virtual_stages if isinstance(plan, PipelinePlan) else 1
    args = ["--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp)]
    args += _pipeline_arguments(graph, plan, found)
    sequence = [_sequence_parallel(s, found) for s in stages] if tp > 1 else [False]
    if all(sequence):
        args.append("--sequence-parallel")
    args += _optimizer_arguments(stages, found)
    args += _recompute_arguments(stages, plan, virtual, found)
    args += _batch_arguments(graph, plan, dp, found)
    args += _model_arguments(graph, found)
    _check_runtime(stages, found)
    if found.why:
        raise ConfigError(
            NOT_EXPRESSIBLE,
            "Megatron-LM's arguments cannot run this plan: " + "; ".join(found.why),
            reasons=found.why,
        )
    cluster = plan.cluster if isinstance(plan, PipelinePlan) else plan.mesh.cluster
    world = cluster.world_size
    found.notes.insert(
        0,
        f"data-parallel size {dp}: Megatron-LM derives it from the {world} GPUs it is launched on "
        f"({cluster.nodes} node(s) x {cluster.devices_per_node}) / (tp {tp} x pp {pp})",
    )
    return MegatronArguments(tuple(args), tp, dp, pp, virtual, world, tuple(found.notes))


def _stages(graph: Graph, plan: Plan | PipelinePlan) -> list[_Stage]:
    """The plan's stages with their graphs (a pipeline cut as :mod:`autopar.pipeline.split`
    cuts it when the plan is evaluated)."""
    if isinstance(plan, Plan):
        return [_Stage(0, graph, plan, tuple(ordered_blocks(graph)))]
    crosses = stage_link(plan.cluster, plan.num_stages).crosses_nodes
    slices = split_graph(graph, plan.counts, crosses)
    return [
        _Stage(sl.index, sl.graph, p, sl.blocks, f"stage {sl.index}: ") for sl, p in zip(slices, plan.stages)
    ]


def _check_runtime(stages: list[_Stage], found: _Findings) -> None:
    runtimes = sorted({s.plan.runtime for s in stages})
    if runtimes != [MEGATRON_RUNTIME]:
        found.why.append(
            f"it is priced under runtime {', '.join(runtimes)}, not {MEGATRON_RUNTIME} "
            f"(plan it with --runtime {MEGATRON_RUNTIME})"
        )


def _example(items: list[str]) -> str:
    return f"{len(items)}, e.g. {items[0]}"


def _parallelism(stage: _Stage, found: _Findings) -> tuple[int, int] | None:
    """(tp, dp) of one stage's plan: the last axis tensor-parallel when the weights there are
    Megatron's layout, data-parallel when they are whole; every other axis data-parallel
    (weights whole, data split on its batch).  None (with the reasons) when neither."""
    graph, plan = stage.graph, stage.plan
    mesh = plan.mesh
    last = mesh.ndim - 1
    megatron = megatron_parameter_layout(graph, mesh)
    on_dp: dict[int, list[str]] = {}
    on_tp: list[str] = []
    tp_split = False
    for v in graph.variables:
        got = plan.output_sbp(v.op, next(iter(graph.op_by_name[v.op].outputs)))
        for a in range(max(last, 1)):
            if mesh.shape[a] > 1 and got[a] != B:
                on_dp.setdefault(a, []).append(f"{v.op} {got[a]}")
        if last > 0 and mesh.shape[last] > 1:
            tp_split |= got[last] != B
            if got[last] != megatron[v.op][last]:
                on_tp.append(f"{v.op} {got[last]}, Megatron-LM {megatron[v.op][last]}")
    for a, names in on_dp.items():
        found.why.append(
            f"{stage.label}weights split on data-parallel mesh axis {a} ({_example(names)}); "
            "Megatron-LM replicates weights across data parallelism"
        )
    wrong_tp = bool(on_tp) and tp_split
    if wrong_tp:
        found.why.append(
            f"{stage.label}weights on the tensor-parallel axis {last} differ from Megatron-LM's "
            f"column-, row- and vocab-parallel linears ({_example(on_tp)})"
        )
    tp = mesh.shape[last] if last > 0 and tp_split and not on_tp else 1
    _check_data(stage, last if tp_split else None, found)
    _check_heads(stage, tp, found)
    return None if on_dp or wrong_tp else (tp, math.prod(mesh.shape) // tp)


def _check_data(stage: _Stage, tp_axis: int | None, found: _Findings) -> None:
    """Every data input with a batch dim (its first, the graph's batch) split on it on each
    data-parallel axis."""
    plan, mesh = stage.plan, stage.plan.mesh
    dp_axes = [a for a in range(mesh.ndim) if mesh.shape[a] > 1 and a != tp_axis]
    batch = batch_shape(stage.graph)
    wrong: dict[int, list[str]] = {}
    for op in stage.graph.ops:
        if op.type != "input" or op.inputs or batch is None:
            continue
        for port, t in op.outputs.items():
            shape = stage.graph.tensors[t].shape
            if not shape or shape[0] != batch.samples:
                continue
            sbp = plan.output_sbp(op.name, port)
            for a in dp_axes:
                if sbp[a] != S(0):
                    wrong.setdefault(a, []).append(f"{op.name} {sbp[a]}")
    for a, names in wrong.items():
        found.why.append(
            f"{stage.label}the data is not split on its batch on data-parallel mesh axis {a} "
            f"({_example(names)})"
        )


def _check_heads(stage: _Stage, tp: int, found: _Findings) -> None:
    heads = ((stage.graph.meta or {}).get("config") or {}).get("heads")
    if tp > 1 and isinstance(heads, int) and heads > 0 and heads % tp:
        found.why.append(
            f"Megatron-LM splits attention heads evenly: {heads} heads over a tensor-parallel size of {tp}"
        )


def _sequence_parallel(stage: _Stage, found: _Findings) -> bool:
    """Whether the stage's norms and dropouts (outside the attention core) on hidden states
    ``[..., seq, hidden]`` split them on the sequence on the tensor-parallel axis: all of them
    (``--sequence-parallel``) or none; a mix, or another split there, is a reason."""
    graph, plan = stage.graph, stage.plan
    tp = plan.mesh.ndim - 1
    hidden = _hidden_size(graph)
    kinds: dict[str, list[str]] = {"sequence": [], "whole": [], "other": []}
    for name, unit in op_groups(graph, stage.blocks).items():
        if split_unit(unit)[1] not in ("norm", "dropout"):
            continue
        op = graph.op_by_name[name]
        hidden_states = [p for p, t in op.inputs.items() if graph.tensors[t].shape[-1:] == (hidden,)]
        port = next((p for p in hidden_states if graph.tensors[op.inputs[p]].ndim >= 3), None)
        if port is None:
            continue
        value = plan.input_sbp(name, port)[tp]
        seq = S(graph.tensors[op.inputs[port]].ndim - 2)
        kinds["sequence" if value == seq else "whole" if value == B else "other"].append(f"{name} {value}")
    if kinds["other"] or (kinds["sequence"] and kinds["whole"]):
        other = f", {len(kinds['other'])} otherwise, e.g. {kinds['other'][0]}" if kinds["other"] else ""
        found.why.append(
            f"{stage.label}of the norms and dropouts {len(kinds['sequence'])} split their hidden states "
            f"on the sequence on the tensor-parallel axis, {len(kinds['whole'])} not{other}; "
            "Megatron-LM's --sequence-parallel splits all of them or none"
        )
        return False
    return bool(kinds["sequence"])


def _pipeline_arguments(graph: Graph, plan: Plan | PipelinePlan, found: _Findings) -> list[str]:
    """Uneven stages and interleaving: Megatron-Core's layer counts per stage and chunk."""
    if not isinstance(plan, PipelinePlan) or plan.num_stages == 1:
        return []
    counts, v = plan.counts, plan.virtual_stages
    family = (graph.meta or {}).get("family")
    if family == "t5":
        found.why.append(
            "it pipelines an encoder-decoder model; Megatron-LM's layer counts per stage are for a "
            "decoder-only stack"
        )
        return []
    if len(set(counts)) == 1:
        if v > 1 and counts[0] % v:
            found.why.append(f"{counts[0]} blocks per stage do not split into {v} virtual stages")
            return []
        return ["--num-layers-per-virtual-pipeline-stage", str(counts[0] // v)] if v > 1 else []
    if v > 1:
        found.why.append(
            f"it interleaves {v} chunks over uneven stages {list(counts)}; Megatron-LM interleaves "
            "even stages only"
        )
        return []
    middle = counts[1:-1]
    if len(set(middle)) > 1:  # Megatron-Core's layout string: E(mbedding), t(ransformer layer), L(oss)
        layout = "E" + "|".join("t" * c for c in counts) + "L"
        return ["--pipeline-model-parallel-layout", layout]
    out = []
    if not middle or counts[0] != middle[0]:
        out += ["--decoder-first-pipeline-num-layers", str(counts[0])]
    if middle and counts[-1] != middle[0]:
        out += ["--decoder-last-pipeline-num-layers", str(counts[-1])]
    return out


def _optimizer_arguments(stages: list[_Stage], found: _Findings) -> list[str]:
    """ZeRO 1 and 2: the distributed optimizer (with its overlapped gather); 0: DDP."""
    zero = max(s.plan.zero_stage for s in stages)
    overlap = ["--overlap-grad-reduce"]
    if zero == 0:
        return overlap
    if zero >= 3:
        found.why.append(
            "ZeRO-3 shards the weights; Megatron-LM's distributed optimizer shards optimizer states "
            "and gradients only: plan it with --zero 1 or 2"
        )
        return []
    if zero == 2:
        found.notes.append(
            "ZeRO-2 runs as the distributed optimizer, which reduce-scatters the gradients into "
            "shards but accumulates them in a full-size buffer"
        )
    return ["--use-distributed-optimizer", *overlap, "--overlap-param-gather"]


def _chunks(stages: list[_Stage], virtual: int) -> list[tuple[str, ...]]:
    """The model chunks Megatron-LM's ``--recompute-method block`` counts in: each stage's
    blocks, or under interleaving the blocks in ``stages x virtual`` even chunks in order."""
    if virtual <= 1:
        return [s.blocks for s in stages]
    blocks = [b for s in stages for b in s.blocks]
    size = len(blocks) // (len(stages) * virtual) or 1
    return [tuple(blocks[i : i + size]) for i in range(0, len(blocks), size)]


def _recompute_arguments(
    stages: list[_Stage], plan: Plan | PipelinePlan, virtual: int, found: _Findings
) -> list[str]:
    """The recomputation (module docstring); a pattern Megatron-LM cannot name is a reason."""
    mode = plan.training.checkpointing
    if mode == "full":
        return list(_EVERY_LAYER)
    if mode == "selective":
        return ["--recompute-granularity", "selective", "--recompute-modules", "core_attn"]
    units = sorted({u for s in stages for u in s.plan.training.recomputed}) if mode == "auto" else []
    if not units:
        return []
    whole = {u for u in units if split_unit(u)[1] is None}
    groups: dict[str, set[str]] = {}
    for u in units:
        block, group = split_unit(u)
        if group is not None:
            groups.setdefault(block, set()).add(group)
    if whole and groups:
        found.why.append(
            f"it recomputes {len(whole)} whole block(s) and parts of {len(groups)} other(s); "
            "Megatron-LM recomputes at one granularity"
        )
        return []
    if whole:
        return _block_recompute(_chunks(stages, virtual), whole, found)
    return _selective_recompute([b for s in stages for b in s.blocks], groups, found)


def _block_recompute(chunks: list[tuple[str, ...]], whole: set[str], found: _Findings) -> list[str]:
    blocks = [b for c in chunks for b in c]
    if whole >= set(blocks):
        return list(_EVERY_LAYER)
    n = sum(1 for b in chunks[0] if b in whole)
    if n and all(set(c) & whole == set(c[: min(n, len(c))]) for c in chunks):
        return [*_EVERY_LAYER[:3], "block", "--recompute-num-layers", str(n)]
    found.why.append(
        f"it recomputes {len(whole)} of {len(blocks)} blocks, not the first N of each of its "
        f"{len(chunks)} stage(s) or chunk(s) as Megatron-LM's --recompute-method block does"
    )
    return []


def _selective_recompute(blocks: list[str], groups: dict[str, set[str]], found: _Findings) -> list[str]:
    patterns = {frozenset(groups.get(b, ())) for b in blocks}
    if len(patterns) > 1:
        found.why.append(
            f"its blocks recompute different op groups ({len(patterns)} patterns over {len(blocks)} "
            "blocks); Megatron-LM's --recompute-modules are the same in every layer"
        )
        return []
    (pattern,) = patterns
    unknown = sorted(pattern - set(_MODULE_OF_GROUP))
    if unknown:
        found.why.append(
            f"it recomputes {', '.join(unknown)} in every block; Megatron-Core's --recompute-modules "
            f"recompute {', '.join(f'{m} ({g})' for m, g in RECOMPUTE_MODULES.items())} of these"
        )
        return []
    modules = [m for m, g in RECOMPUTE_MODULES.items() if g in pattern]
    return ["--recompute-granularity", "selective", "--recompute-modules", *modules]


def _batch_arguments(graph: Graph, plan: Plan | PipelinePlan, dp: int, found: _Findings) -> list[str]:
    """``--micro-batch-size`` (the graph's batch per data-parallel rank) and
    ``--global-batch-size`` (the graph's batch times the plan's micro-batches)."""
    shape = batch_shape(graph)
    if shape is None:
        found.notes.append("the graph does not say its batch: set --micro-batch-size and --global-batch-size")
        return []
    if shape.samples % dp:
        found.why.append(f"the batch of {shape.samples} does not split over {dp} data-parallel ranks")
        return []
    k = plan.training.micro_batches
    return ["--micro-batch-size", str(shape.samples // dp), "--global-batch-size", str(shape.samples * k)]


_MODEL_KEYS = (
    ("hidden", "--hidden-size"),
    ("heads", "--num-attention-heads"),
    ("ffn", "--ffn-hidden-size"),
    ("seq", "--seq-length"),
    ("max_position", "--max-position-embeddings"),
)
_T5_KEYS = (
    ("encoder_layers", "--encoder-num-layers"),
    ("decoder_layers", "--decoder-num-layers"),
    ("hidden", "--hidden-size"),
    ("heads", "--num-attention-heads"),
    ("d_kv", "--kv-channels"),
    ("ffn", "--ffn-hidden-size"),
    ("encoder_seq", "--encoder-seq-length"),
    ("decoder_seq", "--decoder-seq-length"),
)


def _model_arguments(graph: Graph, found: _Findings) -> list[str]:
    """The model's shape as a built model's configuration says it (``--num-layers`` from the
    graph's blocks otherwise)."""
    meta = graph.meta or {}
    config = meta.get("config") or {}
    t5 = meta.get("family") == "t5"
    out = [] if t5 else ["--num-layers", str(len(ordered_blocks(graph)))]
    for key, flag in _T5_KEYS if t5 else _MODEL_KEYS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            out += [flag, str(value)]
    if not config:
        found.notes.append("the graph has no model configuration: add the model's own arguments")
    return out
