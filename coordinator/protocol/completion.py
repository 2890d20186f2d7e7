"""Finishing a decided xid: roll a ``Committing`` one forward, an ``Aborting`` one back.

This is everything that happens *after* the decision, so it runs identically in the
``commit``/``abort`` that made the decision and in a later ``recover`` by another process:

- commit: publish each winner (the caller's ``publish_groups`` at once, the winners of
  one group one after another), then one multi-op marks the branches
  ``Committed``/``Aborted``, sets the xid ``Committed``, advances ``last_committed`` (and
  ``txn_version`` for a versioned xid) and drops the xid from the open index; then
  every other branch is rolled back (its staging dropped; what a crash or a failure
  leaves there is ``txsink gc``'s). Branches are marked only at the end (one round trip
  instead of one per branch); a recovery therefore publishes every winner again, which
  the publish contract (idempotent) makes harmless.
- abort: roll back every branch, then one multi-op marks them and sets ``Aborted``.

Crash safety comes from the order: nothing here changes the decision, the callbacks are
idempotent, and the final state is written only after every callback returned. A crash
anywhere leaves the xid ``Committing``/``Aborting`` and the next run repeats the
callbacks. Overlap safety comes from the publish lease (``publish_lease.py``): the caller
holds it for the whole call, and every write (here and in the publish ledger) carries its
check, so an actor whose lease died stops at its next write. Finishing a decided xid is
owned by the lease, not by the generation: a driver fenced after its decision still
finishes what it decided, and nobody else touches it meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextvars import copy_context
from dataclasses import replace
from typing import Any

from kazoo.exceptions import KazooException

from coordinator.errors import CallbackFailed, CoordinatorError, PublishLeaseLost
from coordinator.formats import steps
from coordinator.formats.records import BranchRecord, XidRecord
from coordinator.formats.states import BranchState, XidState
from coordinator.plumbing.multi import CHUNK_BYTES, CONFLICT_RETRIES, Multi, MultiFailed
from coordinator.plumbing.store import SinkStore
from coordinator.protocol.callbacks import BranchCallback, CallbackPolicy, GroupCallback
from coordinator.protocol.epochs import LAST_COMMITTED, LastCommitted, TxnVersion
from coordinator.protocol.publish_lease import LEASE, PublishLease

log = logging.getLogger(__name__)

_PUBLISHABLE = (BranchState.PREPARED, BranchState.COMMITTED)
CLEANUP_WORKERS = 4  # rollbacks of a committed xid's non-winners in flight at once
PUBLISH_WORKERS = 4  # groups of winners published at once

#: The caller's split of the winners to publish into groups (each winner in exactly one):
#: the groups are published at once, the winners of one group one after another.
PublishGroups = Callable[[Sequence[BranchRecord]], list[list[BranchRecord]]]


def grouped_by(key: Callable[[BranchRecord], Hashable]) -> PublishGroups:
    """``PublishGroups`` putting the winners of one ``key`` (say, what their publish
    touches) into one group."""
    def groups(winners: Sequence[BranchRecord]) -> list[list[BranchRecord]]:
        found: dict[Hashable, list[BranchRecord]] = {}
        for branch in winners:
            found.setdefault(key(branch), []).append(branch)
        return list(found.values())
    return groups

Step = Callable[[str], None]


class Completion:
    """Roll decided xids forward or back.

    Usage (inside :class:`~coordinator.Coordinator`; ``record`` is ``Committing`` and was
    read after ``lease`` was acquired)::

        completion = Completion(store, LastCommitted(store), CallbackPolicy(),
                                step=lambda name: None)
        committed = completion.finish_commit(record, lease, generation, publish, rollback)
    """

    def __init__(self, store: SinkStore, last: LastCommitted, policy: CallbackPolicy,
                 step: Step) -> None:
        self.store = store
        self.last = last
        self.txn_versions = TxnVersion(store)
        self.policy = policy
        self.step = step

    # -- commit ----------------------------------------------------------------------

    def finish_commit(self, record: XidRecord, lease: PublishLease, generation: int,
                      publish: BranchCallback,
                      rollback: BranchCallback,
                      metrics_of: Callable[[XidRecord], dict[str, Any]] | None = None,
                      known: dict[str, BranchRecord] | None = None,
                      publish_groups: PublishGroups | None = None,
                      every: frozenset[str] | None = None,
                      publish_group: GroupCallback | None = None) -> XidRecord:
        """Publish the winners of a ``Committing`` xid and mark it ``Committed``.
        ``known``: branch records the caller read in this attempt, not read again (the
        final write is a compare-and-set of each: a record changed since fails it, and
        the retry reads every branch afresh). ``every``: each branch id the xid has, as
        its decision proved (``Transitions.decide_commit``); else they are listed."""
        known = dict(known or {})
        branches = {b: known[b] for b in record.winners if b in known}
        missing = [b for b in record.winners if b not in branches]
        if missing:
            branches.update(self.store.run(self.store.read_branches, record.epoch, missing))
        pending: list[BranchRecord] = []
        for branch_id in record.winners:
            branch = branches.get(branch_id)
            if branch is None or branch.state not in _PUBLISHABLE:
                raise CoordinatorError(
                    f"xid {record.xid}: winner {branch_id} is "
                    f"{branch.state.value if branch else 'missing'}; the record was altered")
            if branch.state is not BranchState.COMMITTED:  # else marked by an earlier,
                pending.append(branch)                      # partly applied final write
        self._publish(pending, publish, publish_groups, publish_group)
        self.step(steps.COMMIT_AFTER_PUBLISH)
        # Every non-winner, read *after* the decision: no branch can register any more.
        names = [b for b in (every if every is not None else
                             self.store.run(self.store.branch_ids, record.epoch))
                 if b not in record.winners]
        losers = {b: known[b] for b in names if b in known}
        unread = [b for b in names if b not in known]
        if unread:
            losers.update(self.store.run(self.store.read_branches, record.epoch, unread))
        final = self.store.run(self._write_committed, record, lease, generation, branches, losers,
                               metrics_of)
        log.info("xid %s committed: %d winner(s) published, %d other branch(es) aborted",
                 record.xid, len(record.winners), len(losers))
        self.step(steps.COMMIT_AFTER_COMMITTED)
        self._clean_up(final, [b for b in losers.values() if b.state is not BranchState.ABORTED],
                       rollback)
        return final

    def _publish(self, winners: list[BranchRecord], publish: BranchCallback,
                 publish_groups: PublishGroups | None,
                 publish_group: GroupCallback | None = None) -> None:
        """Publish ``winners``: one after another within a group (a group of several in
        one call of ``publish_group``, where given), the groups at once
        (``publish_groups``; without it, all one after another).

        The caller's groups are what may run at once (for txsink, publishes into
        different tables, or ones the publish strategy proves independent), and a crash or
        a failure amid them leaves the xid ``Committing`` as a crash amid sequential
        publishes does: the final write comes only after every publish returned, and each
        publish is idempotent. The first failure (in group order) is raised once every
        group has stopped.
        """
        def publish_all(group: list[BranchRecord]) -> None:
            if publish_group is not None and len(group) > 1:
                self.policy.call_group(publish_group, group, "publish", XidState.COMMITTING)
                self.step(steps.COMMIT_AFTER_BRANCH_PUBLISHED)
                return
            for branch in group:
                self.policy.call(publish, branch, "publish", XidState.COMMITTING)
                self.step(steps.COMMIT_AFTER_BRANCH_PUBLISHED)

        groups = [list(winners)] if publish_groups is None else publish_groups(winners)
        grouped = sorted(b.branch_id for group in groups for b in group)
        if grouped != sorted(b.branch_id for b in winners):
            raise CoordinatorError(f"publish groups {[[b.branch_id for b in g] for g in groups]}"
                                   f" are not a split of the winners "
                                   f"{[b.branch_id for b in winners]}")
        groups = [group for group in groups if group]
        if len(groups) <= 1:
            for group in groups:
                publish_all(group)
            return
        with ThreadPoolExecutor(min(PUBLISH_WORKERS, len(groups))) as pool:
            # each in the caller's context (a caller may count the messages its work sends)
            futures = [pool.submit(copy_context().run, publish_all, group) for group in groups]
        for future in futures:
            future.result()

    def _clean_up(self, record: XidRecord, losers: list[BranchRecord],
                  rollback: BranchCallback) -> None:
        """Roll back the non-winners of a ``Committed`` xid, a few at once.

        After the final write, because a rolled-back branch only takes space: it is never
        published, so its rollback need not delay the rows' visibility nor the commit. A
        rollback that fails (or a crash before it) leaves its staging to ``txsink gc``,
        which drops the staging of finished xids. Rollbacks of different branches run
        concurrently (the callback contract allows it).
        """
        def roll_back(loser: BranchRecord) -> None:
            try:
                self.policy.call(rollback, loser, "rollback", XidState.COMMITTED)
            except CallbackFailed as exc:
                log.warning("xid %s: %s; its staging is left for txsink gc", record.xid, exc)

        if len(losers) <= 1:
            for loser in losers:
                roll_back(loser)
            return
        with ThreadPoolExecutor(min(CLEANUP_WORKERS, len(losers))) as pool:
            list(pool.map(roll_back, losers))

    def _write_committed(self, record: XidRecord, lease: PublishLease, generation: int,
                         winners: dict[str, BranchRecord], losers: dict[str, BranchRecord],
                         metrics_of: Callable[[XidRecord], dict[str, Any]] | None
                         ) -> XidRecord:
        current = record
        # last_committed as this process last wrote it, if it did (its versioned write
        # checks it); read when that fails or there is none
        remembered = self.last.remembered_below(record.epoch)
        for _ in range(CONFLICT_RETRIES):
            if current.state is XidState.COMMITTED:
                return current
            final = current.moved_to(XidState.COMMITTED, generation)
            updates = [b.moved_to(BranchState.COMMITTED) for b in winners.values()
                       if b.state is not BranchState.COMMITTED and b.branch_id in record.winners]
            updates += [b.moved_to(BranchState.ABORTED) for b in losers.values()
                        if b.state is not BranchState.ABORTED]
            last_epoch, last_version = remembered or self.last.require()
            txn = self.txn_versions.read() if record.txn_version is not None else None
            if metrics_of is not None:  # last, right before the write that carries them
                final = replace(final, metrics={**final.metrics, **metrics_of(final)})

            def close(multi: Multi, last_epoch: int | None = last_epoch,
                      last_version: int = last_version,
                      txn: tuple[int | None, int] | None = txn) -> None:
                self.last.advance(multi, record.epoch, last_epoch, last_version)
                if txn is not None and record.txn_version is not None:
                    self.txn_versions.advance(multi, record.txn_version, *txn)
                multi.delete(self.store.layout.open_marker(record.epoch), label="open")
                lease.release_in(multi)

            try:
                written = self._apply(current, final, updates, lease, extra=close)
            except MultiFailed as failed:
                if remembered is not None and failed.label == LAST_COMMITTED:
                    remembered = None  # moved since this process wrote it: read it
                    self.last.forget()
                    continue
                current = self._after_conflict(failed, current)
                winners = self.store.read_branches(record.epoch, record.winners)
                losers = self.store.read_branches(record.epoch, losers.keys())
                continue
            if self.last.moves(record.epoch, last_epoch):
                self.last.advanced(record.epoch, last_version)
            return written
        raise CoordinatorError(f"xid {record.xid}: too much contention marking Committed")

    # -- abort -----------------------------------------------------------------------

    def finish_abort(self, record: XidRecord, lease: PublishLease, generation: int,
                     rollback: BranchCallback) -> XidRecord:
        """Roll back every branch of an ``Aborting`` xid and mark it ``Aborted``."""
        branches = self.store.run(self.store.read_branches, record.epoch)
        for branch in branches.values():
            if branch.state is not BranchState.ABORTED:
                self.policy.call(rollback, branch, "rollback", XidState.ABORTING)
        self.step(steps.ABORT_AFTER_ROLLBACK)
        final = self.store.run(self._write_aborted, record, lease, generation, branches)
        log.info("xid %s aborted: %d branch(es) rolled back", record.xid, len(branches))
        return final

    def _write_aborted(self, record: XidRecord, lease: PublishLease, generation: int,
                       branches: dict[str, BranchRecord]) -> XidRecord:
        current = record
        for _ in range(CONFLICT_RETRIES):
            if current.state is XidState.ABORTED:
                return current
            final = current.moved_to(XidState.ABORTED, generation)
            updates = [b.moved_to(BranchState.ABORTED) for b in branches.values()
                       if b.state is not BranchState.ABORTED]
            try:
                return self._apply(current, final, updates, lease, extra=lambda m: (
                    m.delete(self.store.layout.open_marker(record.epoch), label="open"),
                    lease.release_in(m)))
            except MultiFailed as failed:
                current = self._after_conflict(failed, current)
                branches = self.store.read_branches(record.epoch)
        raise CoordinatorError(f"xid {record.xid}: too much contention marking Aborted")

    # -- shared ----------------------------------------------------------------------

    def _apply(self, current: XidRecord, final: XidRecord, updates: list[BranchRecord],
               lease: PublishLease, extra: Callable[[Multi], object]) -> XidRecord:
        """Write branch updates (in chunks if large) and then the xid's final state,
        which releases the lease (``extra`` adds its release).

        Every chunk re-checks the lease and the xid's version, so a chunk never lands
        after someone else changed the xid; the xid's own write comes last, so a crash
        between chunks leaves it in its decided state with some branches already marked.
        """
        layout = self.store.layout
        multi = lease.guard(Multi(self.store.client))
        for branch in updates:
            data = branch.to_bytes()
            if len(multi) > 1 and multi.size + len(data) > CHUNK_BYTES:
                multi.check(layout.xid(current.epoch), current.version, label="xid").commit()
                multi = lease.guard(Multi(self.store.client))
            multi.set_data(layout.branch(branch.epoch, branch.branch_id), data,
                           branch.version, label="branch")
        multi.set_data(layout.xid(current.epoch), final.to_bytes(), current.version,
                       label="xid")
        extra(multi)
        multi.commit()
        lease.released()  # the final write releases the lease
        return replace(final, version=current.version + 1)

    def _after_conflict(self, failed: MultiFailed, current: XidRecord) -> XidRecord:
        """Re-read the xid after a failed final write. Finished by someone else is
        success; a lost lease is not (another actor may be finishing it now)."""
        fresh = self.store.read_xid(current.epoch)
        if fresh is None:
            raise CoordinatorError(f"xid {current.xid} vanished while being finished")
        if fresh.state in (XidState.COMMITTED, XidState.ABORTED):
            return fresh
        if failed.label == "open":
            # The open xid lost its index entry (only a manual edit does that): put it
            # back so the next try deletes it together with the final write.
            self._restore_marker(current.epoch)
            return fresh
        if failed.label == LEASE:
            raise PublishLeaseLost(f"xid {current.xid}: the publish lease was lost before the "
                                   "final write; another actor finishes the xid")
        if not failed.conflict:
            raise failed.error
        return fresh

    def _restore_marker(self, epoch: int) -> None:
        try:
            self.store.client.create(self.store.layout.open_marker(epoch))
        except KazooException:
            pass  # recreated concurrently: the next try deletes it
