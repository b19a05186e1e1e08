"""Ctrl-C: exit status 130 and one line, no traceback."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time

from tests.cli.helpers import REPO


def test_ctrl_c_exits_130_with_one_line(tmp_path) -> None:
    # The graph "file" is a named pipe that this test holds open without writing: the
    # command blocks reading it, so the signal lands inside the command whatever the
    # machine's speed (opening the pipe's other end shows the command has got there).
    fifo = tmp_path / "graph.json"
    os.mkfifo(fifo)
    # A child inherits an ignored SIGINT, and Python then installs no KeyboardInterrupt
    # handler: start it with the default disposition, as a shell starts a command.
    inherited = signal.getsignal(signal.SIGINT)
    process = subprocess.Popen(
        [sys.executable, "-m", "autopar.cli", "costs", str(fifo), "--workers", "1"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    writer = None
    try:
        while writer is None:
            try:
                writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:  # no reader yet
                assert exc.errno == errno.ENXIO, exc
                assert process.poll() is None, process.communicate()
                time.sleep(0.05)
        _wait_blocked_reading(process.pid)
        process.send_signal(signal.SIGINT)
        try:
            out, err = process.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            message = f"no exit 120 s after SIGINT (the test process's SIGINT: {inherited!r})"
            raise AssertionError(message) from None
    finally:
        if writer is not None:
            os.close(writer)
        if process.poll() is None:
            process.kill()
            process.communicate()  # reap it and close its pipes
    assert process.returncode == 130, err
    assert err.splitlines() == ["autopar: interrupted"]
    assert out == ""


def _wait_blocked_reading(pid: int, timeout_s: float = 10.0) -> None:
    """Until the command sleeps in the pipe's read.  Between its ``open`` returning and its
    ``read`` blocking, a signal is taken in C code that checks for none, and the handler it
    leaves pending would only run after the read, which never returns (5 runs of 106 here);
    inside the read, the signal interrupts it.  Linux names the wait in ``/proc/PID/wchan``
    (``pipe_read``, ``anon_pipe_read``, ``pipe_wait``); elsewhere, a moment's grace."""
    wchan = f"/proc/{pid}/wchan"
    if not os.path.exists(wchan):
        time.sleep(0.5)
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(wchan) as f:
            where = f.read()
        if "pipe" in where:
            return
        time.sleep(0.01)
