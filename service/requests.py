"""Request bodies of the API and their translation to :class:`autopar_solver.planner.PlanRequest`.

The API parses a body into :class:`PlanBody` (the graph stays a plain dict),
then :func:`build_request` resolves defaults (memory budget = the device's
memory, solver time limit, worker threads) and validates everything the
planner would reject, so bad input is a 422 before any job starts.

A job carries a small *payload* (:func:`payload_of`): the resolved request
without the graph, which is stored once under ``graph:{hash}``.  A worker
rebuilds the identical request with :func:`request_from_payload` and checks
that its plan key equals the job id (same request, same code versions).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from autopar.cli.args import DEFAULT_TIME_LIMIT_S, TIME_LIMIT_MEANING
from autopar.errors import ConfigError
from autopar.hardware.cluster import PRESETS, Cluster
from autopar.hardware.devices import DeviceSpec
from autopar.hardware.mesh import Mesh
from autopar.ir.graph import Graph
from autopar.ir.plan_key import (
    KEY_SCHEMA,
    RESULT_NEUTRAL_OPTIONS,  # noqa: F401  (named in the docstrings; the core owns it)
    KeyContext,
    plan_key_dict,
    record_answers,
)
from autopar_service.schemas import GraphField
from autopar_service.settings import Settings
from autopar_solver.options import SolverOptions
from autopar_solver.planner import PlanRequest

__all__ = [
    "EvaluateBody",
    "PlanBody",
    "ServiceRequest",
    "SolverOptionsBody",
    "SweepBody",
    "answers_within_gap",
    "build_request",
    "cluster_of",
    "key_context",
    "key_dict_of",
    "least_time_limit_s",
    "payload_of",
    "request_from_payload",
    "stage_mesh_shape_of",
]

PresetName = Literal[tuple(sorted(PRESETS))]  # type: ignore[valid-type]

MAX_STAGES = 4096
"""Most pipeline stages a body may name (the cluster's devices and the graph's blocks bound it
further: :func:`build_request`)."""


class SolverOptionsBody(BaseModel):
    """Solver options a client may set; unset ones take the server's defaults."""

    model_config = ConfigDict(extra="forbid", strict=True)

    time_limit_s: float | None = Field(
        default=None,
        gt=0,
        description=f"{TIME_LIMIT_MEANING[0].upper()}{TIME_LIMIT_MEANING[1:]}, as `autopar plan "
        "--time-limit`; waiting in the queue is not counted (default: the server's "
        f"AUTOPAR_DEFAULT_TIME_LIMIT_S, {DEFAULT_TIME_LIMIT_S:g}).",
    )
    relative_gap: float | None = Field(
        default=None, ge=0, lt=1, description="Stop within this relative optimality gap."
    )
    seed: int | None = Field(default=None, ge=0, lt=2**31, description="CP-SAT random seed.")
    deterministic: bool | None = Field(default=None, description="Reproducible search.")
    use_hint: bool | None = Field(default=None, description="Warm-start CP-SAT with a heuristic plan.")
    reductions: bool | None = Field(default=None, description="Apply exact graph reductions first.")
    runtime: Literal["oneflow-0.9", "ideal"] | None = Field(
        default=None, description="Runtime profile that prices boxing (docs/runtime-profiles.md)."
    )
    micro_batches: int | None = Field(
        default=None,
        ge=1,
        le=65536,
        description="Micro-batches per optimizer step (gradient accumulation): the plan minimises "
        "K x micro-batch + once-per-step work (default 1).",
    )
    checkpointing: Literal["off", "full", "auto"] | None = Field(
        default=None,
        description="Activation checkpointing: off, full (every transformer block) or auto (the "
        "default: what each block recomputes is chosen with the layout, nothing where everything fits).",
    )
    stages: Annotated[int, Field(ge=1, le=MAX_STAGES)] | Literal["auto"] | None = Field(
        default=None,
        description="Pipeline stages, as `autopar plan --stages`: 1 plans one stage on the "
        "whole mesh; S > 1 a pipeline of S stages of contiguous blocks, each on world / S devices "
        "(whole nodes or an even slice of one node) with `mesh_shape` as each stage's mesh; `auto` "
        "(the default) one stage on one node, else the best of one stage and every candidate S. "
        "A pipeline plan is an `autopar.pipeline/v1` document (docs/plan-format.md).",
    )


