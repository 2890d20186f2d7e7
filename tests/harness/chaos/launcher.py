"""Start, promote, stop and kill the pipeline's driver process.

The pipeline (:mod:`tests.harness.chaos.pipeline`) runs in a session of its own
(``start_new_session=True``): its driver process, JVM and Python workers all belong to
that session, so :meth:`DriverProcess.kill` ends every one of them at once, like a lost
machine. PySpark's daemon moves its workers into a process group of their own, so the
session, not the process group, is what holds the whole driver.

Usage::

    spec = PipelineSpec(source, checkpoint, "db.events", url, zookeeper)
    driver = DriverProcess(spec, log_dir, standby=True)
    driver.start()          # or promotes the warm standby
    driver.kill()           # kill -9 of the whole driver
    driver.start()          # restart from the same checkpoint
    driver.stop()           # graceful: the query stops after its current epoch
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness.chaos import jvm
from tests.harness.chaos.faults import kill_session
from tests.harness.chaos.pipeline import RECOVERED_LINE, RUNNING_LINE, STANDBY_LINE
from txsink.core.crashpoints import HOOK_VARIABLE


@dataclass
class PipelineSpec:
    """Everything the driver process is started with."""

    source: Path
    checkpoint: Path
    table: str
    url: str
    zookeeper: str
    sink: str = "clickhouse_tx"
    mode: str = "stream"
    way: str = "datasource"  # the pipeline's --way: datasource, foreach_batch or write
    trigger: str = "processing-time"
    interval: str = "1 second"
    sink_id: str | None = None
    zk_root: str = "/txsink"
    master: str = "local[2,3]"
    fail_flag: Path | None = None
    options: dict[str, str] = field(default_factory=dict)

    @property
    def stop_file(self) -> Path:
        return self.checkpoint.with_name(self.checkpoint.name + ".stop")

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "tests.harness.chaos.pipeline", "--source", str(self.source),
                "--checkpoint", str(self.checkpoint), "--table", self.table,
                "--url", self.url, "--zookeeper", self.zookeeper, "--sink", self.sink,
                "--mode", self.mode, "--way", self.way, "--trigger", self.trigger,
                "--interval", self.interval,
                "--zk-root", self.zk_root, "--master", self.master]
        if self.sink_id:
            argv += ["--sink-id", self.sink_id]
        if self.fail_flag:
            argv += ["--fail-flag", str(self.fail_flag)]
        for key, value in self.options.items():
            argv += ["--option", f"{key}={value}"]
        return argv


@dataclass
class _Standby:
    proc: subprocess.Popen
    go_file: Path
    log_file: Path

    def ready(self) -> bool:
        """Booted and waiting (it printed its standing-by line)."""
        try:
            return STANDBY_LINE in self.log_file.read_text(errors="replace")
        except FileNotFoundError:
            return False


class DriverProcess:
    """The pipeline as a child process in a session of its own.

    With ``standby=N`` (N > 0) up to N further drivers are kept warm: started, JVM and
    Python workers up, but waiting before they read the checkpoint or reach the sink.
    :meth:`start` promotes one (a booted one first), which saves most of the ~15 s a
    Spark driver needs to start. Standbys live in sessions of their own, so killing the
    current driver spares them. Every driver's JVM starts from a class-data-sharing
    archive (:mod:`tests.harness.chaos.jvm`), built on the first spawn.

    ``restarts``, when the caller knows it, is how many times :meth:`start` will be called
    after the first: no more standbys are booted than restarts remain (a standby left
    unused at the end cost a whole driver start of CPU for nothing).
    """

    def __init__(self, spec: PipelineSpec, log_dir: Path,
                 extra_env: dict[str, str] | None = None, standby: int = 0,
                 restarts: int | None = None) -> None:
        self.spec = spec
        self.log_dir = log_dir
        self.extra_env = extra_env or {}
        self.standbys = int(standby)
        self.restarts = restarts
        self.proc: subprocess.Popen | None = None
        self.log_file: Path | None = None
        self._warm: list[_Standby] = []
        self._spawned = 0
        self._jvm_env: dict[str, str] | None = None
        self.starts = 0

    def _spawn(self, go_file: Path | None) -> tuple[subprocess.Popen, Path]:
        if self._jvm_env is None:
            self._jvm_env = jvm.submit_env()
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("TXSINK_CRASH_") and k != HOOK_VARIABLE}
        env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
                   **self._jvm_env, **self.extra_env)
        self._spawned += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_file = self.log_dir / f"driver-{self._spawned:03d}.log"
        argv = self.spec.argv() + (["--go-file", str(go_file)] if go_file else [])
        with open(log_file, "ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True)
        return proc, log_file

    def prestart(self, count: int | None = None) -> None:
        """Boot standbys until ``count`` (default: the configured number) are alive, never
        more than the restarts left."""
        self._warm = [w for w in self._warm if w.proc.poll() is None]
        wanted = self.standbys if count is None else count
        if self.restarts is not None:
            wanted = min(wanted, self.restarts - max(0, self.starts - 1))
        while len(self._warm) < wanted:
            go_file = self.log_dir / f"go-{self._spawned + 1:03d}"
            proc, log_file = self._spawn(go_file)
            self._warm.append(_Standby(proc, go_file, log_file))

    def start(self, warm_up_standbys: bool = True) -> int:
        """Start a driver (promoting a warm standby if there is one); returns its pid.

        ``warm_up_standbys=False`` boots no replacement standby yet: on a small machine
        the first driver boots faster alone (call :meth:`prestart` once it runs).
        """
        self.spec.stop_file.unlink(missing_ok=True)
        self._warm = [w for w in self._warm if w.proc.poll() is None]
        if self._warm:
            chosen = next((w for w in self._warm if w.ready()), self._warm[0])
            self._warm.remove(chosen)
            self.proc, self.log_file = chosen.proc, chosen.log_file
            chosen.go_file.touch()
        else:
            self.proc, self.log_file = self._spawn(None)
        self.starts += 1
        if warm_up_standbys:
            self.prestart()
        return self.proc.pid

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def poll(self) -> int | None:
        """The exit code if the driver has ended (negative: killed by that signal)."""
        return self.proc.poll() if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait(self, timeout: float | None = None) -> int | None:
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> bool:
        """SIGKILL the current driver's whole session; True if it was running."""
        if self.proc is None or not self.alive():
            return False
        _kill_session(self.proc)
        return True

    def stop(self, timeout: float = 60.0) -> int | None:
        """Ask the query to stop after its current epoch; kill it after ``timeout``.

        Standbys see the same stop file and exit too.
        """
        self.spec.stop_file.touch()
        code = self.poll()
        if self.alive():
            code = self.wait(timeout)
        self.close()
        return code if code is not None else self.poll()

    def close(self) -> None:
        """Kill whatever is left: the current driver's session and every standby."""
        if self.proc is not None:
            _kill_session(self.proc)
        for warm in self._warm:
            _kill_session(warm.proc)
        self._warm = []

    def running(self) -> bool:
        """True once the current driver has started its query (or its batch loop)."""
        if not self.alive():
            return False
        try:
            text = self.log_file.read_text(errors="replace")
        except (AttributeError, FileNotFoundError):
            return False
        return RUNNING_LINE in text or RECOVERED_LINE in text

    def last_error(self) -> str:
        """The current driver's one-line failure, if it printed one."""
        try:
            lines = self.log_file.read_text(errors="replace").splitlines()
        except (AttributeError, FileNotFoundError):
            return ""
        failures = [line for line in lines if line.startswith("pipeline failed:")]
        return failures[-1] if failures else ""


def _kill_session(proc: subprocess.Popen) -> None:
    kill_session(proc.pid)
    proc.wait()
