"""The plan key: how the planning service names a plan, computable without the solver.

A plan key is the SHA-256 of the canonical JSON (:func:`autopar.ir.content_key.content_key`) of

* the request's canonical form (:func:`plan_key_dict`): the graph by its content hash
  (:meth:`autopar.ir.graph.Graph.content_hash`), the cluster, the mesh shape, the memory
  budget, the ZeRO stage, *every* solver option that can change the plan, the versions the
  request is priced with (autopar, the cost model, OR-Tools); and
* the code versions of the service that solves it (autopar, a digest of its sources, OR-Tools).

The service computes it from a resolved request (``autopar_service.requests.key_dict_of``); a
client computes the same key from what it would send (:func:`request_key_dict`) and the
service's :class:`KeyContext` (``GET /v1/plan-keys``: its code versions and option defaults),
so it can ask for a cached plan by key (``GET /v1/plans/{key}``) instead of uploading the graph.
Both go through :func:`plan_key_dict`; whether a cached plan answers a request is
:func:`record_answers`, on both sides too.  Standard library and the core only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autopar.ir.content_key import content_key

__all__ = [
    "FLOAT_OPTIONS",
    "KEY_SCHEMA",
    "RESULT_NEUTRAL_OPTIONS",
    "KeyContext",
    "plan_key",
    "plan_key_dict",
    "record_answers",
    "request_key_dict",
    "resolved_options",
]

KEY_SCHEMA = 1
"""Bump when the meaning of a key's inputs changes."""

RESULT_NEUTRAL_OPTIONS = frozenset({"log"})
"""Solver options that cannot change the plan; every other option is part of the plan key."""

FLOAT_OPTIONS = ("time_limit_s", "relative_gap")
"""Options a service reads as floats (an integer sent is keyed as the float)."""

_TRAINING_DEFAULT = {"micro_batches": 1, "checkpointing": "off"}


def plan_key_dict(
    *,
    graph_hash: str,
    cluster: Mapping[str, Any],
    mesh_shape: Sequence[int] | None,
    memory_budget_bytes: int | None,
    zero_stage: int,
    options: Mapping[str, Any],
    request_versions: Mapping[str, str],
    tie_layers: bool | None = None,
    stage_mesh_shape: Sequence[int] | None = None,
) -> dict[str, Any]:
    """The plan key's input: the request's canonical form.

    ``options`` holds every solver option, resolved (the server's defaults filled in; ``stages``
    None for ``auto``).  Only :data:`RESULT_NEUTRAL_OPTIONS` stay out, and ``workers`` outside
    deterministic mode; a request at K = 1 without checkpointing and with one stage has the key
    it had before those options existed; outside deterministic mode the time limit and the gap
    asked for stay out too (the key is the problem, not the effort: :func:`record_answers`).
    """
    opts = {k: v for k, v in options.items() if k not in RESULT_NEUTRAL_OPTIONS}
    deterministic = bool(opts.get("deterministic"))
    if not deterministic:
        opts["workers"] = None
    if all(opts.get(k, v) == v for k, v in _TRAINING_DEFAULT.items()):
        for k in _TRAINING_DEFAULT:
            opts.pop(k, None)
    key: dict[str, Any] = {
        "graph": graph_hash,
        "cluster": dict(cluster),
        "mesh_shape": list(mesh_shape) if mesh_shape else None,
        "memory_budget_bytes": memory_budget_bytes,
        "zero_stage": zero_stage,
        "tie_layers": tie_layers,
        "versions": dict(request_versions),
    }
    stages = opts.pop("stages", 1)
    if stages != 1:  # one stage keeps the keys it had before pipelines
        opts["stages"] = "auto" if stages is None else stages
        if stage_mesh_shape is not None:
            key["stage_mesh_shape"] = list(stage_mesh_shape)
    if not deterministic:
        opts.pop("time_limit_s", None)
        opts.pop("relative_gap", None)
    key["options"] = opts
    return key


def plan_key(key_dict: Mapping[str, Any], versions: Mapping[str, str]) -> str:
    """SHA-256 hex of the canonical request plus the service's code versions."""
    return content_key({"schema": KEY_SCHEMA, "request": dict(key_dict), "versions": dict(versions)})


def record_answers(record: Mapping[str, Any], options: Mapping[str, Any]) -> bool:
    """Whether a cached plan ``record`` answers a request with the resolved ``options``: its
    proven gap is within the gap asked for, or it was solved with at least the time this
    request allows, so a new solve could do no more (a deterministic request keys on its gap and
    its time limit, so any record under its key answers it)."""
    if options.get("deterministic"):
        return True
    solver = record.get("solver") or {}
    gap = solver.get("gap")
    if isinstance(gap, (int, float)) and gap <= float(options.get("relative_gap", 0.0)):
        return True
    spent = solver.get("time_limit_s")
    return isinstance(spent, (int, float)) and spent >= float(options.get("time_limit_s", 0.0))


@dataclass(frozen=True)
class KeyContext:
    """What a service folds into its plan keys besides the request (``GET /v1/plan-keys``)."""

    schema: int
    versions: dict[str, str]
    """The code versions of :func:`plan_key` (autopar, its source digest, OR-Tools)."""
    request_versions: dict[str, str]
    """The versions inside the request's key (autopar, the cost model, OR-Tools)."""
    options: dict[str, Any]
    """Every solver option at the service's defaults (its time limit and workers included)."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KeyContext:
        return cls(
            int(data["schema"]),
            dict(data["versions"]),
            dict(data["request_versions"]),
            dict(data["options"]),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "versions": dict(self.versions),
            "request_versions": dict(self.request_versions),
            "options": dict(self.options),
        }


def resolved_options(context: KeyContext, given: Mapping[str, Any] | None) -> dict[str, Any]:
    """The options a service resolves a request's ``options`` to: its defaults, overlaid with
    the given ones (``stages: "auto"`` is None, the time limit a float)."""
    options = {**context.options, **{k: v for k, v in (given or {}).items() if v is not None}}
    if options.get("stages") == "auto":
        options["stages"] = None
    for name in FLOAT_OPTIONS:  # the service reads them as floats: 0 is 0.0 in its key
        value = options.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            options[name] = float(value)
    return options


def request_key_dict(
    context: KeyContext,
    *,
    graph_hash: str,
    cluster: str = "2x4",
    preset: str = "a100-40g",
    mesh_shape: Sequence[int] | None = None,
    memory_budget_bytes: int | None = None,
    zero_stage: int = 2,
    options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The key input of a plan request as a client sends it (``POST /v1/plans`` fields), resolved
    as the service resolves it: the cluster of the preset, the device's memory as the budget
    when none is given, the service's option defaults; with ``options.stages`` S > 1 the mesh
    shape is each stage's.  Raises what :meth:`Cluster.parse` raises for a bad cluster."""
    from autopar.hardware.cluster import Cluster

    parsed = Cluster.parse(cluster, preset)
    resolved = resolved_options(context, options)
    stages = resolved.get("stages", 1)
    shape = tuple(mesh_shape) if mesh_shape else None
    pipeline = stages is not None and stages > 1
    return plan_key_dict(
        graph_hash=graph_hash,
        cluster=parsed.to_dict(),
        mesh_shape=None if pipeline else shape,
        memory_budget_bytes=memory_budget_bytes or parsed.device.memory_bytes,
        zero_stage=zero_stage,
        options=resolved,
        request_versions=context.request_versions,
        stage_mesh_shape=shape if pipeline else None,
    )