class ClusterFields(BaseModel):
    """Where the plan runs."""

    model_config = ConfigDict(extra="forbid", strict=True)

    graph: GraphField
    cluster: str = Field(
        default="2x4",
        pattern=r"^[0-9]{1,5}x[0-9]{1,5}$",
        description="NODESxDEVICES_PER_NODE, e.g. `2x4`.",
    )
    preset: PresetName = Field(default="a100-40g", description="Device preset.")  # type: ignore[valid-type]
    options: SolverOptionsBody = Field(default_factory=SolverOptionsBody)


class PlanBody(ClusterFields):
    """``POST /v1/plans``: one plan request."""

    mesh_shape: list[Annotated[int, Field(ge=1, le=65536)]] | None = Field(
        default=None,
        min_length=1,
        max_length=4,
        description="Logical mesh shape, e.g. `[4, 2]`; omitted = search the candidate shapes. With "
        "`options.stages` S > 1, the mesh of each stage (world / S devices).",
    )
    memory_budget_bytes: int | None = Field(
        default=None,
        gt=0,
        lt=2**63,
        description="Per-device memory budget, bytes; omitted = the device's memory.",
    )
    zero_stage: int = Field(default=2, ge=0, le=3, description="ZeRO stage (0-3).")


def _no_mesh() -> list[list[int] | None]:
    return [None]


def _no_budget() -> list[int | None]:
    return [None]


class SweepBody(ClusterFields):
    """``POST /v1/sweeps``: the cartesian product of the listed values, one plan each."""

    mesh_shapes: list[list[Annotated[int, Field(ge=1, le=65536)]] | None] = Field(
        default_factory=_no_mesh, min_length=1, max_length=64, description="Mesh shapes (null = search)."
    )
    memory_budgets_bytes: list[Annotated[int, Field(gt=0, lt=2**63)] | None] = Field(
        default_factory=_no_budget,
        min_length=1,
        max_length=64,
        description="Per-device budgets, bytes (null = the device's memory).",
    )
    zero_stages: list[Annotated[int, Field(ge=0, le=3)]] = Field(
        default_factory=lambda: [2], min_length=1, max_length=4, description="ZeRO stages."
    )


