"""Pipeline plans and their wire format ``autopar.pipeline/v1``: one plan per stage, each on its
sub-mesh, the cut (:class:`PipelinePlan`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from autopar.errors import PlanError
from autopar.hardware.cluster import Cluster
from autopar.ir.batch import BatchShape
from autopar.ir.plan import Plan, format_bytes, throughput_line
from autopar.ir.training import TrainingConfig

__all__ = ["FORMAT", "PipelinePlan"]

FORMAT = "autopar.pipeline/v1"


@dataclass
class PipelinePlan:
    """A plan in stages: block counts, and per stage a plan of its graph on its sub-mesh."""

    graph_name: str
    graph_hash: str
    cluster: Cluster
    counts: tuple[int, ...]
    stages: list[Plan]
    training: TrainingConfig
    predicted: dict[str, Any] = field(default_factory=dict)
    solver: dict[str, Any] | None = None
    source: str = "autopar"
    memory_budget_bytes: int | None = None
    diagnostics: dict[str, Any] = field(default_factory=dict)
    virtual_stages: int = 1
    """Model chunks per device under Megatron-LM's interleaved 1F1B (1: plain 1F1B)."""

    @property
    def iteration_time_s(self) -> float:
        return float(self.predicted.get("iteration_time_s", math.nan))

    @property
    def achieved_iteration_time_s(self) -> float:
        """The iteration as the stages' runtime runs it (less the communication it hides)."""
        return float(self.predicted.get("achieved_iteration_time_s", self.iteration_time_s))

    @property
    def memory_per_device_bytes(self) -> float:
        """The largest stage's bytes per device (with its micro-batches in flight)."""
        return float(self.predicted.get("memory_per_device_bytes", math.nan))

    @property
    def num_stages(self) -> int:
        return len(self.counts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "source": self.source,
            "graph": {"name": self.graph_name, "hash": self.graph_hash},
            "cluster": self.cluster.to_dict(),
            "block_counts": list(self.counts),
            "micro_batches": self.training.micro_batches,
            "checkpointing": self.training.checkpointing,
            "memory_budget_bytes": self.memory_budget_bytes,
            "predicted": self.predicted,
            "solver": self.solver,
            "diagnostics": self.diagnostics,
            "stages": [p.to_dict() for p in self.stages],
            **({"virtual_stages": self.virtual_stages} if self.virtual_stages > 1 else {}),
        }

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str | bytes) -> PipelinePlan:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise PlanError("bad_plan", f"plan is not JSON: {exc}") from None
        return cls.from_dict(data)

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            f.write(self.to_json(indent=1))

    def mesh_text(self) -> str:
        """``2 stages x [32, 8]`` (``, 2 chunks each`` under interleaving)."""
        chunks = f", {self.virtual_stages} chunks each" if self.virtual_stages > 1 else ""
        return f"{self.num_stages} stages x {list(self.stages[0].mesh.shape)}{chunks}"

    def schedule_text(self) -> str:
        """`` (interleaved 1F1B, 2 chunks per device)`` under interleaving, else nothing."""
        v = self.virtual_stages
        return f" (interleaved 1F1B, {v} chunks per device)" if v > 1 else ""

    @classmethod
    def from_dict(cls, data: Any) -> PipelinePlan:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise PlanError("bad_plan", f"not an {FORMAT} document")
        try:
            stages = [Plan.from_dict(s) for s in data["stages"]]
            training = TrainingConfig(int(data["micro_batches"]), str(data["checkpointing"]))
            return cls(
                data["graph"]["name"],
                data["graph"]["hash"],
                Cluster.from_dict(data["cluster"]),
                tuple(int(c) for c in data["block_counts"]),
                stages,
                training,
                dict(data.get("predicted") or {}),
                data.get("solver"),
                str(data.get("source", "autopar")),
                data.get("memory_budget_bytes"),
                dict(data.get("diagnostics") or {}),
                int(data.get("virtual_stages", 1)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanError("bad_plan", f"malformed {FORMAT} document: {exc}") from None

    def summary(self, batch: BatchShape | None = None) -> str:
        """A line for the pipeline and one per stage; with the graph's ``batch``
        (:func:`autopar.ir.batch.batch_shape`) also the throughput."""
        p = self.predicted
        lines = [
            f"{self.source} pipeline plan for {self.graph_name} on {self.cluster}: {self.num_stages} stages"
            f"{self.schedule_text()}, "
            f"iteration {self.iteration_time_s * 1e3:.2f} ms modelled "
            f"({self.training.micro_batches} micro-batches, "
            f"bubble {p.get('bubble_fraction', math.nan) * 100:.1f} %), "
            f"{format_bytes(self.memory_per_device_bytes)} per device (largest stage)",
        ]
        if batch is not None:
            lines.append(throughput_line(batch, self.training.micro_batches, self.iteration_time_s))
        for row in p.get("stages", []):
            lines.append(
                f"  stage {row['stage']}: {row['blocks']} block(s) on {row['devices']} devices "
                f"mesh {row['mesh_shape']}, {row['micro_batch_time_s'] * 1e3:.2f} ms per micro-batch "
                f"(receives {row['receive_time_s'] * 1e3:.2f} ms), "
                f"{format_bytes(row['memory_per_device_bytes'])} ({row['in_flight']} in flight)"
            )
        return "\n".join(lines)
