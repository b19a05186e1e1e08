"""Import a OneFlow training ``Job`` as an ``autopar.graph/v1`` graph.

The job is what ``nn.Graph._full_job_proto`` holds after ``build_graph``:
forward, backward (OneFlow autograd) and optimizer ops, with ZeRO's and
auto-parallel's rewrites when enabled.  The import keeps OneFlow's op names,
port names and logical blob names, so a plan maps back op by op:

* user ops: type ``user_conf.op_type_name``; ports are OneFlow's arg names with
  the index of the blob in the arg (``a_0``, ``in_0``, ``in_1``, ``out_0``),
  in ``input_order`` / ``output_order``; attrs decoded to plain JSON (shapes as
  lists, dtypes as autopar names);
* ``variable_conf`` -> type ``variable`` with outputs ``{"out": lbn}``;
  ``input_conf`` -> ``input``; ``output_conf`` / ``return_conf`` -> ``output``;
  other system confs -> their conf name without ``_conf`` (``identity``,
  ``learning_rate_schedule``, ``tick`` ...), ports named after the conf fields;
* tensors: every blob the kept ops read or write, with shape and dtype from
  ``helper.lbn2logical_blob_desc``.

What the import removes, and why (all recorded in ``graph.meta["oneflow"]``):

* optimizer *state* variables (Adam ``m``, ``v`` ...) and the optimizer ports
  that read them: the memory model counts optimizer states once per parameter
  from its :class:`~autopar.ir.graph.Variable`;
* the optimizer's scalar side inputs (``learning_rate_0``, ``bias_correction1_0``
  ...) and the ops that only compute them (train-step counter, learning-rate
  schedule, bias-correction factors, the step ``assign``): they do not depend
  on the model or the data and are ``B`` scalars whatever the plan;
* ZeRO's ``System-ZeRO-ParallelCast-*`` ops, which pin a variable's layout for
  the forward pass: their consumers read the variable directly, so the plan
  chooses that layout; the pinned layout is kept in
  ``meta["oneflow"]["zero_layouts"]``;
* ``identity`` ops whose input is a parameter (a model reads parameters so to
  keep OneFlow from boxing a variable's own buffer): consumers read the
  parameter.

Ops with no data dependence on the model or the inputs (``arange`` and the
relative-position bucket arithmetic, masks, constants) compute the same value
whatever the plan; OneFlow computes them replicated.  The ones whose outputs a
data-dependent op reads are kept as inputless ops (same name and outputs; type
``constant`` with ``attrs["folded_type"]`` when they had inputs), the ops
feeding them are dropped (``meta["oneflow"]["dropped"]["constant_input"]``).

Roles: ops downstream of the loss-gradient seed (``train_conf.loss_grad_lbn``)
are backward; optimizer update ops (they read ``model_0`` and ``model_diff_0``)
and ops between a variable's gradient and its update (clipping) are optimizer;
the rest is forward.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from autopar.bridges.oneflow.convert import dtype_name, nd_sbp_from_strings, parallel_size
from autopar.bridges.oneflow.iteration import (
    job_training,
)
from autopar.bridges.oneflow.job_ops import (
    _descendants,
    _Import,
    _RawOp,
    _read_system_op,
    _read_user_op,
    _strings,
)
from autopar.bridges.oneflow.job_rewrites import (
    _bypass_parameter_identities,
    _drop_optimizer_state,
    _drop_zero_casts,
    _fold_constants,
    _strip_iteration,
    _strip_optimizer_ports,
)
from autopar.bridges.oneflow.jobs import load_job
from autopar.errors import GraphError
from autopar.ir.graph import Graph, Op, Role, TensorSpec, Variable

__all__ = ["graph_name_of", "import_job", "job_mesh_shape"]


def job_mesh_shape(job: Any) -> tuple[int, ...]:
    """The device mesh of a job: the hierarchy of the placement holding the most ops."""
    best: tuple[int, tuple[int, ...]] | None = None
    for group in job.placement.placement_group:
        conf = group.parallel_conf
        shape = tuple(int(d) for d in conf.hierarchy.dim) or (parallel_size(conf.device_name),)
        size = len(group.op_set.op_name)
        if best is None or size > best[0]:
            best = (size, shape)
    return best[1] if best else (1,)


def import_job(
    job: Any,
    *,
    name: str | None = None,
    zero_stage: int | None = None,
    bypass_parameter_identities: bool = True,
) -> Graph:
    """Import a OneFlow ``Job`` (message, serialized bytes or ``.pb`` path) as a validated :class:`Graph`.

    ``name`` is the graph's name (default: :func:`graph_name_of` the job's name and file).
    ``zero_stage`` overrides the ZeRO stage recorded in ``meta`` (OneFlow's job
    only says whether ZeRO is on; it is recorded as stage 2, OneFlow's default).
    ``bypass_parameter_identities`` makes ``identity`` ops that only re-read a
    parameter transparent (the example models read parameters so on CPU).
    Raises :class:`~autopar.errors.GraphError` naming the op or blob when the job
    cannot be represented (unknown dtype, blob without a descriptor).

    Three steps: read (every op of the job, decoded), classify (drop or fold what is
    not part of the training step's data flow, give each kept op its role), convert
    (tensors, ops, variables and ``meta`` of the graph).
    """
    source = job if isinstance(job, (str, os.PathLike)) else None
    job = load_job(job)
    imp = _read(job)
    _strip_iteration(imp)
    _drop_zero_casts(imp)
    if bypass_parameter_identities:
        _bypass_parameter_identities(imp)
    state_candidates = _strip_optimizer_ports(imp)
    consumers_of = _drop_optimizer_state(imp, state_candidates)
    _fold_constants(imp, consumers_of)
    backward, optimizer = _roles(imp)
    tensors = _tensors(imp)
    ops = [
        Op(r.name, r.type, dict(r.inputs), dict(r.outputs), r.attrs, _role(r.name, backward, optimizer))
        for r in imp.kept
    ]
    variables = _variables(imp, tensors)
    meta = _meta(imp, job, zero_stage)
    graph = Graph(
        name or graph_name_of(job.job_conf.job_name, source), tensors.values(), ops, variables, meta
    )
    graph.meta["training"] = job_training(job, graph)
    return graph.validate()


WRAPPER_JOB_NAME = re.compile(r"(Pipeline)?TrainGraph_[0-9]+")
"""The job name OneFlow gives the ``nn.Graph`` of :func:`~autopar.bridges.oneflow.jobs.make_train_graph`
(and of a pipeline's): the wrapper's class and a counter, the same for every model."""


def graph_name_of(job_name: str, source: str | os.PathLike[str] | None = None) -> str:
    """The name of the graph imported from a job named ``job_name``, read from the file
    ``source`` (None: from bytes or a message): the job's name, unless it is empty or the
    generic name of autopar's own training wrapper (``TrainGraph_0``), then the file's stem
    (``gpt-13b.pb`` -> ``gpt-13b``); ``oneflow-job`` when neither says more."""
    stem = Path(source).stem if source is not None else ""
    if job_name and not (stem and WRAPPER_JOB_NAME.fullmatch(job_name)):
        return job_name
    return stem or job_name or "oneflow-job"


# ---------------------------------------------------------------- read


def _read(job: Any) -> _Import:
    """Every op of ``job`` decoded, who produces each blob, and what ``train_conf`` says."""
    blob_desc = job.helper.lbn2logical_blob_desc
    lbns = set(blob_desc.keys())
    outputs_by_op: dict[str, list[str]] = defaultdict(list)
    for lbn in lbns:
        outputs_by_op[lbn.split("/", 1)[0]].append(lbn)
    for lbns_of_op in outputs_by_op.values():
        lbns_of_op.sort()
    raw: list[_RawOp] = []
    for op in job.net.op:
        kind = op.WhichOneof("op_type")
        if kind == "user_conf":
            raw.append(_read_user_op(op))
        else:
            raw.append(_read_system_op(op, kind, lbns, outputs_by_op))
    train = job.job_conf.train_conf if job.job_conf.HasField("train_conf") else None
    trainable: dict[str, str] = {}  # variable op -> grad lbn from train_conf
    if train is not None:
        for opt_conf in train.optimizer_conf:
            trainable.update(zip(opt_conf.variable_op_names, opt_conf.variable_grad_lbns))
    imp = _Import(blob_desc, lbns, raw, train, trainable, kept=list(raw))
    imp.by_name = {r.name: r for r in raw}
    imp.producer = {lbn: r.name for r in raw for lbn in r.outputs.values()}
    return imp


def _roles(imp: _Import) -> tuple[set[str], set[str]]:
    """5. Roles: the backward ops (reached from the loss gradient) and the optimizer ops
    (the updates, and everything downstream of a gradient's consumers)."""
    producer = imp.producer
    consumers_kept: dict[str, list[str]] = defaultdict(list)
    for r in imp.kept:
        for t in r.inputs.values():
            if t in producer:
                consumers_kept[producer[t]].append(r.name)
    backward: set[str] = set()
    optimizer: set[str] = set(imp.update_ops)
    if imp.train is not None:
        seeds = [producer[g] for g in _strings(imp.train.loss_grad_lbn) if g in producer]
        backward = _descendants(seeds, consumers_kept)
    grad_lbns = {r.inputs["model_diff_0"] for r in imp.kept if r.name in imp.update_ops}
    grad_lbns |= {imp.rename.get(g, g) for g in imp.trainable.values()}
    after_grads = set()
    for g in grad_lbns:
        readers = consumers_kept.get(producer.get(g, ""), ())
        for c in (c for c in readers if g in imp.by_name[c].inputs.values()):
            after_grads |= _descendants([c], consumers_kept)
    optimizer |= after_grads
    return backward, optimizer


def _role(name: str, backward: set[str], optimizer: set[str]) -> Role:
    return Role.OPTIMIZER if name in optimizer else Role.BACKWARD if name in backward else Role.FORWARD


# ---------------------------------------------------------------- convert


def _tensors(imp: _Import) -> dict[str, TensorSpec]:
    """6. Every blob a kept op reads or writes, with its logical shape and dtype."""
    tensors: dict[str, TensorSpec] = {}
    for r in imp.kept:
        for t in (*r.inputs.values(), *r.outputs.values()):
            if t in tensors:
                continue
            desc = imp.blob_desc.get(imp.shape_of.get(t, t)) if t in imp.lbns else None
            if desc is None:
                raise GraphError(
                    "unknown_blob",
                    f"op {r.name!r} uses blob {t!r}, which has no entry in helper.lbn2logical_blob_desc; "
                    "export the job after build_graph (graph._full_job_proto)",
                    op=r.name,
                    tensor=t,
                )
            enum = desc.DESCRIPTOR.fields_by_name["data_type"].enum_type.values_by_number[desc.data_type].name
            tensors[t] = TensorSpec(t, tuple(int(d) for d in desc.shape.dim), dtype_name(enum, f"blob {t!r}"))
    return tensors


def _variables(imp: _Import, tensors: dict[str, TensorSpec]) -> list[Variable]:
    """Each model variable with its gradient and update op (when the job has them)."""
    update_of_var: dict[str, str] = {}
    for upd in imp.update_ops:
        param_op = imp.producer.get(imp.by_name[upd].inputs["model_0"])
        if param_op is not None:
            update_of_var[param_op] = upd
    variables: list[Variable] = []
    for r in imp.kept:
        if r.kind != "variable_conf" or r.name.startswith("System-"):
            continue
        (tensor,) = r.outputs.values()
        update = update_of_var.get(r.name)
        if update is not None:
            grad: str | None = imp.by_name[update].inputs["model_diff_0"]
        elif r.name in imp.trainable:
            grad = imp.rename.get(imp.trainable[r.name], imp.trainable[r.name])
            grad = grad if grad in tensors else None
        else:
            grad = None
        variables.append(Variable(r.name, tensor, grad, update))
    return variables


def _meta(imp: _Import, job: Any, zero_stage: int | None) -> dict[str, Any]:
    """The graph's ``meta``: the job's mesh, ZeRO stage, and what the import dropped or folded."""
    mesh_shape = job_mesh_shape(job)
    zero_on = job.job_conf.optimizer_placement_optimization_mode == "distributed_split"
    meta: dict[str, Any] = {
        "source": "oneflow",
        "job_name": job.job_conf.job_name,
        "mesh_shape": list(mesh_shape),
        "zero_stage": zero_stage if zero_stage is not None else (2 if zero_on else 0),
        "oneflow": {
            "op_count": len(imp.raw),
            "tensor_count": len(imp.lbns),
            "dropped": {k: sorted(v) for k, v in sorted(imp.dropped.items())},
            "dropped_ports": imp.dropped_ports,
            "folded_to_constant": sorted(imp.folded),
            "zero_layouts": {
                var: str(nd_sbp_from_strings(v, len(mesh_shape)))
                for var, v in sorted(imp.zero_layouts.items())
            },
        },
    }
    if imp.train is not None:
        meta["loss"] = _strings(imp.train.loss_lbn)
    return meta
