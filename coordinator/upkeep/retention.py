"""Retention: removing finished xids without forgetting what they decided or wrote.

A sink that commits every few seconds accumulates thousands of xid records; ZooKeeper
keeps everything in memory, so finished xids (``Committed`` or ``Aborted``) are removed
after an age: by the writers themselves, a bounded pass after their own commit
(:meth:`Retention.step`), and by an operator's ``txsink gc --prune-older-than``
(:meth:`Retention.prune`, every pass until none is left). What must survive is the
*answer* they gave and *what they wrote*:

- ``pruned`` holds compact ranges of the removed epochs: a replayed streaming batch asks
  ``is_committed(epoch)`` long after its record is gone, and the audit must not mistake a
  pruned epoch for a gap (a streaming sink's history stays one range);
- ``summary`` holds what the removed committed xids wrote, folded by the caller's
  :data:`Fold` (the coordinator reads no manifest; ``txsink`` folds rows and content
  digests per target partition, which add up), and the ranges of epochs folded into it
  (``folded``): an epoch pruned but not folded (no fold given, a record the fold could not
  read, a summary that would outgrow a record) is one whose writes are unknown;
- ``last_committed``, ``next_epoch``, ``generation``, ``txn_version``, ``stream`` and every
  open xid are never removed.

A pass: read the oldest finished xids (at most ``limit``), fold the committed ones not yet
in ``pruned`` into ``summary`` and add every one to ``pruned`` in ONE multi-op checking
both versions (crash point ``retain.after_fold``), then delete each xid's subtree in a
multi-op guarded by the version it was read at (``retain.after_delete`` after each), at
most ``max_nodes`` nodes per pass. Repeating is safe: an epoch already in ``pruned`` is
never folded again, only deleted; an xid that changed since it was read (a new attempt of
an aborted one) is left for a later pass; two pruners racing lose nothing, one CAS wins
and the other re-reads. Readers of the history (``audit.read_history``) read the records
first and ``pruned``/``summary`` after, and drop a record whose epoch the summary already
holds: an xid deleted while they read is counted once.

A sink that will never write again (a one-off batch job's, whose id is never reused) can
be forgotten as a whole with :meth:`Retention.forget_sink`: nothing open, nothing changed
for an age. Which sinks are one-off is the caller's call (``txsink gc`` decides by the id
a job without ``sink_id`` gets).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kazoo.exceptions import NoNodeError

from coordinator.errors import RecordTooLarge
from coordinator.formats import steps
from coordinator.formats.records import BranchRecord, XidRecord, encode
from coordinator.formats.states import XidState
from coordinator.plumbing.multi import CHUNK_BYTES, Multi, MultiFailed, tries
from coordinator.plumbing.store import SinkStore

log = logging.getLogger(__name__)

Ranges = list[list[int]]
SUMMARY_FORMAT = 1
#: Xids one writer's pass removes at most, and nodes it deletes at most: a commit's
#: retention step costs a bounded number of writes, whatever the backlog.
PASS_XIDS = 32
PASS_NODES = 2048


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


@dataclass(frozen=True)
class DecidedXid:
    """A ``Committing`` or ``Committed`` xid with the records of its winners.

    ``missing`` lists winners without a record (a hand edit, or retention deleting the
    xid while it was being read): what they published is unknown.
    """

    record: XidRecord
    winners: tuple[BranchRecord, ...]
    missing: tuple[str, ...] = ()


#: ``fold(partitions, xid)``: the summary's ``partitions`` with what the committed ``xid``
#: wrote added (the argument may be changed and returned), or None when what it wrote
#: cannot be told (the epoch is then pruned without being folded).
Fold = Callable[[dict[str, Any], DecidedXid], dict[str, Any] | None]


@dataclass(frozen=True)
class Summary:
    """What retention kept of the removed committed xids: the epochs folded (``folded``)
    and the caller's per-partition figures (``partitions``, opaque here)."""

    folded: Ranges = field(default_factory=list)
    partitions: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, raw: dict[str, Any] | None) -> Summary:
        raw = raw or {}
        return cls(raw.get("folded", []), raw.get("partitions", {}))

    def to_json(self) -> dict[str, Any]:
        return {"format": SUMMARY_FORMAT, "folded": self.folded, "partitions": self.partitions}


