"""A batch job whose driver is killed at any named crash point recovers to exactly once.

One batch pipeline (one job per input file) runs as its own process session; for each
point of ``txsink.crashpoints.CRASH_POINTS`` the next job kills it there (driver, JVM and
Python workers). The restarted pipeline recovers the sink (``txsink recover``) and re-runs
the job if none of its rows is visible, as an operator would; the independent checker
then counts every id in the target. A job partly visible would fail the run.
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
    run = CrashPointRun(tmp_path_factory.mktemp("crash-batch"), clickhouse_url,
                        zk_hosts + chroot, f"{db}.events", mode="batch")
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
def test_job_killed_at_point_is_exactly_once_after_rerun(crash_run, point):
    outcome = crash_run.run_point(point)
    assert outcome.fired, f"the batch job never reached {point}: {outcome.explain()}"
    assert outcome.exit_code == -9, outcome.explain()
    assert outcome.after_crash is not None, outcome.explain()
    assert outcome.after_crash.duplicates == 0, outcome.explain()
    assert outcome.after_crash.unexpected == 0, outcome.explain()
    assert outcome.after_restart is not None, outcome.explain()
    assert outcome.after_restart.exactly_once, outcome.explain()
