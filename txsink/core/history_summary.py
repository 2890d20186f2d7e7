"""What a committed xid wrote, per target partition, and the sink's summary of pruned ones.

Retention (``coordinator/upkeep/retention.py``) removes finished xids; before a committed one
goes, :func:`fold_into` adds what it wrote to the sink's summary: per (server, database,
table, partition) the rows and the content digest since the last dynamic overwrite of
that partition (both add up: ``server_ext.types.digest``), the epochs and decision times
they span. Its size depends on the partitions written, not on the epochs. ``txsink
verify`` reads the retained xids with :func:`xid_writes` and the summary with
:func:`summary_entries`, and judges each partition on their sum.

:func:`retain_after_commit` is the writers' retention step, called after their own
``Committed`` write: a bounded pass (``Coordinator.retain``) at most every
:func:`pass_interval` seconds per sink and process, at once again while a backlog is
left. It never fails the commit it follows (a failed pass is logged; the next one repeats
it). Any number of writers and operators may run it at once.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

from coordinator import Coordinator
from coordinator.upkeep.retention import DecidedXid, Fold, Summary
from server_ext.types import ContentDigest, digest_union
from txsink.core.metrics import EpochMetrics
from txsink.core.payload import contributions, from_record
from txsink.core.publisher import server_of
from txsink.core.tuning import DEFAULT_TUNING, Tuning
from txsink.options import SinkOptions

log = logging.getLogger(__name__)

MAX_PASS_INTERVAL = 60.0  # seconds between two writers' passes of one sink, at most


class Unreadable(Exception):
    """A winner's record does not say what it published."""


class PartitionWrite(NamedTuple):
    """The rows one committed xid put into one partition of one table on one server."""

    server: str
    database: str
    table: str
    partition_id: str
    value: str
    rows: int
    overwrite: bool
    digest: ContentDigest | None  # None: a branch sealed without one


def xid_writes(decided: DecidedXid, default_url: str | None) -> list[PartitionWrite]:
    """What each winner of ``decided`` put where, one entry per (server, table, partition);
    :class:`Unreadable` when a winner's record cannot say."""
    record = decided.record
    if decided.missing:
        raise Unreadable(f"winner {decided.missing[0]} has no record")
    totals: dict[tuple[str, str, str, str], list[Any]] = {}
    # partitions an operator gave up (txsink resolve --give-up) were never published
    given_up = {(g.branch, g.partition) for g in EpochMetrics.from_dict(record.metrics).given_up}
    for branch in decided.winners:
        server = server_of(branch) or default_url
        try:
            found = from_record(branch.manifest)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            raise Unreadable(f"winner {branch.branch_id} has no readable manifest") from exc
        if found is None:
            raise Unreadable(f"winner {branch.branch_id} has no readable manifest")
        if server is None:
            raise Unreadable(f"winner {branch.branch_id} names no server (pass --url)")
        for share in contributions(found):
            if (branch.branch_id, share.partition_id) in given_up:
                continue
            entry = totals.setdefault(
                (server, share.database, share.table, share.partition_id),
                [share.value, 0, found.overwrite, []])
            entry[1] += share.rows
            entry[3].append(share.digest)
    return [PartitionWrite(server, database, table, pid, value, rows, overwrite,
                           digest_union(digests))
            for (server, database, table, pid), (value, rows, overwrite, digests)
            in totals.items()]


