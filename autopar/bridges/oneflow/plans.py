"""OneFlow's own SBP choices as an autopar :class:`~autopar.ir.plan.Plan`.

After ``build_graph`` a job records, for every op, the N-D SBP OneFlow chose
for every port (``job_parallel_view_conf.op_name2nd_sbp_signature_conf``): the
result of OneFlow's greedy per-op SBP inference, or of its auto-parallel search
when ``enable_auto_parallel`` was on.  :func:`import_plan` reads those choices
for the ops of the imported graph, so autopar's evaluator can score OneFlow's
plans next to autopar's own.

Normalisations (each keeps the meaning of OneFlow's choice):

* one value on an N-D mesh stands for itself on every axis (OneFlow writes
  ``(B, B)`` as ``B``);
* under ZeRO a variable OneFlow shards is stored split over its data-parallel
  axes and gathered back for the forward pass; autopar models this with the
  ZeRO stage, so the variable's layout in the plan is the layout its forward
  consumers read (the ``System-ZeRO-ParallelCast`` target), and its optimizer
  op reads the parameter in that layout.  Where OneFlow pruned the cast (one
  op reads it, in its layout: ``PruneParallelCastOpsPass``), that op's read is
  the layout (:func:`_uncast_zero_layout`).  A variable OneFlow's ZeRO leaves
  unsharded (no cast: under ``shard_min_size``) keeps the layout the job
  stores it in, which its update reads (:func:`_variable_layouts`).  The
  optimizer's gradient layout is OneFlow's own (the ``oneflow-0.9`` runtime's
  one-axis ZeRO, :func:`autopar.rules.families.optimizer.oneflow_zero_shard`);
  where the rule does not offer it, it is taken from the ``adam_update`` rule
  (listed in ``diagnostics["zero_gradient_layout_normalized"]``);
* the plan is priced with the runtime profile of the job's ZeRO settings
  (:func:`job_runtime`): ``oneflow-0.9`` for OneFlow's default
  ``shard_min_size`` (1024), ``oneflow-0.9-shard-min-1`` for ``shard_min_size=1``,
  so the rules offer the unsharded update OneFlow keeps for small variables;
* an auto-parallel job is imported as ZeRO stage 0 (the plan's ``zero_stage``):
  OneFlow's auto-parallel sets every variable's SBP itself after the ZeRO pass,
  and in its compiled jobs every update reads ``model`` and ``model_diff`` in
  the variable's stored layout, no gradient sharded (observed on the tiny
  MT5 / GPT / BERT jobs of ``benchmarks/fidelity.py``).
"""

from __future__ import annotations

from typing import Any

from autopar.bridges.oneflow.convert import nd_sbp_from_proto, parse_nd_sbp_text
from autopar.bridges.oneflow.importer import import_job
from autopar.bridges.oneflow.jobs import load_job
from autopar.cost.compute import op_signatures, rule_context
from autopar.errors import ConfigError, PlanError
from autopar.hardware.cluster import PRESETS, Cluster
from autopar.hardware.mesh import Mesh
from autopar.ir.graph import Graph, Variable
from autopar.ir.plan import Plan
from autopar.ir.sbp import NdSbp, Signature, local_shape
from autopar.ir.training import TrainingConfig
from autopar.ir.wire import DEFAULT_RUNTIME
from autopar.rules.families.optimizer import zero_shard
from autopar.rules.registry import default_rules
from autopar.runtimes.profile import Lowering
from autopar.runtimes.registry import RUNTIMES

__all__ = ["import_plan", "imported_training", "job_runtime", "job_signatures", "zero_update_layouts"]


