"""Recovery after a crash at each step of commit and abort, by a new writer.

The "crash" is the ``on_step`` hook raising at the named step; the writer that crashed
is then abandoned and a new coordinator (a new driver: new session, new generation)
runs ``recover``. ``Target`` is shared by both, as the real target table would be.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from kazoo.client import KazooClient

from coordinator import (
    BranchRecord,
    BranchState,
    CallbackPolicy,
    Coordinator,
    PublishFailed,
    RecoveryIncomplete,
    RetryLater,
    XidState,
)
from coordinator.protocol.recovery import Recovery
from coordinator.sink_admin import SinkAdmin
from tests.coordinator.test_coordinator_support import (
    SINK,
    Crash,
    Target,
    crash_at,
    new_coordinator,
    prepared_branches,
)

EPOCH = 7
LOSER = "p9-a1-loser000"
FAST = CallbackPolicy(attempts=3, initial_wait=0.01, max_wait=0.02)


def crashed_commit(zk: KazooClient, step: str, target: Target) -> list[str]:
    """A driver that dies at ``step`` of committing EPOCH; returns the winners."""
    driver, generation = new_coordinator(zk, on_step=crash_at(step))
    driver.begin(EPOCH, generation)
    winners = prepared_branches(driver, EPOCH, generation, 3)
    driver.register_branch(EPOCH, LOSER, generation, owner={"staging": LOSER})
    with pytest.raises(Crash):
        driver.commit(EPOCH, generation, winners, target.publish, target.rollback)
    return winners


def crashed_abort(zk: KazooClient, step: str, target: Target) -> None:
    driver, generation = new_coordinator(zk, on_step=crash_at(step))
    driver.begin(EPOCH, generation)
    prepared_branches(driver, EPOCH, generation, 2)
    driver.register_branch(EPOCH, LOSER, generation, owner={"staging": LOSER})
    with pytest.raises(Crash):
        driver.abort(EPOCH, generation, target.rollback)


COMMIT_STEPS = ["commit.after_decision", "commit.after_branch_published",
                "commit.after_publish", "commit.after_committed"]
ABORT_STEPS = ["abort.after_decision", "abort.after_rollback"]


@pytest.mark.parametrize("step", COMMIT_STEPS)
def test_recovery_after_a_crash_at_each_commit_step_publishes_every_winner(
        zk: KazooClient, step: str) -> None:
    target = Target()
    winners = crashed_commit(zk, step, target)
    successor, _ = new_coordinator(zk)
    report = successor.recover(target.publish, target.rollback)
    assert successor.xid(EPOCH).state is XidState.COMMITTED
    assert target.visible_in(EPOCH) == set(winners)
    # Non-winners are rolled back after the Committed write: a crash right after it
    # leaves the loser's staging to gc (it can never be published).
    assert (LOSER in target.rollback_calls) == (step != "commit.after_committed")
    assert SinkAdmin(successor).last_committed() == EPOCH
    expected = [] if step == "commit.after_committed" else [
        (f"{SINK}/{EPOCH}", XidState.COMMITTING, "rolled_forward")]
    assert [(a.xid, a.from_state, a.action) for a in report.actions] == expected


@pytest.mark.parametrize("step", ABORT_STEPS)
def test_recovery_after_a_crash_at_each_abort_step_rolls_back_every_branch(
        zk: KazooClient, step: str) -> None:
    target = Target()
    crashed_abort(zk, step, target)
    successor, _ = new_coordinator(zk)
    report = successor.recover(target.publish, target.rollback)
    assert successor.xid(EPOCH).state is XidState.ABORTED
    assert len(target.rollback_calls) == 3 and not target.visible
    assert {b.state for b in successor.branches(EPOCH)} == {BranchState.ABORTED}
    assert [(a.from_state, a.action) for a in report.actions] == [
        (XidState.ABORTING, "rolled_back")]


def test_a_crash_during_recovery_is_finished_by_the_next_recovery(zk: KazooClient) -> None:
    target = Target()
    winners = crashed_commit(zk, "commit.after_decision", target)
    second, _ = new_coordinator(zk, on_step=crash_at("commit.after_branch_published"))
    with pytest.raises(Crash):
        second.recover(target.publish, target.rollback)
    third, _ = new_coordinator(zk)
    third.recover(target.publish, target.rollback)
    assert third.xid(EPOCH).state is XidState.COMMITTED
    assert target.visible_in(EPOCH) == set(winners)


def test_recovery_rolls_back_an_undecided_xid_of_an_older_generation(
        zk: KazooClient) -> None:
    target = Target()
    dead, dead_generation = new_coordinator(zk)
    dead.begin(EPOCH, dead_generation)
    prepared_branches(dead, EPOCH, dead_generation, 2)
    successor, _ = new_coordinator(zk)
    report = successor.recover(target.publish, target.rollback)
    assert successor.xid(EPOCH).state is XidState.ABORTED
    assert len(target.rollback_calls) == 2 and not target.visible
    assert [(a.from_state, a.action) for a in report.actions] == [
        (XidState.INITIALIZED, "rolled_back")]


def test_recovery_leaves_undecided_xids_of_the_current_generation_alone(
        zk: KazooClient) -> None:
    driver, generation = new_coordinator(zk)
    driver.begin(EPOCH, generation)
    report = driver.recover(Target().publish, Target().rollback)
    assert report.actions == [] and driver.xid(EPOCH).state is XidState.INITIALIZED


def test_recovery_of_an_aborted_xid_lets_the_new_writer_retry_the_epoch(
        zk: KazooClient) -> None:
    dead, dead_generation = new_coordinator(zk)
    dead.begin(EPOCH, dead_generation)
    successor, generation = new_coordinator(zk)
    successor.recover(Target().publish, Target().rollback)
    assert successor.begin(EPOCH, generation) is XidState.INITIALIZED
    assert successor.xid(EPOCH).attempt == 2


def test_a_publish_that_keeps_failing_leaves_the_xid_committing(zk: KazooClient) -> None:
    driver, generation = new_coordinator(zk, callback_policy=FAST)
    driver.begin(EPOCH, generation)
    winners = prepared_branches(driver, EPOCH, generation, 1)

    def broken(_: BranchRecord) -> None:
        raise ConnectionError("ClickHouse is down")

    with pytest.raises(PublishFailed, match="stays Committing") as failure:
        driver.commit(EPOCH, generation, winners, broken, Target().rollback)
    assert isinstance(failure.value.__cause__, ConnectionError)
    assert driver.xid(EPOCH).state is XidState.COMMITTING
    assert SinkAdmin(driver).last_committed() is None


def test_a_transient_publish_error_is_retried_until_it_succeeds(zk: KazooClient) -> None:
    driver, generation = new_coordinator(zk, callback_policy=FAST)
    driver.begin(EPOCH, generation)
    winners = prepared_branches(driver, EPOCH, generation, 1)
    calls = []

    def flaky(branch: BranchRecord) -> RetryLater | None:
        calls.append(branch.branch_id)
        return RetryLater("too many parts") if len(calls) < 3 else None

    assert driver.commit(EPOCH, generation, winners, flaky, Target().rollback).state \
        is XidState.COMMITTED
    assert len(calls) == 3


def test_a_non_retryable_publish_error_is_not_retried(zk: KazooClient) -> None:
    driver, generation = new_coordinator(zk, callback_policy=FAST)
    driver.begin(EPOCH, generation)
    winners = prepared_branches(driver, EPOCH, generation, 1)
    calls = []

    def wrong(branch: BranchRecord) -> None:
        calls.append(branch.branch_id)
        raise ValueError("schema changed")

    with pytest.raises(PublishFailed):
        driver.commit(EPOCH, generation, winners, wrong, Target().rollback)
    assert len(calls) == 1


def test_recovery_that_cannot_publish_reports_the_xid_and_raises(zk: KazooClient) -> None:
    crashed_commit(zk, "commit.after_decision", Target())
    successor, _ = new_coordinator(zk, callback_policy=FAST)

    def broken(_: BranchRecord) -> None:
        raise ValueError("in doubt: partition 202401")

    with pytest.raises(RecoveryIncomplete) as failure:
        successor.recover(broken, Target().rollback)
    (action,) = failure.value.report.actions
    assert (action.xid, action.action) == (f"{SINK}/{EPOCH}", "failed")
    assert "in doubt" in action.detail
    assert successor.xid(EPOCH).state is XidState.COMMITTING


def test_recovery_can_return_failures_in_the_report_instead_of_raising(
        zk: KazooClient) -> None:
    crashed_commit(zk, "commit.after_decision", Target())
    successor, _ = new_coordinator(zk, callback_policy=FAST)

    def broken(_: BranchRecord) -> None:
        raise ValueError("in doubt")

    report = successor.recover(broken, Target().rollback, raise_on_failure=False)
    assert not report.ok and len(report.failed) == 1


def test_recovery_only_reads_open_xids(zk: KazooClient) -> None:
    driver, generation = new_coordinator(zk)
    for epoch in range(3):
        driver.begin(epoch, generation)
        driver.commit(epoch, generation, [], Target().publish, Target().rollback)
    driver.begin(3, generation)
    open_states = [XidState.INITIALIZED, XidState.COMMITTING]
    assert [r.epoch for r in SinkAdmin(driver).xids(open_states)] == [3]
    assert zk.get_children(f"/txsink/sinks/{SINK}/open") == [f"{3:020d}"]


def test_recovery_that_read_an_abort_leaves_the_new_attempt_begun_before_its_lease(
        zk: KazooClient) -> None:
    """Recovery reads an ``Aborting`` xid, then takes its lease; meanwhile the writer that
    decided the abort finished it and began the epoch's next attempt. Under the lease the
    record is that new ``Initialized`` attempt: not the one recovery judged, so none of its
    branches is rolled back and it is not aborted."""
    first, old = new_coordinator(zk)
    first.begin(EPOCH, old)
    prepared_branches(first, EPOCH, old, 1, prefix="old")
    second, new = new_coordinator(zk)
    target = Target()
    second.abort(EPOCH, new, target.rollback)  # attempt 1: Aborting, then Aborted
    judged = replace(SinkAdmin(second).xids()[0], state=XidState.ABORTING)  # read then
    second.begin(EPOCH, new)  # attempt 2
    fresh = prepared_branches(second, EPOCH, new, 1, prefix="new")
    operator = Coordinator(zk, SINK)
    recovery = Recovery(operator.store, operator._completion, operator._abort_if_older,
                        lambda epoch: operator.publish_lease(epoch, new, 0.0), None)
    assert recovery._finish(judged, new, target.publish, target.rollback) is None
    assert target.rollback_calls[fresh[0]] == 0
    record = SinkAdmin(second).xids()[0]
    assert (record.state, record.attempt) == (XidState.INITIALIZED, 2)
