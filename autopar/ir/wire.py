"""The wire formats ``autopar.graph/v1`` and ``autopar.plan/v1`` as pydantic models.

One module for both formats, shared by the core's readers (:meth:`Graph.from_dict`,
:meth:`Plan.from_dict`), the service's OpenAPI schema and the JSON Schema files in
``docs/schemas/`` (``python -m autopar.ir.wire docs/schemas`` writes them).  The models
check the *shape* of a document: types (strict: no ``true`` for an int, no ``"3"``
for a number), bounded sizes and nesting, allowed values.  What needs the whole
document (every tensor produced once, the ops a DAG, a plan matching its graph) is
checked by :meth:`Graph.validate` and the evaluator.

pydantic 2 is a core dependency: it installs and imports beside OneFlow 0.9
(Python 3.10, numpy 1.26, protobuf 3.20).

Limits (a document past one is refused with the field named):

=====================  ==========================================================
``MAX_NAME_CHARS``     op, tensor, port, variable and graph names
``MAX_RANK``           dims of one tensor
``MAX_DIM``            one tensor dim (2^40: far past any real tensor, and every
                       ``numel * dtype size`` stays an exact integer)
``MAX_PORTS``          inputs (or outputs) of one op
``MAX_JSON_DEPTH``     nesting of ``attrs`` and ``meta`` values
``MAX_OPS``            ops (and variables) of one graph; tensors: 4x that
=====================  ==========================================================
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StringConstraints,
    TypeAdapter,
    with_config,
)
from typing_extensions import NotRequired, TypedDict

__all__ = [
    "DEFAULT_RUNTIME",
    "GRAPH_DOCUMENT",
    "GRAPH_FORMAT",
    "MAX_DIM",
    "MAX_JSON_DEPTH",
    "MAX_NAME_CHARS",
    "MAX_OPS",
    "MAX_PORTS",
    "MAX_RANK",
    "PLAN_FORMAT",
    "ClusterModel",
    "DeviceModel",
    "Diagnostics",
    "GraphModel",
    "MemoryReport",
    "MeshModel",
    "OpModel",
    "PlanModel",
    "PlanOpModel",
    "Predicted",
    "SolverReport",
    "TensorModel",
    "VariableLayout",
    "VariableModel",
    "json_schemas",
]

DEFAULT_RUNTIME = "oneflow-0.9"
"""Plans are applied to OneFlow jobs: price them as OneFlow 0.9 runs them."""

GRAPH_FORMAT = "autopar.graph/v1"
PLAN_FORMAT = "autopar.plan/v1"

MAX_NAME_CHARS = 1024
MAX_RANK = 16
MAX_DIM = 2**40
MAX_PORTS = 4096
MAX_JSON_DEPTH = 32
MAX_OPS = 1_000_000

DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "int64", "bool")
"""The tensor dtypes (``autopar.ir.graph.DTYPE_BYTES`` gives their sizes)."""

Name = Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME_CHARS)]
Dim = Annotated[int, Field(ge=0, le=MAX_DIM)]
NdSbpText = Annotated[
    str,
    StringConstraints(max_length=256, pattern=r"^\(?\s*(S\(\d+\)|B|P)(\s*,\s*(S\(\d+\)|B|P))*\s*,?\s*\)?$"),
]
"""An N-D SBP as printed: ``(S(0), B)``; a 1-D one may omit the parentheses."""


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of a JSON value (a scalar is 0), counting no further than ``limit + 1``."""
    if limit < 0:
        return 1
    if isinstance(value, dict):
        return 1 + max((_depth(v, limit - 1) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v, limit - 1) for v in value), default=0)
    return 0


_SCALARS = (str, int, float, bool, type(None))


def _flat(value: dict[str, JsonValue]) -> bool:
    """True for an object whose values are scalars or lists of scalars (2 levels deep at most)."""
    for v in value.values():
        if isinstance(v, _SCALARS):
            continue
        if not isinstance(v, list):
            return False
        for x in v:
            if not isinstance(x, _SCALARS):
                return False
    return True


