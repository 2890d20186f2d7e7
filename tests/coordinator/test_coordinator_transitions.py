"""Every operation from every xid state, allowed and refused, on both node stores (the
real ZooKeeper, and KeeperMap tables of the real modern ClickHouse).

Each xid under test has two prepared branches (the winners of a commit) and one branch
that registered but never prepared (a failed task attempt).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from coordinator import (
    BranchRecord,
    BranchState,
    Coordinator,
    InvalidTransition,
    RecordTooLarge,
    UnknownBranch,
    UnknownXid,
    WinnerNotPrepared,
    XidAborted,
    XidDecided,
    XidRecord,
    XidState,
)
from coordinator.plumbing.nodes import NodeStore
from coordinator.sink_admin import SinkAdmin
from tests.coordinator.test_coordinator_support import (
    SINK,
    Crash,
    Target,
    crash_at,
    new_coordinator,
    prepared_branches,
)

X = XidState
EPOCH = 1
LOSER = "p9-a0-failed00"


@pytest.fixture
def zk(nodes: Callable[[], NodeStore]) -> NodeStore:
    """The test's node store: ZooKeeper or KeeperMap (``nodes`` in conftest)."""
    return nodes()


@pytest.fixture
def driver(zk: NodeStore) -> tuple[Coordinator, int]:
    return new_coordinator(zk)


def bring_to(coord: Coordinator, generation: int, state: XidState) -> list[str]:
    """Put xid EPOCH into ``state``; returns the prepared branch ids (the winners)."""
    if state is X.UNKNOWN:
        return []
    coord.begin(EPOCH, generation)
    winners = prepared_branches(coord, EPOCH, generation, 2)
    coord.register_branch(EPOCH, LOSER, generation, owner={"staging": LOSER})
    target = Target()
    if state in (X.COMMITTING, X.COMMITTED):
        coord.on_step = crash_at("commit.after_decision") if state is X.COMMITTING else None
        try:
            coord.commit(EPOCH, generation, winners, target.publish, target.rollback)
        except Crash:
            pass
    if state in (X.ABORTING, X.ABORTED):
        coord.on_step = crash_at("abort.after_decision") if state is X.ABORTING else None
        try:
            coord.abort(EPOCH, generation, target.rollback)
        except Crash:
            pass
    coord.on_step = None
    assert coord.xid(EPOCH).state is state
    return winners


def state_of(coord: Coordinator) -> XidState:
    record = coord.xid(EPOCH)
    return record.state if record else X.UNKNOWN


ALL = list(XidState)


# -- the matrix: operation x state ---------------------------------------------------

BEGIN = {X.UNKNOWN: X.INITIALIZED, X.INITIALIZED: X.INITIALIZED, X.COMMITTING: X.COMMITTING,
         X.COMMITTED: X.COMMITTED, X.ABORTING: X.ABORTING, X.ABORTED: XidAborted}


@pytest.mark.parametrize("state", ALL, ids=lambda s: s.value)
def test_begin_by_the_same_generation_reports_the_state_and_changes_nothing_decided(
        driver: tuple[Coordinator, int], state: XidState) -> None:
    coord, generation = driver
    bring_to(coord, generation, state)
    expected = BEGIN[state]
    if isinstance(expected, XidState):
        assert coord.begin(EPOCH, generation) is expected
        assert state_of(coord) is expected
    else:
        with pytest.raises(expected):
            coord.begin(EPOCH, generation)
        assert state_of(coord) is state


REGISTER = {X.UNKNOWN: UnknownXid, X.INITIALIZED: None, X.COMMITTING: XidDecided,
            X.COMMITTED: XidDecided, X.ABORTING: XidDecided, X.ABORTED: XidDecided}


