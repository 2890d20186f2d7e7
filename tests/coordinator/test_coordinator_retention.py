"""Epoch skip (a replayed epoch writes nothing), epoch allocation and retention.

The writers' retention pass (``Coordinator.retain``) runs on both stores (fixture
``nodes``: ZooKeeper, and KeeperMap tables of the modern server): bounded, idempotent,
finished by the next pass after a crash at any of its steps, safe beside other pruners.
"""

from __future__ import annotations

import threading
import time

import pytest
from kazoo.client import KazooClient

from coordinator import Coordinator, XidState
from coordinator.formats.steps import RETAIN_STEPS
from coordinator.plumbing.nodes import NodeStore
from coordinator.sink_admin import SinkAdmin
from coordinator.upkeep.retention import DecidedXid, Pass, Retention, add_to_ranges
from tests.coordinator.test_coordinator_support import (
    SINK,
    Crash,
    Target,
    crash_at,
    new_coordinator,
    prepared_branches,
)


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


# -- the writers' retention pass, on both stores ------------------------------------------

def count_folds(partitions: dict, decided: DecidedXid) -> dict:
    """A fold that counts how often each epoch was folded (the coordinator's fold is
    opaque to it: ``txsink.core.history_summary`` folds rows and digests)."""
    key = str(decided.record.epoch)
    return {**partitions, key: partitions.get(key, 0) + 1}


def committed_epochs(coord: Coordinator, generation: int, epochs: range) -> None:
    for epoch in epochs:
        coord.begin(epoch, generation)
        winners = prepared_branches(coord, epoch, generation, 2)
        coord.commit(epoch, generation, winners, Target().publish, Target().rollback)


def sink_nodes(client: NodeStore, path: str = f"/txsink/sinks/{SINK}") -> int:
    """Nodes of the sink's tree (a walk)."""
    return 1 + sum(sink_nodes(client, f"{path}/{c}") for c in client.get_children(path))


def test_a_pass_removes_at_most_its_bound_and_says_a_backlog_is_left(nodes) -> None:
    coord, generation = new_coordinator(nodes())
    committed_epochs(coord, generation, range(5))
    time.sleep(0.05)
    first = coord.retain(0.01, count_folds, limit=2)
    assert (first.pruned, first.more) == ([0, 1], True)
    assert coord.retain(0.01, count_folds, limit=8) == Pass([2, 3, 4], False)


def test_a_pass_keeps_what_exactly_once_needs(nodes) -> None:
    coord, generation = new_coordinator(nodes())
    committed_epochs(coord, generation, range(3))
    coord.begin(3, generation)  # open: never removed
    time.sleep(0.05)
    coord.retain(0.01, count_folds)
    admin = SinkAdmin(coord)
    assert [x.epoch for x in admin.xids()] == [3]
    assert admin.last_committed() == 2 and coord.is_committed(1) and not coord.is_committed(3)
    assert coord.generation() == generation
    assert coord.begin(1, generation) is XidState.COMMITTED  # a replay writes nothing


def test_a_pass_leaves_xids_younger_than_the_retention(nodes) -> None:
    coord, generation = new_coordinator(nodes())
    committed_epochs(coord, generation, range(2))
    assert coord.retain(3600, count_folds) == Pass([], False)
    assert len(SinkAdmin(coord).xids()) == 2


def test_a_pass_folds_each_committed_xid_into_the_summary_once(nodes) -> None:
    coord, generation = new_coordinator(nodes())
    committed_epochs(coord, generation, range(3))
    coord.begin(3, generation)
    coord.abort(3, generation, Target().rollback)
    time.sleep(0.05)
    coord.retain(0.01, count_folds)
    summary = SinkAdmin(coord).summary()
    assert (summary.partitions, summary.folded) == ({"0": 1, "1": 1, "2": 1}, [[0, 2]])
    assert Retention(coord.store).ranges() == {"committed": [[0, 2]], "aborted": [[3, 3]]}


def test_an_epoch_the_fold_cannot_tell_is_pruned_outside_the_summary(nodes) -> None:
    coord, generation = new_coordinator(nodes())
    committed_epochs(coord, generation, range(2))
    time.sleep(0.05)
    coord.retain(0.01, lambda p, d: None if d.record.epoch == 1 else count_folds(p, d))
    assert SinkAdmin(coord).summary().folded == [[0, 0]]
    assert Retention(coord.store).ranges()["committed"] == [[0, 1]]


@pytest.mark.parametrize("step", RETAIN_STEPS)
def test_a_pass_crashed_at_a_step_is_finished_by_the_next_without_folding_twice(
        nodes, step: str) -> None:
    client = nodes()
    coord, generation = new_coordinator(client)
    committed_epochs(coord, generation, range(3))
    time.sleep(0.05)
    crashing = Coordinator(client, SINK, on_step=crash_at(step))
    with pytest.raises(Crash):
        crashing.retain(0.01, count_folds)
    after, _ = new_coordinator(nodes())
    after.retain(0.01, count_folds)
    assert SinkAdmin(after).xids() == []
    assert SinkAdmin(after).summary().partitions == {"0": 1, "1": 1, "2": 1}


def test_overlapping_pruners_fold_every_epoch_once(nodes) -> None:
    """Writers' passes of two processes and an operator's prune at the same time."""
    coord, generation = new_coordinator(nodes())
    committed_epochs(coord, generation, range(12))
    time.sleep(0.05)
    actors = [Coordinator(nodes(), SINK) for _ in range(3)]
    errors: list[BaseException] = []

    def run(actor: Coordinator, operator: bool) -> None:
        try:
            if operator:
                SinkAdmin(actor).prune(0.01, count_folds)
            else:
                while actor.retain(0.01, count_folds, limit=3).more:
                    pass
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(a, i == 0)) for i, a in enumerate(actors)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    SinkAdmin(coord).prune(0.01, count_folds)  # whatever a racer left for a later pass
    assert SinkAdmin(coord).xids() == []
    assert SinkAdmin(coord).summary().partitions == {str(e): 1 for e in range(12)}


def test_the_sinks_tree_stays_bounded_as_epochs_go_on(nodes) -> None:
    client = nodes()
    coord, generation = new_coordinator(client)
    sizes = []
    for epoch in range(40):  # each epoch older than the retention at the next one's pass
        committed_epochs(coord, generation, range(epoch, epoch + 1))
        coord.retain(0.05, count_folds)
        sizes.append(sink_nodes(client))
        time.sleep(0.1)  # a slower machine only makes the epochs older, never younger
    assert max(sizes[20:]) <= max(sizes[:20])
    assert len(SinkAdmin(coord).xids()) < 20
