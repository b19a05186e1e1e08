"""Response models of the API (documentation and schema checks; handlers build plain dicts)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from autopar.models import MODEL_NAMES

__all__ = [
    "GRAPH_DEFS",
    "GRAPH_SCHEMA",
    "Evaluation",
    "GraphDoc",
    "GraphField",
    "JobView",
    "KeyContextView",
    "Liveness",
    "PlanRecordView",
    "Problem",
    "Readiness",
    "StageRow",
    "SweepView",
]


# ------------------------------------------------------------------ the graph a request carries


class TensorDoc(BaseModel):
    """A logical tensor."""

    shape: list[Annotated[int, Field(ge=0)]] = Field(description="Dims, e.g. `[8, 512, 768]`.")
    dtype: str = Field(description="`float32`, `float16`, `bfloat16`, `int64`, ...")


class OpDoc(BaseModel):
    """One op; ports map port name -> tensor name, in port order."""

    name: str = Field(min_length=1)
    type: str = Field(min_length=1, description="OneFlow op type, e.g. `matmul`.")
    role: Literal["forward", "backward", "optimizer"] = "forward"
    inputs: dict[str, str] = Field(default_factory=dict)
    outputs: dict[str, str] = Field(default_factory=dict)
    attrs: dict[str, Any] = Field(default_factory=dict)


class VariableDoc(BaseModel):
    """A parameter: the variable op producing it, its gradient and optimizer op."""

    op: str
    tensor: str
    grad: str | None = None
    optimizer: str | None = None


class GraphDoc(BaseModel):
    """A training-step graph in the `autopar.graph/v1` format (docs/graph-format.md)."""

    format: Literal["autopar.graph/v1"]
    name: str = Field(default="graph", description="Shown to the requester only; not part of the plan key.")
    meta: dict[str, Any] = Field(default_factory=dict, description="Free-form; not stored with the plan.")
    tensors: dict[str, TensorDoc]
    ops: list[OpDoc] = Field(min_length=1)
    variables: list[VariableDoc] = Field(default_factory=list)


def _graph_schema() -> tuple[dict[str, Any], dict[str, Any]]:
    schema = GraphDoc.model_json_schema(ref_template="#/components/schemas/{model}")
    return schema, schema.pop("$defs", {})


GRAPH_SCHEMA, GRAPH_DEFS = _graph_schema()
"""The graph's JSON Schema (inline) and the schemas it refers to (``components/schemas``)."""

GraphField = Annotated[
    dict[str, Any] | str,
    WithJsonSchema(
        {
            "anyOf": [
                GRAPH_SCHEMA,
                {"type": "string", "enum": list(MODEL_NAMES), "description": "a bundled model's name"},
            ]
        }
    ),
]
"""The type of a request's ``graph``: an ``autopar.graph/v1`` document (documented as
:class:`GraphDoc`) or a bundled model's name, parsed by :func:`autopar_service.graphs.parse_graph`.
The one place to point at shared wire models when they exist."""


# ------------------------------------------------------------------ responses