@pytest.mark.parametrize("state", ALL, ids=lambda s: s.value)
def test_register_branch_is_accepted_only_while_initialized(
        driver: tuple[Coordinator, int], state: XidState) -> None:
    coord, generation = driver
    bring_to(coord, generation, state)
    refusal = REGISTER[state]
    if refusal is None:
        coord.register_branch(EPOCH, "p5-a0-new00000", generation, owner={})
        assert "p5-a0-new00000" in {b.branch_id for b in coord.branches(EPOCH)}
    else:
        with pytest.raises(refusal):
            coord.register_branch(EPOCH, "p5-a0-new00000", generation, owner={})
        assert "p5-a0-new00000" not in {b.branch_id for b in coord.branches(EPOCH)}


PREPARE = {X.UNKNOWN: UnknownXid, X.INITIALIZED: None, X.COMMITTING: XidDecided,
           X.COMMITTED: XidDecided, X.ABORTING: XidDecided, X.ABORTED: XidDecided}


@pytest.mark.parametrize("state", ALL, ids=lambda s: s.value)
def test_prepare_branch_is_accepted_only_while_initialized(
        driver: tuple[Coordinator, int], state: XidState) -> None:
    coord, generation = driver
    bring_to(coord, generation, state)
    refusal = PREPARE[state]
    if refusal is None:
        coord.prepare_branch(EPOCH, LOSER, {"rows": 1})
        assert coord.branches(EPOCH)[-1].state is BranchState.PREPARED
    else:
        with pytest.raises(refusal):
            coord.prepare_branch(EPOCH, LOSER, {"rows": 1})


SELECT = {X.UNKNOWN: UnknownXid, X.INITIALIZED: None, X.COMMITTING: XidDecided,
          X.COMMITTED: XidDecided, X.ABORTING: XidAborted, X.ABORTED: XidAborted}


@pytest.mark.parametrize("state", ALL, ids=lambda s: s.value)
def test_select_is_accepted_only_while_initialized(
        driver: tuple[Coordinator, int], state: XidState) -> None:
    coord, generation = driver
    winners = bring_to(coord, generation, state) or ["p0-a0-x"]
    refusal = SELECT[state]
    if refusal is None:
        coord.select(EPOCH, generation, winners)
        assert coord.xid(EPOCH).selected == tuple(winners)
    else:
        with pytest.raises(refusal):
            coord.select(EPOCH, generation, winners)


COMMIT = {X.UNKNOWN: UnknownXid, X.INITIALIZED: X.COMMITTED, X.COMMITTING: X.COMMITTED,
          X.COMMITTED: X.COMMITTED, X.ABORTING: XidAborted, X.ABORTED: XidAborted}


@pytest.mark.parametrize("state", ALL, ids=lambda s: s.value)
def test_commit_from_each_state(driver: tuple[Coordinator, int], state: XidState) -> None:
    coord, generation = driver
    winners = bring_to(coord, generation, state) or ["p0-a0-x"]
    target = Target()
    expected = COMMIT[state]
    if isinstance(expected, XidState):
        assert coord.commit(EPOCH, generation, winners, target.publish,
                            target.rollback).state is expected
        published_now = set() if state is X.COMMITTED else set(winners)
        assert target.visible_in(EPOCH) == published_now
    else:
        with pytest.raises(expected):
            coord.commit(EPOCH, generation, winners, target.publish, target.rollback)
        assert not target.visible
        assert state_of(coord) is state


ABORT = {X.UNKNOWN: UnknownXid, X.INITIALIZED: X.ABORTED, X.COMMITTING: XidDecided,
         X.COMMITTED: XidDecided, X.ABORTING: X.ABORTED, X.ABORTED: X.ABORTED}


@pytest.mark.parametrize("state", ALL, ids=lambda s: s.value)
def test_abort_from_each_state(driver: tuple[Coordinator, int], state: XidState) -> None:
    coord, generation = driver
    bring_to(coord, generation, state)
    target = Target()
    expected = ABORT[state]
    if isinstance(expected, XidState):
        assert coord.abort(EPOCH, generation, target.rollback).state is expected
    else:
        with pytest.raises(expected):
            coord.abort(EPOCH, generation, target.rollback)
        assert state_of(coord) is state
    assert not target.visible