@dataclass(frozen=True)
class Pass:
    """One retention pass: the epochs it removed, and whether old xids were left for the
    next pass because it reached its bound (``more``)."""

    pruned: list[int]
    more: bool = False


class Retention:
    """Prune finished xids of one sink; answer for the pruned ones.

    Usage::

        retention = Retention(store, fold=fold, on_step=hook)
        retention.step(3600)                      # a writer's bounded pass: Pass
        retention.prune(7 * 24 * 3600)            # an operator's: every old epoch removed
        retention.was_pruned_committed(12)        # True if 12 was Committed, then pruned
    """

    def __init__(self, store: SinkStore, fold: Fold | None = None,
                 on_step: Callable[[str], None] | None = None) -> None:
        self.store = store
        self.path = store.layout.pruned
        self.fold = fold
        self.on_step = on_step

    def ranges(self) -> dict[str, Ranges]:
        """``{"committed": [[lo, hi], ...], "aborted": [...]}`` of pruned epochs."""
        found = self.store.run(self.store.read_json, self.path)
        data = found[0] if found else {}
        return {"committed": data.get("committed", []), "aborted": data.get("aborted", [])}

    def summary(self) -> Summary:
        found = self.store.run(self.store.read_json, self.store.layout.summary)
        return Summary.of(found[0] if found else None)

    def was_pruned_committed(self, epoch: int) -> bool:
        return in_ranges(self.ranges()["committed"], epoch)

    def prune(self, max_age_seconds: float) -> list[int]:
        """Remove every finished xid not updated for ``max_age_seconds``, pass after pass
        (the operator's ``gc --prune-older-than``); the epochs removed."""
        removed: list[int] = []
        while True:
            done = self.step(max_age_seconds, limit=None, max_nodes=None)
            removed += done.pruned
            if not done.more:
                return sorted(removed)

    def step(self, max_age_seconds: float, limit: int | None = PASS_XIDS,
             max_nodes: int | None = PASS_NODES) -> Pass:
        """One pass over the oldest finished xids (module docstring): at most ``limit``
        xids and ``max_nodes`` deleted nodes (None: no bound)."""
        cutoff = time.time() - max_age_seconds
        open_epochs = set(self.store.run(self.store.epochs, True))
        candidates = [e for e in self.store.run(self.store.epochs, False)
                      if e not in open_epochs]
        scanned = candidates if limit is None else candidates[:2 * limit]
        records = self.store.run(self.store.read_xids, scanned)
        old = [r for r in records
               if r.state in (XidState.COMMITTED, XidState.ABORTED) and r.updated < cutoff]
        more = limit is not None and len(old) >= limit  # a backlog: the next pass at once
        old = old if limit is None else old[:limit]
        if not old:
            return Pass([], False)
        self.store.run(self._remember, old)
        self._step(steps.RETAIN_AFTER_FOLD)
        removed: list[int] = []
        nodes = 0
        for record in old:
            if max_nodes is not None and nodes >= max_nodes:
                return Pass(removed, True)
            deleted = self.store.run(self._delete, record)
            nodes += max(deleted, 1)
            if deleted:
                removed.append(record.epoch)
                self._step(steps.RETAIN_AFTER_DELETE)
        return Pass(removed, more and bool(removed))

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

    def _step(self, name: str) -> None:
        if self.on_step is not None:
            self.on_step(name)

    def _decided(self, records: list[XidRecord]) -> list[DecidedXid]:
        """The committed ones of ``records`` with their winners' records (pipelined)."""
        found = []
        for record in records:
            if record.state is not XidState.COMMITTED:
                continue
            branches = self.store.read_branches(record.epoch, record.winners)
            found.append(DecidedXid(record, tuple(branches[b] for b in record.winners
                                                  if b in branches),
                                    tuple(b for b in record.winners if b not in branches)))
        return found

    def _remember(self, records: list[XidRecord]) -> None:
        """Fold and add to ``pruned`` every one of ``records`` not there yet: one multi-op
        checking the versions of both nodes, repeated on a lost race."""
        layout = self.store.layout
        decided = self._decided(records) if self.fold is not None else []
        for _ in tries(f"to record pruned xids in {self.path}: other pruners wrote first"):
            found = self.store.read_json(self.path)
            data: dict[str, Any] = found[0] if found else {}
            version = found[1] if found else -1
            summary_found = self.store.read_json(layout.summary)
            summary = Summary.of(summary_found[0] if summary_found else None)
            pruned = {"committed": data.get("committed", []),
                      "aborted": data.get("aborted", [])}
            fresh = [r for r in records if not in_ranges(pruned[_kind(r)], r.epoch)]
            if not fresh:
                return
            new = {kind: add_to_ranges(pruned[kind], [r.epoch for r in fresh
                                                      if _kind(r) == kind])
                   for kind in ("committed", "aborted")}
            multi = Multi(self.store.client)
            multi.set_data(self.path, encode(new, "pruned"), version, label="pruned")
            fresh_epochs = {r.epoch for r in fresh}
            folded = self._fold(summary, [d for d in decided if d.record.epoch in fresh_epochs])
            if folded is not None:
                multi.write(layout.summary, folded, summary_found and summary_found[1],
                            label="summary")
            try:
                multi.commit()
                return
            except MultiFailed as failed:
                if not failed.conflict:
                    raise failed.error from None  # else another pruner: merge again

    def _fold(self, summary: Summary, decided: list[DecidedXid]) -> bytes | None:
        """The summary with ``decided`` folded in, encoded; None when nothing changes or
        it would outgrow a record (then those epochs are pruned unfolded, said once)."""
        if self.fold is None or not decided:
            return None
        partitions = copy.deepcopy(summary.partitions)
        epochs = []
        for xid in sorted(decided, key=lambda d: (d.record.decided_at or d.record.updated,
                                                  d.record.epoch)):
            if in_ranges(summary.folded, xid.record.epoch):
                continue
            added = self.fold(partitions, xid)
            if added is None:
                log.warning("sink %s: what epoch %d wrote cannot be told (%s); pruned "
                            "without its summary", self.store.sink_id, xid.record.epoch,
                            "winner records missing" if xid.missing else "unreadable")
                continue
            partitions, epochs = added, epochs + [xid.record.epoch]
        if not epochs:
            return None
        new = Summary(add_to_ranges(summary.folded, epochs), partitions)
        try:
            return encode(new.to_json(), f"the summary of sink {self.store.sink_id}")
        except RecordTooLarge as exc:
            log.warning("sink %s: epochs %s pruned without their summary: %s",
                        self.store.sink_id, epochs, exc)
            return None

    def _delete(self, record: XidRecord) -> int:
        """Delete the xid's subtree, deepest first; the nodes deleted (0: it changed
        since it was read, or is gone already)."""
        layout = self.store.layout
        paths = self._subtree(layout.xid(record.epoch))
        multi = Multi(self.store.client)
        for path in paths:
            if len(multi) > 1 and multi.size > CHUNK_BYTES / 4:
                multi.check(layout.xid(record.epoch), record.version, label="xid")
                if not self._commit(multi):
                    return 0
                multi = Multi(self.store.client)
            multi.delete(path, label="child")
        multi.delete(layout.xid(record.epoch), record.version, label="xid")
        if self._open(record.epoch):  # a finished xid has none, unless edited by hand
            multi.delete(layout.open_marker(record.epoch), label="open")
        return len(paths) + 1 if self._commit(multi) else 0

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


def _kind(record: XidRecord) -> str:
    return "committed" if record.state is XidState.COMMITTED else "aborted"
