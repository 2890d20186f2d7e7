"""Publish records: the small durable memory that makes publish re-runnable.

The caller backs the ``PublishLedger`` with durable storage (txsink: the coordinator's
store, under the branch record, through the coordinator). Publish keeps one
:class:`PublishRecord` per staging table, keyed by the staging table's name: ``attaching``
(an intent) before the statement that makes rows visible, ``published`` after it; a
combined table's build is recorded as ``combined`` under its own key
(``server_ext/publish/combined.py``). The record type is the only writer and reader of
that JSON: every module reads and writes records through :meth:`PublishRecord.load` and
:meth:`PublishRecord.store`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Protocol

from server_ext.staging.manifest import Manifest

PUBLISHED = "published"
ATTACHING = "attaching"
COMBINED = "combined"
RECORD_FORMAT = 1


class PublishLedger(Protocol):
    """Durable publish records, backed by the caller (e.g. ZooKeeper).

    ``put`` must be durable when it returns; values are small JSON-safe dicts. It may
    refuse (raise) when the caller is no longer the xid's only publisher. ``confirm``
    raises unless the caller still is; publish calls it right before every statement
    that makes rows visible.
    """

    def get(self, key: str) -> dict | None: ...

    def put(self, key: str, value: dict) -> None: ...

    def confirm(self) -> None: ...


class MemoryLedger:
    """A ``PublishLedger`` in a dict, for tests and benchmarks (values stored as JSON text)."""

    def __init__(self) -> None:
        self._records: dict[str, str] = {}

    def get(self, key: str) -> dict | None:
        text = self._records.get(key)
        return None if text is None else json.loads(text)

    def put(self, key: str, value: dict) -> None:
        self._records[key] = json.dumps(value, sort_keys=True)

    def confirm(self) -> None:
        """A memory ledger has one publisher: always confirmed."""

    def keys(self) -> list[str]:
        return sorted(self._records)


class UnknownPublishRecord(ValueError):
    """A ledger entry this release cannot read (a newer format or an unknown state)."""


@dataclass(frozen=True)
class PublishRecord:
    """What publish knows of one staging (or combined) table, stored in the ledger.

    ``attaching``: partitions the statement in flight may already have made visible (an
    intent); ``published``: partitions recorded as visible; ``deduplicated``: partitions
    the server dropped as duplicates of earlier parts (``attach_replicated`` copies them
    with an INSERT); ``watermark``: the target's highest block number before an
    ``attach_marked`` attach or a ``move``; ``server_clock``: the server's clock (Unix
    seconds) read with that watermark (``move``: a repeat on a server started before it
    knows that no restart came between); ``at``: when the first ``attach_replicated`` intent was
    written; ``blocks_before`` and ``attach_watermarks``: per partition, the deduplication
    block ids and the highest block number the target held before the first
    ``attach_replicated`` ATTACH; ``dropped_parts``: per deduplicated partition, the staged
    parts the server dropped (all of them where absent); ``watermarks``: per partition, the
    target's highest block number before the INSERT of the dropped parts;
    ``manifest``: a combined table's sealed manifest (state ``combined``).

    Format 1. The records of releases before the format key read the same (the key is
    the only difference); a newer format is refused by name, never guessed at.
    """

    state: str
    attaching: tuple[str, ...] = ()
    published: tuple[str, ...] = ()
    deduplicated: tuple[str, ...] = ()
    watermark: int | None = None
    server_clock: int | None = None
    at: float | None = None
    blocks_before: dict[str, tuple[str, ...]] | None = None
    attach_watermarks: dict[str, int] | None = None
    dropped_parts: dict[str, tuple[str, ...]] | None = None
    watermarks: dict[str, int] | None = None
    manifest: Manifest | None = None

    @property
    def is_published(self) -> bool:
        return self.state == PUBLISHED

    @property
    def intended(self) -> set[str]:
        """Partitions an earlier, interrupted run may already have made visible."""
        return set(self.attaching) if self.state == ATTACHING else set()

    def to_dict(self) -> dict[str, Any]:
        raw: dict[str, Any] = {"format": RECORD_FORMAT, "state": self.state}
        if self.state == ATTACHING:
            raw.update(attaching=list(self.attaching), published=sorted(self.published))
        if self.deduplicated:
            raw["deduplicated"] = list(self.deduplicated)
        if self.watermark is not None:
            raw["watermark"] = self.watermark
        if self.server_clock is not None:
            raw["server_clock"] = self.server_clock
        if self.at is not None:
            raw["at"] = self.at
        if self.blocks_before is not None:
            raw["blocks_before"] = {pid: sorted(ids) for pid, ids in self.blocks_before.items()}
        if self.attach_watermarks is not None:
            raw["attach_watermarks"] = dict(self.attach_watermarks)
        if self.dropped_parts is not None:
            raw["dropped_parts"] = {pid: list(parts) for pid, parts in self.dropped_parts.items()}
        if self.watermarks is not None:
            raw["watermarks"] = dict(self.watermarks)
        if self.manifest is not None:
            raw["manifest"] = self.manifest.to_dict()
        return raw

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> PublishRecord:
        version = int(raw.get("format", 1))
        state = raw.get("state", ATTACHING)
        if version > RECORD_FORMAT or state not in (ATTACHING, PUBLISHED, COMBINED):
            raise UnknownPublishRecord(
                f"publish record of format {version}, state {state!r}: this release reads "
                f"format {RECORD_FORMAT}; finish the xid with the release that wrote it")
        manifest = raw.get("manifest")
        blocks = raw.get("blocks_before")
        attach_marks = raw.get("attach_watermarks")
        dropped = raw.get("dropped_parts")
        marks = raw.get("watermarks")
        return cls(state=state, attaching=tuple(raw.get("attaching", ())),
                   published=tuple(raw.get("published", ())),
                   deduplicated=tuple(raw.get("deduplicated", ())),
                   watermark=raw.get("watermark"), server_clock=raw.get("server_clock"),
                   at=raw.get("at"),
                   blocks_before=None if blocks is None else {
                       pid: tuple(ids) for pid, ids in blocks.items()},
                   attach_watermarks=None if attach_marks is None else {
                       pid: int(mark) for pid, mark in attach_marks.items()},
                   dropped_parts=None if dropped is None else {
                       pid: tuple(parts) for pid, parts in dropped.items()},
                   watermarks=None if marks is None else {
                       pid: int(mark) for pid, mark in marks.items()},
                   manifest=Manifest.from_dict(manifest) if manifest else None)

    @classmethod
    def intent(cls, attaching: Any, published: Any, **extra: Any) -> PublishRecord:
        """An ``attaching`` record: the partitions about to be made visible."""
        return cls(ATTACHING, attaching=tuple(attaching), published=tuple(sorted(published)),
                   **extra)

    @classmethod
    def load(cls, ledger: PublishLedger, key: str) -> PublishRecord | None:
        raw = ledger.get(key)
        return None if raw is None else cls.from_dict(raw)

    def store(self, ledger: PublishLedger, key: str) -> None:
        ledger.put(key, self.to_dict())


def ledger_key(staging_table: str) -> str:
    """Ledger key of the publish record of one staging (or combined) table."""
    return staging_table


def resolve_partition(manifest: Manifest, partition_id: str, ledger: PublishLedger, *,
                      attached: bool) -> None:
    """Record an operator's decision on an in-doubt or deduplicated partition.

    ``attached=True``: the rows are in the target (or their loss is accepted); publish
    will not attach the partition again. ``attached=False``: they are not; the next
    ``publish`` attaches it afresh.
    """
    manifest.partition(partition_id)  # KeyError for a partition the manifest lacks
    key = ledger_key(manifest.staging_table)
    record = PublishRecord.load(ledger, key) or PublishRecord(ATTACHING)
    if record.is_published:
        return
    published = set(record.published) | ({partition_id} if attached else set())
    replace(record, state=ATTACHING, published=tuple(sorted(published)),
            attaching=tuple(pid for pid in record.attaching if pid != partition_id),
            deduplicated=tuple(pid for pid in record.deduplicated if pid != partition_id),
            ).store(ledger, key)
