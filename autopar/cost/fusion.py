"""Kernels as a runtime fuses them: which ops of a graph run as one kernel, and what that costs.

A runtime names the fusions its framework runs
(:attr:`~autopar.runtimes.profile.RuntimeProfile.fused_kernels`); :func:`fused_kernels` finds
their instances in a graph from its structure (:mod:`autopar.ir.blocks`):

=======================  ==========================================================================
fusion                   ops of one kernel instance
=======================  ==========================================================================
``flash_attention``      an attention core (``QK^T``, scale, mask or bias add, softmax, dropout,
                         ``PV``) with its backward: FlashAttention (Dao et al. 2022, 2023), which
                         Megatron-LM runs (``--attention-backend flash|fused``)
``bias_gelu``            a bias add feeding an activation (Megatron-LM's ``bias_gelu_impl``,
                         megatron/core/fusions/fused_bias_gelu.py)
``bias_dropout_add``     a bias add, dropout and residual add (``bias_dropout_add_fused_train``,
                         megatron/core/fusions/fused_bias_dropout.py)
=======================  ==========================================================================

Inside a kernel instance a tensor made and used only by its ops is never written to memory
(:attr:`Kernels.internal`: no activation memory, no traffic), an edge between two of its ops
cannot be boxed (:class:`autopar.cost.edges.EdgeKind` ``FUSED``: equal layouts or ``inf``),
and each op costs (:func:`fused_compute_time`):

* the attention GEMMs of ``flash_attention``: their FLOPs at FlashAttention's measured fraction
  of the device's peak (:data:`FLASH_ATTENTION_EFFICIENCY`), the backward's times 5/4 (it
  recomputes ``QK^T``: five GEMMs for the graph's four), half of both under a causal mask
  (FlashAttention skips the masked tiles);
* every other op: streaming what it reads from outside the kernel and what it writes that is
  used outside it (:func:`autopar.hardware.kernels.memory_time`).

The ops keep their own types and signatures (a plan still names every op, and applies to the
framework's graph); the fusion rides on an attr, :data:`KERNEL_ATTR`, of the op a cost model
prices (:func:`priced_op`), so cost-table keys tell fused ops from unfused ones.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autopar.hardware.kernels import memory_time
from autopar.hardware.mesh import Mesh
from autopar.ir.blocks import ACTIVATION_OPS, attention_backward_ops, layer_of, op_groups, split_unit
from autopar.ir.graph import DTYPE_BYTES, Graph, Op, Role
from autopar.ir.sbp import Signature, local_shape
from autopar.ir.structure import _structure
from autopar.rules.registry import Rule, RuleContext, work_share
from autopar.runtimes.profile import RuntimeProfile

__all__ = [
    "FLASH_ATTENTION_EFFICIENCY",
    "FUSIONS",
    "KERNEL_ATTR",
    "Kernels",
    "fused_compute_time",
    "fused_kernels",
    "priced_op",
]

FUSIONS = ("flash_attention", "bias_gelu", "bias_dropout_add")
"""The fusions a runtime may name."""

KERNEL_ATTR = "_kernel"
"""The attr of a fused op as priced: ``{"fusion", "gemm", "read", "write", ...}``."""

FLASH_ATTENTION_EFFICIENCY = ((64, 0.50), (128, 0.60))
"""FlashAttention-2's forward and backward throughput as a fraction of an A100's fp16 peak, by
head dim (linear between, flat outside): Dao 2023, "FlashAttention-2: Faster Attention with
Better Parallelism and Work Partitioning" (arXiv:2307.08691): 50-73 % of the theoretical
maximum FLOPs/s on A100 (abstract), the forward near the top of that range and the backward
near the bottom, head dim 64 slower than 128 (section 4.1, figures "Attention forward +
backward speed on A100"); we take the lower figures for forward and backward alike.  Devices
other than the A100 scale it by their ``matmul_efficiency`` over the A100's (0.86, the presets'
mamf-finder measurement)."""
_A100_MATMUL_EFFICIENCY = 0.86
_BACKWARD_GEMMS = 5 / 4
"""FlashAttention's backward runs five GEMMs (``QK^T`` again, ``dV``, ``dP``, ``dQ``, ``dK``)
where the graph's backward has four."""


