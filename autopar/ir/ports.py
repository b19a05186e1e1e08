"""Port names: OneFlow names an op's ports ``base_index`` (``a_0``, ``model_diff_0``)."""

from __future__ import annotations

import re

__all__ = ["base_name"]

_PORT_RE = re.compile(r"^(?P<base>.+?)(?:_(?P<index>\d+))?$")


def base_name(port: str) -> str:
    """``a_0`` -> ``a``; ``model_diff_0`` -> ``model_diff``; ``out`` -> ``out``."""
    m = _PORT_RE.match(port)
    return m.group("base") if m else port
