"""``Coordinator.commit``'s ``publish_groups``: different groups (say, tables) are
published at once, the winners of one group one after another, and a failure in one group
leaves the xid ``Committing`` for a repeat that publishes each winner once more at most."""

from __future__ import annotations

import threading

import pytest
from kazoo.client import KazooClient

from coordinator import BranchRecord, CoordinatorError, PublishFailed, XidState, grouped_by
from tests.coordinator.test_coordinator_support import Target, new_coordinator, prepared_branches

EPOCH = 1


class OverlapTarget(Target):
    """A target that records how many publishes of each group ran at once."""

    def __init__(self, groups: dict[str, str]) -> None:
        super().__init__()
        self.groups = groups
        self.lock = threading.Lock()
        self.running: dict[str, int] = {}
        self.most_at_once: dict[str, int] = {}
        self.all_groups_met = threading.Barrier(len(set(groups.values())), timeout=10)

    def group(self, branch: BranchRecord) -> str:
        return self.groups[branch.branch_id]

    def publish(self, branch: BranchRecord) -> None:
        group = self.group(branch)
        with self.lock:
            self.running[group] = self.running.get(group, 0) + 1
            self.most_at_once[group] = max(self.most_at_once.get(group, 0),
                                           self.running[group])
        try:
            if self.publish_calls[branch.branch_id] == 0 and branch.branch_id.endswith("0"):
                self.all_groups_met.wait()  # every group's first winner is in flight at once
            super().publish(branch)
        finally:
            with self.lock:
                self.running[group] -= 1


def test_winners_of_different_groups_are_published_at_once(zk: KazooClient) -> None:
    coord, generation = new_coordinator(zk)
    coord.begin(EPOCH, generation)
    first = prepared_branches(coord, EPOCH, generation, 1, prefix="a")
    second = prepared_branches(coord, EPOCH, generation, 1, prefix="b")
    target = OverlapTarget({first[0]: "events", second[0]: "rollup"})
    coord.commit(EPOCH, generation, first + second, target.publish, target.rollback,
                 publish_groups=grouped_by(target.group))
    assert target.visible_in(EPOCH) == {*first, *second}


def test_winners_of_one_group_are_published_one_after_another(zk: KazooClient) -> None:
    coord, generation = new_coordinator(zk)
    coord.begin(EPOCH, generation)
    winners = prepared_branches(coord, EPOCH, generation, 3)
    target = OverlapTarget(dict.fromkeys(winners, "events"))
    coord.commit(EPOCH, generation, winners, target.publish, target.rollback,
                 publish_groups=grouped_by(target.group))
    assert target.most_at_once == {"events": 1}
    assert target.visible_in(EPOCH) == set(winners)


def test_a_failed_group_leaves_the_xid_committing_and_a_repeat_finishes_it(
        zk: KazooClient) -> None:
    coord, generation = new_coordinator(zk)
    coord.begin(EPOCH, generation)
    good = prepared_branches(coord, EPOCH, generation, 1, prefix="a")
    bad = prepared_branches(coord, EPOCH, generation, 1, prefix="b")
    target = Target()

    def failing(branch: BranchRecord) -> None:
        if branch.branch_id in bad:
            raise ValueError("the rollup's server refuses")
        target.publish(branch)

    groups = {good[0]: "events", bad[0]: "rollup"}
    with pytest.raises(PublishFailed, match="the rollup's server refuses"):
        coord.commit(EPOCH, generation, good + bad, failing, target.rollback,
                     publish_groups=grouped_by(lambda b: groups[b.branch_id]))
    assert coord.xid(EPOCH).state is XidState.COMMITTING
    coord.commit(EPOCH, generation, None, target.publish, target.rollback,
                 publish_groups=grouped_by(lambda b: groups[b.branch_id]))
    assert coord.xid(EPOCH).state is XidState.COMMITTED
    assert target.visible_in(EPOCH) == {*good, *bad}


def test_groups_that_are_not_a_split_of_the_winners_are_refused_before_any_publish(
        zk: KazooClient) -> None:
    coord, generation = new_coordinator(zk)
    coord.begin(EPOCH, generation)
    winners = prepared_branches(coord, EPOCH, generation, 2)
    target = Target()
    with pytest.raises(CoordinatorError, match="not a split of the winners"):
        coord.commit(EPOCH, generation, winners, target.publish, target.rollback,
                     publish_groups=lambda found: [list(found)[:1]])
    assert target.visible_in(EPOCH) == set()


def test_a_group_of_several_winners_is_published_in_one_call_of_publish_group(
        zk: KazooClient) -> None:
    coord, generation = new_coordinator(zk)
    coord.begin(EPOCH, generation)
    winners = prepared_branches(coord, EPOCH, generation, 2, prefix="a")
    lone = prepared_branches(coord, EPOCH, generation, 1, prefix="b")
    target = Target()
    calls: list[list[str]] = []

    def publish_group(group: list[BranchRecord]) -> None:
        calls.append([b.branch_id for b in group])
        for branch in group:
            target.publish(branch)

    coord.commit(EPOCH, generation, winners + lone, target.publish, target.rollback,
                 publish_groups=grouped_by(lambda b: b.branch_id[0]),
                 publish_group=publish_group)
    assert calls == [winners]  # the lone winner through publish
    assert target.visible_in(EPOCH) == {*winners, *lone}
