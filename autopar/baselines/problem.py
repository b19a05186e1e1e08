"""What every baseline reads and what it is: the graph, mesh and pricing of one baseline plan
(:class:`_Problem`), where it puts its sources (:class:`_Layout`), the kinds
(:class:`BaselineKind`) and the strategy type (:class:`Baseline`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum
from typing import ClassVar

from autopar.cost.compute import op_signatures, rule_context
from autopar.hardware.mesh import Mesh
from autopar.ir.graph import Graph, Op
from autopar.ir.plan import Plan
from autopar.ir.sbp import B, NdSbp, Signature
from autopar.ir.structure import batch_size
from autopar.rules.registry import RuleContext, RuleSet
from autopar.runtimes.registry import runtime_profile

__all__ = ["BASELINES", "BaselineKind"]


class BaselineKind(str, Enum):
    MEGATRON = "megatron"
    INFERRED = "inferred"
    DATA_PARALLEL = "data-parallel"
    SINGLE_DEVICE = "single-device"


BASELINES = [k.value for k in BaselineKind]


def _closest(sigs: list[Signature], out_target: NdSbp) -> Signature:
    def score(sig: Signature) -> int:
        return sum(1 for a, b in zip(sig.outputs[0], out_target) if a != b) if sig.outputs else 0

    return min(sigs, key=score)


@dataclass
class _Problem:
    """What every baseline strategy reads: the graph, the mesh and how to price it."""

    graph: Graph
    mesh: Mesh
    zero_stage: int
    rules: RuleSet
    runtime: str
    sequence_parallel: bool = False
    """Megatron-LM's ``--sequence-parallel``: norms, dropouts and residual adds split the
    sequence on the tensor-parallel axis (:class:`autopar.baselines.greedy_walk._GreedyWalk`)."""
    _contexts: dict[str, tuple[RuleContext, list[Signature]]] = field(default_factory=dict)
    _batch: list[int | None] = field(default_factory=list)

    @property
    def batch(self) -> int | None:
        """The batch size (:func:`batch_size`), found once."""
        if not self._batch:
            self._batch.append(batch_size(self.graph))
        return self._batch[0]

    @property
    def replicated(self) -> NdSbp:
        return NdSbp(tuple(B for _ in range(self.mesh.ndim)))

    @property
    def tp_axis(self) -> int | None:
        """The tensor-parallel axis: the last one of a mesh with two or more axes."""
        return self.mesh.ndim - 1 if self.mesh.ndim >= 2 else None

    def signatures_of(self, op: Op) -> tuple[RuleContext, list[Signature]]:
        """The op's rule context and valid signatures (one rule evaluation per op)."""
        found = self._contexts.get(op.name)
        if found is None:
            sharding = runtime_profile(self.runtime).zero_sharding.value
            ctx = rule_context(self.graph, op, self.mesh.shape, self.zero_stage, sharding)
            found = self._contexts[op.name] = (ctx, op_signatures(self.rules, ctx)[0])
        return found

    def source_signature(self, op: Op, layout: _Layout) -> Signature:
        """A source op's signature: the closest to :func:`_source_layout` of ``layout``."""
        _, sigs = self.signatures_of(op)
        target = _source_layout(self.graph, op, layout.variables, layout.data, self.batch, self.replicated)
        return _closest(sigs, target)

    def to_plan(self, kind: BaselineKind, chosen: dict[str, Signature]) -> Plan:
        return Plan.from_assignment(
            self.graph,
            self.mesh,
            self.zero_stage,
            chosen,
            source=f"baseline:{kind.value}",  # MEGATRON_SOURCE for megatron
            runtime=runtime_profile(self.runtime).name,
        )


@dataclass(frozen=True)
class _Layout:
    """Where a baseline puts its sources: parameters, batch inputs, and Megatron's linears."""

    variables: dict[str, NdSbp]
    data: NdSbp
    fused: dict[str, int] = field(default_factory=dict)  # column-parallel variable -> linear id


class Baseline(ABC):
    """One reference plan: a parameter layout and a rule for every other op's signature."""

    kind: ClassVar[BaselineKind]

    @abstractmethod
    def signatures(self, problem: _Problem) -> dict[str, Signature]:
        """Op name -> the signature this baseline gives it."""

    def plan(self, problem: _Problem) -> Plan:
        return problem.to_plan(self.kind, self.signatures(problem))


def _source_layout(
    graph: Graph, op: Op, var_layout: dict[str, NdSbp], data: NdSbp, batch: int | None, replicated: NdSbp
) -> NdSbp:
    """The layout a baseline gives a source op: a parameter its ``var_layout`` entry
    (else replicated); a batch input ``data``; any other input or constant replicated
    (T5's position buckets are the same on every rank)."""
    if op.name in var_layout or op.type == "variable":
        return var_layout.get(op.name, replicated)
    if op.type in ("input", "pipeline_recv"):  # a stage's received activation: data-parallel too
        spec = graph.tensors[next(iter(op.outputs.values()))]
        return data if spec.shape[:1] == (batch,) else replicated
    return replicated
