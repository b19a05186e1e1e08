"""Checks of a profile's JSON objects shared by the link and network sections: unknown
fields (:func:`check_keys`) and numbers (:func:`number`), each failing with a
``bad_profile`` error that names the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autopar.errors import ConfigError

__all__ = ["check_keys", "number"]


def check_keys(data: Any, allowed: set[str], where: str) -> None:
    """``data`` is a JSON object whose fields are all in ``allowed``."""
    if not isinstance(data, Mapping):
        raise ConfigError("bad_profile", f"{where} must be a JSON object, got {type(data).__name__}")
    unknown = set(data) - allowed
    if unknown:
        raise ConfigError(
            "bad_profile", f"{where}: unknown field(s) {sorted(unknown)}; allowed: {sorted(allowed)}"
        )


def number(data: Mapping[str, Any], key: str, where: str) -> float:
    """``data[key]`` as a float; a missing field or a non-number is a ``bad_profile`` error."""
    if key not in data:
        raise ConfigError("bad_profile", f"{where}: missing field {key!r}")
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError("bad_profile", f"{where}.{key} must be a number, got {value!r}")
    return float(value)
