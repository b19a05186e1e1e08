"""Optimizer updates: ``adam_update``, ``sgd_update``, ``momentum_update`` ... (full N-D rules).

An update reads the parameter (``model``), its gradient (``model_diff``) and its
states (``m``, ``v`` ...) elementwise, so all of them share one layout ``v``:
any N-D SBP of the parameter made of ``B`` and ``S(d)`` (never ``P``: a variable
holds values, not addends) that OneFlow accepts (:func:`autopar.ir.sbp.local_shape`:
uneven splits included).

ZeRO (``ctx.zero_stage >= 1``; Rajbhandari et al. 2020, OneFlow's
``optimizer_placement_optimization_mode="distributed_split"``): on every mesh
axis where ``v`` is ``B`` the parameter is replicated, so the gradient and the
optimizer states are sharded there instead (``ctx.zero_sharding="one_axis"``,
the ``oneflow-0.9`` runtime: on one such axis only, :func:`oneflow_zero_shard`)
-- ``B`` becomes ``S(d)`` for the first dim ``d`` that still divides evenly (it
stays ``B`` when none does, and on axes of size 1).  The gradient producer's
``P`` then reaches the update through a reduce-scatter rather than an all-reduce.  With ``model`` ``B`` and
``model_diff`` ``S`` on an axis, the update computes one shard of the new
parameter and all-gathers it back into the replicated variable over that axis;
the cost model charges that all-gather (the second half of ZeRO's traffic).
OneFlow leaves a variable unsharded when a shard would keep fewer than
``shard_min_size`` elements (default 1024; ``ctx.zero_sharding`` carries it,
:func:`autopar.runtimes.profile.parse_zero_sharding`): its update then reads ``model``,
``model_diff`` and the states all in ``v``, so no all-gather is charged.

Scalar inputs (``learning_rate``, ``bias_correction1/2``, ``scale_by_tensor``,
``skip_if``, ``train_step``) are ``B``.  ``model_copy`` (the fp16 copy) follows
``model``.  LAMB and LARS need norms of the whole tensor, so they take the
replicated layout only.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from autopar.ir.optimizer import OPTIMIZER_OPS, SCALAR_PORTS
from autopar.ir.sbp import B, NdSbp, SbpValue, Signature, Split, local_shape
from autopar.rules.families._common import port_map
from autopar.rules.registry import CostKind, RuleContext, register
from autopar.runtimes.profile import ONEFLOW_SHARD_MIN_SIZE, parse_zero_sharding

__all__ = ["OPTIMIZER_OPS", "oneflow_shard_is_valid", "oneflow_zero_shard", "parameter_layouts", "zero_shard"]

_REPLICATED_ONLY = frozenset({"lamb_update", "lars_update"})
_MODEL_LAYOUT = frozenset({"model", "model_copy"})
_SCALARS = SCALAR_PORTS


def parameter_layouts(shape: Sequence[int], mesh_shape: Sequence[int]) -> list[NdSbp]:
    """Every N-D SBP of ``B`` / ``S(d)`` per axis that OneFlow accepts for ``shape`` (no ``P``).

    Ordered with the fully replicated layout first.
    """
    per_axis: list[SbpValue] = [B, *(Split(d) for d in range(len(shape)))]
    layouts = []
    for combo in itertools.product(per_axis, repeat=len(mesh_shape)):
        v = NdSbp(tuple(combo))
        if local_shape(shape, v, mesh_shape) is not None:
            layouts.append(v)
    return layouts


def zero_shard(
    shape: Sequence[int], v: NdSbp, mesh_shape: Sequence[int], sharding: str = "all_axes"
) -> NdSbp:
    """Where ZeRO keeps a replicated parameter's gradient and states.

    ``sharding="all_axes"``: ``v`` with each ``B`` axis (of size > 1) turned
    into ``S(d)``, ``d`` the first dim whose local size still divides by the
    axis size; ``B`` stays when none does.
    ``sharding="data_axes"`` (Megatron-LM): the same, but never on the last
    (tensor-parallel) axis of a mesh of two or more axes.

    ``sharding="one_axis"`` (OneFlow 0.9, :func:`oneflow_zero_shard`): one
    ``B`` axis becomes split, as OneFlow's ``GenerateSplitSignature`` chooses,
    unless a shard would keep fewer than ``shard_min_size`` elements (default
    1024; ``"one_axis:shard_min_size=N"`` sets it).
    """
    local = local_shape(shape, v, mesh_shape)
    if local is None:
        raise ValueError(f"layout {v} does not divide shape {list(shape)} on mesh {list(mesh_shape)}")
    axes, min_size = parse_zero_sharding(sharding)
    if axes == "one_axis":
        return oneflow_zero_shard(shape, v, mesh_shape, min_size)
    sizes = list(local)
    values = list(v.values)
    # data_axes (Megatron-LM's data-parallel group): never the last axis of a 2+ axis mesh
    skip = len(mesh_shape) - 1 if axes == "data_axes" and len(mesh_shape) > 1 else None
    for axis, (value, n) in enumerate(zip(v.values, mesh_shape, strict=True)):
        if value != B or n == 1 or axis == skip:
            continue
        for d, size in enumerate(sizes):
            if size % n == 0:
                values[axis] = Split(d)
                sizes[d] //= n
                break
    return NdSbp(tuple(values))


def oneflow_shard_is_valid(
    shape: Sequence[int], layout: NdSbp, mesh_shape: Sequence[int], min_size: int
) -> bool:
    """Whether OneFlow 0.9's ZeRO keeps a variable of ``shape`` sharded as ``layout``.

    Port of ``IsSplitValid`` (``optimizer_placement_optimization_pass.cpp``):
    the tensor must hold ``min_size`` elements, and after each split axis of
    ``layout`` in mesh order (dim ``d`` floor-divided by the axis size: uneven
    splits count their smallest shard) still ``min_size``.  ``min_size`` is the
    job's ``optimizer_placement_optimization_threshold``
    (``enable_zero(shard_min_size=...)``, default 1024).  Units: elements.
    """
    if not shape or math.prod(shape) < 1:
        return False
    cur = list(shape)
    if math.prod(cur) < min_size:
        return False
    for value, n in zip(layout.values, mesh_shape, strict=True):
        if isinstance(value, Split):
            if value.dim >= len(cur):
                return False
            cur[value.dim] //= n
            if math.prod(cur) < min_size:
                return False
    return True


def oneflow_zero_shard(
    shape: Sequence[int], v: NdSbp, mesh_shape: Sequence[int], min_size: int = ONEFLOW_SHARD_MIN_SIZE
) -> NdSbp:
    """OneFlow 0.9's ZeRO layout of a variable laid out as ``v`` (one more split axis).

    Source: ``oneflow/core/job_rewriter/optimizer_placement_optimization_pass.cpp``
    (``GenerateSplitSignature``, ``IsSplitValid``): an all-``B`` variable gets
    ``S(0)`` on the last mesh axis; otherwise the first ``B`` axis ``j`` whose
    neighbour ``j-1`` (else ``j+1``) is ``S(d)`` becomes ``S(d)``; nothing else
    changes ("Only split one more dim").  Axes of size 1 are skipped (autopar
    solves them away; OneFlow would split such an axis, sharding nothing).
    OneFlow accepts uneven splits
    (``BalancedSplitter``) as long as the shard keeps ``threshold`` elements, and
    so does autopar (:func:`autopar.ir.sbp.local_shape`; the planner still chooses
    among even parameter layouts, :func:`autopar.rules.registry.planning_signatures`).
    When the new layout leaves
    a shard of fewer than ``min_size`` elements (:func:`oneflow_shard_is_valid`,
    OneFlow's ``shard_min_size``, default 1024) the variable keeps ``v``.
    Checked on OneFlow 0.9 (``tests/oneflow/test_oneflow_zero_shard.py``: conv and
    matmul weights, ``(B, B)`` and ``(B, S(0))``, one or two readers, all stored as
    this says; where the job lacks the forward cast, OneFlow pruned it, see
    ``autopar/bridges/oneflow/plans.py``).
    """
    values = list(v.values)
    # size-1 mesh axes hold nothing (the planner solves them away): neighbours and the
    # last axis are taken among the axes of size > 1, so the rule does not depend on them
    live = [a for a, size in enumerate(mesh_shape) if size > 1]
    target: int | None = None
    split: SbpValue = B
    if live and all(values[a] == B for a in live):
        target, split = live[-1], Split(0)
    else:
        for idx, j in enumerate(live):
            if values[j] != B:
                continue
            for k in (idx - 1, idx + 1):
                if 0 <= k < len(live) and isinstance(values[live[k]], Split):
                    target, split = j, values[live[k]]
                    break
            if target is not None:
                break
    if target is None:
        return v
    values[target] = split
    out = NdSbp(tuple(values))
    if local_shape(shape, out, mesh_shape) is None or not oneflow_shard_is_valid(
        shape, out, mesh_shape, min_size
    ):
        return v
    return out


@register(*OPTIMIZER_OPS, cost=CostKind.MEMORY, nd=True)
def optimizer_update(ctx: RuleContext) -> list[Signature]:
    """One signature per parameter layout ``v``: ``model`` ``v``, ``model_diff`` and states
    ``v`` (ZeRO 0) or ``zero_shard(v)`` (ZeRO >= 1), scalars ``B``."""
    pm = port_map(ctx, OPTIMIZER_OPS[ctx.op.type])
    model = pm.input("model") or ctx.inputs[0]
    mesh = ctx.mesh_shape
    replicated = NdSbp(tuple(B for _ in mesh))
    layouts = parameter_layouts(model.shape, mesh)
    if ctx.op.type in _REPLICATED_ONLY:
        layouts = [replicated]
    sigs = []
    for v in layouts:
        g = zero_shard(model.shape, v, mesh, ctx.zero_sharding) if ctx.zero_stage >= 1 else v
        ins = []
        for name, spec in zip(pm.inputs, pm.input_specs, strict=True):
            if name in _MODEL_LAYOUT:
                ins.append(v)
            elif name in _SCALARS or spec.shape != model.shape:
                ins.append(replicated)
            else:  # model_diff and the optimizer states
                ins.append(g)
        outs = [v if spec.shape == model.shape else replicated for spec in pm.output_specs]
        sigs.append(Signature(tuple(ins), tuple(outs)))
    return sigs