@dataclass(frozen=True)
class SummaryEntry:
    """One partition in a sink's summary: ``rows`` and ``digest`` of the pruned xids'
    writes since ``first`` (an overwrite, when ``overwrite``), decided from ``first_at``
    to ``last_at``; ``digest`` None when one of them recorded none."""

    server: str
    database: str
    table: str
    partition_id: str
    value: str
    rows: int
    digest: ContentDigest | None
    overwrite: bool
    first: int
    last: int
    first_at: float
    last_at: float

    @property
    def key(self) -> str:
        return json.dumps([self.server, self.database, self.table, self.partition_id])

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "rows": self.rows,
                "digest": self.digest.to_json() if self.digest else None,
                "overwrite": self.overwrite, "first": self.first, "last": self.last,
                "first_at": self.first_at, "last_at": self.last_at}

    @classmethod
    def from_json(cls, key: str, raw: dict[str, Any]) -> SummaryEntry:
        server, database, table, partition_id = json.loads(key)
        digest = raw.get("digest")
        return cls(server, database, table, partition_id, raw["value"], int(raw["rows"]),
                   ContentDigest.from_json(digest) if digest else None,
                   bool(raw["overwrite"]), int(raw["first"]), int(raw["last"]),
                   float(raw["first_at"]), float(raw["last_at"]))

    def plus(self, write: PartitionWrite, epoch: int, at: float) -> SummaryEntry:
        """This entry with ``write`` (decided at ``at``, after every write in it) added."""
        if write.overwrite:  # what came before is replaced
            return _entry(write, epoch, at)
        return SummaryEntry(
            self.server, self.database, self.table, self.partition_id, self.value,
            self.rows + write.rows,
            digest_union([self.digest, write.digest]) if self.digest else None,
            self.overwrite, self.first, epoch, self.first_at, at)


def _entry(write: PartitionWrite, epoch: int, at: float) -> SummaryEntry:
    return SummaryEntry(write.server, write.database, write.table, write.partition_id,
                        write.value, write.rows, write.digest, write.overwrite, epoch, epoch,
                        at, at)


def summary_entries(summary: Summary) -> list[SummaryEntry]:
    """The partitions of a sink's summary."""
    return [SummaryEntry.from_json(key, raw) for key, raw in sorted(summary.partitions.items())]


def fold_into(default_url: str | None) -> Fold:
    """The fold retention calls before a committed xid goes (``coordinator.upkeep.retention``):
    its writes added to the summary's partitions; None when they cannot be told."""

    def fold(partitions: dict[str, Any], decided: DecidedXid) -> dict[str, Any] | None:
        try:
            writes = xid_writes(decided, default_url)
        except Unreadable:
            return None
        record = decided.record
        at = record.decided_at or record.updated
        for write in writes:
            key = json.dumps([write.server, write.database, write.table, write.partition_id])
            found = partitions.get(key)
            entry = (SummaryEntry.from_json(key, found).plus(write, record.epoch, at)
                     if found is not None else _entry(write, record.epoch, at))
            partitions[key] = entry.to_json()
        return partitions

    return fold


def pass_interval(retention: float) -> float:
    """Seconds between a writer's retention passes of one sink: a twentieth of the
    retention (the retained window then swings by at most 5%), at most
    :data:`MAX_PASS_INTERVAL` (a pass that left a backlog is followed at once)."""
    return min(retention / 20, MAX_PASS_INTERVAL)


_next_pass: dict[tuple[object, ...], float] = {}  # (store, root, sink) -> monotonic time


def retain_after_commit(options: SinkOptions, coord: Coordinator,
                        tuning: Tuning = DEFAULT_TUNING) -> None:
    """The writers' retention step (module docstring); call after a ``Committed`` write;
    one pass removes at most ``tuning.retention_pass_xids`` xids."""
    if not options.transaction.retention:
        return
    key = (options.store.root_identity, options.store.zk_root, coord.sink_id)
    now = time.monotonic()
    if _next_pass.get(key, 0.0) > now:
        return
    _next_pass[key] = now + pass_interval(options.transaction.retention)
    try:
        done = coord.retain(options.transaction.retention, fold_into(options.connection.url),
                            limit=tuning.retention_pass_xids)
    except Exception as exc:  # noqa: BLE001 - the commit is done; the next pass repeats
        log.warning("txsink sink=%s retention pass failed (the next one repeats it): %s",
                    coord.sink_id, exc)
        return
    if done.more:
        _next_pass[key] = now
    if done.pruned:
        log.info("txsink sink=%s retention removed epochs %d..%d (%d xids)", coord.sink_id,
                 done.pruned[0], done.pruned[-1], len(done.pruned))