class EvaluateBody(BaseModel):
    """``POST /v1/evaluate``: a graph and a plan for it (inline or by key)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    graph: GraphField
    plan: dict[str, Any] | None = Field(default=None, description="An `autopar.plan/v1` plan.")
    plan_key: str | None = Field(
        default=None, pattern=r"^[0-9a-f]{64}$", description="Key of a cached plan instead."
    )
    micro_batches: int | None = Field(
        default=None,
        ge=1,
        le=65536,
        description="Re-price the plan at this many micro-batches per optimizer step (default: the plan's).",
    )
    checkpointing: Literal["off", "full", "auto"] | None = Field(
        default=None,
        description="Re-price the plan with this activation checkpointing (default: the plan's).",
    )


def cluster_of(cluster: str, preset: str, max_devices: int) -> Cluster:
    """The cluster ``NODESxDEVICES`` of ``preset`` devices, at most ``max_devices`` of them."""
    parsed = Cluster.parse(cluster, preset)
    if parsed.world_size > max_devices:
        raise ConfigError(
            "bad_cluster",
            f"cluster {cluster} has {parsed.world_size} devices; this server plans for at most {max_devices}",
        )
    return parsed


def _options(body: SolverOptionsBody, settings: Settings) -> SolverOptions:
    given = body.model_dump(exclude_none=True)
    time_limit = given.pop("time_limit_s", settings.default_time_limit_s)
    if time_limit > settings.max_time_limit_s:
        raise ConfigError(
            "bad_solver_option",
            f"time_limit_s {time_limit} exceeds this server's limit of "
            f"{settings.max_time_limit_s} s; ask for less",
        )
    stages = given.pop("stages", "auto")  # as autopar plan: auto, one stage on one node
    given.setdefault("checkpointing", "auto")
    options = SolverOptions(
        time_limit_s=float(time_limit), stages=None if stages == "auto" else stages, **given
    )
    if settings.solver_workers is not None:
        options = replace(options, workers=settings.solver_workers)
    return options


@dataclass(frozen=True)
class ServiceRequest(PlanRequest):
    """A :class:`PlanRequest` as the service solves it: with ``options.stages`` S > 1 the
    request's own ``mesh_shape`` is None (the pipeline spans the cluster) and a mesh shape the
    client named is each stage's, ``stage_mesh_shape`` (as ``autopar plan --stages S
    --mesh-shape``).  It is part of the plan key (:func:`key_dict_of`) and of the job payload."""

    stage_mesh_shape: tuple[int, ...] | None = None


def _check_stages(graph: Graph, cluster: Cluster, stages: int, shape: tuple[int, ...] | None) -> None:
    """422 before any job when ``stages`` cannot cut this cluster and graph: every stage needs
    world / S devices as whole nodes or an even slice of one node, and one block at least;
    a stage mesh shape must cover a stage's devices."""
    from autopar.pipeline.evaluate import stage_cluster
    from autopar.pipeline.split import ordered_blocks

    try:
        sub = stage_cluster(cluster, stages)
        if shape is not None:
            Mesh(sub, shape)
    except ConfigError as exc:
        raise ConfigError(
            "bad_stages", f"options.stages {stages} on cluster {cluster}: {exc.message}"
        ) from None
    blocks = len(ordered_blocks(graph))
    if stages > blocks:
        raise ConfigError(
            "bad_stages",
            f"options.stages {stages}: this graph has {blocks} blocks (transformer layers) to cut "
            f"into stages; ask for 1 to {max(blocks, 1)} stages",
        )


def build_request(
    graph: Graph,
    cluster: Cluster,
    mesh_shape: list[int] | None,
    memory_budget_bytes: int | None,
    zero_stage: int,
    options: SolverOptionsBody,
    settings: Settings,
) -> ServiceRequest:
    """A validated request with the server's defaults filled in; with ``options.stages`` S > 1,
    ``mesh_shape`` is each stage's (:class:`ServiceRequest`)."""
    shape = tuple(mesh_shape) if mesh_shape else None
    budget = memory_budget_bytes or cluster.device.memory_bytes
    solver_options = _options(options, settings)
    stages = solver_options.stages
    if stages is not None and stages > 1:
        _check_stages(graph, cluster, stages, shape)
        _check_least_time(solver_options.time_limit_s, graph, settings)
        return ServiceRequest(
            graph, cluster, None, budget, zero_stage, solver_options, stage_mesh_shape=shape
        )
    if shape is not None:
        Mesh(cluster, shape)  # ConfigError naming the shape and the device count
    _check_least_time(solver_options.time_limit_s, graph, settings)
    return ServiceRequest(graph, cluster, shape, budget, zero_stage, solver_options)


def stage_mesh_shape_of(request: PlanRequest) -> tuple[int, ...] | None:
    """The stage mesh shape a :class:`ServiceRequest` carries (None for a plain request)."""
    return getattr(request, "stage_mesh_shape", None)


def least_time_limit_s(graph: Graph, settings: Settings) -> float:
    """The least time limit that can load ``graph`` (read it and start its cost tables):
    ``min_time_limit_s`` plus ``min_time_limit_s_per_op`` per op, rounded up to 0.01 s."""
    least = settings.min_time_limit_s + settings.min_time_limit_s_per_op * len(graph.ops)
    return math.ceil(least * 100) / 100