# -- commit ---------------------------------------------------------------------------

def test_commit_publishes_the_winners_and_rolls_back_every_other_branch(
        driver: tuple[Coordinator, int]) -> None:
    coord, generation = driver
    winners = bring_to(coord, generation, X.INITIALIZED)
    target = Target()
    coord.commit(EPOCH, generation, winners, target.publish, target.rollback)
    assert target.visible_in(EPOCH) == set(winners)
    assert set(target.rollback_calls) == {LOSER}


def test_commit_marks_winners_committed_and_other_branches_aborted(
        driver: tuple[Coordinator, int]) -> None:
    coord, generation = driver
    winners = bring_to(coord, generation, X.INITIALIZED)
    coord.commit(EPOCH, generation, winners, Target().publish, Target().rollback)
    states = {b.branch_id: b.state for b in coord.branches(EPOCH)}
    assert states == {winners[0]: BranchState.COMMITTED, winners[1]: BranchState.COMMITTED,
                      LOSER: BranchState.ABORTED}


def test_a_prepared_branch_that_did_not_win_is_rolled_back(
        driver: tuple[Coordinator, int]) -> None:
    coord, generation = driver
    winners = bring_to(coord, generation, X.INITIALIZED)
    target = Target()
    coord.commit(EPOCH, generation, winners[:1], target.publish, target.rollback)
    assert target.visible_in(EPOCH) == {winners[0]}
    assert set(target.rollback_calls) == {winners[1], LOSER}
    assert {b.branch_id: b.state for b in coord.branches(EPOCH)}[winners[1]] \
        is BranchState.ABORTED


def test_commit_advances_last_committed(driver: tuple[Coordinator, int]) -> None:
    coord, generation = driver
    winners = bring_to(coord, generation, X.INITIALIZED)
    assert SinkAdmin(coord).last_committed() is None
    coord.commit(EPOCH, generation, winners, Target().publish, Target().rollback)
    assert SinkAdmin(coord).last_committed() == EPOCH
    assert coord.is_committed(EPOCH)


def test_last_committed_never_goes_back_when_an_older_epoch_commits_later(
        driver: tuple[Coordinator, int]) -> None:
    coord, generation = driver
    for epoch in (5, 3):
        coord.begin(epoch, generation)
    target = Target()
    coord.commit(5, generation, [], target.publish, target.rollback)
    coord.commit(3, generation, [], target.publish, target.rollback)
    assert SinkAdmin(coord).last_committed() == 5


def test_commit_of_a_committing_xid_publishes_the_recorded_winners_not_the_new_ones(
        driver: tuple[Coordinator, int]) -> None:
    coord, generation = driver
    winners = bring_to(coord, generation, X.INITIALIZED)
    coord.on_step = crash_at("commit.after_decision")
    with pytest.raises(Crash):
        coord.commit(EPOCH, generation, winners[:1], Target().publish, Target().rollback)
    coord.on_step = None
    target = Target()
    record = coord.commit(EPOCH, generation, winners, target.publish, target.rollback)
    assert record.winners == (winners[0],)
    assert target.visible_in(EPOCH) == {winners[0]}


def test_commit_with_an_unprepared_winner_is_refused_before_deciding(
        driver: tuple[Coordinator, int]) -> None:
    coord, generation = driver
    winners = bring_to(coord, generation, X.INITIALIZED)
    target = Target()
    with pytest.raises(WinnerNotPrepared):
        coord.commit(EPOCH, generation, [*winners, LOSER], target.publish, target.rollback)
    assert state_of(coord) is X.INITIALIZED
    assert not target.publish_calls and not target.rollback_calls


