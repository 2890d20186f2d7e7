"""Fencing: a writer with an older generation can decide nothing and register nothing."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient

from coordinator import Coordinator, Fenced, SinkTakenOver, XidDecided, XidState
from tests.coordinator.test_coordinator_support import (
    Crash,
    Target,
    crash_at,
    new_coordinator,
    prepared_branches,
)

EPOCH = 4


def test_fence_bumps_the_generation_by_one(zk: KazooClient) -> None:
    coord = Coordinator(zk, "orders")
    assert coord.generation() == 0
    assert coord.fence() == 1
    assert coord.fence() == 2
    assert Coordinator(zk, "orders").generation() == 2


def test_generations_of_different_sinks_are_independent(zk: KazooClient) -> None:
    Coordinator(zk, "a").fence()
    assert Coordinator(zk, "b").fence() == 1


def test_commit_by_a_fenced_writer_is_refused_and_decides_nothing(zk: KazooClient) -> None:
    old, old_generation = new_coordinator(zk)
    old.begin(EPOCH, old_generation)
    winners = prepared_branches(old, EPOCH, old_generation, 2)
    new_coordinator(zk)
    target = Target()
    with pytest.raises(Fenced):
        old.commit(EPOCH, old_generation, winners, target.publish, target.rollback)
    assert old.xid(EPOCH).state is XidState.INITIALIZED
    assert not target.publish_calls


def test_commit_of_winners_a_newer_writer_rolled_back_for_a_new_attempt_is_refused_as_taken_over(
        zk: KazooClient) -> None:
    old, old_generation = new_coordinator(zk)
    old.begin(EPOCH, old_generation)
    winners = prepared_branches(old, EPOCH, old_generation, 2)
    new, generation = new_coordinator(zk)
    target = Target()
    new.abort(EPOCH, generation, target.rollback)  # a replay: the attempt is started over
    new.begin(EPOCH, generation)
    with pytest.raises(SinkTakenOver):
        old.commit(EPOCH, old_generation, winners, target.publish, target.rollback)
    assert new.xid(EPOCH).state is XidState.INITIALIZED


def test_abort_by_a_fenced_writer_is_refused(zk: KazooClient) -> None:
    old, old_generation = new_coordinator(zk)
    old.begin(EPOCH, old_generation)
    new_coordinator(zk)
    with pytest.raises(Fenced):
        old.abort(EPOCH, old_generation, Target().rollback)
    assert old.xid(EPOCH).state is XidState.INITIALIZED


def test_register_branch_by_a_fenced_writer_is_refused(zk: KazooClient) -> None:
    old, old_generation = new_coordinator(zk)
    old.begin(EPOCH, old_generation)
    new_coordinator(zk)
    with pytest.raises(Fenced):
        old.register_branch(EPOCH, "p0-a0-zombie00", old_generation, owner={})
    assert old.branches(EPOCH) == []


def test_begin_of_a_new_xid_by_a_fenced_writer_is_refused(zk: KazooClient) -> None:
    old, old_generation = new_coordinator(zk)
    new_coordinator(zk)
    with pytest.raises(Fenced):
        old.begin(EPOCH, old_generation)
    assert old.xid(EPOCH) is None


def test_select_by_a_fenced_writer_is_refused(zk: KazooClient) -> None:
    old, old_generation = new_coordinator(zk)
    old.begin(EPOCH, old_generation)
    winners = prepared_branches(old, EPOCH, old_generation, 1)
    new_coordinator(zk)
    with pytest.raises(Fenced):
        old.select(EPOCH, old_generation, winners)


def test_begin_by_a_fenced_writer_of_an_xid_a_newer_one_adopted_is_refused(
        zk: KazooClient) -> None:
    old, old_generation = new_coordinator(zk)
    old.begin(EPOCH, old_generation)
    new, new_generation = new_coordinator(zk)
    new.begin(EPOCH, new_generation)
    with pytest.raises(Fenced):
        old.begin(EPOCH, old_generation)


def test_a_writer_fenced_after_its_decision_still_finishes_it(zk: KazooClient) -> None:
    """The decision stands; finishing it is owned by the publish lease, not the generation."""
    old, old_generation = new_coordinator(zk, on_step=crash_at("commit.after_publish"))
    old.begin(EPOCH, old_generation)
    winners = prepared_branches(old, EPOCH, old_generation, 1)
    with pytest.raises(Crash):
        old.commit(EPOCH, old_generation, winners, Target().publish, Target().rollback)
    new_coordinator(zk)
    old.on_step = None
    record = old.commit(EPOCH, old_generation, winners, Target().publish, Target().rollback)
    assert record.state is XidState.COMMITTED


def test_a_fenced_writer_sees_success_when_its_successor_finished_the_commit(
        zk: KazooClient) -> None:
    old, old_generation = new_coordinator(zk, on_step=crash_at("commit.after_decision"))
    old.begin(EPOCH, old_generation)
    winners = prepared_branches(old, EPOCH, old_generation, 1)
    with pytest.raises(Crash):
        old.commit(EPOCH, old_generation, winners, Target().publish, Target().rollback)
    new, _ = new_coordinator(zk)
    new.recover(Target().publish, Target().rollback)
    old.on_step = None
    record = old.commit(EPOCH, old_generation, winners, Target().publish, Target().rollback)
    assert record.state is XidState.COMMITTED


def test_a_zombie_task_cannot_register_a_branch_after_the_decision(zk: KazooClient) -> None:
    driver, generation = new_coordinator(zk, on_step=crash_at("commit.after_decision"))
    driver.begin(EPOCH, generation)
    winners = prepared_branches(driver, EPOCH, generation, 1)
    zombie = Coordinator(zk, "orders")  # a task of the same, current generation
    assert zombie.begin(EPOCH, generation) is XidState.INITIALIZED  # it saw the xid open
    with pytest.raises(Crash):
        driver.commit(EPOCH, generation, winners, Target().publish, Target().rollback)
    with pytest.raises(XidDecided):
        zombie.register_branch(EPOCH, "p1-a1-zombie00", generation, owner={})
    assert [b.branch_id for b in driver.branches(EPOCH)] == winners


def test_a_zombie_task_cannot_prepare_its_branch_after_the_decision(zk: KazooClient) -> None:
    driver, generation = new_coordinator(zk)
    driver.begin(EPOCH, generation)
    winners = prepared_branches(driver, EPOCH, generation, 1)
    zombie = Coordinator(zk, "orders")
    zombie.register_branch(EPOCH, "p1-a1-zombie00", generation, owner={})
    driver.commit(EPOCH, generation, winners, Target().publish, Target().rollback)
    with pytest.raises(XidDecided):
        zombie.prepare_branch(EPOCH, "p1-a1-zombie00", {"rows": 5})


# -- claim: fencing once per run ------------------------------------------------------

def test_claim_by_the_tasks_of_one_run_bumps_the_generation_once(zk: KazooClient) -> None:
    first = Coordinator(zk, "orders").claim("run-a")
    assert [Coordinator(zk, "orders").claim("run-a") for _ in range(3)] == [first] * 3
    assert Coordinator(zk, "orders").generation() == first


def test_claim_by_a_new_run_fences_the_previous_run(zk: KazooClient) -> None:
    old = Coordinator(zk, "orders")
    old_generation = old.claim("run-a")
    old.begin(EPOCH, old_generation)
    assert Coordinator(zk, "orders").claim("run-b") == old_generation + 1
    with pytest.raises(Fenced):
        old.register_branch(EPOCH, "p0-a0-zombie00", old_generation, owner={})


def test_claim_by_a_superseded_run_is_fenced(zk: KazooClient) -> None:
    Coordinator(zk, "orders").claim("run-a")
    current = Coordinator(zk, "orders").claim("run-b")
    with pytest.raises(Fenced, match="run-a"):
        Coordinator(zk, "orders").claim("run-a")
    assert Coordinator(zk, "orders").generation() == current


def test_claim_after_an_anonymous_fence_bumps_again(zk: KazooClient) -> None:
    claimed = Coordinator(zk, "orders").claim("run-a")
    fenced = Coordinator(zk, "orders").fence()
    with pytest.raises(Fenced):
        Coordinator(zk, "orders").claim("run-a")
    assert Coordinator(zk, "orders").claim("run-b") == fenced + 1 == claimed + 2
