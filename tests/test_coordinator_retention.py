"""Epoch skip (a replayed epoch writes nothing), epoch allocation and retention."""

from __future__ import annotations

import time

import pytest
from kazoo.client import KazooClient

from coordinator import XidState
from coordinator.retention import add_to_ranges
from coordinator.sink_admin import SinkAdmin
from tests.test_coordinator_support import SINK, Target, new_coordinator, prepared_branches


def commit_epochs(zk: KazooClient, epochs: range) -> None:
    driver, generation = new_coordinator(zk)
    for epoch in epochs:
        driver.begin(epoch, generation)
        winners = prepared_branches(driver, epoch, generation, 1)
        driver.commit(epoch, generation, winners, Target().publish, Target().rollback)


# -- epoch skip -----------------------------------------------------------------------

def test_a_replayed_epoch_is_reported_committed_and_its_commit_publishes_nothing(
        zk: KazooClient) -> None:
    commit_epochs(zk, range(3))
    replay, generation = new_coordinator(zk)
    assert replay.is_committed(2) and SinkAdmin(replay).last_committed() == 2
    assert replay.begin(2, generation) is XidState.COMMITTED
    target = Target()
    record = replay.commit(2, generation, ["p0-a1-replay00"], target.publish, target.rollback)
    assert record.state is XidState.COMMITTED
    assert not target.publish_calls and not target.rollback_calls


def test_an_epoch_never_begun_is_not_committed(zk: KazooClient) -> None:
    coord, _ = new_coordinator(zk)
    assert not coord.is_committed(0)
    assert SinkAdmin(coord).last_committed() is None


def test_allocated_epochs_are_monotonic_across_coordinators(zk: KazooClient) -> None:
    first, _ = new_coordinator(zk)
    second, _ = new_coordinator(zk)
    assert [first.allocate_epoch(), second.allocate_epoch(), first.allocate_epoch()] == [0, 1, 2]


def test_metrics_recorded_after_the_commit_are_kept_with_the_xid(zk: KazooClient) -> None:
    commit_epochs(zk, range(1))
    coord, _ = new_coordinator(zk)
    coord.record_metrics(0, {"rows": 10, "latency_ms": 120.5})
    coord.record_metrics(0, {"commit_ms": 8})
    assert coord.xid(0).metrics == {"rows": 10, "latency_ms": 120.5, "commit_ms": 8}


# -- retention ------------------------------------------------------------------------

def test_prune_removes_finished_xids_older_than_the_age(zk: KazooClient) -> None:
    commit_epochs(zk, range(3))
    coord, _ = new_coordinator(zk)
    time.sleep(0.05)
    assert SinkAdmin(coord).prune(0.01) == [0, 1, 2]
    assert SinkAdmin(coord).xids() == []
    assert zk.get_children(f"/txsink/sinks/{SINK}/xids") == []


def test_prune_keeps_xids_younger_than_the_age(zk: KazooClient) -> None:
    commit_epochs(zk, range(2))
    coord, _ = new_coordinator(zk)
    assert SinkAdmin(coord).prune(3600) == []
    assert len(SinkAdmin(coord).xids()) == 2


def test_prune_never_removes_an_open_xid(zk: KazooClient) -> None:
    coord, generation = new_coordinator(zk)
    coord.begin(0, generation)
    time.sleep(0.05)
    assert SinkAdmin(coord).prune(0.01) == []
    assert coord.xid(0).state is XidState.INITIALIZED


def test_a_pruned_epoch_is_still_reported_committed(zk: KazooClient) -> None:
    commit_epochs(zk, range(3))
    coord, generation = new_coordinator(zk)
    time.sleep(0.05)
    SinkAdmin(coord).prune(0.01)
    assert coord.is_committed(1)
    assert SinkAdmin(coord).last_committed() == 2


def test_a_replayed_task_of_a_pruned_committed_epoch_begins_no_new_xid(
        zk: KazooClient) -> None:
    commit_epochs(zk, range(3))
    coord, _ = new_coordinator(zk)
    time.sleep(0.05)
    SinkAdmin(coord).prune(0.01)
    replay, generation = new_coordinator(zk)
    assert replay.begin(1, generation) is XidState.COMMITTED
    assert replay.xid(1) is None


def test_a_pruned_aborted_epoch_is_not_reported_committed(zk: KazooClient) -> None:
    coord, generation = new_coordinator(zk)
    coord.begin(0, generation)
    coord.abort(0, generation, Target().rollback)
    time.sleep(0.05)
    SinkAdmin(coord).prune(0.01)
    assert not coord.is_committed(0)


def test_epoch_allocation_continues_after_pruning(zk: KazooClient) -> None:
    coord, generation = new_coordinator(zk)
    for _ in range(2):
        epoch = coord.allocate_epoch()
        coord.begin(epoch, generation)
        coord.commit(epoch, generation, [], Target().publish, Target().rollback)
    time.sleep(0.05)
    SinkAdmin(coord).prune(0.01)
    assert coord.allocate_epoch() == 2


def test_prune_removes_branches_and_their_ledgers(zk: KazooClient) -> None:
    coord, generation = new_coordinator(zk)
    coord.begin(0, generation)
    (branch,) = prepared_branches(coord, 0, generation, 1)
    with coord.publish_lease(0):
        coord.ledger(0, branch).put("202401", {"state": "published"})
    coord.commit(0, generation, [branch], Target().publish, Target().rollback)
    time.sleep(0.05)
    assert SinkAdmin(coord).prune(0.01) == [0]
    assert coord.branches(0) == []


@pytest.mark.parametrize(("ranges", "epochs", "merged"), [
    ([], [3, 1, 2], [[1, 3]]),
    ([[0, 4]], [5], [[0, 5]]),
    ([[0, 4]], [7], [[0, 4], [7, 7]]),
    ([[0, 4], [7, 9]], [5, 6], [[0, 9]]),
])
def test_pruned_epochs_are_kept_as_merged_ranges(ranges: list[list[int]], epochs: list[int],
                                                  merged: list[list[int]]) -> None:
    assert add_to_ranges(ranges, epochs) == merged