def test_commit_with_an_unregistered_winner_is_refused(
        driver: tuple[Coordinator, int]) -> None:
    coord, generation = driver
    bring_to(coord, generation, X.INITIALIZED)
    with pytest.raises(UnknownBranch):
        coord.commit(EPOCH, generation, ["p7-a0-nobody00"], Target().publish,
                     Target().rollback)
    assert state_of(coord) is X.INITIALIZED


def test_commit_without_winners_commits_the_selected_branches(
        driver: tuple[Coordinator, int]) -> None:
    coord, generation = driver
    winners = bring_to(coord, generation, X.INITIALIZED)
    coord.select(EPOCH, generation, winners[:1])
    coord.select(EPOCH, generation, winners[1:])
    target = Target()
    record = coord.commit(EPOCH, generation, None, target.publish, target.rollback)
    assert record.winners == tuple(winners)
    assert target.visible_in(EPOCH) == set(winners)


def test_select_is_idempotent(driver: tuple[Coordinator, int]) -> None:
    coord, generation = driver
    winners = bring_to(coord, generation, X.INITIALIZED)
    coord.select(EPOCH, generation, winners)
    coord.select(EPOCH, generation, winners[::-1])
    assert coord.xid(EPOCH).selected == tuple(winners)


def test_select_refuses_a_branch_that_is_not_prepared(
        driver: tuple[Coordinator, int]) -> None:
    coord, generation = driver
    bring_to(coord, generation, X.INITIALIZED)
    with pytest.raises(WinnerNotPrepared):
        coord.select(EPOCH, generation, [LOSER])
    assert coord.xid(EPOCH).selected == ()


def test_commit_with_no_winner_commits_an_empty_epoch_and_rolls_back_all(
        driver: tuple[Coordinator, int]) -> None:
    coord, generation = driver
    bring_to(coord, generation, X.INITIALIZED)
    target = Target()
    assert coord.commit(EPOCH, generation, [], target.publish, target.rollback).state \
        is X.COMMITTED
    assert not target.visible
    assert len(target.rollback_calls) == 3


def test_commit_writes_the_caller_metrics_with_the_committed_record(
        driver: tuple[Coordinator, int]) -> None:
    coord, generation = driver
    winners = bring_to(coord, generation, X.INITIALIZED)
    seen: list[X] = []

    def metrics_of(final: XidRecord) -> dict[str, object]:
        seen.append(final.state)
        return {"rows": 20, "committed": final.updated}

    final = coord.commit(EPOCH, generation, winners, Target().publish, Target().rollback,
                         metrics_of=metrics_of)
    assert seen == [X.COMMITTED]
    assert coord.xid(EPOCH).metrics == final.metrics == {"rows": 20, "committed": final.updated}


def test_history_lists_every_state_the_xid_entered(driver: tuple[Coordinator, int]) -> None:
    coord, generation = driver
    winners = bring_to(coord, generation, X.INITIALIZED)
    coord.commit(EPOCH, generation, winners, Target().publish, Target().rollback)
    record = coord.xid(EPOCH)
    assert [h["state"] for h in record.history] == ["Initialized", "Committing", "Committed"]
    assert record.decided_at is not None


# -- branches -------------------------------------------------------------------------

def test_register_branch_is_idempotent_for_the_same_branch(
        driver: tuple[Coordinator, int]) -> None:
    coord, generation = driver
    coord.begin(EPOCH, generation)
    coord.register_branch(EPOCH, "p0-a0-aaaa0000", generation, owner={"staging": "s"})
    coord.register_branch(EPOCH, "p0-a0-aaaa0000", generation, owner={"staging": "s"})
    assert [b.branch_id for b in coord.branches(EPOCH)] == ["p0-a0-aaaa0000"]


