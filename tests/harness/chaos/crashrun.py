"""Each named crash point once: arm it, feed one epoch, let the driver die there, restart.

One pipeline driver (streaming, or batch with one job per input file) runs for the whole
sequence with every crash point armed but marked "already fired"
(:class:`~tests.harness.chaos.faults.CrashArming`). For each point the runner waits until the
pipeline has caught up, arms the point, writes the next input file and waits for the
driver to die at that point. It then records what the target holds right after the kill
(rows may be missing, none may be doubled), restarts the driver from its checkpoint
(streaming) or re-runs the job after recovery (batch), and records the target again once
the pipeline has caught up: every id exactly once.

The ``abort.*`` points lie on the failure path only: for them the epoch's tasks are made
to fail (the pipeline's fail flag) until the driver has died, so Spark aborts the epoch.

Usage::

    run = CrashPointRun(workdir, url, zookeeper, "db.events", mode="stream")
    run.setup()
    outcome = run.run_point("commit.after_decision")
    assert outcome.fired and outcome.after_restart.exactly_once
    run.close()
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from coordinator.formats.steps import RETAIN_STEPS
from tests.harness.chaos import checker
from tests.harness.chaos.faults import CrashArming
from tests.harness.chaos.launcher import DriverProcess, PipelineSpec
from tests.harness.chaos.pipeline import (
    check_with_view,
    committed_batches,
    create_events_table,
    create_fed_view,
    write_epoch_file,
)

ABORT_PREFIX = "abort."
#: seconds a pipelined run waits, after Spark recorded the batch, for its background
#: publish to reach the armed point
PIPELINED_GRACE = 15.0


@dataclass(frozen=True)
class PointOutcome:
    """What happened when the driver was crashed at one point."""

    name: str
    fired: bool
    exit_code: int | None           # -9: killed by the crash point
    after_crash: checker.CheckResult | None
    after_restart: checker.CheckResult | None
    driver_error: str = ""

    def explain(self) -> str:
        crash = self.after_crash.summary() if self.after_crash else "unreadable"
        restart = self.after_restart.summary() if self.after_restart else "not caught up"
        text = (f"{self.name}: fired={self.fired} exit={self.exit_code}; after the crash "
                f"{crash}; after the restart {restart}")
        return text + (f"; driver said: {self.driver_error}" if self.driver_error else "")


@dataclass
class CrashPointRun:
    """One long-lived pipeline through which crash points are tried one by one."""

    workdir: Path
    url: str
    zookeeper: str
    table: str
    mode: str = "stream"
    way: str = "datasource"  # the pipeline's --way (foreach_batch, write: every PySpark)
    rows_per_epoch: int = 300
    timeout: float = 120.0
    setup_timeout: float = 300.0  # the first driver boots cold
    log: Callable[[str], None] = lambda line: None
    standby: int = 2  # drivers kept warm: a restart promotes one instead of booting
    points: int | None = None  # how many points will be run (no standby booted beyond)
    views: bool = True  # the target feeds a materialized view, checked like the target
    options: dict[str, str] = field(default_factory=dict)  # more sink options (the store)

    def __post_init__(self) -> None:
        self.files = 0
        self.arming = CrashArming(self.workdir / "crash-markers")
        self.fail_flag = self.workdir / "fail.flag"
        self.checkpoint = self.workdir / "checkpoint"

    def setup(self) -> None:
        """Create the target, start the driver and commit a first epoch (warm-up)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        create_events_table(self.url, self.table)
        if self.views:
            create_fed_view(self.url, self.table)
        self.arming.disarm_all()
        spec = PipelineSpec(
            source=self.workdir / "input", checkpoint=self.checkpoint, table=self.table,
            url=self.url, zookeeper=self.zookeeper, mode=self.mode, way=self.way,
            interval="200 milliseconds", sink_id=f"crash-{self.mode}",
            fail_flag=self.fail_flag, options=dict(self.options),
        )
        self.driver = DriverProcess(spec, self.workdir / "logs", self.arming.env(),
                                    standby=self.standby, restarts=self.points)
        self._write_epoch()
        self.driver.start(warm_up_standbys=False)
        if not self._caught_up(self.setup_timeout):
            raise RuntimeError(f"the {self.mode} pipeline did not commit its first epoch: "
                               f"{self.driver.last_error() or 'no error printed'}")
        self.driver.prestart()

    def close(self) -> None:
        if hasattr(self, "driver"):
            self.driver.stop(timeout=20)

    def expected(self) -> range:
        return range(0, self.files * self.rows_per_epoch)

    def check(self) -> checker.CheckResult | None:
        """The target's counts; the view's table's where the target's are exactly once
        and those are not (every row must reach both exactly once)."""
        try:
            if self.views:
                return check_with_view(self.url, self.table, self.expected())
            return checker.check(self.url, self.table, self.expected())
        except checker.CheckerError:
            return None

    def _write_epoch(self) -> None:
        ids = range(self.files * self.rows_per_epoch, (self.files + 1) * self.rows_per_epoch)
        write_epoch_file(self.workdir / "input", self.files, ids)
        self.files += 1

    def _caught_up(self, timeout: float) -> bool:
        """Wait until every file is recorded as done and every id is visible once."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if committed_batches(self.checkpoint) >= self.files:
                result = self.check()
                if result is not None and result.exactly_once:
                    return True
            if not self.driver.alive():
                return False
            time.sleep(0.1)
        return False

    def run_point(self, name: str, feed_after_restart: bool = False) -> PointOutcome:
        """Crash the driver at ``name`` during the next epoch, restart, check.

        ``feed_after_restart``: write one more epoch's input once the driver restarted,
        as a stream that keeps receiving data does (a query restarted with nothing new
        runs no micro-batch, so nothing calls the sink)."""
        failing = name.startswith(ABORT_PREFIX)
        if failing:
            self.fail_flag.touch()
        if name in RETAIN_STEPS:  # a pass folds only finished xids older than the retention
            time.sleep(float(self.options.get("retention", 0)) + 0.5)
        self.arming.arm(name)
        self._write_epoch()
        died = self._wait_for_death(self.timeout, expect_commit=not failing)
        fired = self.arming.fired(name)
        if not fired:
            self.arming.disarm(name)
        code = self.driver.poll()
        error = self.driver.last_error() if code and code > 0 else ""
        after_crash = self.check()
        self.fail_flag.unlink(missing_ok=True)
        if not died and committed_batches(self.checkpoint) < self.files:
            died = self.driver.kill()  # neither died nor committed: hung, start afresh
        if died:
            self.log(f"{name}: fired={fired} exit={code}; restarting")
            self.driver.start()
        if feed_after_restart:
            self._write_epoch()
        caught_up = self._caught_up(self.timeout)
        return PointOutcome(name, fired, code, after_crash,
                            self.check() if caught_up else None, error)

    def _wait_for_death(self, timeout: float, expect_commit: bool) -> bool:
        """True once the driver has died; False if the epoch committed without dying."""
        deadline = time.monotonic() + timeout
        recorded_at: float | None = None
        while time.monotonic() < deadline:
            if not self.driver.alive():
                return True
            if expect_commit and committed_batches(self.checkpoint) >= self.files:
                # publish=pipelined: Spark records the batch at its decision, and the
                # background publish passes its points after that
                recorded_at = recorded_at or time.monotonic()
                if not self.pipelined or time.monotonic() - recorded_at > PIPELINED_GRACE:
                    return False
            time.sleep(0.05)
        return False

    @property
    def pipelined(self) -> bool:
        return self.options.get("publish") == "pipelined"
