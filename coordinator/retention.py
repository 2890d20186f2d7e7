"""Retention: removing finished xids without forgetting what they decided.

A sink that commits every few seconds accumulates thousands of xid records; ZooKeeper
keeps everything in memory, so finished xids (``Committed`` or ``Aborted``) are pruned
after an age. What must survive pruning is the *answer* they gave: a replayed streaming
batch asks ``is_committed(epoch)`` long after its record is gone, and the audit must not
mistake a pruned epoch for a gap. So before deleting, the epochs are added to compact
ranges in ``<sink>/pruned`` (a streaming sink's history stays one range), and
``last_committed`` and ``next_epoch`` are never pruned.

Each xid is deleted in one multi-op guarded by the version it was read at, so an xid that
changed meanwhile (a new attempt of an aborted one) is left alone.

A sink that will never write again (a one-off batch job's, whose id is never reused) can
be forgotten as a whole with :meth:`Retention.forget_sink`: nothing open, nothing changed
for an age. Which sinks are one-off is the caller's call (``txsink gc`` decides by the id
a job without ``sink_id`` gets).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from kazoo.exceptions import BadVersionError, NoNodeError

from coordinator.multi import CHUNK_BYTES, Multi, MultiFailed, tries
from coordinator.records import XidRecord, encode
from coordinator.states import XidState
from coordinator.store import SinkStore

Ranges = list[list[int]]


def add_to_ranges(ranges: Ranges, epochs: Iterable[int]) -> Ranges:
    """Merge ``epochs`` into sorted, non-overlapping, non-adjacent ``[first, last]``s."""
    intervals = sorted([list(r) for r in ranges] + [[e, e] for e in epochs])
    merged: Ranges = []
    for lo, hi in intervals:
        if merged and lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return merged


def in_ranges(ranges: Ranges, epoch: int) -> bool:
    return any(lo <= epoch <= hi for lo, hi in ranges)


class Retention:
    """Prune finished xids of one sink; answer for the pruned ones.

    Usage::

        retention = Retention(store)
        retention.prune(7 * 24 * 3600)           # epochs removed
        retention.was_pruned_committed(12)        # True if 12 was Committed, then pruned
    """

    def __init__(self, store: SinkStore) -> None:
        self.store = store
        self.path = store.layout.pruned

    def ranges(self) -> dict[str, Ranges]:
        """``{"committed": [[lo, hi], ...], "aborted": [...]}`` of pruned epochs."""
        found = self.store.run(self.store.read_json, self.path)
        data = found[0] if found else {}
        return {"committed": data.get("committed", []), "aborted": data.get("aborted", [])}

    def was_pruned_committed(self, epoch: int) -> bool:
        return in_ranges(self.ranges()["committed"], epoch)

    def prune(self, max_age_seconds: float) -> list[int]:
        cutoff = time.time() - max_age_seconds
        epochs = self.store.run(self.store.epochs, False)
        records = self.store.run(self.store.read_xids, epochs)
        old = [r for r in records
               if r.state in (XidState.COMMITTED, XidState.ABORTED) and r.updated < cutoff]
        if not old:
            return []
        self.store.run(self._remember, old)
        return [r.epoch for r in old if self.store.run(self._delete, r)]

    def forget_sink(self, max_age_seconds: float) -> float | None:
        """Delete the whole sink if no xid is open and nothing of it (generation, xids)
        changed for ``max_age_seconds``; returns the age of its last change, None if it
        was kept. Not atomic (a recursive delete), but repeatable: a repeat after a crash
        deletes the rest. Only for sinks that nobody writes again."""
        layout = self.store.layout
        if self.store.run(self.store.epochs, True):
            return None
        records = self.store.run(self.store.read_xids, self.store.run(self.store.epochs, False))
        stat = self.store.run(self.store.client.exists, layout.generation)
        changes = [r.updated for r in records] + ([stat.mtime / 1000] if stat else [])
        age = time.time() - max(changes, default=0.0)
        if age < max_age_seconds:
            return None
        self.store.run(self.store.client.delete, layout.sink, recursive=True)
        return age

    def _remember(self, records: list[XidRecord]) -> None:
        for _ in tries(f"to record pruned xids in {self.path}: other pruners wrote first"):
            found = self.store.read_json(self.path)
            data: dict[str, Any] = found[0] if found else {}
            version = found[1] if found else -1
            new = {
                "committed": add_to_ranges(data.get("committed", []), [
                    r.epoch for r in records if r.state is XidState.COMMITTED]),
                "aborted": add_to_ranges(data.get("aborted", []), [
                    r.epoch for r in records if r.state is XidState.ABORTED]),
            }
            try:
                self.store.client.set(self.path, encode(new, "pruned"), version=version)
                return
            except BadVersionError:
                continue  # another pruner; merge again

    def _delete(self, record: XidRecord) -> bool:
        """Delete the xid's subtree, deepest first; False if it changed since read."""
        layout = self.store.layout
        paths = self._subtree(layout.xid(record.epoch))
        multi = Multi(self.store.client)
        for path in paths:
            if len(multi) > 1 and multi.size > CHUNK_BYTES / 4:
                multi.check(layout.xid(record.epoch), record.version, label="xid")
                if not self._commit(multi):
                    return False
                multi = Multi(self.store.client)
            multi.delete(path, label="child")
        multi.delete(layout.xid(record.epoch), record.version, label="xid")
        if self._open(record.epoch):  # a finished xid has none, unless edited by hand
            multi.delete(layout.open_marker(record.epoch), label="open")
        return self._commit(multi)

    def _open(self, epoch: int) -> bool:
        return self.store.client.exists(self.store.layout.open_marker(epoch)) is not None

    @staticmethod
    def _commit(multi: Multi) -> bool:
        try:
            multi.commit()
            return True
        except MultiFailed as failed:
            if failed.conflict:
                return False
            raise failed.error from None

    def _subtree(self, path: str) -> list[str]:
        """Every descendant of ``path``, children before parents (``path`` excluded)."""
        try:
            children = self.store.client.get_children(path)
        except NoNodeError:
            return []
        found: list[str] = []
        for child in children:
            found += self._subtree(f"{path}/{child}")
            found.append(f"{path}/{child}")
        return found