def test_register_records_the_owner_so_an_unprepared_branch_can_be_rolled_back(
        driver: tuple[Coordinator, int]) -> None:
    coord, generation = driver
    coord.begin(EPOCH, generation)
    coord.register_branch(EPOCH, "p0-a0-aaaa0000", generation, owner={"staging": "stg_1"})
    target = Target()
    rolled_back = []
    coord.abort(EPOCH, generation, lambda b: rolled_back.append(b.owner["staging"]))
    assert rolled_back == ["stg_1"] and not target.visible


def test_prepare_branch_is_idempotent_for_the_same_manifest(
        driver: tuple[Coordinator, int]) -> None:
    coord, generation = driver
    coord.begin(EPOCH, generation)
    coord.register_branch(EPOCH, "p0-a0-aaaa0000", generation, owner={})
    coord.prepare_branch(EPOCH, "p0-a0-aaaa0000", {"rows": 3, "parts": ("a", "b")})
    coord.prepare_branch(EPOCH, "p0-a0-aaaa0000", {"parts": ["a", "b"], "rows": 3})
    assert coord.branches(EPOCH)[0].manifest == {"rows": 3, "parts": ["a", "b"]}


def test_prepare_branch_again_with_another_manifest_is_refused(
        driver: tuple[Coordinator, int]) -> None:
    coord, generation = driver
    coord.begin(EPOCH, generation)
    coord.register_branch(EPOCH, "p0-a0-aaaa0000", generation, owner={})
    coord.prepare_branch(EPOCH, "p0-a0-aaaa0000", {"rows": 3})
    with pytest.raises(InvalidTransition, match="another manifest"):
        coord.prepare_branch(EPOCH, "p0-a0-aaaa0000", {"rows": 4})


def test_prepare_of_an_unregistered_branch_is_refused(
        driver: tuple[Coordinator, int]) -> None:
    coord, generation = driver
    coord.begin(EPOCH, generation)
    with pytest.raises(UnknownBranch):
        coord.prepare_branch(EPOCH, "p0-a0-nobody00", {"rows": 3})


def test_a_manifest_too_large_for_a_znode_is_refused_at_prepare(
        driver: tuple[Coordinator, int]) -> None:
    coord, generation = driver
    coord.begin(EPOCH, generation)
    coord.register_branch(EPOCH, "p0-a0-aaaa0000", generation, owner={})
    with pytest.raises(RecordTooLarge, match="bytes"):
        coord.prepare_branch(EPOCH, "p0-a0-aaaa0000", {"parts": ["x" * 1000] * 1000})
    assert coord.branches(EPOCH)[0].state is BranchState.INITIALIZED


# -- abort and attempts ---------------------------------------------------------------

def test_abort_rolls_back_every_branch_and_publishes_nothing(
        driver: tuple[Coordinator, int]) -> None:
    coord, generation = driver
    bring_to(coord, generation, X.INITIALIZED)
    target = Target()
    coord.abort(EPOCH, generation, target.rollback)
    assert len(target.rollback_calls) == 3 and not target.visible
    assert {b.state for b in coord.branches(EPOCH)} == {BranchState.ABORTED}


def test_begin_by_a_newer_generation_adopts_an_initialized_xid(zk: NodeStore) -> None:
    old, old_generation = new_coordinator(zk)
    old.begin(EPOCH, old_generation)
    new, new_generation = new_coordinator(zk)
    assert new.begin(EPOCH, new_generation) is X.INITIALIZED
    record = new.xid(EPOCH)
    assert (record.generation, record.attempt) == (new_generation, 1)
    assert record.history[-1]["event"] == "adopted"


def test_begin_by_a_newer_generation_starts_a_new_attempt_of_an_aborted_xid(
        zk: NodeStore) -> None:
    old, old_generation = new_coordinator(zk)
    bring_to(old, old_generation, X.ABORTED)
    new, new_generation = new_coordinator(zk)
    assert new.begin(EPOCH, new_generation) is X.INITIALIZED
    record = new.xid(EPOCH)
    assert (record.state, record.attempt, record.generation) == (
        X.INITIALIZED, 2, new_generation)


