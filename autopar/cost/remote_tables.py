"""Cost-table entries built on other processes: a batch of missing entries as JSON
(:class:`RemoteBatch`), the builder the service injects (:class:`RemoteTableBuilder`, its RQ
workers) and the worker's side (:func:`compute_remote_batch`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from autopar.cost.edges import EdgeKind
from autopar.cost.tables import _chunks, _compute_edge_batch, _compute_op_batch
from autopar.errors import ConfigError
from autopar.hardware.mesh import Mesh
from autopar.infra.progress import Deadline, ProgressFn
from autopar.infra.store import KeyValueStore
from autopar.ir.graph import Op, Role, TensorSpec
from autopar.ir.sbp import parse_nd_sbp
from autopar.runtimes.profile import Lowering, RuntimeProfile, ZeroSharding

__all__ = ["RemoteBatch", "RemoteTableBuilder", "compute_remote_batch"]


# ------------------------------------------------------------------ entries built elsewhere

REMOTE_BATCHES = 8
"""Batches the missing entries of one phase are split into for a :class:`RemoteTableBuilder`
(more than the workers: a fast worker takes more of them, a lost one loses little; each
batch pays a job's overhead and cold process caches: mt5-base [2, 2, 2] cold with one RQ
worker took 33 s in 32 batches per phase, 15 s in 8, on a loaded 2-core machine)."""


@dataclass(frozen=True)
class RemoteBatch:
    """Entries to build elsewhere: their store keys, and what :func:`compute_remote_batch`
    computes them from (JSON: no pickle crosses the queue)."""

    keys: list[str]
    payload: dict[str, Any]


class RemoteTableBuilder(Protocol):
    """Builds cost-table entries outside this process into the store the build reads
    (the service: RQ workers writing to the shared Redis store, ``autopar_service.table_jobs``).

    :meth:`build` returns once every batch's entries are in the store, or when it gives
    up on some (a lost worker, its own wait limit, ``deadline``); the build computes what
    is still missing itself.  ``progress`` gets the number of entries known to be in."""

    def build(
        self, batches: list[RemoteBatch], deadline: Deadline, progress: Callable[[int], None]
    ) -> None: ...


def _run_remote(
    remote: RemoteTableBuilder,
    keys: list[str],
    jobs: list[Any],
    phase: str,
    store: KeyValueStore,
    progress: ProgressFn | None,
    deadline: Deadline,
) -> dict[str, bytes]:
    """The entries of ``keys`` built by ``remote`` (read back from ``store``); any it did
    not build are left out."""
    name = f"cost_tables:{phase}"
    total = len(keys)
    batches = [
        RemoteBatch([keys[i] for i in idx], _encode_jobs(phase, [jobs[i] for i in idx]))
        for idx in _chunks(list(range(total)), REMOTE_BATCHES)
    ]
    deadline.report(progress, name, done=0, total=total)
    remote.build(batches, deadline, lambda done: deadline.report(progress, name, done=done, total=total))
    return store.get_many(keys)


def _spec_json(spec: TensorSpec) -> list[Any]:
    return [spec.name, list(spec.shape), spec.dtype]


def _spec_of(data: list[Any]) -> TensorSpec:
    return TensorSpec(str(data[0]), tuple(int(d) for d in data[1]), str(data[2]))


def _encode_jobs(phase: str, jobs: list[Any]) -> dict[str, Any]:
    """The JSON payload of a batch of op jobs (:func:`_compute_op_batch`) or edge jobs
    (:func:`_compute_edge_batch`); one mesh, ZeRO stage and runtime per batch."""
    mesh: Mesh = jobs[0][3]
    head = {"phase": phase, "mesh": mesh.to_dict(), "mesh_key": mesh.key()}
    if phase == "ops":
        return {
            **head,
            "zero": jobs[0][4],
            "lowering": jobs[0][5],
            "zero_sharding": jobs[0][6],
            "jobs": [
                {
                    "op": op.to_dict(),
                    "in": [_spec_json(t) for t in ins],
                    "out": [_spec_json(t) for t in outs],
                    "gather": gather,
                }
                for op, ins, outs, *_, gather in jobs
            ],
        }
    runtime: RuntimeProfile = jobs[0][5]
    return {
        **head,
        "runtime": runtime.key(),
        "jobs": [
            {
                "t": _spec_json(spec),
                "src": [str(v) for v in src],
                "dst": [str(v) for v in dst],
                "kind": kind.value,
            }
            for spec, src, dst, _, kind, _ in jobs
        ],
    }


def _runtime_of(data: dict[str, Any]) -> RuntimeProfile:
    """The runtime profile a batch names (:meth:`RuntimeProfile.key`: every field but its source)."""

    def decoded(name: str, value: Any) -> Any:
        if name == "lowering":
            return Lowering(value)
        if name == "zero_sharding":
            return ZeroSharding(value)
        return tuple(value) if isinstance(value, list) else value

    fields: dict[str, Any] = {
        f.name: decoded(f.name, data[f.name])
        for f in dataclasses.fields(RuntimeProfile)
        if f.name != "source" and f.name in data
    }
    try:
        profile = RuntimeProfile(**fields)
    except TypeError as exc:
        raise ConfigError("bad_remote_batch", f"runtime {data.get('name')!r} is malformed: {exc}") from None
    if json.loads(json.dumps(profile.key())) != json.loads(json.dumps(data)):  # tuples sent as lists
        raise ConfigError("bad_remote_batch", f"runtime {data['name']!r} does not decode to the profile sent")
    return profile


def compute_remote_batch(payload: dict[str, Any]) -> list[bytes]:
    """The entries of a :class:`RemoteBatch` payload, in the order of its keys: the bytes
    this process's own build would store (same functions, same inputs).  A payload whose
    mesh or runtime does not decode to what was sent raises :class:`ConfigError`."""
    mesh = Mesh.from_dict(payload["mesh"])
    if mesh.key() != payload["mesh_key"]:
        raise ConfigError("bad_remote_batch", "the batch's mesh does not decode to the mesh it was built for")
    if payload["phase"] == "ops":
        zero, lowering, sharding = (
            int(payload["zero"]),
            str(payload["lowering"]),
            str(payload["zero_sharding"]),
        )
        return _compute_op_batch(
            [
                (
                    _op_of(job["op"]),
                    tuple(map(_spec_of, job["in"])),
                    tuple(map(_spec_of, job["out"])),
                    mesh,
                    zero,
                    lowering,
                    sharding,
                    job.get("gather"),
                )
                for job in payload["jobs"]
            ]
        )
    runtime = _runtime_of(payload["runtime"])
    return _compute_edge_batch(
        [
            (
                _spec_of(job["t"]),
                [parse_nd_sbp(v) for v in job["src"]],
                [parse_nd_sbp(v) for v in job["dst"]],
                mesh,
                EdgeKind(job["kind"]),
                runtime,
            )
            for job in payload["jobs"]
        ]
    )


def _op_of(data: dict[str, Any]) -> Op:
    return Op(
        str(data["name"]),
        str(data["type"]),
        dict(data["inputs"]),
        dict(data["outputs"]),
        dict(data.get("attrs", {})),
        Role(data["role"]),
    )