@dataclass(frozen=True)
class Kernels:
    """The fused kernel instances of one graph under one runtime."""

    instance: Mapping[str, str]
    """Op name -> its kernel instance (``<fusion>@<first op>``)."""
    internal: frozenset[str]
    """Tensors made and used only inside one instance: never written to memory."""
    attrs: Mapping[str, dict[str, Any]]
    """Op name -> the :data:`KERNEL_ATTR` it is priced with."""

    def same_kernel(self, producer: str, consumer: str) -> bool:
        """Whether the edge ``producer -> consumer`` runs inside one kernel instance."""
        found = self.instance.get(producer)
        return found is not None and found == self.instance.get(consumer)


NO_KERNELS = Kernels({}, frozenset(), {})

_cache: dict[tuple[str, tuple[str, ...]], Kernels] = {}


def fused_kernels(graph: Graph, runtime: RuntimeProfile) -> Kernels:
    """The kernel instances of ``runtime``'s fusions in ``graph`` (module docstring); cached per
    graph content and fusions."""
    if not runtime.fused_kernels:
        return NO_KERNELS
    key = (graph.content_hash(), tuple(runtime.fused_kernels))
    found = _cache.get(key)
    if found is None:
        if len(_cache) >= 64:
            _cache.pop(next(iter(_cache)))
        found = _cache[key] = _find(graph, runtime.fused_kernels)
    return found


def _find(graph: Graph, fusions: Sequence[str]) -> Kernels:
    groups: dict[str, list[str]] = defaultdict(list)  # instance -> member ops
    blocks = {layer_of(op.name) for op in graph.ops}
    units = op_groups(graph, blocks)
    if "flash_attention" in fusions:
        for name, unit in units.items():
            if split_unit(unit)[1] == "attention_core":
                groups[f"flash_attention@{unit}"].append(name)
        for name, unit in attention_backward_ops(graph, units).items():
            groups[f"flash_attention@{unit}"].append(name)
    taken = {name for members in groups.values() for name in members}
    bias_adds = _bias_adds(graph)
    for op in graph.topological_order:
        if op.role is not Role.FORWARD or op.name in taken or op.name not in bias_adds:
            continue
        chain = _bias_chain(graph, op, fusions, taken)
        if chain is not None:
            fusion, members = chain
            groups[f"{fusion}@{op.name}"].extend(members)
            taken.update(members)
    instance = {name: key for key, members in groups.items() for name in members}
    internal = frozenset(
        t
        for op_name, key in instance.items()
        for t in graph.op_by_name[op_name].outputs.values()
        if graph.consumers.get(t) and all(instance.get(c) == key for c, _ in graph.consumers[t])
    )
    attrs = {
        name: _attr(graph, graph.op_by_name[name], key, instance, internal) for name, key in instance.items()
    }
    return Kernels(instance, internal, attrs)


def _bias_adds(graph: Graph) -> frozenset[str]:
    """Forward broadcast adds of a 1-D parameter (a linear's bias)."""
    st = _structure(graph)
    return frozenset(
        op.name
        for op in graph.ops
        if op.role is Role.FORWARD
        and op.type in ("broadcast_add", "bias_add")
        and any(t in st.param_source and graph.tensors[t].ndim == 1 for t in op.inputs.values())
    )


def _only_consumer(graph: Graph, tensor: str) -> Op | None:
    consumers = graph.consumers.get(tensor, [])
    forward = [graph.op_by_name[c] for c, _ in consumers if graph.op_by_name[c].role is Role.FORWARD]
    return forward[0] if len(forward) == 1 else None


def _bias_chain(
    graph: Graph, bias_add: Op, fusions: Sequence[str], taken: set[str]
) -> tuple[str, list[str]] | None:
    """``bias_gelu`` (bias add -> activation) or ``bias_dropout_add`` (bias add -> dropout ->
    residual add) starting at ``bias_add``, when ``fusions`` has it."""
    out = next(iter(bias_add.outputs.values()))
    nxt = _only_consumer(graph, out)
    if nxt is None or nxt.name in taken:
        return None
    if nxt.type in ACTIVATION_OPS and "bias_gelu" in fusions:
        return "bias_gelu", [bias_add.name, nxt.name]
    if nxt.type == "dropout" and "bias_dropout_add" in fusions:
        dropped = nxt.outputs.get("out_0") or next(iter(nxt.outputs.values()))
        add = _only_consumer(graph, dropped)
        if add is not None and add.type in ("add_n", "add", "broadcast_add") and add.name not in taken:
            return "bias_dropout_add", [bias_add.name, nxt.name, add.name]
    return None


