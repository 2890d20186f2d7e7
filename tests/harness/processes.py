"""The processes the harness runs: a pid-file-tracked server process, readiness waits,
the inter-process lock of ``up``/``down``, and the test users every server has.

Shared by :mod:`tests.harness.services` (ClickHouse 18.16, ZooKeeper, the cluster) and
:mod:`tests.harness.modern_server` (the modern ClickHouse), which import it and not
each other.
"""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

SECRET_USER = "txsink_secret"
SECRET_PASSWORD = "s3cr3t-Pa55"
READONLY_USER = "reader"


class ServiceError(RuntimeError):
    """A service could not be installed, started or reached."""


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.3)
        return sock.connect_ex((host, port)) == 0


@dataclass
class ManagedProcess:
    """A background server process tracked by a pid file."""

    name: str
    home: Path
    marker: str  # a string that must appear in the process's command line

    @property
    def pid_file(self) -> Path:
        return self.home / f"{self.name}.pid"

    @property
    def log_file(self) -> Path:
        return self.home / f"{self.name}.log"

    def pid(self) -> int | None:
        """The recorded pid if that process is alive and still ours, else None."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except FileNotFoundError:
            return None
        if self.marker not in cmdline:
            return None
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except (FileNotFoundError, IndexError):
            return None
        return None if state == "Z" else pid

    def spawn(self, argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> int:
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as out:
            proc = subprocess.Popen(
                argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, env=env,
            )
        self.pid_file.write_text(str(proc.pid))
        return proc.pid

    def exited(self) -> bool:
        """True once the recorded process is gone (or a zombie).

        Unlike :meth:`pid` this ignores the command line: right after ``spawn`` the child
        may still show the parent's command line until it has exec'd the server.
        """
        try:
            pid = int(self.pid_file.read_text().strip())
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except (FileNotFoundError, ValueError, IndexError):
            return True
        if state == "Z":
            _reap(pid)
            return True
        return False

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> bool:
        """Stop the recorded process; returns True if one was running."""
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        _signal(pid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.pid() is not None:
            _reap(pid)
            time.sleep(0.05)
        if self.pid() is not None:
            _signal(pid, signal.SIGKILL)
            while self.pid() is not None:
                _reap(pid)
                time.sleep(0.05)
        self.pid_file.unlink(missing_ok=True)
        return True

    def kill(self) -> bool:
        """SIGKILL: the crash a fault test wants."""
        return self.stop(signal.SIGKILL, timeout=5.0)

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


#: Seconds a ClickHouse 18.16 server may take to answer after its start: it loads every
#: table's metadata first, and one with thousands of tables left by earlier runs (crashed
#: jobs' staging) was not ready within 60 s on a 2-core machine.
START_TIMEOUT = 180.0


def _wait(ready, proc: ManagedProcess, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.exited():
            raise ServiceError(f"{what} exited during start-up; last log lines:\n{proc.tail()}")
        if ready():
            return
        time.sleep(0.1)
    raise ServiceError(f"{what} not ready after {timeout:.0f}s; last log lines:\n{proc.tail()}")


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Serialise ``up``/``down`` of the cluster between processes (parallel test runs)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


#: The checkout the harness runs from: its modules are not installed (the wheel has no
#: ``tests``), so a child that runs one from another folder needs it on its path.
CHECKOUT = Path(__file__).resolve().parents[2]


def checkout_env() -> dict[str, str]:
    """This process's environment with :data:`CHECKOUT` first on ``PYTHONPATH``."""
    paths = [str(CHECKOUT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
