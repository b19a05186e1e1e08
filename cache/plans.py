"""Plan keys and the plan cache.

A plan key is the SHA-256 of the canonical JSON of

* the request's canonical form (:func:`autopar.ir.plan_key.plan_key_dict`: the graph by
  its content hash, so op order and whitespace do not matter; cluster; mesh shape;
  memory budget; ZeRO stage; solver options), and
* the code versions that produce the plan (:func:`code_versions`: autopar's
  version and a digest of its sources, OR-Tools' version).

:func:`plan_key` and :data:`KEY_SCHEMA` live in the core (:mod:`autopar.ir.plan_key`), so a
client computes the same key without the solver; they are re-exported here.

A plan record is stored as compressed JSON under ``plan:{key}`` with its
predicted step time as the score: :meth:`PlanCache.put` only replaces a stored
plan by a strictly cheaper one.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from autopar.ir.content_key import python_sources, source_digest
from autopar.ir.plan_key import KEY_SCHEMA, plan_key
from autopar_cache import codec
from autopar_cache.base import Store

__all__ = [
    "KEY_SCHEMA",
    "PlanCache",
    "PlanRecord",
    "code_versions",
    "plan_key",
]

_SOURCE_PACKAGES = ("autopar", "autopar_solver")
"""The packages whose sources change a plan (by import name: their folders are found where
they import from, a source checkout's ``solver/`` or an installed ``autopar_solver/``)."""


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"package {name!r} is not importable")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def _package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "unknown"


def code_versions() -> dict[str, str]:
    """Versions that change a plan: autopar (package + source digest) and OR-Tools.

    Compute once per process (it reads the package sources, ~ms) and pass it on.
    """
    digests = []
    for name in _SOURCE_PACKAGES:
        folder = _package_dir(name)
        digests.append(f"{name}:{source_digest(folder, python_sources(folder, ['.']))}")
    return {
        "autopar": _package_version("autopar"),
        "source": hashlib.sha256(" ".join(digests).encode()).hexdigest()[:16],
        "ortools": _package_version("ortools"),
    }


@dataclass(frozen=True)
class PlanRecord:
    """A stored plan: ``body`` is the JSON the API returns for it."""

    key: str
    body: bytes
    etag: str

    def data(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.body)
        return value

    def renamed(self, old: str, new: str) -> PlanRecord:
        """The record with every ``old`` inside its JSON strings written ``new`` (a graph's name:
        the stored record is shared, the name a request gives belongs to its own answer), with
        its own ETag.  ``old`` must be a name no other field holds (``graph-{hash}``)."""
        if old == new:
            return self
        body = self.body.replace(_in_string(old), _in_string(new))
        return PlanRecord(self.key, body, _etag(body))


def _etag(body: bytes) -> str:
    return '"' + hashlib.blake2b(body, digest_size=16).hexdigest() + '"'


def _in_string(text: str) -> bytes:
    """``text`` as it reads inside a JSON string of a record (:func:`autopar_cache.codec.dumps`)."""
    return json.dumps(text, ensure_ascii=False)[1:-1].encode()


class PlanCache:
    """Plan records in a :class:`autopar_cache.base.Store` under ``plan:``."""

    def __init__(self, store: Store, ttl_s: float | None = None) -> None:
        self.store = store
        self.ttl_s = ttl_s

    @staticmethod
    def _key(key: str) -> str:
        return f"plan:{key}"

    def get(self, key: str) -> PlanRecord | None:
        raw = self.store.get(self._key(key))
        if raw is None:
            return None
        body = codec.inflate(raw)
        return PlanRecord(key, body, _etag(body))

    def put(self, key: str, record: Mapping[str, Any], iteration_time_s: float) -> bool:
        """Store ``record`` unless a plan at least as cheap (by its iteration time: K
        micro-batches plus once per step) is stored; True when stored."""
        value = codec.encode(dict(record))
        return self.store.put_if_lower(self._key(key), value, iteration_time_s, self.ttl_s)

    def delete(self, key: str) -> None:
        self.store.delete(self._key(key))
        self.store.delete(self._key(key) + "#score")
