"""A streaming driver killed at any named crash point recovers to exactly once.

One pipeline driver runs as its own process session; for each point of
``txsink.crashpoints.CRASH_POINTS`` the next micro-batch kills it there (all of it: JVM
and Python workers), the driver is restarted from the same checkpoint, and the
independent checker counts every id in the target.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from tests.conftest import run_sql
from txsink.crashpoints import CRASH_POINTS
from txsink.harness.chaos.crashrun import CrashPointRun


@pytest.fixture(scope="module")
def crash_run(tmp_path_factory, clickhouse_url: str, zk_hosts: str) -> Iterator[CrashPointRun]:
    db, chroot = f"t_{uuid.uuid4().hex[:10]}", f"/tests/{uuid.uuid4().hex[:10]}"
    run = CrashPointRun(tmp_path_factory.mktemp("crash-stream"), clickhouse_url,
                        zk_hosts + chroot, f"{db}.events", mode="stream")
    admin = KazooClient(hosts=zk_hosts)
    admin.start(timeout=15)
    admin.ensure_path(chroot)
    try:
        run.setup()
        yield run
    finally:
        run.close()
        run_sql(clickhouse_url, f"DROP DATABASE IF EXISTS `{db}`")
        admin.delete(chroot, recursive=True)
        admin.stop()
        admin.close()


@pytest.mark.parametrize("point", CRASH_POINTS, ids=CRASH_POINTS)
def test_micro_batch_killed_at_point_is_exactly_once_after_restart(crash_run, point):
    outcome = crash_run.run_point(point)
    assert outcome.fired, f"the micro-batch never reached {point}: {outcome.explain()}"
    assert outcome.exit_code == -9, outcome.explain()
    assert outcome.after_crash is not None, outcome.explain()
    assert outcome.after_crash.duplicates == 0, outcome.explain()
    assert outcome.after_crash.unexpected == 0, outcome.explain()
    assert outcome.after_restart is not None, outcome.explain()
    assert outcome.after_restart.exactly_once, outcome.explain()
