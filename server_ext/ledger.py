"""Publish records: the small durable memory that makes publish re-runnable.

The caller backs the ``Ledger`` with durable storage (txsink: ZooKeeper, under the branch
record, through the coordinator). Publish keeps one record per staging table, keyed by the
staging table's name: ``{"state": "attaching", ...}`` before the statement that makes
rows visible, ``{"state": "published"}`` after it.
"""

from __future__ import annotations

import json
from typing import Protocol

from server_ext.manifest import Manifest

PUBLISHED = "published"
ATTACHING = "attaching"


class Ledger(Protocol):
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
    """A ``Ledger`` in a dict, for tests and benchmarks (values stored as JSON text)."""

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


def ledger_key(staging_table: str) -> str:
    """Ledger key of the publish record of one staging (or combined) table."""
    return staging_table


def resolve_partition(manifest: Manifest, partition_id: str, ledger: Ledger, *,
                      attached: bool) -> None:
    """Record an operator's decision on an in-doubt or deduplicated partition.

    ``attached=True``: the rows are in the target (or their loss is accepted); publish
    will not attach the partition again. ``attached=False``: they are not; the next
    ``publish`` attaches it afresh (for a deduplicated partition the server will drop it
    again: its rows must be copied some other way).
    """
    manifest.partition(partition_id)  # KeyError for a partition the manifest lacks
    key = ledger_key(manifest.staging_table)
    record = ledger.get(key) or {"state": ATTACHING}
    if record.get("state") == PUBLISHED:
        return
    published = set(record.get("published", []))
    if attached:
        published.add(partition_id)
    record.update(
        published=sorted(published),
        attaching=[pid for pid in record.get("attaching", []) if pid != partition_id],
        deduplicated=[pid for pid in record.get("deduplicated", []) if pid != partition_id],
    )
    ledger.put(key, record)