def _attr(
    graph: Graph, op: Op, key: str, instance: Mapping[str, str], internal: frozenset[str]
) -> dict[str, Any]:
    """The :data:`KERNEL_ATTR` of member ``op`` of kernel ``key``: the ports it reads from and
    writes to memory, and for a FlashAttention GEMM its pass, head dim and mask."""
    fusion = key.split("@", 1)[0]
    read = [p for p, t in op.inputs.items() if instance.get(graph.producer[t][0]) != key]
    write = [p for p, t in op.outputs.items() if t not in internal]
    out: dict[str, Any] = {"fusion": fusion, "read": read, "write": write}
    if fusion == "flash_attention" and op.type == "batch_matmul":
        out["gemm"] = "backward" if op.role is Role.BACKWARD else "forward"
        out["head_dim"] = _head_dim(graph, key, instance)
        out["causal"] = (graph.meta or {}).get("family") == "gpt"
    return out


def _head_dim(graph: Graph, key: str, instance: Mapping[str, str]) -> int:
    """The head dim of an attention core: the contracted dim of its forward ``QK^T``."""
    for name, k in instance.items():
        op = graph.op_by_name[name]
        if k == key and op.role is Role.FORWARD and op.type == "batch_matmul":
            return int(graph.tensors[next(iter(op.inputs.values()))].shape[-1])
    return 64


def priced_op(op: Op, kernels: Kernels) -> Op:
    """``op`` as a cost model prices it: with its :data:`KERNEL_ATTR` when it is fused."""
    attr = kernels.attrs.get(op.name)
    if attr is None:
        return op
    return dataclasses.replace(op, attrs={**op.attrs, KERNEL_ATTR: attr})


def flash_efficiency(head_dim: int, matmul_efficiency: float) -> float:
    """FlashAttention's fraction of peak for ``head_dim`` on a device whose large GEMMs reach
    ``matmul_efficiency`` (:data:`FLASH_ATTENTION_EFFICIENCY`).  Unitless."""
    (d0, e0), (d1, e1) = FLASH_ATTENTION_EFFICIENCY
    at = e0 + (e1 - e0) * (min(max(head_dim, d0), d1) - d0) / (d1 - d0)
    return at * matmul_efficiency / _A100_MATMUL_EFFICIENCY


def fused_compute_time(rule: Rule | None, ctx: RuleContext, sig: Signature, mesh: Mesh) -> float:
    """Seconds of fused op ``ctx.op`` under ``sig`` (module docstring): a FlashAttention GEMM's
    FLOPs per device over ``peak x`` :func:`flash_efficiency` (times 5/4 in backward, half under
    a causal mask); any other member's bytes read from and written to memory over the
    streaming bandwidth.  Units: seconds."""
    attr = ctx.op.attrs[KERNEL_ATTR]
    dev = mesh.cluster.device
    if attr.get("gemm") and rule is not None and rule.flops is not None:
        flops = rule.flops(ctx) / work_share(sig, mesh.shape)
        if attr["gemm"] == "backward":
            flops *= _BACKWARD_GEMMS
        if attr.get("causal"):
            flops /= 2
        return flops / (dev.peak_flops * flash_efficiency(int(attr["head_dim"]), dev.matmul_efficiency))
    ports_in, ports_out = list(ctx.op.inputs), list(ctx.op.outputs)
    moved = 0.0
    for port in attr["read"]:
        i = ports_in.index(port)
        moved += _local_bytes(ctx.inputs[i], sig.inputs[i], mesh.shape)
    for port in attr["write"]:
        i = ports_out.index(port)
        moved += _local_bytes(ctx.outputs[i], sig.outputs[i], mesh.shape)
    return memory_time(dev, moved)


def _local_bytes(spec: Any, sbp: Any, mesh_shape: Sequence[int]) -> float:
    local = local_shape(spec.shape, sbp, mesh_shape)
    numel = math.prod(local) if local is not None else spec.numel
    return float(numel * DTYPE_BYTES[spec.dtype])
