"""Abandoned writers: an open xid whose writer's session is gone is rolled back by
recovery that asks for it (``txsink recover``/``gc``), a live writer's xid never.

A "writer" here is its own ZooKeeper session (a second kazoo client); killing the writer
is closing that session, which deletes its ephemeral liveness holder exactly as a
SIGKILLed process's expired session would (the Spark-level kill is in
``tests/ops/test_abandoned_writers.py``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from coordinator import BranchState, Coordinator, WinnerNotPrepared, XidAborted, XidState
from coordinator.protocol.liveness import ALIVE, SUPERSEDED, UNWATCHED, UNWATCHED_OLD, WRITER_GONE
from coordinator.sink_admin import SinkAdmin
from tests.conftest import kazoo_client
from tests.coordinator.test_coordinator_support import (
    SINK,
    Target,
    new_coordinator,
    prepared_branches,
)

EPOCH = 3


@pytest.fixture
def writer_session(zk_hosts: str, zk_chroot: str) -> Iterator[KazooClient]:
    """A second ZooKeeper session: the writer's, which a test may end."""
    client = kazoo_client(zk_hosts + zk_chroot)
    client.start(timeout=15)
    yield client
    client.stop()
    client.close()


def end(session: KazooClient) -> None:
    """The writer dies: its session ends and its ephemeral nodes with it."""
    session.stop()
    session.close()


def watched_writer(session: KazooClient, branches: int = 2) -> tuple[Coordinator, int]:
    writer, generation = new_coordinator(session)
    writer.begin(EPOCH, generation, hold="batch driver")
    prepared_branches(writer, EPOCH, generation, branches)
    writer.register_branch(EPOCH, "p9-a0-unprepared", generation,
                           owner={"staging": "p9-a0-unprepared"})
    return writer, generation


def operator(zk: KazooClient) -> Coordinator:
    return Coordinator(zk, SINK, role="txsink operator")


def test_xid_whose_writer_session_ended_before_the_decision_is_rolled_back(
        zk: KazooClient, writer_session: KazooClient) -> None:
    watched_writer(writer_session)
    end(writer_session)
    target = Target()
    report = operator(zk).recover(target.publish, target.rollback, abandoned=True)
    record = operator(zk).xid(EPOCH)
    assert record is not None and record.state is XidState.ABORTED
    assert [a.action for a in report.actions] == ["rolled_back"]
    assert "session ended" in report.actions[0].detail
    assert set(target.rollback_calls) == {b.branch_id for b in operator(zk).branches(EPOCH)}
    assert all(b.state is BranchState.ABORTED for b in operator(zk).branches(EPOCH))


def test_xid_of_a_live_writer_session_is_left_alone(
        zk: KazooClient, writer_session: KazooClient) -> None:
    writer, generation = watched_writer(writer_session)
    target = Target()
    report = operator(zk).recover(target.publish, target.rollback, abandoned=True)
    assert report.actions == [] and not target.rollback_calls
    [verdict] = SinkAdmin(operator(zk)).verdicts()
    assert verdict.reason == ALIVE and not verdict.abandoned
    winners = [b.branch_id for b in writer.branches(EPOCH) if b.state is BranchState.PREPARED]
    writer.commit(EPOCH, generation, winners, target.publish, target.rollback)
    assert operator(zk).xid(EPOCH).state is XidState.COMMITTED


def test_writer_whose_xid_was_rolled_back_cannot_decide_it(
        zk: KazooClient, writer_session: KazooClient) -> None:
    """The rollback fences the xid: a writer misjudged gone (its session expired while
    it lived) fails at its decision instead of publishing."""
    writer, generation = watched_writer(writer_session)
    winners = [b.branch_id for b in writer.branches(EPOCH) if b.state is BranchState.PREPARED]
    writer.release(EPOCH)  # as if its session had expired
    target = Target()
    operator(zk).recover(target.publish, target.rollback, abandoned=True)
    with pytest.raises((XidAborted, WinnerNotPrepared)):
        writer.commit(EPOCH, generation, winners, target.publish, target.rollback)
    assert not target.publish_calls