def test_a_branch_of_an_aborted_attempt_can_never_win(zk: NodeStore) -> None:
    old, old_generation = new_coordinator(zk)
    old_winners = bring_to(old, old_generation, X.ABORTED)
    new, new_generation = new_coordinator(zk)
    new.begin(EPOCH, new_generation)
    target = Target()
    with pytest.raises(WinnerNotPrepared, match="attempt 1"):
        new.commit(EPOCH, new_generation, old_winners, target.publish, target.rollback)
    assert not target.visible


def test_a_branch_of_an_aborted_attempt_cannot_register_again(zk: NodeStore) -> None:
    old, old_generation = new_coordinator(zk)
    old_winners = bring_to(old, old_generation, X.ABORTED)
    new, new_generation = new_coordinator(zk)
    new.begin(EPOCH, new_generation)
    with pytest.raises(XidDecided, match="aborted attempt"):
        new.register_branch(EPOCH, old_winners[0], new_generation, owner={})


def test_a_new_attempt_commits_only_its_own_branches(zk: NodeStore) -> None:
    old, old_generation = new_coordinator(zk)
    bring_to(old, old_generation, X.ABORTED)
    new, new_generation = new_coordinator(zk)
    new.begin(EPOCH, new_generation)
    fresh = prepared_branches(new, EPOCH, new_generation, 1, prefix="q")
    target = Target()
    new.commit(EPOCH, new_generation, fresh, target.publish, target.rollback)
    assert target.visible_in(EPOCH) == set(fresh)
    assert not target.rollback_calls  # the old attempt's branches were rolled back already


def test_select_and_metrics_keep_the_state_and_add_no_history(
        driver: tuple[Coordinator, int]) -> None:
    coord, generation = driver
    winners = bring_to(coord, generation, X.INITIALIZED)
    before = coord.xid(EPOCH)
    coord.select(EPOCH, generation, winners[:1])
    coord.record_metrics(EPOCH, {"rows": 3})
    after = coord.xid(EPOCH)
    assert after.state is X.INITIALIZED and after.history == before.history
    assert after.selected == tuple(winners[:1]) and after.metrics == {"rows": 3}


def test_reset_marks_an_epoch_committed_with_the_reset_move(zk: NodeStore) -> None:
    """``txsink reset --committed-through`` writes its marker xid through the table's
    ``Unknown → Committed`` move, replacing an aborted xid of that epoch."""
    coord, generation = new_coordinator(zk)
    bring_to(coord, generation, X.ABORTED)
    outcome = SinkAdmin(coord).reset_stream(committed_through=EPOCH, by="test")
    marker = coord.xid(EPOCH)
    assert marker.state is X.COMMITTED and marker.generation == outcome.generation
    assert [(h["state"], h.get("event")) for h in marker.history] == [("Committed", "reset")]
    assert coord.branches(EPOCH) == [] and coord.is_committed(EPOCH)
    assert SinkAdmin(coord).last_committed() == EPOCH


def task_prepared(zk: NodeStore, generation: int, branch_id: str) -> BranchRecord:
    """A branch registered and prepared by a task's own coordinator: its record as
    written, what the task's commit message hands over."""
    task = Coordinator(zk, SINK)
    task.begin(EPOCH, generation)
    task.register_branch(EPOCH, branch_id, generation, owner={"staging": branch_id})
    written = task.prepare_branch(EPOCH, branch_id, {"rows": 3, "staging": branch_id})
    assert written is not None and written.state is BranchState.PREPARED
    return written


def test_a_winner_record_handed_over_by_its_task_is_taken_without_a_read(
        driver: tuple[Coordinator, int], zk: NodeStore) -> None:
    coord, generation = driver
    coord.begin(EPOCH, generation)
    written = task_prepared(zk, generation, "p0-a0-00010000")
    marked = replace(written, manifest={"rows": 99, "staging": written.branch_id})
    (taken,) = coord.winner_records(EPOCH, [written.branch_id], handed=[marked])
    assert taken.manifest == marked.manifest  # not what the store holds: not read


