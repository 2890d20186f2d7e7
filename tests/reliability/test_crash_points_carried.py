"""A driver killed while it stages and publishes carried rows recovers to exactly once.

With ``carry_max_bytes`` the tasks stage nothing: the driver's commit registers, stages,
seals and prepares the epoch's rows as one attempt of its own, so the task's crash points
(``branch.*``) are passed by the driver, between the xid's begin and its decision. A
stream (18.16, records in ZooKeeper) is killed at the first and the last of them (a
branch registered with no staging; one prepared and undecided); a batch job on the
modern server with the records in KeeperMap at the prepared branch. The states after the
decision do not depend on who staged the winner: the streaming and batch suites try them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.crashcases import assert_exactly_once_after, crash_point_run
from tests.harness.chaos.crashrun import CrashPointRun
from txsink.core.crashpoints import BRANCH_AFTER_PREPARE, BRANCH_AFTER_REGISTER

CARRY = {"carry_max_bytes": str(64 << 20)}
STREAM_POINTS = (BRANCH_AFTER_REGISTER, BRANCH_AFTER_PREPARE)


@pytest.fixture(scope="module")
def stream_run(request, tmp_path_factory, zk_hosts: str) -> Iterator[CrashPointRun]:
    yield from crash_point_run(request, tmp_path_factory, zk_hosts, "stream",
                               points=len(STREAM_POINTS), options_given=CARRY)


@pytest.fixture(scope="module")
def batch_run(request, tmp_path_factory, zk_hosts: str) -> Iterator[CrashPointRun]:
    yield from crash_point_run(request, tmp_path_factory, zk_hosts, "batch", points=1,
                               options_given=CARRY)


@pytest.mark.parametrize("stream_run", ["ch18"], indirect=True)
@pytest.mark.parametrize("point", STREAM_POINTS)
def test_a_micro_batch_whose_driver_dies_staging_carried_rows_is_exactly_once(
        stream_run, point):
    assert_exactly_once_after(stream_run.run_point(point), point, "the micro-batch")


@pytest.mark.parametrize("batch_run", ["km26"], indirect=True)
def test_a_job_whose_driver_dies_with_carried_rows_prepared_is_exactly_once(batch_run):
    assert_exactly_once_after(batch_run.run_point(BRANCH_AFTER_PREPARE),
                              BRANCH_AFTER_PREPARE, "the job")
