"""Publish and roll back branches from their records in the coordinator's store alone.

The coordinator decides; this module is the callback that turns a decision into
ClickHouse statements. It needs nothing but the branch records (payload, strategy,
staging name), so a restarted driver, ``txsink recover`` or another sink's recovery can
finish a commit that a crashed process decided. Both keep the callback contract of
``coordinator.protocol.callbacks`` and answer with its outcomes: a server error marked
``retryable`` is ``RetryLater``, any other server error ``Failed`` (as is whatever else
they raise), a repeat that found every partition published ``AlreadyDone``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import replace

import server_ext
from coordinator import (
    AlreadyDone,
    BranchRecord,
    Coordinator,
    CoordinatorError,
    Done,
    Failed,
    Outcome,
    RetryLater,
    put_together,
)
from server_ext.client import ClickHouseClient
from server_ext.publish import (
    COMBINED,
    DEFAULT_LIMITS,
    PublishLedger,
    PublishRecord,
    PublishReport,
    SizeLimits,
    Strategy,
    combine_key,
    move_apart,
    move_together,
    publish,
    publish_combined,
    publish_overwrite,
)
from txsink.core import crashpoints
from txsink.core.operator_records import StrategySwitch
from txsink.core.payload import (
    CombinedBranch,
    StagedBranch,
    direct_sources,
    from_record,
    staged_manifest,
    staging_place,
)
from txsink.core.tuning import DEFAULT_TUNING

log = logging.getLogger(__name__)


class BranchPublisher:
    """Callbacks for :meth:`Coordinator.commit`, ``abort`` and ``recover``.

    Each branch is published on, and rolled back from, the server that holds its staging
    (recorded with the branch); ``client_for(None)`` serves records written before
    branches named their server. A combined branch publishes its sources in one pass;
    they are rolled back (dropped) as non-winners once the xid is ``Committed``. A
    published winner's own staging is dropped in the background (``drain`` waits).
    ``tables``: the target and its views' tables as the plan described them, from which
    the branches' staging tables were created; a combined table is created from its
    table's description (a publisher without it, as in recovery, describes the table).

    Usage (leaving the block waits for the background drops, as ``drain`` does)::

        with BranchPublisher(lambda url: ClickHouseClient(url or default_url), coord) as p:
            coord.commit(epoch, generation, winners, publish=p.publish, rollback=p.rollback)
    """

    def __init__(self, client_for: Callable[[str | None], ClickHouseClient],
                 coord: Coordinator, limits: SizeLimits = DEFAULT_LIMITS,
                 tables: tuple[server_ext.TargetTable, ...] = (),
                 release_workers: int = DEFAULT_TUNING.release_workers) -> None:
        self.client_for = client_for
        self.coord = coord
        self.limits = limits
        self.release_workers = release_workers
        self.tables = {(t.database, t.name): t for t in tables}
        self._known: dict[tuple[int, str], BranchRecord] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[tuple[BranchRecord, Future[None]]] = []
        self._lock = threading.Lock()
        self._target_locks: dict[tuple[str | None, str, str], threading.Lock] = {}

    def __enter__(self) -> BranchPublisher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.drain()

    def remember(self, records: Iterable[BranchRecord]) -> None:
        """Branch records the caller has just read (spares reading sources again)."""
        self._known.update(((r.epoch, r.branch_id), r) for r in records)

    def publish(self, record: BranchRecord) -> Outcome:
        """Publish a winner, then drop its staging in the background."""
        try:
            report = self._publish(record)
        except server_ext.ClickHouseError as exc:
            return judged(exc)
        self._release(record)
        if report is not None and report.already_published and not report.published:
            return AlreadyDone(f"partitions {report.already_published} were published")
        return Done()

    def _publish(self, record: BranchRecord) -> PublishReport | None:
        payload = from_record(record.manifest)
        if payload is None:
            raise CoordinatorError(f"xid {record.xid}: winner {record.branch_id} has no payload")
        client = self.client_for(server_of(record))
        ledger = self.coord.ledger(record.epoch, record.branch_id)
        strategy = switched_strategy(self.coord, record, ledger) or payload.strategy
        if isinstance(payload, CombinedBranch):
            records = [] if payload.embedded else self.source_records(record, payload)
            sources = list(payload.embedded) or [staged_manifest(r) for r in records]
            if payload.overwrite:
                return publish_overwrite(client, sources, payload.staging, ledger,
                                         on_step=crashpoints.hit)
            return publish_combined(client, sources, payload.staging, strategy, ledger,
                                    precombined=payload.precombined,
                                    direct=direct_sources(records, payload.precombined),
                                    target=self.tables.get(payload.target),
                                    on_step=crashpoints.hit, limits=self.limits)
        if not payload.manifest.partitions:
            return None
        # an operator's switch: ``groups`` judged the recorded strategy, so one at a time
        switched = self._target_lock(record) if strategy != payload.strategy else nullcontext()
        with switched:
            return publish(client, payload.manifest, strategy, ledger, on_step=crashpoints.hit)

    @staticmethod
    def groups(winners: Sequence[BranchRecord]) -> list[list[BranchRecord]]:
        """``Coordinator.commit``'s ``publish_groups``: the winners of one server and
        target table form one group, published by :meth:`publish_group`; different
        groups are published at once. One combined branch per server and table
        (``txsink.core.combine``) makes most groups one winner."""
        by_target: dict[tuple[str | None, str, str], list[BranchRecord]] = {}
        for record in winners:
            by_target.setdefault(target_of(record), []).append(record)
        return list(by_target.values())

    @staticmethod
    def together(records: Sequence[BranchRecord]) -> list[server_ext.Manifest]:
        """The manifests of ``records`` if :meth:`publish_group` publishes them together
        (``move`` winners of their own staging that ``move_apart``), else none."""
        payloads = [from_record(r.manifest) for r in records]
        moved = [p.manifest for p in payloads if isinstance(p, StagedBranch)
                 and p.strategy == Strategy.MOVE and not p.overwrite]
        return moved if len(moved) == len(records) > 1 and move_apart(moved) else []

    def publish_group(self, records: list[BranchRecord]) -> Outcome:
        """``Coordinator.commit``'s ``publish_group``: ``move`` winners of their own
        staging that ``move_apart`` lets publish independently go together
        (``server_ext.publish.move_together``: one intent write, one confirm); any other
        group one winner after another, as :meth:`publish` each."""
        moved = self.together(records)
        ledgers = [self.coord.ledger(r.epoch, r.branch_id) for r in records] if moved else []
        if not ledgers or any(switched_strategy(self.coord, r, ledger)
                              for r, ledger in zip(records, ledgers, strict=True)):
            for record in records:
                outcome = self.publish(record)
                if not isinstance(outcome, Done | AlreadyDone):
                    return outcome
            return Done()
        try:
            move_together(self.client_for(server_of(records[0])),
                          list(zip(moved, ledgers, strict=True)), put_together,
                          on_step=crashpoints.hit)
        except server_ext.ClickHouseError as exc:
            return judged(exc)
        for record in records:
            self._release(record)
        return Done()

    def _target_lock(self, record: BranchRecord) -> threading.Lock:
        with self._lock:
            return self._target_locks.setdefault(target_of(record), threading.Lock())

    def _release(self, record: BranchRecord) -> None:
        """Drop a published winner's staging in the background.

        Its rows are visible and its publish recorded, so the drop only frees space; on
        18.16 dropping a table of many parts takes seconds, which the commit need not
        wait for. A repeat of the publish needs nothing of it (the ledger says what is
        done), exactly as when the drop was synchronous.
        """
        with self._lock:  # winners of different groups are published at once
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.release_workers,
                                                thread_name_prefix="txsink-release")
            self._pending.append((record, self._pool.submit(self.drop_staging, record)))

    def drain(self) -> None:
        """Wait for the staging drops ``publish`` started; a failed one is logged and its
        staging left to ``txsink gc``. Leaving the publisher's ``with`` block calls it."""
        with self._lock:
            pending, self._pending = self._pending, []
        for record, future in pending:
            try:
                future.result()
            except Exception as exc:  # noqa: BLE001 - a drop only frees space
                log.warning("xid %s: staging of winner %s left for txsink gc: %s",
                            record.xid, record.branch_id, exc)

    def source_records(self, record: BranchRecord, combined: CombinedBranch
                       ) -> list[BranchRecord]:
        """The records of a combined branch's sources, in source order."""
        missing = [b for b in combined.sources if (record.epoch, b) not in self._known]
        if missing:
            self.remember(self.coord.branches(record.epoch, missing))
        found = [self._known.get((record.epoch, b)) for b in combined.sources]
        lost = [b for b, source in zip(combined.sources, found, strict=True) if source is None]
        if lost:
            raise CoordinatorError(f"xid {record.xid}: sources {lost} of {record.branch_id} "
                                   "have no record; the record was altered")
        return [source for source in found if source is not None]

    def rollback(self, record: BranchRecord) -> Outcome:
        """The rollback callback: :meth:`drop_staging`, its errors judged."""
        try:
            self.drop_staging(record)
        except server_ext.ClickHouseError as exc:
            return judged(exc)
        return Done()

    def drop_staging(self, record: BranchRecord) -> None:
        """Drop the branch's staging table (and the staging view filling it, for a
        materialized view's share); on an unreachable server, leave it.

        A branch that is rolled back is never published, so its staging table can never
        become visible: ``txsink gc`` drops it once the xid is finished. Failing instead
        would keep a decided xid ``Committing`` (and fail the job) for as long as one
        replica that a failed task attempt chose stays down.
        """
        place = staging_place(record)
        if place is None:
            return
        try:
            server_ext.rollback(self.client_for(place.server), place.staging, view=place.view)
        except server_ext.ServerUnreachable as exc:
            log.warning("xid %s: staging %s of branch %s left for txsink gc: %s",
                        record.xid, place.staging, record.branch_id, exc)


