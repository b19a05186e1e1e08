"""A finished job is never run again: the janitor's "worker lost" and the attempt's end.

Found under load (two test workers on two cores): ``test_miss_hit_and_single_flight_with_two_workers``
counted two solves for one job.  The attempt stopped its heartbeat before it wrote the job's
end, the janitor read the record as running with no heartbeat in between and queued the job
again, and the second run solved it once more.  Here each step of that race is taken apart:
the end is written while the heartbeat beats, the janitor changes only a record that is still
running (in one atomic update with its check), and a run that finds the record ended does
nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from rq import Queue, Retry
from rq.executions import Execution
from rq.job import JobStatus as RQStatus
from rq.registry import StartedJobRegistry

from autopar_cache.redis_server import RedisServer
from autopar_cache.redis_store import RedisStore
from autopar_service import rq_jobs
from autopar_service.jobs import JobInfo, JobStatus
from autopar_service.rq_jobs import SOLVE_FUNC, JobRecords, solve_job
from autopar_service.rq_manager import RQJobManager
from tests.service.helpers import make_settings

pytestmark = pytest.mark.redis

JOB = "f" * 64


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    redis.Redis.from_url(redis_server.url).flushall()
    return redis_server.url


@pytest.fixture
def manager(tmp_path: Path, redis_url: str) -> Iterator[RQJobManager]:
    settings = make_settings(tmp_path, redis_url=redis_url, job_retries=1)
    yield RQJobManager(settings, RedisStore(redis_url))


def _started_long_ago(manager: RQJobManager) -> None:
    """The job as a worker holds it: RQ's job started (in the started registry), its record
    running since well past the lease, and no heartbeat key."""
    queue: Queue = manager.queue
    job = queue.enqueue(SOLVE_FUNC, JOB, {}, job_id=JOB, retry=Retry(max=1))
    queue.remove(job)
    with manager.client.pipeline() as pipe:
        Execution.create(job, ttl=600, pipeline=pipe, worker_name="w")
        job.set_status(RQStatus.STARTED, pipeline=pipe)
        pipe.execute()
    assert JOB in StartedJobRegistry(queue=queue).get_job_ids(cleanup=False)
    started = time.time() - 10 * manager.settings.worker_lost_after_s
    manager.records.save(JobInfo(JOB, JobStatus.RUNNING, attempts=1, started_at=started, fence="a"))


def test_the_janitor_requeues_a_running_job_whose_heartbeat_stopped(manager: RQJobManager) -> None:
    _started_long_ago(manager)
    assert manager.reap_lost() == [JOB]
    record = manager.records.load(JOB)
    assert record is not None and record.status is JobStatus.QUEUED and record.fence is None
    assert JOB in manager.queue.get_job_ids()


def test_the_janitor_leaves_a_job_whose_end_was_written_after_it_looked(
    manager: RQJobManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    _started_long_ago(manager)
    records = manager.records
    load = records.load

    def load_then_the_attempt_ends(job_id: str) -> JobInfo | None:
        seen = load(job_id)  # the janitor sees it running, with no heartbeat ...
        ended = JobInfo(JOB, JobStatus.SUCCEEDED, attempts=1, fence="a", result={"plan": 1})
        records.save(ended)  # ... and the attempt writes the job's end right after
        return seen

    monkeypatch.setattr(records, "load", load_then_the_attempt_ends)
    assert manager.reap_lost() == []
    monkeypatch.undo()
    record = manager.records.load(JOB)
    assert record is not None and record.status is JobStatus.SUCCEEDED and record.result == {"plan": 1}
    assert JOB not in manager.queue.get_job_ids()  # not queued again: it would run twice


def _worker_env(monkeypatch: pytest.MonkeyPatch, manager: RQJobManager) -> JobRecords:
    monkeypatch.setenv("AUTOPAR_REDIS_URL", str(manager.settings.redis_url))
    monkeypatch.setenv("AUTOPAR_CACHE_DIR", str(manager.settings.cache_dir))
    return manager.records


def test_a_run_that_finds_the_job_ended_does_nothing(
    manager: RQJobManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = _worker_env(monkeypatch, manager)
    records.save(JobInfo(JOB, JobStatus.SUCCEEDED, attempts=1, result={"plan": 1}))
    ran: list[str] = []
    monkeypatch.setattr("autopar_service.tasks.run_job", lambda job_id, *_: ran.append(job_id))
    assert solve_job(JOB, {}) == {"ok": False, "already_ended": True}
    assert ran == []
    assert manager.store.get("stat:solves_started") is None
    record = records.load(JOB)
    assert record is not None and record.status is JobStatus.SUCCEEDED and record.attempts == 1


def test_the_end_is_written_while_the_heartbeat_beats(
    manager: RQJobManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = _worker_env(monkeypatch, manager)
    records.save(JobInfo(JOB))
    monkeypatch.setattr("autopar_service.tasks.run_job", lambda *_: {"plan": 1})
    alive_at_the_end: list[bool] = []
    record_outcome = rq_jobs._record_outcome

    def checked(records: JobRecords, job_id: str, *args: Any, **kwargs: Any) -> None:
        alive_at_the_end.append(records.alive(job_id))
        record_outcome(records, job_id, *args, **kwargs)

    monkeypatch.setattr(rq_jobs, "_record_outcome", checked)
    assert solve_job(JOB, {}) == {"ok": True, "result": {"plan": 1}}
    assert alive_at_the_end == [True]
    assert not records.alive(JOB)  # and stops once it is written
    record = records.load(JOB)
    assert record is not None and record.status is JobStatus.SUCCEEDED and record.attempts == 1
    assert manager.store.get("stat:solves_started") == b"1"
