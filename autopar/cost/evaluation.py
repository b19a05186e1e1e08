"""The result of re-evaluating a plan: per op (:class:`OpCost`), per edge (:class:`EdgeCost`) and
in total (:class:`Evaluation`: iteration and step time, communication per axis and per
collective, memory, errors), and what one evaluation shares with the next
(:class:`PricingMemo`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from autopar.cost.compute import op_signature_set
from autopar.cost.memory import (
    MemoryBreakdown,
)
from autopar.hardware.mesh import Mesh
from autopar.ir.sbp import NdSbp, Signature
from autopar.ir.training import TrainingConfig
from autopar.rules.registry import RuleContext, RuleSet
from autopar.runtimes.boxing import BoxingStep

__all__ = ["EdgeCost", "Evaluation", "OpCost", "PricingMemo"]


@dataclass(frozen=True)
class OpCost:
    """One op's chosen signature and its compute time (the ZeRO gather counts as communication)."""

    name: str
    type: str
    signature: str
    compute_s: float
    """Seconds: :func:`autopar.cost.compute.op_compute_time` less the op's ZeRO parameter gathers."""
    per_micro_batch: int = 1
    """Runs per micro-batch (2: recomputed in backward; 0: once per optimizer step)."""
    per_step: int = 0
    """Runs per optimizer step outside the micro-batches (1 for the update and clipping)."""

    @property
    def cost_s(self) -> float:
        return self.compute_s


@dataclass(frozen=True)
class EdgeCost:
    """One producer -> consumer edge that needs boxing (or the ZeRO gather inside an optimizer op)."""

    producer: str
    consumer: str
    port: str
    tensor: str
    shape: tuple[int, ...]
    dtype: str
    src: NdSbp
    dst: NdSbp
    steps: tuple[BoxingStep, ...]
    """The boxing's steps; a bucketed gradient edge's saving is spread over them in proportion."""
    time_s: float
    """Seconds: :func:`autopar.cost.edges.edge_time` (sum of the steps' times)."""
    zero_gather: bool = False
    """True for the ZeRO parameter all-gather of an optimizer op (not a graph edge)."""
    gradient: bool = False
    """True for a data-parallel gradient reduction (overlappable with the backward pass)."""
    per_micro_batch: int = 1
    """Runs per micro-batch (2: recomputed forward boxing; 0: once per optimizer step)."""
    per_step: int = 0
    """Runs per optimizer step outside the micro-batches (the reduction of accumulated
    gradients, a ZeRO gather after the update)."""

    @property
    def cost_s(self) -> float:
        return self.time_s

    @property
    def bytes_per_device(self) -> float:
        return sum(s.bytes_per_device for s in self.steps)

    @property
    def collectives(self) -> str:
        """``all-reduce@1, all-gather@0``: the steps' collectives and mesh axes."""
        return ", ".join(f"{s.collective.value}@{s.axis}" for s in self.steps) or "local"


class PricingMemo:
    """What evaluations of plans of one graph on one mesh share: each op's valid signatures.

    Pass the same memo to :func:`evaluate` for several plans of one graph (a
    report comparing plans) to ask the rules once per op.
    """

    def __init__(self) -> None:
        self.signatures: dict[tuple[str, str, int, str, int], tuple[frozenset[Signature], bool]] = {}
        """(mesh, op, ZeRO stage, sharding, id of the rule set) -> the op's valid signatures."""
        self._mesh_keys: dict[int, tuple[Mesh, str]] = {}
        """id of a mesh -> (the mesh, its key): an evaluation asks once per op."""

    def valid_signatures(
        self, rules: RuleSet, ctx: RuleContext, mesh: Mesh, zero_stage: int
    ) -> tuple[frozenset[Signature], bool]:
        known = self._mesh_keys.get(id(mesh))
        if known is None or known[0] is not mesh:
            known = self._mesh_keys[id(mesh)] = (mesh, mesh.key())
        key = (known[1], ctx.op.name, zero_stage, ctx.zero_sharding, id(rules))
        found = self.signatures.get(key)
        if found is None:
            found = self.signatures[key] = op_signature_set(rules, ctx)
        return found


