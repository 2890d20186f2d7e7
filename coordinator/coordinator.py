"""The writers' front of one sink's coordinator: xids, branches, decisions, fencing.

What the Spark side calls to write (``txsink/core``, ``txsink/spark``), and what an
operator's ``recover`` or ``resolve`` calls when it finishes an xid as a writer would.
Operators' reads and repairs (xid lists, verdicts, lost records, the open index, stream
reset, pruning) are :class:`~coordinator.sink_admin.SinkAdmin`'s, over the same store.

Contract (what a caller may assume; every method may be called again after a crash or a
lost reply, from this process or another):

- ``fence()`` makes the caller the sink's writer and returns its generation; every
  decision and branch registration made with an older generation fails with
  :class:`Fenced`, atomically with the write it attempted.
- ``begin`` is idempotent and says what the caller may do: ``Initialized`` → write;
  ``Committed`` → the epoch is done, write nothing; ``Committing``/``Aborting`` → finish
  it first (``commit`` or ``recover``). An ``Aborted`` xid begun by a *newer* generation
  than the one that owned the aborted attempt starts a new attempt.
- ``register_branch`` and ``prepare_branch`` are idempotent for the same branch and are
  refused with :class:`XidDecided` once the xid is decided: a zombie task cannot add to
  a decided xid, because the registration checks the xid's version in the same multi-op.
- ``commit`` writes ``Committing`` with the winners in ONE compare-and-set that also
  checks the generation, before any publish. From then on the xid is never rolled back:
  publish failures leave it ``Committing`` for ``commit`` or ``recover`` to finish, and
  the publish callback must be idempotent. Of concurrent deciders exactly one wins.
- ``abort`` of an undecided xid rolls back every branch; of a decided one it refuses.
- After the decision, an xid is finished by one actor at a time: the holder of its
  publish lease (``publish_lease.py``). ``commit`` of an xid another live actor is
  finishing waits for it (``lease_wait`` seconds) and returns its result; ``recover``
  leaves such an xid to its holder and reports it ``in_progress``. Ledger writes and the
  final write of a decided xid pass only while the caller's lease lives.

Usage::

    coord = Coordinator(kazoo_client, "orders-stream")
    generation = coord.fence()
    coord.recover(publish=publish, rollback=rollback)     # what a dead driver left
    if coord.begin(epoch, generation) is XidState.INITIALIZED:
        coord.register_branch(epoch, "p0-a0-1f2e3d4c", generation, owner={"staging": s})
        coord.prepare_branch(epoch, "p0-a0-1f2e3d4c", manifest)
        coord.commit(epoch, generation, ["p0-a0-1f2e3d4c"], publish, rollback)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.retry import KazooRetry

from coordinator.errors import (
    PublishInProgress,
    PublishLeaseLost,
    RecoveryIncomplete,
    SinkTakenOver,
)
from coordinator.formats import steps
from coordinator.formats.records import BranchRecord, StreamRecord, XidRecord
from coordinator.formats.states import XidState
from coordinator.plumbing.nodes import NodeStore
from coordinator.plumbing.paths import DEFAULT_ROOT, SinkLayout
from coordinator.plumbing.store import SinkStore, default_retry
from coordinator.protocol.branch_ledger import Ledger
from coordinator.protocol.callbacks import BranchCallback, CallbackPolicy, GroupCallback
from coordinator.protocol.completion import Completion, PublishGroups
from coordinator.protocol.epochs import EpochCounter, LastCommitted, TxnVersion
from coordinator.protocol.fencing import Generation
from coordinator.protocol.liveness import Liveness, Verdict, holder_identity, judge
from coordinator.protocol.publish_lease import PublishLease, actor_identity
from coordinator.protocol.recovery import ROLLED_FORWARD, Recovery, RecoveryReport
from coordinator.protocol.stream import StreamOwnership
from coordinator.protocol.transitions import Transitions
from coordinator.upkeep.retention import PASS_XIDS, Fold, Pass, Retention

StepHook = Callable[[str], None]
LEASE_RETAKES = 3  # a commit re-takes a lease lost to session expiry this many times

log = logging.getLogger(__name__)


class Coordinator:
    """Two-phase-commit coordinator for one sink, backed by a node store: a kazoo client
    (ZooKeeper or Keeper) or ``coordinator.plumbing.keepermap.KeeperMapNodes``.

    ``on_step(name)`` is called at every crash point of commit and abort
    (``commit.after_decision``, ``commit.after_branch_published``, ``commit.after_publish``,
    ``commit.after_committed``, ``abort.after_decision``, ``abort.after_rollback``) and of
    a retention pass (``retain.after_fold``, ``retain.after_delete``); a fault test makes
    it raise to simulate a crash at exactly that step.
    """

    def __init__(self, client: NodeStore, sink_id: str, root: str = DEFAULT_ROOT,
                 retry: KazooRetry | None = None, on_step: StepHook | None = None,
                 callback_policy: CallbackPolicy | None = None, lease_wait: float = 300.0,
                 role: str = "driver") -> None:
        if not isinstance(sink_id, str) or not sink_id:
            raise ValueError("sink_id must be a non-empty string")
        self.client = client
        self.sink_id = sink_id
        self.layout = SinkLayout(root, sink_id)
        self.store = SinkStore(client, self.layout, retry or default_retry(client))
        self.on_step = on_step
        self._sink_generation = Generation(self.store)
        self._epochs = EpochCounter(self.store)
        self._txn_versions = TxnVersion(self.store)
        self._last = LastCommitted(self.store)
        self._completion = Completion(self.store, self._last,
                                      callback_policy or CallbackPolicy(), self._step)
        self._steps = Transitions(self.store, self._sink_generation)
        self._own_generation: int | None = None  # the generation this instance fenced with
        self.lease_wait = lease_wait
        self.role = role
        self._leases: dict[int, PublishLease] = {}  # held while finishing an xid
        self._holders: dict[int, str] = {}  # liveness holders this instance created

    # -- sink ------------------------------------------------------------------------

    def readable(self) -> bool:
        """Whether this session may read the sink's records: False when their ACL names
        other credentials (``coordinator/plumbing/auth.py``). A sink not created yet is readable:
        this session will create it."""
        try:
            self.client.get(self.layout.sink)
        except NoNodeError:
            return True
        except NoAuthError:
            return False
        return True

    def check_tree(self) -> None:
        """Check the sink's existing tree before it is used: complete a half-made one,
        refuse a damaged one (:class:`SinkTreeDamaged`) and, for a client with
        credentials, one with a node whose ACL is not theirs (:class:`AccessDenied`).
        Nothing to do for a sink not created yet: its creation makes the whole tree at
        once, with this client's ACL."""
        self.store.run(self.layout.check, self.client)

    def fence(self) -> int:
        """Bump the sink's generation: this writer now owns the sink (Kafka's
        ``initTransactions``). Returns the new generation."""
        self._own_generation = self._sink_generation.bump()
        return self._own_generation

    def claim(self, owner: str) -> int:
        """Fence once per ``owner`` (a streaming run id: every task of a run calls this,
        the first one bumps the generation). The same ``owner`` gets the same generation;
        an ``owner`` a newer writer superseded gets :class:`Fenced`."""
        self._own_generation = self._sink_generation.claim(owner)
        return self._own_generation

    # -- stream ownership (coordinator/protocol/stream.py) ------------------------------------

    def own_stream(self, query_id: str, epoch: int) -> StreamRecord:
        """Refuse micro-batch ``epoch`` of streaming query ``query_id`` unless the sink's
        state and the query's checkpoint describe the same history; call it before
        ``claim``, ``begin`` or any staging.

        :class:`CheckpointReplaced`: the sink's epochs belong to another query that
        committed some, or the checkpoint is behind the sink. :class:`SinkStateLost`: the
        checkpoint says batches were committed that the sink has no record of. Otherwise
        returns the stream record (a sink owned by nobody, or by a query that committed
        nothing, is adopted by ``query_id``).
        """
        return StreamOwnership(self.store).check(query_id, epoch)

    def generation(self) -> int:
        """The sink's current generation (0 if never fenced)."""
        return self._sink_generation.current()

    def taken_over(self, generation: int, cause: Exception | None = None
                   ) -> SinkTakenOver | None:
        """:class:`SinkTakenOver` if a newer writer than ``generation`` owns the sink.

        Writers call it when a step is refused, to replace a low-level refusal by one
        error that says the sink was taken over::

            except (Fenced, XidDecided) as exc:
                raise coord.taken_over(generation, exc) or exc
        """
        return self._sink_generation.taken_over(generation, cause)

    def allocate_epoch(self) -> int:
        """A new epoch for a batch job: monotonic, never handed out twice."""
        return self._epochs.allocate()

    # -- xid -------------------------------------------------------------------------

    def begin(self, epoch: int, generation: int, hold: str | None = None,
              new: bool = False, known: XidRecord | None = None,
              last_committed: tuple[int | None, int] | None = None,
              defer: bool = False) -> XidState:
        """Create the xid (``Unknown → Initialized``) or report its state; idempotent.

        ``Initialized`` of an older generation is adopted by this one (so recovery by
        this generation leaves it alone). ``Aborted`` becomes a new attempt when
        ``generation`` is newer than the generation that owned the aborted attempt,
        else :class:`XidAborted`. A stale ``generation`` that would write raises
        :class:`Fenced`.

        ``hold`` (a role, e.g. ``"batch driver"``): a new xid is created *watched*, with a
        liveness holder of this session in the same multi-op; until the decision, an xid
        all of whose holders are gone is abandoned (``coordinator/protocol/liveness.py``). The
        caller keeps its session until it decides, or hands over with :meth:`hold`, and
        ends its holding with :meth:`release`. An adopted xid is not watched.

        ``new``: the caller expects the xid not to exist yet (an allocated epoch): it is
        created without being read first. ``known``: its record as the writer that began
        it handed it over (:meth:`begun`), not read again while ``Initialized`` (every
        later step's compare-and-set proves it current). ``last_committed``: the sink's
        :meth:`last_committed` as a planner read it, checked (not read) where the xid is
        created. ``defer``: an xid to create is created with the first branch that
        registers, in one multi-op (or by :meth:`begun`). The result is the same either
        way.
        """
        holder = holder_identity(hold) if hold else None
        state = self._steps.begin(epoch, generation, holder, new=new, known=known,
                                  last_committed=last_committed, defer=defer)
        if holder is not None:
            self._holders[epoch] = holder[0]
        return state

    def last_committed(self) -> tuple[int | None, int]:
        """The sink's last committed epoch and the version of its node (None, -1 before
        any), for a later :meth:`begin` to check instead of reading it."""
        return self.store.run(self._last.read)

    def begun(self, epoch: int) -> XidRecord | None:
        """The xid's record as this instance last wrote or read it: after :meth:`begin`,
        what to hand to the writers that join it (``begin``'s ``known``). A creation
        that a deferring ``begin`` left to a registration that never came is sent first."""
        self._steps.send_deferred(epoch)
        return self._steps.known(epoch)

    def hold(self, epoch: int, role: str) -> bool:
        """Join the liveness holders of an ``Initialized`` xid that someone still holds
        (a keeper taking over from the process that began it); False when the xid was
        decided or every holder is gone."""
        name, data = holder_identity(role)
        if not Liveness(self.store).hold(epoch, name, data):
            return False
        self._holders[epoch] = name
        return True

    def release(self, epoch: int) -> None:
        """Drop this instance's liveness holder of ``epoch`` (idempotent)."""
        name = self._holders.pop(epoch, None)
        if name is not None:
            Liveness(self.store).release(epoch, name)

    def register_branch(self, epoch: int, branch_id: str, generation: int,
                        owner: dict[str, Any]) -> None:
        """Record a branch (``Initialized``) before it stages anything.

        Refused with :class:`Fenced` under a stale generation and :class:`XidDecided`
        once the xid is no longer ``Initialized`` (a zombie task); idempotent for the
        same branch id. ``owner`` should say how to roll the branch back (its staging).
        """
        self._steps.register(epoch, branch_id, generation, owner)

    def prepare_branch(self, epoch: int, branch_id: str, manifest: dict[str, Any]
                       ) -> BranchRecord | None:
        """Seal a branch: ``Initialized → Prepared`` with its manifest; returns the record
        as written (None where a repeat found it prepared already), which the process
        that decides may take instead of reading it (:meth:`winner_records`).

        Idempotent for the same manifest; a different manifest for a prepared branch is
        :class:`InvalidTransition`; after the decision :class:`XidDecided`. A manifest
        over ~900 kB is :class:`RecordTooLarge`.
        """
        self._steps.prepare(epoch, branch_id, manifest)
        return self._steps.prepared_record(epoch, branch_id)

    def select(self, epoch: int, generation: int, branch_ids: Iterable[str]) -> None:
        """Add prepared branches to the winners a later ``commit(winners=None)`` uses,
        without deciding (one xid spanning several writes). Idempotent, accumulates."""
        self._steps.select(epoch, generation, list(branch_ids))

    def commit(self, epoch: int, generation: int, winners: list[str] | None,
               publish: BranchCallback, rollback: BranchCallback,
               metrics_of: Callable[[XidRecord], dict[str, Any]] | None = None,
               txn_version: int | None = None,
               publish_groups: PublishGroups | None = None,
               prepared: Iterable[BranchRecord] = (),
               publish_group: GroupCallback | None = None) -> XidRecord:
        """Decide ``Committing`` with ``winners`` (None: the selected branches), publish
        them, roll back every other branch, mark ``Committed``; returns the record.

        ``publish_groups`` splits the winners into groups (for txsink: by server and
        target table, see ``BranchPublisher.groups``; ``grouped_by`` makes one from a key):
        the groups are published at once, the winners of one group one after another.
        Without it, one after another. ``publish_group``: publishes a group of several
        winners in one call (``coordinator.protocol.callbacks``), instead of ``publish``
        for each.

        On an xid already ``Committing`` the recorded decision is finished (``winners``
        is ignored); on a ``Committed`` one nothing happens. ``Aborted`` raises
        :class:`XidAborted`; a winner that is not ``Prepared`` raises before deciding.
        A publish that keeps failing raises :class:`PublishFailed` with the xid left
        ``Committing``. ``txn_version`` is recorded with the decision and becomes the
        sink's :meth:`txn_version` with the ``Committed`` write. ``prepared``: branch
        records the caller read since the xid began (the winners', their sources'), not
        read again. ``metrics_of(record)``: the caller's metrics for the xid, computed from
        its ``Committed`` record and written in the same write (not called on an xid
        another actor finishes).
        """
        prepared = list(prepared)
        record, decided_now, known, every = self._steps.decide_commit(
            epoch, generation, winners, txn_version, prepared)
        if decided_now:  # the caller's records of this attempt: the losers' among them
            known = {**{b.branch_id: b for b in prepared}, **known}
        if record.state is XidState.COMMITTED:
            return record
        if decided_now:
            self._step(steps.COMMIT_AFTER_DECISION)
        return self._finish(record, generation, fresh=decided_now, finish=lambda r, lease:
                            self._completion.finish_commit(r, lease, generation, publish,
                                                           rollback, metrics_of, known,
                                                           publish_groups, every,
                                                           publish_group))

    def decide(self, epoch: int, generation: int, winners: list[str] | None,
               txn_version: int | None = None,
               prepared: Iterable[BranchRecord] = ()) -> XidRecord:
        """Decide ``Committing`` with ``winners`` and return, leaving the publish to a
        later :meth:`commit` of the same xid (which finishes the recorded decision), or
        to recovery. A pipelined writer holds the xid's :meth:`publish_lease` across both,
        so that nobody else starts its publish meanwhile. On a decided xid nothing is
        written; ``Aborted`` raises :class:`XidAborted`."""
        record, decided_now, _, _ = self._steps.decide_commit(epoch, generation, winners,
                                                              txn_version, prepared)
        if decided_now:
            self._step(steps.COMMIT_AFTER_DECISION)
        return record

    def lease_holder(self, epoch: int) -> str | None:
        """The identity of the live holder of the xid's publish lease (None: nobody)."""
        return PublishLease(self.store, epoch, "").holder()

    def abort(self, epoch: int, generation: int, rollback: BranchCallback) -> XidRecord:
        """``Initialized → Aborting``, roll back every branch, ``Aborted``; idempotent.

        Raises :class:`XidDecided` when the xid is ``Committing`` or ``Committed``.
        """
        record, decided_now = self._steps.decide_abort(epoch, generation)
        if record.state is XidState.ABORTED:
            return record
        if decided_now:
            self._step(steps.ABORT_AFTER_DECISION)
        return self._finish(record, generation, fresh=decided_now, finish=lambda r, lease:
                            self._completion.finish_abort(r, lease, generation, rollback))

    def recover(self, publish: BranchCallback, rollback: BranchCallback,
                older_than_generation: int | None = None,
                raise_on_failure: bool = True, wait_for_holders: float = 0.0,
                abandoned: bool = False, unwatched_after: float | None = None,
                leave_to: Callable[[str], bool] | None = None) -> RecoveryReport:
        """Finish what crashed writers left: roll every ``Committing`` xid forward, finish
        every ``Aborting`` one, roll back every ``Initialized`` xid of a generation older
        than ``older_than_generation`` (default: this writer's generation).

        With ``abandoned``, also every ``Initialized`` xid that ``SinkAdmin.verdicts`` finds
        abandoned (its writer's liveness holders all gone; with ``unwatched_after``, an
        unwatched xid not updated for that many seconds), each only while it is still the
        record that was judged. Operators' commands ask for it; a writer at start-up does
        not need to (it fenced, so every other xid is older anyway).

        A decided xid whose publish lease another live actor still holds after
        ``wait_for_holders`` seconds is left to it and reported ``in_progress``: a writer
        starting right after a crash waits about a ZooKeeper session timeout, so that the
        dead driver's lease expires and recovery finishes its xid.

        ``leave_to(holder identity)`` says which live holders not to wait for: a decided
        xid held by one is reported ``in_progress`` at once (a pipelined writer's own
        background publish, which its next decision waits for).

        Every xid is attempted; if some could not be finished, :class:`RecoveryIncomplete`
        carries the report (or, with ``raise_on_failure=False``, the report lists them).
        """
        epochs = self.store.run(self.store.epochs, True)
        if not epochs:  # nothing open: nothing to finish, judge or fence against
            return RecoveryReport(self.sink_id, self._own_generation)
        generation = (self._own_generation if self._own_generation is not None
                      else self.generation())
        judged = self._judge(unwatched_after) if abandoned else None
        def lease_for(epoch: int) -> AbstractContextManager[PublishLease]:
            wait = wait_for_holders
            if wait and leave_to is not None:
                holder = self.lease_holder(epoch)
                if holder is not None and leave_to(holder):
                    wait = 0.0
            return self.publish_lease(epoch, generation, wait)

        recovery = Recovery(self.store, self._completion, self._abort_if_older, lease_for,
                            judged, leave_to)
        try:
            report = recovery.run(generation, publish, rollback,
                                  generation if older_than_generation is None
                                  else older_than_generation, raise_on_failure, epochs)
        except RecoveryIncomplete as exc:
            self._mark_recovered(exc.report)
            raise
        self._mark_recovered(report)
        return report

    def _mark_recovered(self, report: RecoveryReport) -> None:
        """Record on every xid recovery published that recovery finished it (operators'
        ``status`` shows it; an xid its writer finished records its own metrics)."""
        for action in report.actions:
            if action.action == ROLLED_FORWARD:
                self.record_metrics(action.epoch, {"finished_by": "recovery",
                                                   "recovered_at": round(time.time(), 3)})

    def retain(self, max_age_seconds: float, fold: Fold | None,
               limit: int = PASS_XIDS) -> Pass:
        """One bounded retention pass (``coordinator/upkeep/retention.py``): finished xids not
        updated for ``max_age_seconds`` folded by ``fold`` into the sink's summary, added
        to ``pruned`` and deleted, at most ``limit`` of them. For a writer, after its own
        ``Committed`` write; safe beside other writers, operators and a crash at any of
        its steps (``retain.after_fold``, ``retain.after_delete``)."""
        return Retention(self.store, fold, self._step).step(max_age_seconds, limit)

    # -- reads -----------------------------------------------------------------------

    def txn_version(self) -> int | None:
        """The highest ``txn_version`` of the sink that is committed or decided (a decided
        xid is never rolled back), None if no commit carried one.

        A batch job with a version at most this one must write nothing: it, or a newer
        one, already committed. Call it after fencing: from then on no older writer can
        decide, so the answer cannot go stale before this writer's own decision.
        """
        committed, _ = self._txn_versions.read()
        if committed is None:
            self._txn_versions.require_not_lost()
        open_epochs = self.store.run(self.store.epochs, True)
        deciding = [r.txn_version for r in self.store.run(self.store.read_xids, open_epochs)
                    if r.state in (XidState.COMMITTING, XidState.COMMITTED)
                    and r.txn_version is not None]
        return max([v for v in (committed, *deciding) if v is not None], default=None)

    def is_committed(self, epoch: int) -> bool:
        """True if the xid is ``Committed`` (also after its record was pruned)."""
        record = self.store.run(self.store.read_xid, epoch)
        if record is not None:
            return record.state is XidState.COMMITTED
        return Retention(self.store).was_pruned_committed(epoch)

    def xid(self, epoch: int) -> XidRecord | None:
        """The xid's record as stored now (None if never begun or pruned)."""
        return self.store.run(self.store.read_xid, epoch)

    def branches(self, epoch: int, branch_ids: Iterable[str] | None = None
                 ) -> list[BranchRecord]:
        """Branches of the xid by branch id: all (every attempt), or those of
        ``branch_ids`` that exist; one pipelined read."""
        found = self.store.run(self.store.read_branches, epoch, branch_ids)
        return [found[b] for b in sorted(found)]

    def winner_records(self, epoch: int, branch_ids: Iterable[str],
                       handed: Iterable[BranchRecord] = ()) -> list[BranchRecord]:
        """:meth:`branches` of ``branch_ids``, those this coordinator prepared, and those
        ``handed`` over as the task that prepared them wrote them (:meth:`prepare_branch`),
        taken without a read: what a driver checks and decides with, in the xid's attempt
        it began or read (the decision's compare-and-set covers them)."""
        wanted = list(branch_ids)
        own = {**self._steps.handed_over(epoch, (r for r in handed if r.branch_id in wanted)),
               **self._steps.prepared_here(epoch, wanted)}
        rest = [b for b in wanted if b not in own]
        found = {**own, **(self.store.run(self.store.read_branches, epoch, rest) if rest else {})}
        return [found[b] for b in sorted(found)]

    def ledger(self, epoch: int, branch_id: str) -> Ledger:
        """The durable key/value ledger of one branch (for the publish step): the
        ``server_ext.publish.PublishLedger`` the publish and combine steps take.

        Its writes are fenced by the publish lease this coordinator holds for ``epoch``
        (inside ``commit``, ``abort``, ``recover`` or ``publish_lease``); outside a lease
        they are refused.
        """
        lease = self._leases.get(epoch)
        return Ledger(self.store, epoch, branch_id, lease,
                      empty=lease is not None and lease.fresh_ledger(branch_id))

    @contextmanager
    def publish_lease(self, epoch: int, generation: int | None = None,
                      wait: float = 0.0) -> Iterator[PublishLease]:
        """Hold the xid's publish lease for the block (re-entrant in one coordinator).

        Raises :class:`PublishInProgress` when another live actor still holds it after
        ``wait`` seconds. After a wait the caller must re-read the xid (``lease.waited``):
        its holder may have finished it.
        """
        held = self._leases.get(epoch)
        if held is not None:
            yield held
            return
        lease = PublishLease(self.store, epoch, actor_identity(self.role, generation))
        deadline = time.monotonic() + wait
        while not lease.acquire():
            if time.monotonic() >= deadline:
                holder = lease.holder()
                raise PublishInProgress(
                    f"xid {self.sink_id}/{epoch} is being finished by another live actor "
                    f"({holder or 'unknown'}); it will publish or roll it back, nothing to do",
                    xid=f"{self.sink_id}/{epoch}", holder=holder)
            lease.waited = True
            time.sleep(0.2)
        self._leases[epoch] = lease
        try:
            yield lease
        finally:
            del self._leases[epoch]
            lease.release()

    def record_metrics(self, epoch: int, metrics: dict[str, Any],
                       known: XidRecord | None = None) -> None:
        """Merge ``metrics`` into the xid's record (any state), for operators; ``known``:
        the record as the caller last saw it (e.g. :meth:`commit`'s), tried first."""
        self._steps.record_metrics(epoch, metrics, known)

    # -- internals -------------------------------------------------------------------

    def _finish(self, record: XidRecord, generation: int, fresh: bool,
                finish: Callable[[XidRecord, PublishLease], XidRecord]) -> XidRecord:
        """Finish a decided xid under its lease, waiting for a live holder first.

        A lease lost mid-way (this session expired) is taken again, if nobody else took
        it meanwhile, and the xid finished from its records: every step is idempotent.
        """
        state = record.state
        for attempt in range(LEASE_RETAKES + 1):
            try:
                with self.publish_lease(record.epoch, generation, self.lease_wait) as lease:
                    if lease.waited or not fresh or attempt:
                        record = self._reread(record)
                    if record.state is not state:
                        return record  # finished by the actor we waited for
                    return finish(record, lease)
            except PublishLeaseLost:
                if attempt == LEASE_RETAKES:
                    raise
                log.warning("xid %s/%d: publish lease lost; taking it again",
                            self.sink_id, record.epoch)
        raise AssertionError("unreachable")

    def _reread(self, record: XidRecord) -> XidRecord:
        fresh = self.store.run(self.store.read_xid, record.epoch)
        return fresh if fresh is not None else record

    def _step(self, name: str) -> None:
        if self.on_step is not None:
            self.on_step(name)

    def _judge(self, unwatched_after: float | None) -> Callable[[XidRecord], Verdict]:
        """A judge for records read *before* its first call: the holders are read then,
        once. Order matters: a holder is created with its xid, so an xid read earlier
        whose holders are gone by then was not held by anyone at that read (an xid
        begun after the holders' read could look abandoned, hence never the reverse)."""
        holders: dict[int, list[str]] | None = None
        sink_generation = self.generation()

        def verdict(record: XidRecord) -> Verdict:
            nonlocal holders
            if holders is None:
                holders = Liveness(self.store).holders()
            return judge(record, sink_generation, holders.get(record.epoch, []),
                         time.time(), unwatched_after)
        return verdict

    def _abort_if_older(self, epoch: int, generation: int, older_than: int | None,
                        rollback: BranchCallback, judged_version: int | None = None
                        ) -> XidRecord | None:
        """Recovery's abort: only while the xid still belongs to an older generation, or
        (``judged_version``) is still the record judged abandoned."""
        record, decided_now = self._steps.decide_abort(epoch, generation, older_than,
                                                       judged_version)
        if record.state is XidState.INITIALIZED:
            return None
        if decided_now:
            self._step(steps.ABORT_AFTER_DECISION)
        if record.state is XidState.ABORTED:
            return record
        with self.publish_lease(epoch, generation) as lease:
            record = self._reread(record)
            if record.state is not XidState.ABORTING:
                return record
            return self._completion.finish_abort(record, lease, generation, rollback)