def _check_least_time(time_limit_s: float, graph: Graph, settings: Settings) -> None:
    least = least_time_limit_s(graph, settings)
    if time_limit_s < least:
        raise ConfigError(
            "time_limit_too_small",
            f"time_limit_s {time_limit_s:g} is below {least:g} s, the least that can load this "
            f"graph of {len(graph.ops)} ops; ask for at least {least:g} s",
            minimum_s=least,
        )


def key_dict_of(request: PlanRequest) -> dict[str, Any]:
    """The plan key's input (:func:`autopar.ir.plan_key.plan_key_dict`, which a client's
    :class:`autopar.client.PlanClient` computes too): the request's canonical form with *every*
    option that can change the plan (``use_hint``, ``reductions``, ``max_model_vars`` ...); only
    :data:`RESULT_NEUTRAL_OPTIONS` (and ``workers`` outside deterministic mode) stay out."""
    base = request.to_key_dict()
    return plan_key_dict(
        graph_hash=base["graph"],
        cluster=base["cluster"],
        mesh_shape=request.mesh_shape,
        memory_budget_bytes=request.memory_budget_bytes,
        zero_stage=request.zero_stage,
        options=asdict(request.options),
        request_versions=base["versions"],
        tie_layers=request.tie_layers,
        stage_mesh_shape=stage_mesh_shape_of(request),
    )


def key_context(settings: Settings, versions: dict[str, str]) -> KeyContext:
    """What this service folds into a plan key besides the request (``GET /v1/plan-keys``): the
    code versions, the versions priced in the request, every solver option at its default."""
    from autopar.hardware.cluster import Cluster

    probe = ServiceRequest(Graph("probe", [], [], []), Cluster.parse("1x1"))
    request_versions = probe.to_key_dict()["versions"]  # what the planner prices a request with
    defaults = asdict(_options(SolverOptionsBody(), settings))
    return KeyContext(KEY_SCHEMA, dict(versions), request_versions, defaults)


def answers_within_gap(record: dict[str, Any], request: PlanRequest) -> bool:
    """Whether a cached plan ``record`` answers ``request`` (:func:`autopar.ir.plan_key.record_answers`:
    its proven gap is within the asked one, or it was solved with at least this request's time).
    A plan of a larger gap, asked for again with more time, is improved by a new solve, which
    starts from it through the solve memo."""
    return record_answers(record, asdict(request.options))


def payload_of(
    request: PlanRequest, versions: dict[str, str], graph_hash: str | None = None
) -> dict[str, Any]:
    """What a job needs besides the graph: the resolved request and the API's code versions.

    ``graph_hash`` saves recomputing the graph's content hash when the caller has it.
    """
    stage_shape = stage_mesh_shape_of(request)
    return {
        "graph": graph_hash or request.graph.content_hash(),
        "cluster": request.cluster.to_dict(),
        "mesh_shape": list(request.mesh_shape) if request.mesh_shape else None,
        "memory_budget_bytes": request.memory_budget_bytes,
        "zero_stage": request.zero_stage,
        "options": asdict(request.options),
        "stage_mesh_shape": list(stage_shape) if stage_shape else None,
        "versions": dict(versions),
    }


def request_from_payload(payload: dict[str, Any], graph: Graph) -> ServiceRequest:
    """The request :func:`payload_of` described, for ``graph``."""
    cluster = Cluster.from_dict(payload["cluster"])
    if not isinstance(cluster.device, DeviceSpec):  # pragma: no cover - from_dict guarantees it
        raise ConfigError("bad_cluster", "malformed cluster in job payload")
    shape = payload.get("mesh_shape")
    stage_shape = payload.get("stage_mesh_shape")
    return ServiceRequest(
        graph,
        cluster,
        tuple(shape) if shape else None,
        payload.get("memory_budget_bytes"),
        int(payload["zero_stage"]),
        SolverOptions(**payload["options"]),
        stage_mesh_shape=tuple(stage_shape) if stage_shape else None,
    )
