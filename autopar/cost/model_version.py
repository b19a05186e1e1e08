"""The cost model's version: what a cost-table key names besides the op, its shapes and the mesh.

* :data:`COST_MODEL_VERSION` -- bumped by hand when the meaning of a table entry changes;
* :func:`model_digest` -- a hash of every source file that can change a table entry, so code
  that prices differently never reads entries written by older code;
* :func:`evaluation_digest` -- the same for a whole evaluation (a priced baseline): every
  source of the core that can change what a plan is built as or priced at.
"""

from __future__ import annotations

from pathlib import Path

from autopar.ir.content_key import python_sources, source_digest

__all__ = ["COST_MODEL_VERSION", "evaluation_digest", "model_digest"]

COST_MODEL_VERSION = "2"

_MODEL_SOURCES = (
    "cost/build_tables.py", "cost/compute.py", "cost/edges.py", "cost/memory.py", "cost/table_keys.py",
    "cost/tables.py", "cost/zero_gathers.py",
    "hardware/cluster.py", "hardware/collectives.py", "hardware/devices.py", "hardware/kernels.py",
    "hardware/links.py", "hardware/mesh.py",
    "ir/graph.py", "ir/optimizer.py", "ir/sbp.py",
    "rules", "runtimes",
)  # fmt: skip
"""Files and folders of :mod:`autopar` (relative to its folder) whose code can change a cost
table entry: the op rules, the compute and memory formulas, the cluster and its links, and
every runtime's boxing lowering."""

_AUTOPAR = Path(__file__).resolve().parent.parent
"""The folder of the :mod:`autopar` package."""


def model_digest(root: str | None = None) -> str:
    """SHA-256 (hex, 16 chars) of every source file that can change a cost.

    Part of every cost-table key, so a changed rule, boxing or cost formula
    misses entries written by older code instead of serving them.  ``root``: an
    :mod:`autopar` folder other than this one (default: this package's).
    """
    if root is None and _DIGEST_CACHE:
        return _DIGEST_CACHE[0]
    base = Path(root) if root else _AUTOPAR
    digest = source_digest(base, python_sources(base, _MODEL_SOURCES))
    if root is None:
        _DIGEST_CACHE.append(digest)
    return digest


_DIGEST_CACHE: list[str] = []


_EVALUATION_SOURCES = ("baselines", "cost", "hardware", "ir", "pipeline", "rules", "runtimes", "models")
"""The core's packages whose code can change a baseline's plan or its evaluation."""

_EVALUATION_CACHE: list[str] = []


def evaluation_digest() -> str:
    """SHA-256 (hex, 16 chars) of every source file that can change a baseline's plan or its
    evaluation: part of the key a priced baseline is kept under
    (:func:`autopar.baselines.pricing.baseline_evaluated`)."""
    if not _EVALUATION_CACHE:
        _EVALUATION_CACHE.append(source_digest(_AUTOPAR, python_sources(_AUTOPAR, _EVALUATION_SOURCES)))
    return _EVALUATION_CACHE[0]