def test_a_record_handed_over_from_another_attempt_of_the_xid_is_read_instead(
        driver: tuple[Coordinator, int], zk: NodeStore) -> None:
    coord, generation = driver
    coord.begin(EPOCH, generation)
    written = task_prepared(zk, generation, "p0-a0-00010000")
    stale = replace(written, attempt=written.attempt + 1, manifest={"rows": 99})
    (taken,) = coord.winner_records(EPOCH, [written.branch_id], handed=[stale])
    assert taken.manifest == written.manifest


# -- a stream task's begin: the creation deferred to its first registration ----------

def task(zk: NodeStore) -> Coordinator:
    return Coordinator(zk, SINK)


def test_a_deferred_begin_creates_the_xid_with_its_first_registration(
        driver: tuple[Coordinator, int], zk: NodeStore) -> None:
    coord, generation = driver
    writer = task(zk)
    assert writer.begin(EPOCH, generation, defer=True) is X.INITIALIZED
    assert coord.xid(EPOCH) is None  # nothing sent yet
    writer.register_branch(EPOCH, "p0-a0-00010000", generation, owner={"staging": "s"})
    assert coord.xid(EPOCH).state is X.INITIALIZED
    assert [b.branch_id for b in coord.branches(EPOCH)] == ["p0-a0-00010000"]
    writer.prepare_branch(EPOCH, "p0-a0-00010000", {"rows": 3, "staging": "s"})
    assert coord.branches(EPOCH)[0].state is BranchState.PREPARED


def test_a_deferred_creation_another_writer_made_first_registers_into_its_xid(
        driver: tuple[Coordinator, int], zk: NodeStore) -> None:
    coord, generation = driver
    late, early = task(zk), task(zk)
    late.begin(EPOCH, generation, defer=True)
    early.begin(EPOCH, generation)
    early.register_branch(EPOCH, "p1-a0-00010000", generation, owner={"staging": "s1"})
    late.register_branch(EPOCH, "p0-a0-00010000", generation, owner={"staging": "s0"})
    assert sorted(b.branch_id for b in coord.branches(EPOCH)) == [
        "p0-a0-00010000", "p1-a0-00010000"]


def test_a_deferred_creation_of_a_xid_decided_meanwhile_is_refused(
        driver: tuple[Coordinator, int], zk: NodeStore) -> None:
    coord, generation = driver
    writer = task(zk)
    writer.begin(EPOCH, generation, defer=True)
    coord.begin(EPOCH, generation)
    coord.abort(EPOCH, generation, Target().rollback)
    with pytest.raises(XidAborted):
        writer.register_branch(EPOCH, "p0-a0-00010000", generation, owner={"staging": "s"})
    assert coord.branches(EPOCH) == []


def test_a_deferred_creation_no_registration_took_is_sent_before_it_is_handed_over(
        driver: tuple[Coordinator, int], zk: NodeStore) -> None:
    coord, generation = driver
    writer = task(zk)
    writer.begin(EPOCH, generation, defer=True)
    assert writer.begun(EPOCH).state is X.INITIALIZED
    assert coord.xid(EPOCH).state is X.INITIALIZED


def test_a_last_committed_handed_over_is_checked_and_read_again_once_it_moved(
        driver: tuple[Coordinator, int], zk: NodeStore) -> None:
    coord, generation = driver
    handed = coord.last_committed()
    bring_to(coord, generation, X.COMMITTED)  # moves it to EPOCH
    writer = task(zk)
    # EPOCH committed and its record is there: the stale value must not create it anew
    assert writer.begin(EPOCH, generation, new=True, last_committed=handed) is X.COMMITTED
    assert writer.begin(EPOCH + 1, generation, new=True, last_committed=handed) is \
        X.INITIALIZED