def job_runtime(job: Any) -> str:
    """The runtime profile that runs ``job`` as OneFlow 0.9 does, ZeRO threshold included.

    A job without ZeRO (``optimizer_placement_optimization_mode`` not
    ``distributed_split``) runs as the default profile; with ZeRO, the
    ``oneflow-0.9`` profile whose ``zero_shard_min_size`` is the job's
    ``optimizer_placement_optimization_threshold`` (``enable_zero(shard_min_size=...)``).
    """
    conf = load_job(job).job_conf
    if conf.optimizer_placement_optimization_mode != "distributed_split":
        return DEFAULT_RUNTIME
    threshold = int(conf.optimizer_placement_optimization_threshold)
    for name, profile in RUNTIMES.items():
        if profile.lowering is Lowering.ONEFLOW_0_9 and profile.zero_shard_min_size == threshold:
            return name
    known = sorted(p.zero_shard_min_size for p in RUNTIMES.values() if p.lowering is Lowering.ONEFLOW_0_9)
    raise ConfigError(
        "unsupported_zero_threshold",
        f"the job's ZeRO shard_min_size is {threshold}; autopar has OneFlow runtime profiles for "
        f"{known}: build the job with enable_zero(shard_min_size=...) set to one of them",
    )


def job_signatures(job: Any, graph: Graph, ndim: int) -> dict[str, dict[str, NdSbp]]:
    """op -> port -> the N-D SBP OneFlow chose, for every port of every op of ``graph``."""
    conf = job.job_parallel_view_conf.op_name2nd_sbp_signature_conf
    out: dict[str, dict[str, NdSbp]] = {}
    for op in graph.ops:
        if op.name not in conf:
            raise PlanError(
                "missing_signature",
                f"the OneFlow job has no SBP signature for op {op.name!r}; export the job after "
                "build_graph so that SBP inference has run",
                op=op.name,
            )
        by_port = conf[op.name].bn_in_op2nd_sbp
        ports: dict[str, NdSbp] = {}
        for port in (*op.inputs, *op.outputs):
            if port not in by_port:
                raise PlanError(
                    "missing_signature",
                    f"OneFlow's signature of op {op.name!r} has no SBP for port {port!r} "
                    f"(it has {sorted(by_port)})",
                    op=op.name,
                )
            ports[port] = nd_sbp_from_proto(by_port[port], ndim)
        out[op.name] = ports
    return out


def _zero_cast_layouts(job: Any, graph: Graph) -> dict[str, str]:
    """variable op -> the layout its ``System-ZeRO-ParallelCast`` restores, as N-D SBP text.

    The import keys a cast by the op it reads; when a model reads its parameter
    through an ``identity`` (OneFlow's ZeRO pass takes that identity into the
    variable's sequence and casts its output), the key is the identity, which the
    import makes transparent: such keys are moved to the variable read.
    """
    pinned = dict(graph.meta.get("oneflow", {}).get("zero_layouts", {}))
    for op in job.net.op:
        if op.name not in pinned or op.WhichOneof("op_type") != "user_conf":
            continue
        if op.user_conf.op_type_name not in ("identity", "amp_white_identity"):
            continue
        (lbns,) = op.user_conf.input.values()
        source = lbns.s[0].split("/", 1)[0]
        if source in graph.variable_by_op:
            pinned.setdefault(source, pinned[op.name])
    return pinned


def _variable_layouts(
    graph: Graph, chosen: dict[str, dict[str, NdSbp]], mesh: Mesh, runtime: str, pinned: dict[str, str]
) -> dict[str, NdSbp]:
    """Layout each variable OneFlow's ZeRO sharded is computed with: the layout its
    ``System-ZeRO-ParallelCast`` restores (``pinned``, :func:`_zero_cast_layouts`), or,
    where the job holds no cast for it, the layout its forward reader reads
    (:func:`_uncast_zero_layout`).

    A variable without a cast that OneFlow's rule
    (:func:`~autopar.rules.families.optimizer.oneflow_zero_shard`) would not shard
    further is one the ZeRO pass left alone
    (``optimizer_placement_optimization_pass.cpp``; e.g. a bias under ``shard_min_size``
    1024 elements per shard): the job stores it, and its update reads ``model`` and
    ``model_diff``, in its own declared layout, which the plan keeps as OneFlow chose
    it, even where its forward consumers all read another (a column-parallel bias
    stored ``(B, B)`` and read ``(B, S(0))``, a local slice).  Taking the consumers'
    read instead dropped the gradient's boxing into the update (``(P, S(0)) -> (B, B)``
    priced as ``(P, S(0)) -> (B, S(0))``: the axis-1 all-gather missing).
    """
    layouts = {v.op: parse_nd_sbp_text(pinned[v.op], mesh.ndim) for v in graph.variables if v.op in pinned}
    sharding = RUNTIMES[runtime].zero_sharding.value
    consumers = graph.consumers
    for v in graph.variables:
        if v.op not in layouts and v.optimizer is not None:
            read = _uncast_zero_layout(graph, v, chosen, mesh, sharding, consumers[v.tensor])
            if read is not None:
                layouts[v.op] = read
    return layouts


