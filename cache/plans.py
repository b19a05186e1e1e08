"""Plan keys and the plan cache.

A plan key is the SHA-256 of the canonical JSON of

* the request's canonical form (``PlanRequest.to_key_dict()``: the graph by its
  content hash, so op order and whitespace do not matter; cluster; mesh shape;
  memory budget; ZeRO stage; solver options), and
* the code versions that produce the plan (:func:`code_versions`: autopar's
  version and a digest of its sources, OR-Tools' version).

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

from autopar.ir.content_key import content_key, python_sources, source_digest
from autopar_cache import codec
from autopar_cache.base import Store

__all__ = [
    "KEY_SCHEMA",
    "PlanCache",
    "PlanRecord",
    "code_versions",
    "plan_key",
]

KEY_SCHEMA = 1
"""Bump when the meaning of a key's inputs changes."""

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


def plan_key(key_dict: Mapping[str, Any], versions: Mapping[str, str]) -> str:
    """SHA-256 hex of the canonical request plus code versions."""
    return content_key({"schema": KEY_SCHEMA, "request": dict(key_dict), "versions": dict(versions)})


@dataclass(frozen=True)
class PlanRecord:
    """A stored plan: ``body`` is the JSON the API returns for it."""

    key: str
    body: bytes
    etag: str

    def data(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.body)
        return value


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
        etag = '"' + hashlib.blake2b(body, digest_size=16).hexdigest() + '"'
        return PlanRecord(key, body, etag)

    def put(self, key: str, record: Mapping[str, Any], iteration_time_s: float) -> bool:
        """Store ``record`` unless a plan at least as cheap (by its iteration time: K
        micro-batches plus once per step) is stored; True when stored."""
        value = codec.encode(dict(record))
        return self.store.put_if_lower(self._key(key), value, iteration_time_s, self.ttl_s)

    def delete(self, key: str) -> None:
        self.store.delete(self._key(key))
        self.store.delete(self._key(key) + "#score")