def judged(error: server_ext.ClickHouseError) -> Outcome:
    """A server's error as a callback outcome: ``retryable`` (repeating the statement is
    safe and may succeed) asks for a retry; anything else is a known failure."""
    if error.retryable:
        return RetryLater(str(error), error)
    return Failed(str(error), error)


def switched_strategy(coord: Coordinator, record: BranchRecord,
                      ledger: PublishLedger | None = None) -> str | None:
    """The strategy an operator switched a winner to (``txsink recover --strategy``, see
    txsink.ops for when a switch is safe), None for a winner never switched. Every
    publisher honours it: a job's recovery as much as the operator's. ``ledger``: the
    branch's, if the caller has it (its entries are read once)."""
    switch = StrategySwitch.load(ledger or coord.ledger(record.epoch, record.branch_id))
    return switch.to if switch else None


def target_of(record: BranchRecord) -> tuple[str | None, str, str]:
    """What a winner's publish touches: its server and target table."""
    payload = from_record(record.manifest)
    if isinstance(payload, CombinedBranch):
        database, table = payload.target
    elif isinstance(payload, StagedBranch):
        database, table = payload.manifest.target_database, payload.manifest.target_table
    else:
        database = table = ""
    return server_of(record), database, table


def server_of(record: BranchRecord) -> str | None:
    """The URL of the server holding the branch's staging (None: the default server)."""
    place = staging_place(record)
    return place.server if place else None


