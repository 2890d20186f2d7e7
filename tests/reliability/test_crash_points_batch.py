"""A batch job whose driver is killed at any named crash point recovers to exactly once.

One batch pipeline (one job per input file) runs as its own process session; for each
point of ``txsink.core.crashpoints.CRASH_POINTS`` the next job kills it there (driver, JVM and
Python workers). The restarted pipeline recovers the sink (``txsink recover``) and re-runs
the job if none of its rows is visible, as an operator would; the independent checker
then counts every id in the target. A job partly visible would fail the run.

Every point runs on ClickHouse 18.16 (``[ch18-...]``); three run on the modern server with
the records in KeeperMap (``[km26-...]``), one of them of the publish path of strategy
``move``: ``tests/crashcases.py`` says which and why that subset is sound.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.crashcases import assert_exactly_once_after, cases, crash_point_run
from tests.harness.chaos.crashrun import CrashPointRun


@pytest.fixture(scope="module")
def crash_run(request, tmp_path_factory, zk_hosts: str) -> Iterator[CrashPointRun]:
    yield from crash_point_run(request, tmp_path_factory, zk_hosts, "batch")


@pytest.mark.parametrize("crash_run, point", cases("batch"), indirect=["crash_run"],
                         scope="module")
def test_job_killed_at_point_is_exactly_once_after_rerun(crash_run, point):
    """Every point on 18.16; on 26.x three, one of them of ``move``'s publish path: the
    other points depend neither on the strategy nor on the store, and a pipeline run per
    point is too slow to try them all twice in CI (``tests/crashcases.py`` gives the
    reasoning)."""
    assert_exactly_once_after(crash_run.run_point(point), point, "the batch job")
