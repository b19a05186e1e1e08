"""A job's reported elapsed time never goes backwards, from queued to finished."""

from __future__ import annotations

from autopar_service.jobs import JobInfo, JobStatus


def test_elapsed_never_goes_backwards_when_the_job_finishes() -> None:
    info = JobInfo("j", JobStatus.RUNNING, started_at=100.0, elapsed_s=1.0)
    running = info.view()["elapsed_s"]
    assert running >= 1.0
    # the worker's last progress report started its clock later than the job started
    info.status, info.finished_at, info.elapsed_s = JobStatus.FAILED, info.started_at + running + 0.5, 0.7
    finished = info.view()["elapsed_s"]
    assert finished >= running
    assert finished == info.finished_at - info.started_at


def test_a_report_ahead_of_the_wall_clock_is_kept() -> None:
    info = JobInfo("j", JobStatus.SUCCEEDED, started_at=100.0, finished_at=101.0, elapsed_s=3.0)
    assert info.view()["elapsed_s"] == 3.0


def test_a_queued_job_has_no_elapsed_time() -> None:
    assert JobInfo("j").view()["elapsed_s"] is None
