"""A pipelined streaming driver killed at a point of its background publish recovers to
exactly once.

The same pipeline as ``tests/reliability/test_crash_points_streaming.py`` with
``publish=pipelined`` (ClickHouse 18.16, records in ZooKeeper): each micro-batch's
commit returns after its decision and a background thread publishes it while the next
micro-batch runs. The points: the commit returned with the epoch decided and nothing
published (``pipeline.before_publish``), the background publish with rows visible but
not marked (``publish.after_attach``, passed in the background thread), ``Committed``
before its clean-up (``commit.after_committed``), and the next epoch's commit before it
waits for the previous publish (``pipeline.before_settle``). The restarted driver rolls
the decided epoch forward before its next decision; the checker counts every id once.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from coordinator.steps import COMMIT_AFTER_COMMITTED
from tests.crashcases import assert_exactly_once_after, crash_point_run
from tests.harness.chaos.crashrun import CrashPointRun
from txsink.core.crashpoints import PIPELINE_BEFORE_PUBLISH, PIPELINE_BEFORE_SETTLE

#: Killed at ``pipeline.before_publish`` after Spark recorded the batch, the restarted
#: query replays nothing; with no new input no micro-batch starts, so nothing calls the
#: sink and the decided epoch waits for the next micro-batch (or ``txsink recover``,
#: ``txsink.wait_published``): the runner's "caught up" then times out.
NO_REPLAY = pytest.mark.xfail(strict=False, reason="a decided epoch Spark recorded is "
                              "published at the restarted query's next micro-batch only")
POINTS = (pytest.param(PIPELINE_BEFORE_PUBLISH, marks=NO_REPLAY), "publish.after_attach",
          COMMIT_AFTER_COMMITTED, PIPELINE_BEFORE_SETTLE)


@pytest.fixture(scope="module", params=["ch18"])
def crash_run(request, tmp_path_factory, zk_hosts: str) -> Iterator[CrashPointRun]:
    yield from crash_point_run(request, tmp_path_factory, zk_hosts, "stream",
                               points=len(POINTS), options_given={"publish": "pipelined"})


@pytest.mark.parametrize("point", POINTS)
def test_pipelined_micro_batch_killed_at_point_is_exactly_once_after_restart(crash_run, point):
    assert_exactly_once_after(crash_run.run_point(point), point, "the micro-batch")
