"""Random interleavings of the whole protocol on both node stores (the real ZooKeeper, and
KeeperMap tables of the real modern ClickHouse).

A hypothesis state machine drives begin / register / prepare / select+commit / abort,
each possibly crashing at any step (``on_step`` raising) or with a publish that fails,
plus recovery and new generations (the previous writer lives on as a zombie that keeps
trying), over three xids. After every step it reads the records back and checks:

- a decided xid never changes its decision within an attempt, and an attempt that was
  decided "commit" is never followed by another attempt;
- the target shows exactly the winners of a ``Committed`` xid (publish is idempotent per
  branch, like the real one, so "exactly once" = "visible iff winner"), at most the
  winners of a ``Committing`` one, and nothing of any other xid;
- no branch is both published and rolled back;
- ``last_committed`` never goes back and equals the highest committed epoch.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from coordinator import (
    BranchRecord,
    BranchState,
    CallbackPolicy,
    Coordinator,
    CoordinatorError,
    Fenced,
    InvalidTransition,
    PublishFailed,
    RecoveryIncomplete,
    XidAborted,
    XidDecided,
    XidState,
)
from coordinator.plumbing.nodes import NodeStore
from coordinator.sink_admin import SinkAdmin
from tests.coordinator.test_coordinator_support import Crash, Target, crash_at

EPOCHS = (0, 1, 2)
COMMIT_STEPS = ("commit.after_decision", "commit.after_branch_published",
                "commit.after_publish", "commit.after_committed")
ABORT_STEPS = ("abort.after_decision", "abort.after_rollback")
ONCE = CallbackPolicy(attempts=1)
# Skewed choices: mostly the current writer, mostly no crash, mostly a working publish,
# so that a short run still reaches commits with published winners.
MOSTLY_NO = st.sampled_from([False, False, False, True])
MOSTLY_YES = st.sampled_from([True, True, True, False])


def crash_or_none(steps: tuple[str, ...]) -> st.SearchStrategy[str | None]:
    return st.one_of(st.none(), st.sampled_from(steps))


COMMITTED_SIDE = (XidState.COMMITTING, XidState.COMMITTED)


class ProtocolMachine(RuleBasedStateMachine):
    open_store: Callable[[], NodeStore]  # set by the test: a started store of either kind

    def __init__(self) -> None:
        super().__init__()
        self.client = type(self).open_store()
        self.root = f"/tests/stateful-{uuid.uuid4().hex[:10]}"
        self.target = Target()
        self.writers: list[tuple[Coordinator, int]] = []  # last one is current
        self.new_generation()
        self.branches: dict[int, list[str]] = {e: [] for e in EPOCHS}
        self.prepared: dict[int, list[str]] = {e: [] for e in EPOCHS}
        self.decisions: dict[tuple[int, int], tuple[str, tuple[str, ...]]] = {}
        self.last_seen: int | None = None

    def teardown(self) -> None:
        self.client.delete(self.root, recursive=True)
        self.client.stop()
        self.client.close()

    # -- who acts ---------------------------------------------------------------------

    def writer(self, zombie: bool) -> tuple[Coordinator, int]:
        return self.writers[0] if zombie and len(self.writers) > 1 else self.writers[-1]

    def failing_publish(self, _: BranchRecord) -> None:
        raise ValueError("target refuses the publish")

    # -- rules ------------------------------------------------------------------------

    @rule()
    def new_generation(self) -> None:
        coord = Coordinator(self.client, "s", root=self.root, callback_policy=ONCE)
        self.writers.append((coord, coord.fence()))
        del self.writers[1:-2]  # keep the first zombie and the last two writers

    @rule(epoch=st.sampled_from(EPOCHS), zombie=MOSTLY_NO)
    def begin(self, epoch: int, zombie: bool) -> None:
        coord, generation = self.writer(zombie)
        try:
            coord.begin(epoch, generation)
        except (XidAborted, Fenced):
            pass

    @rule(epoch=st.sampled_from(EPOCHS), zombie=MOSTLY_NO, prepare=MOSTLY_YES)
    def task(self, epoch: int, zombie: bool, prepare: bool) -> None:
        """A task attempt: begin, register, and (unless it dies first) prepare."""
        coord = Coordinator(self.client, "s", root=self.root)
        _, generation = self.writer(zombie)
        branch_id = f"p{len(self.branches[epoch])}-a0-{uuid.uuid4().hex[:8]}"
        try:
            if coord.begin(epoch, generation) is not XidState.INITIALIZED:
                return
            coord.register_branch(epoch, branch_id, generation, owner={"staging": branch_id})
            self.branches[epoch].append(branch_id)
            if prepare:
                self.prepare_branch(coord, epoch, branch_id)
        except (XidDecided, Fenced):
            pass

    @precondition(lambda self: any(self.branches.values()))
    @rule(data=st.data())
    def late_prepare(self, data: st.DataObject) -> None:
        """A slow task prepares its branch, maybe after the decision (a zombie)."""
        epoch = data.draw(st.sampled_from([e for e in EPOCHS if self.branches[e]]))
        branch_id = data.draw(st.sampled_from(self.branches[epoch]))
        try:
            self.prepare_branch(self.writers[-1][0], epoch, branch_id)
        except XidDecided:
            pass

    def prepare_branch(self, coord: Coordinator, epoch: int, branch_id: str) -> None:
        coord.prepare_branch(epoch, branch_id, {"rows": 1, "staging": branch_id})
        if branch_id not in self.prepared[epoch]:
            self.prepared[epoch].append(branch_id)

    @rule(data=st.data(), epoch=st.sampled_from(EPOCHS), zombie=MOSTLY_NO,
          crash=crash_or_none(COMMIT_STEPS), fail_publish=MOSTLY_NO,
          via_select=st.booleans(), any_branch=MOSTLY_NO)
    def commit(self, data: st.DataObject, epoch: int, zombie: bool, crash: str | None,
               fail_publish: bool, via_select: bool, any_branch: bool) -> None:
        """The driver decides, with winners among the prepared branches (or, with
        ``any_branch``, among all registered ones, which must be refused if unprepared)."""
        coord, generation = self.writer(zombie)
        pool = self.branches[epoch] if any_branch else self.prepared[epoch]
        winners = data.draw(st.lists(st.sampled_from(pool), unique=True, min_size=1)
                            if pool else st.just([]))
        publish = self.failing_publish if fail_publish else self.target.publish
        coord.on_step = crash_at(crash) if crash else None
        try:
            if via_select:
                coord.select(epoch, generation, winners)
            coord.commit(epoch, generation, None if via_select else winners, publish,
                         self.target.rollback)
        except (Crash, PublishFailed, XidDecided, Fenced, InvalidTransition):
            pass
        finally:
            coord.on_step = None

    @rule(epoch=st.sampled_from(EPOCHS), zombie=MOSTLY_NO, crash=crash_or_none(ABORT_STEPS))
    def abort(self, epoch: int, zombie: bool, crash: str | None) -> None:
        coord, generation = self.writer(zombie)
        coord.on_step = crash_at(crash) if crash else None
        try:
            coord.abort(epoch, generation, self.target.rollback)
        except (Crash, XidDecided, Fenced, InvalidTransition):
            pass
        finally:
            coord.on_step = None

    @rule(crash=crash_or_none(COMMIT_STEPS + ABORT_STEPS), fail_publish=MOSTLY_NO)
    def recover(self, crash: str | None, fail_publish: bool) -> None:
        coord, _ = self.writers[-1]
        publish = self.failing_publish if fail_publish else self.target.publish
        coord.on_step = crash_at(crash) if crash else None
        try:
            coord.recover(publish, self.target.rollback)
        except (Crash, RecoveryIncomplete):
            pass
        finally:
            coord.on_step = None

    # -- invariants -------------------------------------------------------------------

    @invariant()
    def decisions_never_change(self) -> None:
        coord, _ = self.writers[-1]
        for record in SinkAdmin(coord).xids():
            if record.state in COMMITTED_SIDE:
                decision = ("commit", record.winners)
            elif record.state in (XidState.ABORTING, XidState.ABORTED):
                decision = ("abort", ())
            else:
                decision = None
            key = (record.epoch, record.attempt)
            if decision is not None:
                assert self.decisions.setdefault(key, decision) == decision, record
            for (epoch, attempt), earlier in self.decisions.items():
                if epoch == record.epoch and attempt < record.attempt:
                    assert earlier[0] == "abort", f"committed attempt {attempt} was retried"

    @invariant()
    def exactly_the_winners_of_committed_xids_are_visible(self) -> None:
        coord, _ = self.writers[-1]
        records = {r.epoch: r for r in SinkAdmin(coord).xids()}
        for epoch in EPOCHS:
            visible = self.target.visible_in(epoch)
            record = records.get(epoch)
            if record is not None and record.state is XidState.COMMITTED:
                assert visible == set(record.winners), (record, visible)
                states = {b.branch_id: b.state for b in coord.branches(epoch)}
                assert all(states[w] is BranchState.COMMITTED for w in record.winners)
            elif record is not None and record.state is XidState.COMMITTING:
                assert visible <= set(record.winners), (record, visible)
            else:
                assert not visible, (record, visible)

    @invariant()
    def no_branch_is_both_published_and_rolled_back(self) -> None:
        assert not set(self.target.publish_calls) & set(self.target.rollback_calls)

    @invariant()
    def last_committed_only_moves_forward(self) -> None:
        coord, _ = self.writers[-1]
        last = SinkAdmin(coord).last_committed()
        committed = [r.epoch for r in SinkAdmin(coord).xids([XidState.COMMITTED])]
        assert last == (max(committed) if committed else None)
        if self.last_seen is not None:
            assert last is not None and last >= self.last_seen
        self.last_seen = last


#: Examples per store. The coordinator's code is the same over both, and a KeeperMap step
#: is a ClickHouse round trip (several times a ZooKeeper one): the store's own semantics
#: (versions, multi-ops, ephemeral expiry) have their tests over both stores
#: (tests/coordinator/: test_coordinator_transitions.py, _race.py, _liveness.py,
#: test_keepermap_store.py).
EXAMPLES = {"zookeeper": 30, "keepermap": 12}


def test_random_interleavings_keep_every_invariant(nodes: Callable[[], NodeStore],
                                                    store_kind: str) -> None:
    ProtocolMachine.open_store = staticmethod(nodes)  # type: ignore[assignment]
    run_state_machine_as_test(ProtocolMachine, settings=settings(
        max_examples=EXAMPLES[store_kind], stateful_step_count=30, deadline=None, derandomize=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))


def test_a_coordinator_error_is_never_a_crash() -> None:
    """The machine above tells refusals from crashes by type: keep them apart."""
    assert not issubclass(Crash, CoordinatorError)
