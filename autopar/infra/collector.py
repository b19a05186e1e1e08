"""Pausing Python's cyclic garbage collector around allocation-heavy work.

Loading a graph, building cost tables and solving allocate millions of small objects
(ops, port dicts, table entries) and keep most of them alive; almost none forms a
reference cycle, so reference counting frees what dies.  The cyclic collector still
walks every live object on each full pass: ``Graph.load`` of a 100k-op graph spent
about a third of its time there, and a 10 s mt5-base plan about 0.6 s (measured with
``gc.callbacks``; benchmarks/README.md's machine).  Pausing it for the duration and
enabling it again afterwards collects any cycles made meanwhile at the next pass.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["collector_paused"]


@contextmanager
def collector_paused() -> Iterator[None]:
    """Disable the cyclic garbage collector inside the block; restore its state after.

    Nests: an inner block leaves the collector as the outer one set it.  Processes forked
    inside the block (cost-table workers) start with it paused too.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
