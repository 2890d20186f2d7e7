"""The compare-and-set steps that move an xid or a branch: one multi-op each.

Every step has the same shape: read the record, decide from its state what to do (or
which typed error to raise), then write the new record in one multi-op that checks the
version it read — and, for anything a writer decides, the sink's generation. When the
multi fails because someone else wrote first, the step reads again and decides again, so
a step is safe to re-run after a lost reply: the re-run finds its own write and returns.

To save a round trip, a step may start from the record this instance last wrote or read
(the CAS proves it current or fails); a cached record is used only while it is
``Initialized``, so a refusal is never based on a stale record.

Each step raises its own typed error (``Fenced``, ``XidDecided``, ``XidAborted``,
``WinnerNotPrepared``, ...) before it builds a new record; the new record itself comes
from ``moved_to``/``changed``, which check the one table in ``coordinator/formats/states.py``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, TypeVar

from kazoo.exceptions import NodeExistsError
from kazoo.retry import ForceRetryError

from coordinator.errors import (
    Fenced,
    InvalidTransition,
    SinkTakenOver,
    SinkTreeDamaged,
    UnknownBranch,
    UnknownXid,
    WinnerNotPrepared,
    XidAborted,
    XidDecided,
)
from coordinator.formats.records import BranchRecord, XidRecord, decode, encode
from coordinator.formats.states import BranchState, XidState
from coordinator.plumbing.multi import CONFLICT_RETRIES, Multi, MultiFailed
from coordinator.plumbing.store import SinkStore
from coordinator.protocol.epochs import LAST_COMMITTED, LastCommitted
from coordinator.protocol.fencing import Generation, settle
from coordinator.protocol.liveness import WATCHED, Liveness
from coordinator.upkeep.retention import Retention

T = TypeVar("T")
NO_FENCE = -1  # the generation of steps that are not fenced (prepare, metrics)
REGISTERED = "registered"  # label of the decision's check of the registrations' count


class Transitions:
    """Begin, register, prepare, select, decide: the writes before and at the decision.

    Usage (each call runs under the store's retry policy)::

        steps = Transitions(store, Generation(store))
        steps.begin(41, generation)                         # -> XidState
        steps.register(41, "p0-a0-1f2e3d4c", generation, owner={"staging": "s"})
        steps.prepare(41, "p0-a0-1f2e3d4c", manifest)
        record, decided_now, winners, every = steps.decide_commit(41, generation,
                                                                  ["p0-a0-1f2e3d4c"])
    """

    def __init__(self, store: SinkStore, sink_generation: Generation) -> None:
        self.store = store
        self.sink_generation = sink_generation
        self.layout = store.layout
        self._xids: dict[int, XidRecord] = {}
        self._branches: dict[tuple[int, str], BranchRecord] = {}
        self._every: tuple[int, frozenset[str]] | None = None  # the last proof: every branch
        # xids a deferring begin found to create: (record, last_committed version to check)
        self._deferred: dict[int, tuple[XidRecord, int | None]] = {}

    # -- public steps ------------------------------------------------------------------

    def begin(self, epoch: int, generation: int,
              holder: tuple[str, bytes] | None = None, new: bool = False,
              known: XidRecord | None = None,
              last_committed: tuple[int | None, int] | None = None,
              defer: bool = False) -> XidState:
        """``holder`` (name, data): a new xid is created watched, with this session's
        liveness holder in the same multi-op (``coordinator/protocol/liveness.py``).
        ``new``: the caller expects no record (an allocated epoch, a micro-batch whose
        tasks staged nothing), so the first try creates it without reading it; a record
        that exists fails that multi-op, and the step reads it and decides as usual.
        ``known``: the record as the writer that created it handed it over (the driver to
        its tasks), taken as the first try's read while ``Initialized``.
        ``last_committed``: (epoch, node version) as a planner read it, the first try's
        value of the node where it lies below ``epoch``: the creating multi-op checks the
        version, so a node moved since fails it, and the next try reads the node.
        ``defer``: an xid to create is created by this object's first :meth:`register` of
        the epoch, in the registration's multi-op (or by :meth:`send_deferred`)."""
        if holder is not None:
            Liveness(self.store).ensure()
        if known is not None and known.epoch == epoch:
            self._remember(known)
        given = (last_committed if last_committed is not None and
                 (last_committed[0] is None or last_committed[0] < epoch) else None)
        defer = defer and holder is None
        return self._run(epoch, generation, lambda first: (
            self._begin_new(epoch, generation, holder, given, defer) if new and first else
            self._begin_once(self._read(epoch, first and known is not None), epoch,
                             generation, holder, first, given if first else None, defer)))

    def send_deferred(self, epoch: int) -> None:
        """Create the xid a deferring :meth:`begin` left to a registration that never
        came (nothing if there is none)."""
        deferred = self._deferred.pop(epoch, None)
        if deferred is not None:
            self._xids.pop(epoch, None)
            self.begin(epoch, deferred[0].generation)

    def known(self, epoch: int) -> XidRecord | None:
        """The xid's record as this object last wrote or read it (None: it has not)."""
        return self._xids.get(epoch)

    def register(self, epoch: int, branch_id: str, generation: int,
                 owner: dict[str, Any]) -> None:
        deferred = self._deferred.pop(epoch, None)
        if deferred is not None:
            try:
                self.store.run(self._create, epoch, generation, None, deferred[1],
                               deferred[0], (branch_id, owner))
                return
            except MultiFailed:  # created meanwhile, fenced, last_committed moved: begin
                self._xids.pop(epoch, None)  # afresh (and say why where it refuses)
            if self.begin(epoch, generation) is not XidState.INITIALIZED:
                raise XidDecided(f"xid {self.store.sink_id}/{epoch} was decided before "
                                 f"branch {branch_id} registered")
        self._run(epoch, generation,
                  lambda cached: self._register_once(epoch, branch_id, generation, owner, cached))

    def prepare(self, epoch: int, branch_id: str, manifest: dict[str, Any]) -> None:
        normalized = decode(encode(manifest, f"manifest of branch {branch_id}"))
        self._run(epoch, NO_FENCE,
                  lambda cached: self._prepare_once(epoch, branch_id, normalized, cached))

    def select(self, epoch: int, generation: int, branch_ids: list[str]) -> None:
        self._run(epoch, generation,
                  lambda cached: self._select_once(epoch, generation, branch_ids, cached))

    def decide_commit(self, epoch: int, generation: int, winners: list[str] | None,
                      txn_version: int | None = None,
                      prepared: Iterable[BranchRecord] = ()
                      ) -> tuple[XidRecord, bool, dict[str, BranchRecord], frozenset[str] | None]:
        """Write ``Committing`` with the winners (and the job's ``txn_version``). Returns
        (record, decided by this call, winner records read while validating, every
        branch id the xid has, where the decision proved it knew them all: else None).
        A decided xid is returned as it is. ``prepared``: winner records the caller read
        in this attempt, not read again (a winner leaves ``Prepared`` only with a change
        of the xid record, which the decision's compare-and-set refuses).

        Each registration's multi-op raises the data version of the xid's branches
        folder by one and checks the xid's version, which the decision raises: so the
        folder's version at the decision counts every branch the xid will ever have. A
        decision that knows as many branch ids carries the check of that count (one
        that fails is sent again without it), and whoever finishes the xid need not
        list its branches to find the rest."""
        given = {b.branch_id: b for b in prepared}
        try:
            return self._run(epoch, generation, lambda cached: self._commit_once(
                epoch, generation, winners, txn_version, cached, given))
        except Fenced as exc:  # a writer told who took the sink over (and rolled it back)
            if isinstance(exc, SinkTakenOver):
                raise
            raise self.sink_generation.taken_over(generation, exc) or exc from None

    def decide_abort(self, epoch: int, generation: int, older_than: int | None = None,
                     judged_version: int | None = None) -> tuple[XidRecord, bool]:
        """Write ``Aborting``. With ``older_than`` (recovery), only while the xid still
        belongs to an older generation; with ``judged_version`` (an abandoned xid), only
        while the xid is still the record judged abandoned. Otherwise it is returned
        untouched."""
        return self._run(epoch, generation, lambda cached: self._abort_once(
            epoch, generation, older_than, judged_version, cached))

    def record_metrics(self, epoch: int, metrics: dict[str, Any],
                       known: XidRecord | None = None) -> None:
        """``known``: the xid's record as the caller last wrote it, tried first (a
        conflict reads it again)."""
        normalized = json.loads(json.dumps(metrics))
        self._run(epoch, NO_FENCE, lambda cached: self._metrics_once(
            epoch, normalized, known if cached else None))

    def prepared_here(self, epoch: int, branch_ids: Iterable[str]) -> dict[str, BranchRecord]:
        """The branches of ``branch_ids`` this object prepared in the xid's attempt it
        last saw, as it wrote them."""
        xid = self._xids.get(epoch)
        return self._prepared_in(xid, branch_ids) if xid is not None else {}

    def handed_over(self, epoch: int, records: Iterable[BranchRecord]
                    ) -> dict[str, BranchRecord]:
        """Of ``records`` (branches as the process that prepared them wrote them), those
        prepared in the xid's attempt this object last saw."""
        xid = self._xids.get(epoch)
        if xid is None:
            return {}
        return {r.branch_id: r for r in records if r.epoch == epoch
                and r.attempt == xid.attempt and r.state is BranchState.PREPARED}

    def prepared_record(self, epoch: int, branch_id: str) -> BranchRecord | None:
        """The branch as this object's prepare wrote it (None if it did not)."""
        found = self._branches.get((epoch, branch_id))
        return found if found is not None and found.state is BranchState.PREPARED else None

    def _prepared_in(self, record: XidRecord, branch_ids: Iterable[str]
                     ) -> dict[str, BranchRecord]:
        found = {b: self._branches.get((record.epoch, b)) for b in branch_ids}
        return {b: r for b, r in found.items() if r is not None
                and r.attempt == record.attempt and r.state is BranchState.PREPARED}

    # -- one try of each step (raise MultiFailed to be re-run from a fresh read) --------

    def _begin_new(self, epoch: int, generation: int, holder: tuple[str, bytes] | None,
                   given: tuple[int | None, int] | None = None, defer: bool = False
                   ) -> XidState:
        """The first try of a begin that expects no record: above ``last_committed`` the
        xid is created unread (a record there fails the creation, and the next try reads
        it); at or below it, the record decides, as in :meth:`_begin_once`."""
        last, check = given or self._last_committed(epoch, first=True)
        if last is not None and epoch <= last:
            record = self._read(epoch, False)
            if record is not None:
                return self._begin_once(record, epoch, generation, holder, False)
        return self._begin_missing(epoch, generation, holder, last, check, defer)

    def _last_committed(self, epoch: int, first: bool) -> tuple[int | None, int | None]:
        """(``last_committed``, the version to check it at in the creating multi-op):
        remembered below ``epoch`` on a first try (checked instead of read), else read
        (nothing to check: a committed epoch cannot slip in after the xid's read)."""
        last_committed = LastCommitted(self.store)
        remembered = last_committed.remembered_below(epoch) if first else None
        if remembered is not None:
            return remembered
        return last_committed.read()[0], None

    def _begin_missing(self, epoch: int, generation: int, holder: tuple[str, bytes] | None,
                       last: int | None, check: int | None, defer: bool = False
                       ) -> XidState:
        """Begin an xid that has no record: every committed epoch lies at or below
        ``last_committed``, so above it there is nothing to ask."""
        if last is not None and epoch <= last:
            if Retention(self.store).was_pruned_committed(epoch):
                # committed long ago, record pruned: a replay must not write it again
                return XidState.COMMITTED
            if epoch == last:
                raise self._lost(epoch, last)
        return self._create(epoch, generation, holder, check, defer=defer)

    def _begin_once(self, record: XidRecord | None, epoch: int, generation: int,
                    holder: tuple[str, bytes] | None, first: bool,
                    given: tuple[int | None, int] | None = None, defer: bool = False
                    ) -> XidState:
        if record is None:
            return self._begin_missing(epoch, generation, holder,
                                       *(given or self._last_committed(epoch, first)), defer)
        if record.state is XidState.INITIALIZED:
            if record.generation > generation:
                raise Fenced(f"xid {record.xid} belongs to generation {record.generation}; "
                             f"generation {generation} is stale")
            if record.generation < generation:  # adopt: recovery by us must leave it alone
                self._write(record, generation, record.moved_to(  # its old holders: not ours
                    XidState.INITIALIZED, generation, event="adopted", generation=generation,
                    liveness=None))
            return XidState.INITIALIZED
        if record.state is XidState.ABORTED:
            if generation <= record.generation:
                raise XidAborted(f"xid {record.xid} attempt {record.attempt} was aborted; "
                                 "only a newer generation may start a new attempt")
            self._write(record, generation, record.moved_to(
                XidState.INITIALIZED, generation, event="new_attempt", generation=generation,
                attempt=record.attempt + 1, winners=(), selected=(), decided_at=None,
                liveness=None), reopen=True)
            return XidState.INITIALIZED
        return record.state  # Committing, Committed, Aborting: the caller writes nothing

    def _register_once(self, epoch: int, branch_id: str, generation: int,
                       owner: dict[str, Any], cached: bool) -> None:
        record = self._require(epoch, cached)
        if record.state is not XidState.INITIALIZED:
            raise XidDecided(f"xid {record.xid} is {record.state.value}; branch "
                             f"{branch_id} may not register after the decision")
        branch = self._new_branch(record, branch_id, owner, generation)
        multi = self._fenced(generation)
        multi.check(self.layout.xid(epoch), record.version, label="xid")  # refuse zombies
        multi.create(self.layout.branch(epoch, branch_id), branch.to_bytes(), label="branch")
        multi.set_data(self.layout.branches(epoch), b"", -1, label="branch")  # counts them
        try:
            multi.commit()
        except MultiFailed as failed:
            if failed.label == "branch" and isinstance(failed.error, NodeExistsError):
                return self._registered_already(record, branch_id)
            raise
        self._branches[(epoch, branch_id)] = replace(branch, version=0)

    def _registered_already(self, record: XidRecord, branch_id: str) -> None:
        existing = self.store.read_branch(record.epoch, branch_id)
        if existing is None:
            raise ForceRetryError()  # pruned in between; start over
        if existing.attempt != record.attempt or existing.state is BranchState.ABORTED:
            raise XidDecided(f"branch {branch_id} of xid {record.xid} belongs to aborted "
                             f"attempt {existing.attempt}; register a new branch id")

    def _prepare_once(self, epoch: int, branch_id: str, manifest: dict[str, Any],
                      cached: bool) -> None:
        record = self._require(epoch, cached)
        branch = self._branches.get((epoch, branch_id)) if cached else None
        branch = branch or self.store.read_branch(epoch, branch_id)
        if branch is None:
            raise UnknownBranch(f"branch {branch_id} of xid {record.xid} was never registered")
        if _prepared_already(branch, manifest):
            return
        if (record.state is not XidState.INITIALIZED or branch.attempt != record.attempt
                or branch.state is BranchState.ABORTED):
            raise XidDecided(f"xid {record.xid} is {record.state.value} (attempt "
                             f"{record.attempt}); branch {branch_id} cannot prepare")
        data = branch.moved_to(BranchState.PREPARED, manifest=manifest).to_bytes()
        multi = Multi(self.store.client)
        multi.check(self.layout.xid(epoch), record.version, label="xid")
        multi.set_data(self.layout.branch(epoch, branch_id), data, branch.version,
                       label="branch")
        try:
            multi.commit()
        except MultiFailed:
            self._branches.pop((epoch, branch_id), None)
            raise
        self._branches[(epoch, branch_id)] = BranchRecord.from_bytes(  # as a reader sees it
            self.store.sink_id, epoch, branch_id, data, branch.version + 1)

    def _select_once(self, epoch: int, generation: int, branch_ids: list[str],
                     cached: bool) -> None:
        record = self._require(epoch, cached)
        _require_undecided(record)
        new = [b for b in dict.fromkeys(branch_ids) if b not in record.selected]
        if new:
            self._require_prepared(record, new)
            self._write(record, generation, record.changed(
                "select", selected=(*record.selected, *new), updated=time.time()))

    def _commit_once(self, epoch: int, generation: int, winners: list[str] | None,
                     txn_version: int | None, cached: bool,
                     given: dict[str, BranchRecord] | None = None
                     ) -> tuple[XidRecord, bool, dict[str, BranchRecord], frozenset[str] | None]:
        record = self._require(epoch, cached)
        if record.state in (XidState.COMMITTING, XidState.COMMITTED):
            # decided already (by this object, if it proved the branches: say them)
            every = self._every[1] if self._every and self._every[0] == epoch else None
            return record, False, {}, every
        _require_undecided(record)
        chosen = list(dict.fromkeys(record.selected if winners is None else winners))
        try:
            known = self._require_prepared(record, chosen, given if cached else None)
        except WinnerNotPrepared as exc:
            # A winner leaves Prepared only once the xid is decided or re-attempted: a
            # rival rolled it back after ``record`` was read. Finish (or refuse) from the
            # fresh read, remembered (a decided record is not read again); a writer the
            # rival took the sink over from is told so.
            fresh = self._require(epoch, cached=False)
            if fresh.version == record.version:
                raise self.sink_generation.taken_over(generation, exc) or exc from None
            return self._commit_once(epoch, generation, winners, txn_version, cached=True)
        decided = record.moved_to(XidState.COMMITTING, generation, winners=tuple(chosen),
                                  decided_at=time.time(), txn_version=txn_version)
        # every branch this attempt knows of: all there are if the registrations' count
        # says so, checked by the decision itself (a registration after it cannot pass)
        seen = frozenset({*chosen, *(given or {}), *known,
                          *(b for e, b in self._branches if e == epoch)})
        try:
            written = self._write(record, generation, decided,
                                  registered=(self.layout.branches(epoch), len(seen)))
        except MultiFailed as failed:
            if failed.label != REGISTERED:
                raise
            # another branch exists (or one an older release registered): list them later
            return self._write(record, generation, decided), True, known, None
        self._every = (epoch, seen)
        return written, True, known, seen

    def _abort_once(self, epoch: int, generation: int, older_than: int | None,
                    judged_version: int | None, cached: bool) -> tuple[XidRecord, bool]:
        record = self._require(epoch, cached and judged_version is None)
        if record.state in (XidState.COMMITTING, XidState.COMMITTED):
            raise XidDecided(f"xid {record.xid} is {record.state.value}: it will be "
                             "published, it cannot be aborted")
        if record.state in (XidState.ABORTING, XidState.ABORTED):
            return record, False
        if older_than is not None and record.generation >= older_than:
            return record, False  # adopted by a current writer meanwhile: leave it
        if judged_version is not None and record.version != judged_version:
            return record, False  # changed since it was judged abandoned: judge again
        return self._write(record, generation, record.moved_to(
            XidState.ABORTING, generation, decided_at=time.time())), True

    def _metrics_once(self, epoch: int, metrics: dict[str, Any],
                      known: XidRecord | None) -> None:
        record = known or self._require(epoch, cached=False)
        merged = record.changed("metrics", metrics={**record.metrics, **metrics})
        multi = Multi(self.store.client)
        multi.set_data(self.layout.xid(epoch), merged.to_bytes(), record.version, label="xid")
        multi.commit()
        self._remember(replace(merged, version=record.version + 1))

    # -- shared ------------------------------------------------------------------------

    def _run(self, epoch: int, generation: int, one_try: Callable[[bool], T]) -> T:
        """Run ``one_try`` under the retry policy until its multi-op applies; after a
        conflict, read again (no cache) and decide again."""
        return self.store.run(self._until_applied, epoch, generation, one_try)

    def _until_applied(self, epoch: int, generation: int, one_try: Callable[[bool], T]) -> T:
        for attempt in range(CONFLICT_RETRIES):
            try:
                return one_try(attempt == 0)
            except MultiFailed as failed:
                self._xids.pop(epoch, None)
                settle(failed, self.store, generation, f"{self.store.sink_id}/{epoch}")
        raise ForceRetryError()  # heavy contention: back off under the retry policy

    def _read(self, epoch: int, cached: bool) -> XidRecord | None:
        record = self._xids.get(epoch) if cached else None
        if record is None or record.state is not XidState.INITIALIZED:
            record = self.store.read_xid(epoch)
        self._remember(record)
        return record

    def _require(self, epoch: int, cached: bool) -> XidRecord:
        record = self._read(epoch, cached)
        if record is None:
            raise UnknownXid(f"xid {self.store.sink_id}/{epoch} has no record; "
                             "begin it first")
        return record

    def _remember(self, record: XidRecord | None) -> None:
        if record is not None:
            self._xids[record.epoch] = record

    def _fenced(self, generation: int) -> Multi:
        return self.sink_generation.guard(Multi(self.store.client), generation)

    def _lost(self, epoch: int, last: int) -> SinkTreeDamaged:
        """The refusal to begin the epoch ``last_committed`` names when it has no record.

        That epoch committed, and only a streaming replay begins it again; its record
        exists (or was pruned, recorded as such). Missing, it was lost, and a new xid
        would write the micro-batch a second time. (An allocated epoch lies above it; a
        streaming query cannot go below it: ``coordinator/protocol/stream.py``.)"""
        return SinkTreeDamaged(
            f"{self.layout.xid(epoch)} is missing although the sink's last committed epoch "
            f"is {last}: the record of epoch {epoch} was lost, and whether it committed "
            "cannot be told. Nothing was written. If its rows are in the target (`txsink "
            f"verify`), record it with `txsink reset --sink {self.store.sink_id} "
            f"--committed-through {last}`; otherwise restore the record from a backup")

    def _create(self, epoch: int, generation: int, holder: tuple[str, bytes] | None,
                last_committed_version: int | None = None, record: XidRecord | None = None,
                registering: tuple[str, dict[str, Any]] | None = None, defer: bool = False
                ) -> XidState:
        """Create the xid (``record``: as a deferring begin made it), with the first
        branch's registration where ``registering`` (branch id, owner) names it;
        ``defer``: left to the epoch's first registration (:meth:`begin`)."""
        now = time.time()
        record = record or XidRecord(self.store.sink_id, epoch, XidState.UNKNOWN, generation,
                                     created=now, updated=now,
                                     liveness=WATCHED if holder else None,
                                     ).moved_to(XidState.INITIALIZED, generation)
        if defer:
            self._deferred[epoch] = (record, last_committed_version)
            self._remember(replace(record, version=0))
            return XidState.INITIALIZED
        multi = self._fenced(generation)
        multi.create(self.layout.xid(epoch), record.to_bytes(), label="xid")
        multi.create(self.layout.branches(epoch), label="branches")
        multi.create(self.layout.publisher(epoch), label="publisher")  # the lease's folder
        multi.create(self.layout.open_marker(epoch), label="open")
        last_committed = LastCommitted(self.store)
        if last_committed_version is not None:
            last_committed.check(multi, last_committed_version)
        if holder is not None:  # watched from its first instant: no window to misjudge
            Liveness(self.store).add_to(multi, epoch, *holder)
        branch = None
        if registering is not None:
            branch = self._new_branch(replace(record, version=0), *registering, generation)
            multi.create(self.layout.branch(epoch, branch.branch_id), branch.to_bytes(),
                         label="branch")
            multi.set_data(self.layout.branches(epoch), b"", -1, label="branch")
        try:
            multi.commit()
        except MultiFailed as failed:
            if failed.label == LAST_COMMITTED:  # moved since this process wrote it
                last_committed.forget()
            raise
        self._remember(replace(record, version=0))
        if branch is not None:
            self._branches[(epoch, branch.branch_id)] = replace(branch, version=0)
        return XidState.INITIALIZED

    def _new_branch(self, record: XidRecord, branch_id: str, owner: dict[str, Any],
                    generation: int) -> BranchRecord:
        now = time.time()
        return BranchRecord(self.store.sink_id, record.epoch, branch_id, BranchState.UNKNOWN,
                            generation, record.attempt, owner=dict(owner), created=now,
                            updated=now).moved_to(BranchState.INITIALIZED)

    def _write(self, current: XidRecord, generation: int, new: XidRecord,
               reopen: bool = False, registered: tuple[str, int] | None = None
               ) -> XidRecord:
        """One fenced compare-and-set of the xid record (plus its open-index entry;
        ``registered``: the check that the branches folder counts that many
        registrations, failing with label ``REGISTERED``)."""
        multi = self._fenced(generation)
        multi.set_data(self.layout.xid(current.epoch), new.to_bytes(), current.version,
                       label="xid")
        if reopen:
            multi.create(self.layout.open_marker(current.epoch), label="open")
        if registered is not None:
            multi.check(*registered, label=REGISTERED)
        multi.commit()
        written = replace(new, version=current.version + 1)
        self._remember(written)
        return written

    def _require_prepared(self, record: XidRecord, branch_ids: list[str],
                          given: dict[str, BranchRecord] | None = None
                          ) -> dict[str, BranchRecord]:
        """Read the would-be winners (those not ``given``, nor, with ``given``, prepared
        by this coordinator in the xid's attempt); each must be ``Prepared`` in the
        current attempt."""
        if given is not None:  # a first try: what this attempt read or wrote
            given = {**self._prepared_in(record, branch_ids),
                     **{b: given[b] for b in branch_ids if b in given}}
        else:
            given = {}
        missing = [b for b in branch_ids if b not in given]
        found = {**given, **(self.store.read_branches(record.epoch, missing) if missing else {})}
        for branch_id in branch_ids:
            branch = found.get(branch_id)
            if branch is None:
                raise UnknownBranch(f"winner {branch_id} of xid {record.xid} was never "
                                    "registered")
            if branch.state is not BranchState.PREPARED or branch.attempt != record.attempt:
                raise WinnerNotPrepared(
                    f"winner {branch_id} of xid {record.xid} is {branch.state.value} in "
                    f"attempt {branch.attempt} (xid attempt {record.attempt}); only a "
                    "Prepared branch of the current attempt can win")
        return found


def _prepared_already(branch: BranchRecord, manifest: dict[str, Any]) -> bool:
    """True for a repeated prepare with the same manifest; a different one is refused."""
    if branch.state not in (BranchState.PREPARED, BranchState.COMMITTED):
        return False
    if branch.manifest != manifest:
        raise InvalidTransition(f"branch {branch.branch_id} of xid {branch.xid} is already "
                                f"{branch.state.value} with another manifest")
    return True


def _require_undecided(record: XidRecord) -> None:
    if record.state in (XidState.ABORTING, XidState.ABORTED):
        raise XidAborted(f"xid {record.xid} attempt {record.attempt} is {record.state.value}")
    if record.state is not XidState.INITIALIZED:
        raise XidDecided(f"xid {record.xid} is {record.state.value}")