def test_a_keeper_that_joined_keeps_the_xid_alive_after_the_beginner_ends(
        zk: KazooClient, writer_session: KazooClient) -> None:
    watched_writer(writer_session)
    keeper = operator(zk)
    assert keeper.hold(EPOCH, "batch keeper")
    end(writer_session)
    [verdict] = SinkAdmin(operator(zk)).verdicts()
    assert verdict.reason == ALIVE


def test_nobody_joins_an_xid_whose_holders_are_all_gone(
        zk: KazooClient, writer_session: KazooClient) -> None:
    """Joining then would hide that the writer is gone."""
    watched_writer(writer_session)
    end(writer_session)
    assert not operator(zk).hold(EPOCH, "batch keeper")
    assert SinkAdmin(operator(zk)).verdicts()[0].reason == WRITER_GONE


def test_unwatched_xid_is_left_unless_an_age_is_given(zk: KazooClient) -> None:
    writer, generation = new_coordinator(zk)
    writer.begin(EPOCH, generation)  # a streaming task's begin: no holder
    target = Target()
    assert operator(zk).recover(target.publish, target.rollback, abandoned=True).actions == []
    assert SinkAdmin(operator(zk)).verdicts()[0].reason == UNWATCHED
    assert SinkAdmin(operator(zk)).verdicts(unwatched_after=0.0)[0].reason == UNWATCHED_OLD
    operator(zk).recover(target.publish, target.rollback, abandoned=True, unwatched_after=0.0)
    assert operator(zk).xid(EPOCH).state is XidState.ABORTED


def test_unwatched_xid_younger_than_the_age_is_left(zk: KazooClient) -> None:
    writer, generation = new_coordinator(zk)
    writer.begin(EPOCH, generation)
    target = Target()
    operator(zk).recover(target.publish, target.rollback, abandoned=True,
                         unwatched_after=3600.0)
    assert operator(zk).xid(EPOCH).state is XidState.INITIALIZED


def test_xid_of_a_superseded_generation_is_abandoned(
        zk: KazooClient, writer_session: KazooClient) -> None:
    watched_writer(writer_session)  # alive, but a newer writer fenced the sink
    new_coordinator(zk)
    assert SinkAdmin(operator(zk)).verdicts()[0].reason == SUPERSEDED


def test_an_adopted_xid_is_not_watched_by_its_old_holders(
        zk: KazooClient, writer_session: KazooClient) -> None:
    """A streaming replay adopts the dead run's xid: the old run's holders say nothing
    of the adopter, so the xid is unwatched from then on."""
    watched_writer(writer_session)
    adopter, generation = new_coordinator(zk)
    adopter.begin(EPOCH, generation)
    end(writer_session)
    record = operator(zk).xid(EPOCH)
    assert record is not None and record.liveness is None
    assert SinkAdmin(operator(zk)).verdicts()[0].reason == UNWATCHED


def test_an_xid_changed_after_it_was_judged_abandoned_is_not_rolled_back(
        zk: KazooClient, writer_session: KazooClient) -> None:
    """Interleaving: recovery judges the xid abandoned, then a newer writer adopts it
    before the abort's compare-and-set: the abort finds another version and leaves it."""
    watched_writer(writer_session)
    end(writer_session)
    judged = operator(zk).xid(EPOCH)
    adopter, generation = new_coordinator(zk)
    adopter.begin(EPOCH, generation)
    record, decided = operator(zk)._steps.decide_abort(EPOCH, generation, None,
                                                       judged.version)
    assert not decided and record.state is XidState.INITIALIZED


def test_release_ends_the_holding(zk: KazooClient, writer_session: KazooClient) -> None:
    writer, _ = watched_writer(writer_session)
    writer.release(EPOCH)
    writer.release(EPOCH)  # idempotent
    assert SinkAdmin(operator(zk)).verdicts()[0].reason == WRITER_GONE
