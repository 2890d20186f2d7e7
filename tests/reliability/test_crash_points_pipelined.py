"""A pipelined streaming driver killed at a point of its background publish recovers to
exactly once.

The same pipeline as ``tests/reliability/test_crash_points_streaming.py`` with
``publish=pipelined`` (ClickHouse 18.16 with records in ZooKeeper; 26.x with records in
KeeperMap): each micro-batch's commit returns after its decision and a background thread
publishes it while the next micro-batch runs. The points:

- ``pipeline.before_publish``: the epoch decided, nothing published, and Spark has
  recorded the micro-batch, so the restarted query does not replay it: its next
  micro-batch publishes it first;
- ``publish.after_attach``: rows visible but not marked (in the background thread);
- ``commit.after_committed``: ``Committed``, before its clean-up;
- ``pipeline.before_settle``: the next epoch's commit, before it waits for the publish.

The stream keeps receiving data after each restart; the checker counts every id once.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from coordinator.formats.steps import COMMIT_AFTER_COMMITTED
from tests.crashcases import assert_exactly_once_after, crash_point_run
from tests.harness.chaos.crashrun import CrashPointRun
from txsink.core.crashpoints import PIPELINE_BEFORE_PUBLISH, PIPELINE_BEFORE_SETTLE

POINTS = (PIPELINE_BEFORE_PUBLISH, "publish.after_attach", COMMIT_AFTER_COMMITTED,
          PIPELINE_BEFORE_SETTLE)


@pytest.fixture(scope="module", params=["ch18", "km26"])
def crash_run(request, tmp_path_factory, zk_hosts: str) -> Iterator[CrashPointRun]:
    yield from crash_point_run(request, tmp_path_factory, zk_hosts, "stream",
                               points=len(POINTS), options_given={"publish": "pipelined"})


@pytest.mark.parametrize("point", POINTS)
def test_pipelined_micro_batch_killed_at_point_is_exactly_once_after_restart(crash_run, point):
    # the stream keeps receiving data: killed after Spark recorded the batch
    # (``pipeline.before_publish``), the decided epoch is published by the restarted
    # query's first micro-batch, before that micro-batch's own decision
    outcome = crash_run.run_point(point, feed_after_restart=True)
    assert_exactly_once_after(outcome, point, "the micro-batch")
