"""What a committed xid wrote, per target partition, and the sink's summary of pruned ones.

One record says what one xid (or, summarized, a run of pruned xids) wrote to one
partition of one table on one server: :class:`PartitionWrite`; the summary's
:class:`SummaryEntry` and ``txsink verify``'s ``Contribution`` embed it.

Retention (``coordinator/upkeep/retention.py``) removes finished xids; before a committed one
goes, :func:`fold_into` adds what it wrote to the sink's summary: per (server, database,
table, partition) the rows and the content digest since the last dynamic overwrite of
that partition (both add up: ``server_ext.types.digest``), the epochs and decision times
they span. Its size depends on the partitions written, not on the epochs. ``txsink
verify`` reads the retained xids with :func:`xid_writes` and the summary with
:func:`summary_entries`, and judges each partition on their sum. The writers' trigger of
retention is ``txsink.core.retention_step``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from coordinator.upkeep.retention import DecidedXid, Fold, Summary
from server_ext.types import ContentDigest, digest_union
from txsink.core.metrics import EpochMetrics
from txsink.core.payload import contributions, from_record
from txsink.core.publisher import server_of


class Unreadable(Exception):
    """A winner's record does not say what it published."""


class PartitionWrite(NamedTuple):
    """The rows an xid put into one partition of one table on one server (or, in a
    summary, the pruned xids since the partition's last overwrite, when ``overwrite``)."""

    server: str
    database: str
    table: str
    partition_id: str
    value: str
    rows: int
    overwrite: bool
    digest: ContentDigest | None  # None: a branch sealed without one

    @property
    def key(self) -> str:
        """Where it went, as the summary's key: JSON of (server, database, table, partition)."""
        return json.dumps([self.server, self.database, self.table, self.partition_id])

    def plus(self, later: PartitionWrite) -> PartitionWrite:
        """This write followed by ``later`` to the same partition: replaced by an
        overwrite, else added up (the digest None unless both have one of one scheme)."""
        if later.overwrite:
            return later
        return self._replace(
            rows=self.rows + later.rows,
            digest=digest_union([self.digest, later.digest]) if self.digest else None)


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
    """One partition in a sink's summary: the pruned xids' ``write`` since epoch ``first``
    (an overwrite, when ``write.overwrite``) up to ``last``, decided from ``first_at`` to
    ``last_at``.

    Stored in the sink's summary record: :meth:`to_json`'s form (keyed by
    ``write.key``) is what the coordinator keeps, the same as before the write was a
    record of its own.
    """

    write: PartitionWrite
    first: int
    last: int
    first_at: float
    last_at: float

    @property
    def key(self) -> str:
        return self.write.key

    def to_json(self) -> dict[str, Any]:
        write = self.write
        return {"value": write.value, "rows": write.rows,
                "digest": write.digest.to_json() if write.digest else None,
                "overwrite": write.overwrite, "first": self.first, "last": self.last,
                "first_at": self.first_at, "last_at": self.last_at}

    @classmethod
    def from_json(cls, key: str, raw: dict[str, Any]) -> SummaryEntry:
        server, database, table, partition_id = json.loads(key)
        digest = raw.get("digest")
        write = PartitionWrite(server, database, table, partition_id, raw["value"],
                               int(raw["rows"]), bool(raw["overwrite"]),
                               ContentDigest.from_json(digest) if digest else None)
        return cls(write, int(raw["first"]), int(raw["last"]), float(raw["first_at"]),
                   float(raw["last_at"]))

    @classmethod
    def first_of(cls, write: PartitionWrite, epoch: int, at: float) -> SummaryEntry:
        """The entry of a partition's first pruned write (or of an overwrite)."""
        return cls(write, epoch, epoch, at, at)

    def plus(self, write: PartitionWrite, epoch: int, at: float) -> SummaryEntry:
        """This entry with ``write`` (decided at ``at``, after every write in it) added."""
        if write.overwrite:  # what came before is replaced
            return SummaryEntry.first_of(write, epoch, at)
        return replace(self, write=self.write.plus(write), last=epoch, last_at=at)


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
            found = partitions.get(write.key)
            entry = (SummaryEntry.from_json(write.key, found).plus(write, record.epoch, at)
                     if found is not None else SummaryEntry.first_of(write, record.epoch, at))
            partitions[write.key] = entry.to_json()
        return partitions

    return fold
