"""A throw-away ``redis-server`` on a free loopback port (tests and benchmarks).

::

    with RedisServer() as server:
        store = RedisStore(server.url)

No persistence by default (``--save "" --appendonly no``); with
``appendonly=True`` every write is appended and fsynced (``appendfsync
always``) and the data survives :meth:`kill` / :meth:`stop` then
:meth:`start`.  The data directory is a temporary directory removed on
:meth:`close` (and on :meth:`stop` without persistence).  A restart reuses
the same port, which lets a test take Redis away from a running API and
workers and bring it back.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from types import TracebackType

from autopar.errors import ConfigError

__all__ = ["RedisServer", "free_port", "redis_server_binary"]


def redis_server_binary() -> str | None:
    """Path of ``redis-server``, or None when it is not installed."""
    return shutil.which("redis-server")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServer:
    """Owns one ``redis-server`` child process."""

    def __init__(
        self, port: int | None = None, startup_timeout_s: float = 10.0, *, appendonly: bool = False
    ) -> None:
        binary = redis_server_binary()
        if binary is None:
            raise ConfigError(
                "redis_missing",
                "redis-server is not installed; install it (apt-get install -y redis-server)",
            )
        self.binary = binary
        self.port = port or free_port()
        self.startup_timeout_s = startup_timeout_s
        self.appendonly = appendonly
        self.process: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        """Start the server and wait until it accepts connections."""
        if self.process is not None and self.process.poll() is None:
            return self
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="autopar-redis-")
        persistence = (
            ["--appendonly", "yes", "--appendfsync", "always"] if self.appendonly else ["--appendonly", "no"]
        )
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                *persistence,
                "--dir",
                self._dir.name,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ConfigError(
                    "redis_start_failed",
                    f"redis-server exited with code {self.process.returncode} on port {self.port}",
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise ConfigError("redis_start_failed", f"redis-server did not answer on port {self.port} in time")

    def kill(self) -> None:
        """SIGKILL the server (a crash); with ``appendonly`` its data survives for :meth:`start`."""
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(5)
            self.process = None
        if not self.appendonly:
            self.close()

    def close(self) -> None:
        """Stop the server and remove its data directory."""
        self.stop()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def stop(self) -> None:
        """Terminate the server (SIGTERM, then SIGKILL after 5 s); without ``appendonly``, drop its data."""
        if self.process is not None:
            if self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(5)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(5)
            self.process = None
        if not self.appendonly and self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