def _uncast_zero_layout(
    graph: Graph,
    v: Variable,
    chosen: dict[str, dict[str, NdSbp]],
    mesh: Mesh,
    sharding: str,
    readers: list[tuple[str, str]],
) -> NdSbp | None:
    """The forward layout of a variable OneFlow's ZeRO sharded and left without a cast, or None.

    OneFlow 0.9 drops the ``System-ZeRO-ParallelCast`` it adds after a sharded
    variable (or the last op of its sequence) when the cast has a single consumer and
    that consumer reads the cast's own N-D SBP (``PruneParallelCastOpsPass``,
    ``prune_parallel_cast_op_pass.cpp``, after the ZeRO pass): the consumer then reads
    the sharded variable directly, boxing it to the layout the cast would have
    restored.  Observed
    with ``tests/oneflow/_probe_zero_shard.py`` on ``[4, 2]`` (ZeRO-2, default
    ``shard_min_size``): a ``(B, B)`` ``[64, 3, 8, 8]`` conv weight (or ``[64, 192]``
    matmul weight) whose input needs no gradient is stored ``(B, S(0))``, as
    :func:`~autopar.rules.families.optimizer.oneflow_zero_shard` predicts, with no cast,
    its conv reading ``(B, B)``; with a second reader (``conv_data_grad`` when the input
    needs a gradient, or a second conv) the ``(B, B)`` cast stays; a ``(B, S(0))``
    weight's cast to ``(B, S(0))`` stays while the conv reads ``(B, B)``.  ViT's
    ``patch_embed.weight`` (replicated, the first layer) is the first case.

    So: when the stored layout is not one OneFlow's rule leaves alone (the pass would
    shard it further) and the variable's one forward read ``r`` has ``r`` as its
    pre-ZeRO layout (``oneflow_zero_shard(r)`` is the stored layout), ``r`` is the
    layout the missing cast restored.
    """
    shape = graph.tensors[v.tensor].shape
    port = next(iter(graph.op_by_name[v.op].outputs))
    stored = chosen[v.op][port]

    def sharded(layout: NdSbp) -> NdSbp | None:
        fits = local_shape(shape, layout, mesh.shape) is not None
        return zero_shard(shape, layout, mesh.shape, sharding) if fits else None

    if sharded(stored) in (None, stored):
        return None
    reads = {chosen[op][p] for op, p in readers if op != v.optimizer}
    if len(reads) != 1:
        return None
    (read,) = reads
    return read if sharded(read) == stored else None


def zero_update_layouts(
    graph: Graph,
    chosen: dict[str, dict[str, NdSbp]],
    mesh: Mesh,
    stage: int,
    runtime: str,
    pinned: dict[str, str],
) -> list[str]:
    """Give each variable and its update the layouts autopar models ZeRO with (see the
    module docstring), in ``chosen`` (op -> port -> OneFlow's N-D SBP, :func:`job_signatures`)
    in place; return the updates whose gradient layout was normalised.  ``pinned``: variable
    op -> the layout its ``System-ZeRO-ParallelCast`` restores, as N-D SBP text (the
    variables OneFlow's ZeRO sharded; :func:`_zero_cast_layouts`)."""
    normalized: list[str] = []
    rules = default_rules()
    for var, layout in _variable_layouts(graph, chosen, mesh, runtime, pinned).items():
        v = graph.variable_by_op[var]
        port = next(iter(graph.op_by_name[var].outputs))
        chosen[var][port] = layout
        if v.optimizer is None:
            continue
        update = chosen[v.optimizer]
        update["model_0"] = layout
        ctx = rule_context(
            graph, graph.op_by_name[v.optimizer], mesh.shape, stage, RUNTIMES[runtime].zero_sharding.value
        )
        ins = list(graph.op_by_name[v.optimizer].inputs)
        offered = [
            s.inputs[ins.index("model_diff_0")]
            for s in op_signatures(rules, ctx)[0]
            if "model_diff_0" in ins and s.inputs[ins.index("model_0")] == layout
        ]
        if offered and update.get("model_diff_0") not in offered:
            # OneFlow's layout is not one the rules offer (an uneven split that
            # autopar's even layouts leave replicated)
            update["model_diff_0"] = offered[0]
            normalized.append(v.optimizer)
    return normalized


