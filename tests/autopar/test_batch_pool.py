"""The cost-table worker pool: results, errors, lost workers, and stopping at a deadline
with large batches in flight (where ``multiprocessing.Pool.terminate`` could hang)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from autopar.infra.batch_pool import BatchPool, PoolTimeout, WorkerLost
from autopar.infra.progress import Deadline


def _square_all(batch: list[int]) -> list[int]:
    return [x * x for x in batch]


def _fail(batch: list[int]) -> list[int]:
    raise ValueError(f"bad batch {batch}")


def _sleep_then_len(batch: bytes) -> int:
    time.sleep(60)
    return len(batch)


def _die(batch: list[int]) -> list[int]:
    os.kill(os.getpid(), signal.SIGKILL)
    return batch


def test_every_batch_comes_back_with_its_tag():
    batches = [(i, list(range(i, i + 5))) for i in range(0, 100, 5)]
    with BatchPool(_square_all, 2) as pool:
        got = dict(pool.run(batches, Deadline()))
    assert got == {i: [x * x for x in b] for i, b in batches}


def test_an_error_in_a_worker_is_raised_here():
    with BatchPool(_fail, 2) as pool, pytest.raises(ValueError, match="bad batch"):
        list(pool.run([(0, [1]), (1, [2])], Deadline()))


def test_a_worker_that_dies_is_reported():
    with BatchPool(_die, 1) as pool, pytest.raises(WorkerLost):
        list(pool.run([(0, [1])], Deadline()))


@pytest.mark.timeout(120)
def test_the_deadline_stops_large_batches_in_flight_and_close_kills_the_workers():
    # batches far over a pipe's buffer, more of them than workers, the workers busy past
    # the deadline: the run stops at the deadline and close() reaps every worker
    big = b"x" * (4 << 20)
    pool = BatchPool(_sleep_then_len, 2)
    processes = [p for p, _ in pool._workers]
    with pytest.raises(PoolTimeout):
        list(pool.run([(i, big) for i in range(6)], Deadline(0.5)))
    pool.close()
    assert all(p.exitcode is not None for p in processes)