class Problem(BaseModel):
    """RFC 9457 problem details; extension members (``op``, ``min_feasible_bytes``) may follow."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(description="`urn:autopar:problem:{code}`")
    title: str
    status: int
    detail: str = Field(description="What was wrong and what to do.")
    code: str = Field(description="Stable machine-readable code.")
    instance: str | None = None


class JobView(BaseModel):
    """A job: one solve of one canonical request (the id is the plan key)."""

    id: str
    status: str = Field(description="queued, running, succeeded, failed or canceled")
    phase: str | None = Field(description="Solver phase of the last progress report.")
    objective: float | None = Field(description="Best predicted step time so far, seconds.")
    bound: float | None = Field(description="Proven lower bound on the step time, seconds.")
    gap: float | None = Field(description="Relative optimality gap.")
    elapsed_s: float | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    attempts: int
    error: dict[str, Any] | None = Field(description="kind, code, message and details when failed.")
    result: dict[str, Any] | None = Field(description="Short result when succeeded.")
    links: dict[str, str]


class KeyContextView(BaseModel):
    """What a plan key folds in besides the request (:class:`autopar.ir.plan_key.KeyContext`)."""

    schema_: int = Field(alias="schema", description="The key's schema (bumped when its inputs change).")
    versions: dict[str, str] = Field(
        description="The code versions keyed: autopar, its source digest, OR-Tools."
    )
    request_versions: dict[str, str] = Field(
        description="The versions inside the request's canonical form: autopar, the cost model, OR-Tools."
    )
    options: dict[str, Any] = Field(
        description="Every solver option at this server's default (its time limit and workers included)."
    )


class StageRow(BaseModel):
    """One stage of a pipeline plan, as predicted (`autopar.pipeline/v1` `predicted.stages`)."""

    model_config = ConfigDict(extra="allow")

    stage: int = Field(description="0-based; stage 0 holds the first blocks (and the embedding).")
    blocks: int = Field(description="Blocks (transformer layers) of the stage.")
    first_block: str | None = Field(description="Its first block, e.g. `layers.0`.")
    last_block: str | None = Field(description="Its last block.")
    devices: int = Field(description="Devices of the stage (world / stages).")
    mesh_shape: list[int] = Field(description="The stage's logical mesh shape.")
    micro_batch_time_s: float | None = Field(
        description="Seconds per micro-batch: forward, recompute, backward and its receives."
    )
    receive_time_s: float | None = Field(
        description="Seconds per micro-batch receiving the boundary activations and gradients (part of "
        "micro_batch_time_s)."
    )
    once_per_step_time_s: float | None = Field(
        description="Seconds of the stage's once-per-step work (reductions, update, tied gradients)."
    )
    memory_per_device_bytes: float | None = Field(
        description="Bytes per device with its micro-batches in flight."
    )
    stash_bytes: float | None = Field(
        description="Activation bytes one micro-batch keeps from its forward to its backward."
    )
    in_flight: int | float = Field(
        description="Micro-batches whose activations the stage holds at once: min(S - s, K) under "
        "1F1B; under interleaved 1F1B a fraction of a device's layers (Megatron-Core's warm-up)."
    )


class PlanRecordView(BaseModel):
    """A cached plan: the `autopar.plan/v1` plan (or, with `options.stages` != 1, possibly an
    `autopar.pipeline/v1` plan) plus what produced it."""

    model_config = ConfigDict(extra="allow")

    key: str
    created_at: float
    graph: dict[str, Any]
    request: dict[str, Any]
    versions: dict[str, str]
    mesh_shape: list[int]
    zero_stage: int
    memory_budget_bytes: int | None
    iteration_time_s: float | None = Field(
        default=None,
        description="seconds of one optimizer step as the job runs it: K micro-batches plus once "
        "per step, with recomputation (what the solver minimises)",
    )
    micro_batch_time_s: float | None = Field(default=None, description="seconds of one micro-batch")
    once_per_step_s: float | None = Field(
        default=None, description="seconds of the once-per-step work (reduction, update, gather)"
    )
    step_time_s: float | None = Field(
        default=None,
        description="deprecated, kept one version: the iteration at K = 1 (one micro-batch with the "
        "once-per-step work, without recomputation); use iteration_time_s",
        json_schema_extra={"deprecated": True},
    )
    memory_per_device_bytes: float | None = Field(
        description="bytes per device; of a pipeline, its largest stage's with its micro-batches in flight"
    )
    num_stages: int | None = Field(
        default=None,
        description="pipeline stages of an `autopar.pipeline/v1` plan; absent for one stage (whose "
        "record is as it always was)",
    )
    bubble_fraction: float | None = Field(
        default=None,
        description="of a pipeline: the share of the iteration the slowest stage waits in the 1F1B fill "
        "and drain",
    )
    stages: list[StageRow] | None = Field(
        default=None, description="of a pipeline: one row per stage (blocks, devices, mesh, time, memory)"
    )
    solver: dict[str, Any]
    summary: str
    plan: dict[str, Any] = Field(
        description="the `autopar.plan/v1` plan, or of a pipeline its `autopar.pipeline/v1` document "
        "(docs/plan-format.md); `mesh_shape` above is then each stage's"
    )


class Evaluation(BaseModel):
    """The independent evaluator's verdict on a plan."""

    model_config = ConfigDict(extra="allow")

    valid: bool
    errors: list[str]
    step_time_s: float | None
    compute_time_s: float | None
    memory_per_device_bytes: float | None
    comm_bytes_per_axis: dict[str, float | None]
    micro_batches: int = Field(description="Micro-batches per optimizer step the plan was priced at.")
    checkpointing: str = Field(description="Activation checkpointing priced: off or full.")
    iteration_time_s: float | None = Field(
        description="One optimizer step: K x micro-batch time + once-per-step work, seconds (of a "
        "pipeline plan, its 1F1B iteration)."
    )
    num_stages: int | None = Field(default=None, description="Of a pipeline plan: its stages.")
    bubble_fraction: float | None = Field(
        default=None, description="Of a pipeline plan: the share of the iteration in the fill and drain."
    )
    stages: list[StageRow] | None = Field(default=None, description="Of a pipeline plan: one row per stage.")


class SweepRow(BaseModel):
    """One point of a sweep."""

    mesh_shape: list[int] | None
    memory_budget_bytes: int | None
    zero_stage: int
    micro_batches: int = Field(description="Micro-batches per optimizer step the point is planned for.")
    checkpointing: str = Field(description="Activation checkpointing: off or full.")
    key: str
    status: str = Field(description="succeeded, infeasible, failed, canceled, queued or running")
    iteration_time_s: float | None = Field(
        description="Predicted optimizer step: K x micro-batch + once-per-step work, seconds."
    )
    micro_batch_time_s: float | None = Field(default=None, description="One micro-batch, seconds.")
    step_time_s: float | None = Field(
        default=None,
        description="deprecated, kept one version: the iteration at K = 1; use iteration_time_s",
        json_schema_extra={"deprecated": True},
    )
    memory_per_device_bytes: float | None
    chosen_mesh_shape: list[int] | None
    gap: float | None
    min_feasible_bytes: int | None
    error: str | None
    links: dict[str, str]


class SweepView(BaseModel):
    """A what-if table: one row per (mesh shape, budget, ZeRO stage), all at the request's
    ``options.micro_batches`` and ``options.checkpointing``."""

    id: str
    complete: bool
    rows: list[SweepRow]
    table: str = Field(description="The rows as an aligned text table.")
    links: dict[str, str]


class Liveness(BaseModel):
    status: str


class Readiness(BaseModel):
    """``ready`` when the cache answers and jobs can run."""

    status: str = Field(description="ready or not_ready")
    checks: dict[str, dict[str, Any]]