def imported_training(graph: Graph) -> TrainingConfig:
    """The iteration a job's import records (``meta["training"]``,
    :func:`autopar.bridges.oneflow.iteration.job_training`) as the plan's :class:`TrainingConfig`.

    ``auto`` (a subset of the blocks recomputed) carries its list
    (:attr:`TrainingConfig.recomputed`)."""
    found = graph.meta.get("training") or {}
    k = int(found.get("micro_batches", 1))
    mode = str(found.get("checkpointing", "off"))
    if mode != "auto":
        return TrainingConfig(k, mode)
    return TrainingConfig(k, mode, recomputed=tuple(found.get("recomputed_blocks") or ()))


def import_plan(
    job: Any,
    *,
    graph: Graph | None = None,
    cluster: Cluster | None = None,
    zero_stage: int | None = None,
) -> Plan:
    """The plan OneFlow chose for ``job`` (message, bytes or ``.pb`` path), on the job's mesh.

    ``graph`` is the job's import (made here when omitted); ``cluster`` the
    hardware to cost it on (default: one node of a100-40g holding every device
    of the mesh); ``zero_stage`` defaults to the graph's.
    """
    job = load_job(job)
    graph = graph if graph is not None else import_job(job)
    shape = tuple(int(s) for s in graph.meta.get("mesh_shape") or ())
    if not shape:
        raise PlanError(
            "no_mesh", "the graph does not record the mesh it was built on; import it from a OneFlow job"
        )
    size = 1
    for s in shape:
        size *= s
    if cluster is None:
        cluster = Cluster(1, size, PRESETS["a100-40g"])
    if cluster.world_size != size:
        raise ConfigError(
            "bad_cluster",
            f"the job runs on {size} devices (mesh {list(shape)}) "
            f"but cluster {cluster} has {cluster.world_size}",
        )
    mesh = Mesh(cluster, shape)
    stage = int(graph.meta.get("zero_stage", 0)) if zero_stage is None else zero_stage
    chosen = job_signatures(job, graph, mesh.ndim)
    runtime = job_runtime(job)
    normalized: list[str] = []
    if stage > 0 and job.job_conf.enable_auto_parallel:
        # OneFlow's auto-parallel sets every variable's SBP itself after the ZeRO pass
        # (compiled jobs: variables stored in the layout their update reads, model and
        # model_diff alike, no gradient sharded): the job runs as ZeRO stage 0, each
        # variable boxed from its stored layout to its consumers
        stage = 0
    if stage > 0:
        normalized = zero_update_layouts(graph, chosen, mesh, stage, runtime, _zero_cast_layouts(job, graph))
    signatures = {
        op.name: Signature(
            tuple(chosen[op.name][p] for p in op.inputs), tuple(chosen[op.name][p] for p in op.outputs)
        )
        for op in graph.ops
    }
    auto = bool(job.job_conf.enable_auto_parallel)
    plan = Plan.from_assignment(
        graph,
        mesh,
        stage,
        signatures,
        source="oneflow-auto-parallel" if auto else "oneflow-inference",
        runtime=runtime,
        training=imported_training(graph),
    )
    plan.diagnostics["oneflow_job"] = job.job_conf.job_name
    if normalized:
        plan.diagnostics["zero_gradient_layout_normalized"] = normalized
    return plan
