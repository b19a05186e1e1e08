"""Content addressing: one way to turn a request and the code behind it into a key.

Every cache in autopar (cost-table entries, plans in the service's store, the
``plan --compare`` baselines on disk) is keyed by *what* was asked and *which
code* answered it, never by when or by whom:

* :func:`canonical_json` -- the bytes of a JSON value with sorted keys and no
  whitespace, so equal values give equal bytes;
* :func:`canonical_numbers` -- a JSON value with every integer-valued float written
  as the int (``1.0`` -> ``1``, ``-0.0`` -> ``0``), so a document re-encoded by a
  client that drops the ``.0`` (JavaScript's ``JSON.stringify``) keys the same;
* :func:`source_digest` -- a hash of source files (relative path + contents), so
  a changed rule or formula misses entries written by older code;
* :func:`content_key` -- SHA-256 hex of the canonical JSON of a payload.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["canonical_json", "canonical_numbers", "content_key", "python_sources", "source_digest"]


def canonical_json(obj: Any) -> bytes:
    """Sorted-key, whitespace-free ASCII JSON: equal values give equal bytes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def canonical_numbers(value: Any) -> Any:
    """``value`` with each integer-valued float replaced by the equal int, in lists and dicts too.

    JSON has one number type: ``1``, ``1.0`` and ``1e0`` are the same number, and so are
    ``0.01`` and ``1e-2`` (Python reads both as the same float).  Python keeps ``1.0`` a
    float, JavaScript prints it as ``1``; this makes both the int.  Booleans stay booleans;
    ``inf`` and ``nan`` stay floats.  Values without such floats come back as they are.
    """
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, dict):
        return {k: canonical_numbers(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [canonical_numbers(v) for v in value]
    return value


def content_key(payload: Mapping[str, Any]) -> str:
    """SHA-256 hex (64 chars) of ``canonical_json(payload)``."""
    return hashlib.sha256(canonical_json(dict(payload))).hexdigest()


def python_sources(root: Path, names: Iterable[str]) -> list[Path]:
    """The ``.py`` files under ``root`` named by ``names`` (files, or folders walked recursively),
    in a stable order."""
    files: list[Path] = []
    for name in names:
        path = root / name
        files.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return files


def source_digest(root: Path, files: Iterable[Path]) -> str:
    """SHA-256 hex (16 chars) over each file's path relative to ``root`` and its bytes."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]
