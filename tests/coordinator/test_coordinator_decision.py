"""The commit decision proves that its driver knows every branch of the xid, so that the
completion lists none; on both node stores. Without the proof the branches are listed.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from coordinator import BranchState, Coordinator, XidState
from coordinator.plumbing.nodes import NodeStore
from coordinator.plumbing.store import SinkStore
from tests.coordinator.test_coordinator_support import (
    Target,
    new_coordinator,
    prepared_branches,
)

EPOCH = 3


@pytest.fixture
def zk(nodes: Callable[[], NodeStore]) -> NodeStore:
    return nodes()


@pytest.fixture
def listings(monkeypatch) -> list[int]:
    """The epochs whose branches were listed during the test."""
    listed: list[int] = []
    original = SinkStore.branch_ids

    def branch_ids(self: SinkStore, epoch: int) -> list[str]:
        listed.append(epoch)
        return original(self, epoch)

    monkeypatch.setattr(SinkStore, "branch_ids", branch_ids)
    return listed


def test_a_commit_knowing_every_branch_lists_none(zk, listings) -> None:
    coord, generation = new_coordinator(zk)
    coord.begin(EPOCH, generation)
    winners = prepared_branches(coord, EPOCH, generation, 2)
    coord.commit(EPOCH, generation, winners, Target().publish, Target().rollback)
    assert EPOCH not in listings


def test_a_branch_the_deciding_driver_never_saw_is_rolled_back_and_aborted(
        zk, listings) -> None:
    coord, generation = new_coordinator(zk)
    coord.begin(EPOCH, generation)
    winners = prepared_branches(coord, EPOCH, generation, 2)
    task = Coordinator(zk, coord.sink_id)  # another process: a task attempt that lost
    lost = prepared_branches(task, EPOCH, generation, 1, prefix="q")
    target = Target()
    coord.commit(EPOCH, generation, winners, target.publish, target.rollback)
    assert EPOCH in listings
    assert target.rollback_calls[lost[0]] == 1 and target.visible_in(EPOCH) == set(winners)
    (loser,) = [b for b in coord.branches(EPOCH) if b.branch_id == lost[0]]
    assert loser.state is BranchState.ABORTED


def test_a_commit_finishing_this_process_s_own_decision_lists_none(zk, listings) -> None:
    coord, generation = new_coordinator(zk)
    coord.begin(EPOCH, generation)
    winners = prepared_branches(coord, EPOCH, generation, 2)
    with coord.publish_lease(EPOCH, generation):  # as a pipelined writer holds it
        coord.decide(EPOCH, generation, winners)
        coord.commit(EPOCH, generation, None, Target().publish, Target().rollback)
    assert EPOCH not in listings and coord.xid(EPOCH).state is XidState.COMMITTED