@dataclass
class Evaluation:
    """What a plan costs, recomputed from scratch."""

    valid: bool
    errors: list[str]
    step_time_s: float
    compute_time_s: float
    comm_time_s: float
    comm_time_s_per_axis: dict[int, float]
    comm_bytes_per_axis: dict[int, float]
    comm_time_s_per_collective: dict[str, float]
    memory: MemoryBreakdown
    step_time_overlapped_s: float = math.nan
    """Serial step time less the gradient reduction hidden behind the backward pass."""
    grad_comm_time_s: float = 0.0
    """Seconds of data-parallel gradient reduction (edges into optimizer gradient ports)."""
    backward_compute_time_s: float = 0.0
    runtime: str = ""
    activation_peak_position: int = 0
    """Position in the topological order where live activations peak."""
    fallback_ops: list[str] = field(default_factory=list)
    fallback_op_types: list[str] = field(default_factory=list)
    boxed_edges: int = 0
    ops: list[OpCost] = field(default_factory=list)
    """Per op, in graph order (ops the plan lacks or mismatches are left out and named in ``errors``)."""
    edges: list[EdgeCost] = field(default_factory=list)
    """Per ZeRO gather (one per gather a step makes) and per boxed edge, in graph order."""
    activation_profile: list[float] = field(default_factory=list)
    """Live activation bytes per device at each position of the topological order, with
    boxed copies and ZeRO-3's gathered parameters (empty when the plan lacks ops)."""
    training: TrainingConfig = field(default_factory=TrainingConfig)
    """The micro-batches per step and checkpointing the iteration is priced for."""
    iteration_time_s: float = math.nan
    """Seconds of one optimizer step: ``K x micro_batch_time_s + once_per_step_time_s``
    (what the solver minimises; equal to ``step_time_s`` at K = 1 without checkpointing)."""
    iteration_time_overlapped_s: float = math.nan
    """The iteration less the gradient reduction hidden behind the backward it follows."""
    micro_batch_time_s: float = 0.0
    """Seconds of one micro-batch's forward, recompute and backward with their boxing."""
    once_per_step_time_s: float = 0.0
    """Seconds of what runs once per optimizer step (update, clipping, reductions after
    accumulation, ZeRO gathers after the update)."""
    recompute_time_s: float = 0.0
    """Seconds per step of recomputed forward compute and boxing (included above)."""
    accumulation_bytes: float = 0.0
    """Bytes per device of gradient-accumulation buffers (included in ``memory.grads``)."""
    shared_edges: list[EdgeCost] = field(default_factory=list)
    """Boxings the runtime shares with an earlier consumer of the same tensor in the same
    layout, or reduces with their fused linear's other parts: priced, not in the totals."""
    forward_compute_time_s: float = 0.0
    """Seconds of one micro-batch's forward compute."""
    hidden_comm_time_s: float = 0.0
    """Seconds per optimizer step of communication the runtime hides behind compute (the
    gradient reduction behind backward, the parameter gather behind forward)."""
    achieved_iteration_time_s: float = math.nan
    """The iteration as the plan's runtime runs it: ``iteration_time_s`` less what it hides
    (``hidden_comm_time_s``): the figure plans and baselines are compared by."""
    per_edge_iteration_time_s: float = math.nan
    """The iteration with every consumer's boxing priced on its own (``iteration_time_s`` plus
    what ``shared_edges`` would cost): the solver's objective, at least ``iteration_time_s``."""

    @property
    def memory_per_device_bytes(self) -> float:
        return self.memory.total

    def to_dict(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "errors": self.errors[:50],
            "error_count": len(self.errors),
            "step_time_s": self.step_time_s,
            "step_time_overlapped_s": self.step_time_overlapped_s,
            "grad_comm_time_s": self.grad_comm_time_s,
            "backward_compute_time_s": self.backward_compute_time_s,
            "runtime": self.runtime,
            "compute_time_s": self.compute_time_s,
            "comm_time_s": self.comm_time_s,
            "comm_time_s_per_axis": {str(k): v for k, v in sorted(self.comm_time_s_per_axis.items())},
            "comm_bytes_per_axis": {str(k): v for k, v in sorted(self.comm_bytes_per_axis.items())},
            "comm_time_s_per_collective": dict(sorted(self.comm_time_s_per_collective.items())),
            "memory_per_device_bytes": self.memory.total,
            "memory": {
                "params_bytes": self.memory.params,
                "grads_bytes": self.memory.grads,
                "optimizer_bytes": self.memory.optimizer,
                "activation_peak_bytes": self.memory.activations,
            },
            "micro_batches": self.training.micro_batches,
            "checkpointing": self.training.checkpointing,
            "iteration_time_s": self.iteration_time_s,
            "iteration_time_overlapped_s": self.iteration_time_overlapped_s,
            "micro_batch_time_s": self.micro_batch_time_s,
            "once_per_step_time_s": self.once_per_step_time_s,
            "recompute_time_s": self.recompute_time_s,
            "accumulation_bytes": self.accumulation_bytes,
            "achieved_iteration_time_s": self.achieved_iteration_time_s,
            "hidden_comm_time_s": self.hidden_comm_time_s,
            "per_edge_iteration_time_s": self.per_edge_iteration_time_s,
            "shared_boxings": len(self.shared_edges),
            "boxed_edges": self.boxed_edges,
            "fallback_ops": self.fallback_ops,
            "fallback_op_types": self.fallback_op_types,
        }
