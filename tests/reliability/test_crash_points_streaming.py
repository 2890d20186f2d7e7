"""A streaming driver killed at any named crash point recovers to exactly once.

One pipeline driver runs as its own process session; for each point tried, the next
micro-batch kills it there (all of it: JVM and Python workers), the driver is restarted
from the same checkpoint, and the independent checker counts every id in the target.

On ClickHouse 18.16 (``[ch18-...]``) one point per state the dead driver leaves its xid
in (the batch suite tries every point); on the modern server with the records in
KeeperMap (``[km26-...]``) two, one of them of the publish path of strategy ``move``.
``tests/crashcases.py`` says why these subsets are sound.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.crashcases import assert_exactly_once_after, cases, crash_point_run
from tests.harness.chaos.crashrun import CrashPointRun


@pytest.fixture(scope="module")
def crash_run(request, tmp_path_factory, zk_hosts: str) -> Iterator[CrashPointRun]:
    yield from crash_point_run(request, tmp_path_factory, zk_hosts, "stream")


@pytest.mark.parametrize("crash_run, point", cases("stream"), indirect=["crash_run"],
                         scope="module")
def test_micro_batch_killed_at_point_is_exactly_once_after_restart(crash_run, point):
    """One point per xid state on 18.16, two on 26.x (one of ``move``'s publish path): the
    steps between them do not depend on the mode (the batch suite tries each) and a
    pipeline run per point is too slow to try them all twice in CI
    (``tests/crashcases.py`` gives the reasoning)."""
    assert_exactly_once_after(crash_run.run_point(point), point, "the micro-batch")