def publish_manifest(coord: Coordinator, record: BranchRecord) -> server_ext.Manifest | None:
    """The manifest whose partitions a winner's publish makes visible, for operators;
    None for a dynamic overwrite (replaced as a whole) or a branch without payload.

    A combined branch's is the combined table's sealed manifest once it is recorded;
    before that, the sources' partitions under the combined table's name (what its
    publish record will be keyed by).
    """
    payload = from_record(record.manifest)
    if payload is None or payload.overwrite:
        return None
    if isinstance(payload, StagedBranch):
        return payload.manifest
    entry = PublishRecord.load(coord.ledger(record.epoch, record.branch_id),
                               combine_key(payload.staging))
    if entry is not None and entry.state == COMBINED and entry.manifest is not None:
        return entry.manifest
    sources = [from_record(r.manifest) for r in coord.branches(record.epoch, payload.sources)]
    manifests = [s.manifest for s in sources if isinstance(s, StagedBranch)]
    if not manifests:
        return None
    partitions = {p.partition_id: p for m in manifests for p in m.partitions}
    return replace(manifests[0], staging_table=payload.staging,
                   partitions=tuple(partitions[pid] for pid in sorted(partitions)))


def recorded_strategy(record: BranchRecord) -> str:
    """The publish strategy a branch was prepared with ("" without payload)."""
    payload = from_record(record.manifest)
    return payload.strategy if payload else ""