def _bounded_depth(value: dict[str, JsonValue]) -> dict[str, JsonValue]:
    # nearly every op's attrs are flat: check that first (a 100k-op graph has 80k attrs)
    if MAX_JSON_DEPTH >= 2 and _flat(value):
        return value
    if _depth(value, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
    return value


JsonObject = Annotated[dict[str, JsonValue], AfterValidator(_bounded_depth)]
"""Free-form JSON (op attrs, graph meta), nested at most ``MAX_JSON_DEPTH`` deep."""


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class _Open(BaseModel):
    """A report section: the listed fields are typed; others are kept as they are."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)


# ------------------------------------------------------------------ autopar.graph/v1


# The graph document is TypedDicts, not models: pydantic validates it straight into plain
# dicts, 2-3x faster than into model instances (a 100k-op graph: about 1.7 s against 4 s on
# the 2-core machine of benchmarks/README.md), and :meth:`Graph.from_model` takes the dicts
# as they are.  Optional keys are ``NotRequired``; :meth:`Graph.from_model` applies the
# defaults that the JSON Schema states.
_DOCUMENT = ConfigDict(strict=True, extra="forbid")


def _default(value: JsonValue) -> Any:
    """The JSON Schema ``default`` of an optional key of a TypedDict document."""
    return Field(json_schema_extra={"default": value})


@with_config(_DOCUMENT)
class TensorModel(TypedDict):
    """A logical (global) tensor."""

    shape: Annotated[list[Dim], Field(max_length=MAX_RANK, description="logical shape, one entry per dim")]
    dtype: Annotated[Literal[DTYPES], Field(description="element type")]  # type: ignore[valid-type]


@with_config(_DOCUMENT)
class OpModel(TypedDict):
    """One op: ports map port name -> tensor name, in port order."""

    name: Name
    type: Annotated[
        Name, Field(description="OneFlow user-op type (matmul, add_n ...), variable, input, output")
    ]
    role: NotRequired[Annotated[Literal["forward", "backward", "optimizer"], _default("forward")]]
    inputs: NotRequired[Annotated[dict[Name, Name], Field(max_length=MAX_PORTS)]]
    outputs: NotRequired[Annotated[dict[Name, Name], Field(max_length=MAX_PORTS)]]
    attrs: NotRequired[Annotated[JsonObject, Field(description="the framework's attrs, as JSON")]]


@with_config(_DOCUMENT)
class VariableModel(TypedDict):
    """A parameter: its variable op and tensor, its gradient and optimizer op (null when frozen)."""

    op: Name
    tensor: Name
    grad: NotRequired[Annotated[Name | None, _default(None)]]
    optimizer: NotRequired[Annotated[Name | None, _default(None)]]


@with_config(ConfigDict(strict=True, extra="forbid", title="autopar.graph/v1"))
class GraphModel(TypedDict):
    """``autopar.graph/v1``: one training step (forward, backward, optimizer)."""

    format: Literal["autopar.graph/v1"]
    name: NotRequired[Annotated[Name, _default("graph")]]
    meta: NotRequired[Annotated[JsonObject, Field(description="free-form; not used for planning")]]
    tensors: Annotated[dict[Name, TensorModel], Field(max_length=4 * MAX_OPS)]
    ops: Annotated[list[OpModel], Field(max_length=MAX_OPS)]
    variables: NotRequired[Annotated[list[VariableModel], Field(max_length=MAX_OPS)]]


GRAPH_DOCUMENT: TypeAdapter[GraphModel] = TypeAdapter(GraphModel)
"""Validates an ``autopar.graph/v1`` document (``validate_python`` / ``validate_json``) into plain dicts."""


# ------------------------------------------------------------------ autopar.plan/v1


class DeviceModel(_Strict):
    """A device preset (``autopar.hardware.devices.DeviceSpec``); rates per second, sizes in bytes."""

    name: Name
    peak_flops: float = Field(gt=0)
    memory_bandwidth: float = Field(gt=0)
    memory_bytes: int = Field(gt=0)
    intra_node_bandwidth: float = Field(gt=0)
    intra_node_latency: float = Field(ge=0)
    inter_node_bandwidth: float = Field(gt=0)
    inter_node_latency: float = Field(ge=0)
    matmul_efficiency: float = Field(default=0.5, gt=0, le=1)
    memory_efficiency: float = Field(default=0.7, gt=0, le=1)
    compute_units: int = Field(default=0, ge=0, description="streaming multiprocessors; 0: not modelled")


class ClusterModel(_Strict):
    nodes: int = Field(ge=1, le=1 << 20)
    devices_per_node: int = Field(ge=1, le=1 << 20)
    device: DeviceModel
    links: dict[str, Any] | None = Field(
        default=None, description="measured per-collective link fits (autopar calibrate; docs/calibration.md)"
    )


class MeshModel(_Strict):
    shape: list[Annotated[int, Field(ge=1, le=1 << 20)]] = Field(min_length=1, max_length=MAX_RANK)
    cluster: ClusterModel


class GraphRef(_Strict):
    name: str = Field(default="", max_length=MAX_NAME_CHARS)
    hash: str = Field(default="", max_length=128, description="Graph.content_hash() of the planned graph")


class PlanOpModel(_Strict):
    """One op's signature and the N-D SBP of each port."""

    signature: str = Field(max_length=1 << 16, description="e.g. (S(0), B) -> (S(0), B)")
    inputs: dict[Name, NdSbpText] = Field(default_factory=dict, max_length=MAX_PORTS)
    outputs: dict[Name, NdSbpText] = Field(default_factory=dict, max_length=MAX_PORTS)


# Report sections are TypedDicts: a plan keeps them as plain dicts (cheap to build, JSON as
# they are), mypy checks every key and value the code writes or reads, and pydantic validates
# them in a plan document.  Keys other than those listed are kept as they are.
_SECTION = ConfigDict(strict=True, extra="allow")


@with_config(_SECTION)
class VariableLayout(TypedDict):
    """Where a parameter lives: its SBP and the axes it is data-parallel over."""

    tensor: Name
    shape: Annotated[list[Dim], Field(max_length=MAX_RANK)]
    sbp: NdSbpText
    dp_axes: list[int]
    split_factor: Annotated[int, Field(ge=1)]


PerKey = dict[str, float]


@with_config(_SECTION)
class Predicted(TypedDict, total=False):
    """The evaluator's step time and communication (seconds, bytes)."""

    step_time_s: float
    step_time_overlapped_s: Annotated[
        float, Field(description="serial step time less the gradient reduction hidden behind backward")
    ]
    grad_comm_time_s: float
    backward_compute_time_s: float
    runtime: str
    compute_time_s: float
    comm_time_s: float
    comm_time_s_per_axis: PerKey
    comm_bytes_per_axis: PerKey
    comm_time_s_per_collective: PerKey
    micro_batches: int
    checkpointing: str
    iteration_time_s: Annotated[
        float, Field(description="one optimizer step: K x micro-batch + once-per-step (what is minimised)")
    ]
    iteration_time_overlapped_s: float
    achieved_iteration_time_s: Annotated[
        float,
        Field(
            description="the iteration as the runtime runs it: less the communication it hides "
            "behind compute (overlapped gradient reduction and parameter gather)"
        ),
    ]
    hidden_comm_time_s: float
    micro_batch_time_s: float
    once_per_step_time_s: float
    recompute_time_s: float


@with_config(_SECTION)
class MemoryReport(TypedDict, total=False):
    """Peak memory per device and its parts (bytes), against the budget."""

    per_device_bytes: float
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activation_peak_bytes: float
    budget_bytes: int | None
    fits: bool


@with_config(_SECTION)
class MeshSearchEntry(TypedDict, total=False):
    """One mesh shape the search tried: its plan's iteration time and memory, or why it failed."""

    shape: list[int]
    iteration_time_s: Annotated[
        float | None,
        Field(
            description="seconds of one optimizer step: K micro-batches plus once per step (the objective)"
        ),
    ]
    micro_batch_time_s: Annotated[float | None, Field(description="seconds of one micro-batch")]
    step_time_s: Annotated[
        float | None,
        Field(description="deprecated: one micro-batch with its gradient reduction; use iteration_time_s"),
    ]
    memory_per_device_bytes: float | None
    gap: float | None
    wall_s: float
    error: str | None
    lower_bound_s: Annotated[
        float | None,
        Field(description="proven least iteration time of any plan on the shape, before solving it"),
    ]
    outcome: Annotated[str, Field(description="solved, proved worse (bound >= the best plan), or no plan")]
    continued: Annotated[
        bool,
        Field(description="solved on after its first share, its gap having missed its target"),
    ]


@with_config(_SECTION)
class Diagnostics(TypedDict, total=False):
    """What the evaluator noticed: ops without a rule, boxed edges, errors; the mesh search."""

    fallback_ops: list[str]
    fallback_op_types: list[str]
    boxed_edges: int
    valid: bool
    errors: list[str]
    mesh_search: list[MeshSearchEntry]
    stage_search: list[dict[str, Any]]
    """Per number of stages tried by ``--stages auto`` (autopar_solver.planner.stage_search)."""
    zero_search: list[dict[str, Any]]
    """Per ZeRO stage tried by ``--zero auto`` (autopar_solver.planner.zero_search)."""
    pipeline_search: list[dict[str, Any]]
    """Per cut and schedule of a pipeline priced or predicted (autopar_solver.planner.pipeline_search)."""
    solved_on_mesh: Annotated[list[int], Field(description="the squeezed mesh the solve ran on")]
    oneflow_job: Annotated[str, Field(description="the OneFlow job a plan was read back from")]
    zero_gradient_layout_normalized: Annotated[
        list[str], Field(description="updates whose ZeRO gradient layout was normalised on import")
    ]
    compare: Annotated[
        list[dict[str, Any]],
        Field(
            description="plan --compare: each baseline at its own configuration (kind, describe, mesh, "
            "ZeRO stage, runtime, iteration_time_s, memory_per_device_bytes, named_by_user, fits_budget)"
        ),
    ]
    baseline_configuration: Annotated[
        dict[str, Any],
        Field(
            description="a baseline's configuration (autopar.baselines.configs): mesh, ZeRO stage, "
            "runtime, tensor/data/pipeline-parallel degrees, whether the user named it, whether it "
            "fits the budget, and every configuration tried"
        ),
    ]


@with_config(_SECTION)
class SolverReport(TypedDict, total=False):
    """How the solver ended: objective and bound (seconds), gap, status, wall time."""

    objective: float
    bound: float | None
    gap: float | None
    status: str
    wall_s: float
    memory_rows: int
    tied_layers: bool
    mesh_search_wall_s: float
    command_wall_s: Annotated[float, Field(description="the whole command: load, tables, solve, checks")]
    stage_search_bound: Annotated[
        float,
        Field(description="--stages auto: the least proven lower bound over every number of stages, seconds"),
    ]
    stage_search_gap: Annotated[float, Field(description="--stages auto: the gap to that bound")]
    zero_search_bound: Annotated[
        float,
        Field(description="--zero auto: the least proven lower bound over the ZeRO stages tried, seconds"),
    ]
    zero_search_gap: Annotated[float, Field(description="--zero auto: the gap to that bound")]
    stats: dict[str, JsonValue]


class PlanModel(_Strict):
    """``autopar.plan/v1``: one N-D SBP signature per op, and what it is predicted to cost."""

    model_config = ConfigDict(title="autopar.plan/v1")

    format: Literal["autopar.plan/v1"]
    source: str = Field(default="autopar", max_length=MAX_NAME_CHARS, description="autopar, a baseline ...")
    graph: GraphRef = Field(default_factory=GraphRef)
    mesh: MeshModel
    zero_stage: int = Field(default=0, ge=0, le=3)
    memory_budget_bytes: int | None = Field(default=None, gt=0)
    runtime: str = Field(
        default=DEFAULT_RUNTIME,
        max_length=MAX_NAME_CHARS,
        description="runtime profile the plan is priced for",
    )
    micro_batches: int = Field(default=1, ge=1, description="micro-batches per optimizer step priced")
    checkpointing: Literal["off", "full", "selective", "auto"] = Field(
        default="off",
        description="activation checkpointing priced: off, full (every block), selective (every "
        "block's attention core) or auto",
    )
    recomputed_blocks: list[Name] = Field(
        default_factory=list,
        max_length=MAX_OPS,
        description="under checkpointing auto: the layer scopes the plan recomputes, sorted",
    )
    predicted: Predicted = Field(default_factory=lambda: Predicted())
    memory: MemoryReport = Field(default_factory=lambda: MemoryReport())
    variables: dict[Name, VariableLayout] = Field(default_factory=dict, max_length=MAX_OPS)
    diagnostics: Diagnostics = Field(default_factory=lambda: Diagnostics())
    solver: SolverReport | None = None
    ops: dict[Name, PlanOpModel] = Field(max_length=MAX_OPS)


# ------------------------------------------------------------------ errors and schemas


def error_path(loc: tuple[int | str, ...]) -> str:
    """``("variables", 0, "grad")`` -> ``variables[0].grad``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(document)"


def json_schemas() -> dict[str, dict[str, Any]]:
    """File name -> JSON Schema of each format (what ``docs/schemas/`` holds)."""
    return {
        "graph-v1.schema.json": GRAPH_DOCUMENT.json_schema(),
        "plan-v1.schema.json": PlanModel.model_json_schema(),
    }


def write_schemas(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, schema in json_schemas().items():
        path = folder / name
        path.write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
        written.append(path)
    return written


if __name__ == "__main__":  # pragma: no cover
    for written_path in write_schemas(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/schemas")):
        sys.stdout.write(f"schema written to {written_path}\n")
