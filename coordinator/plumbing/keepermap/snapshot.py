"""Snapshots of a sink's folded log, and the trim of what they made redundant.

Snapshots. The writer that appends an entry whose sequence number is a multiple of
:data:`COMPACT_EVERY` stores the folded tree at that number (``snap:<sink>:<seq>``: chunk
keys, then a head key naming their count and when it was written, each a strict INSERT)
and points ``base:<sink>`` at it. A process that meets a sink for the first time reads
the pointer with its first log read, loads the snapshot and folds only the entries after
it. Both are safe to repeat and to race: the fold at a sequence number is deterministic
and serialized canonically, so two writers store the same chunks (a chunk or head that
exists already is the same); a head is written only after all its chunks, so a head
found means a whole snapshot. Once the pointer names the new snapshot, the writer drops
the chunks of every older one (their heads stay for the trim), so the table holds one
snapshot of the tree, not one per ``compact_every`` entries; a reader that follows an
older or moved-back pointer and finds chunks missing loads the newest whole snapshot.

Retention. An existing key is what stops a writer with a stale copy of the tree from
appending at a number already taken (a strict INSERT refuses only keys that exist), so an
entry may be deleted only once no copy that old can still be used. The rule is one of
time, like the sessions': after storing a snapshot the writer deletes the entries and
older snapshots below the newest snapshot whose head is older than the retention
(:data:`RETAIN`, ``trim:<sink>`` remembers how far that went); and a copy of a log not
known current for half the retention (no read that found its end, no append) is not
trusted: the next read or write fetches the pointer with the entries and loads the
snapshot if it is newer than the copy. Every entry deleted was written after such a
copy was last current and at least a retention before the deletion, so a copy recent
enough to be used never skips a deleted entry. A sink's log therefore holds the entries
of about one retention (~1 MB of keys at a 1 s trigger) and one snapshot.

:class:`Snapshots` is called by the store under its lock: ``compact`` after an append at a
multiple of ``compact_every``, ``load`` when a read finds a newer snapshot than its copy.
"""

from __future__ import annotations

import json
import logging
import time

from kazoo.exceptions import ConnectionLoss, RuntimeInconsistency

from coordinator.plumbing.keepermap.log import Log
from coordinator.plumbing.keepermap.table import KeyValueTable, TableKeys, call_table

logger = logging.getLogger(__name__)

COMPACT_EVERY = 256  # entries between snapshots of a sink's tree
SNAPSHOT_CHUNK = 256_000  # characters per snapshot key, far below Keeper's 1 MB node limit
RETAIN = 600.0  # seconds a snapshot stands before the entries below it are deleted
TRIM_BATCH = 4096  # entries deleted by one trim at most (a long-untrimmed log: in steps)


class Snapshots:
    """Store, find and load the snapshots of one store's sinks (module docstring)."""

    def __init__(self, table: KeyValueTable, keys: TableKeys, compact_every: int,
                 retain: float) -> None:
        self.table = table
        self.keys = keys
        self.compact_every = compact_every
        self.retain = retain

    def stale(self, log: Log, now: float) -> bool:
        return now - log.synced > self.retain / 2

    def load(self, log: Log, seq: int) -> None:
        """Restore ``log`` from snapshot ``seq``, or from the newest whole snapshot if that
        one's chunks were dropped (a pointer put back by a writer paused past a newer
        snapshot, or a newer snapshot stored while this was read)."""
        for head in (self.keys.snapshot(log.root, seq), None):
            text = self._read(head or self.newest_head(log.root))
            if text is not None:
                log.restore(text)
                return
        raise ConnectionLoss(f"no whole snapshot of {log.root} could be read")

    def _read(self, head: str) -> str | None:
        found = call_table(self.table.get_many, [head])
        if head not in found:
            return None
        count = int(json.loads(found[head])["chunks"])
        chunks = [f"{head}:{i:04d}" for i in range(count)]
        found = call_table(self.table.get_many, chunks)
        if any(key not in found for key in chunks):
            return None
        return "".join(found[key] for key in chunks)

    def newest_head(self, root: str) -> str:
        prefix = self.keys.snapshot(root, None)
        heads = [k for k in call_table(self.table.keys_with_prefix, prefix)
                 if ":" not in k[len(prefix):]]
        if not heads:
            raise RuntimeInconsistency(f"the snapshot pointer of {root} names no snapshot")
        return max(heads)

    def compact(self, log: Log) -> None:
        """Store the fold at ``log.seq``, point the sink's readers at it and trim what an
        older snapshot made redundant (module docstring). Best
        effort: the entry is written already, and a failed snapshot or trim only leaves
        readers more entries to fold."""
        head = self.keys.snapshot(log.root, log.seq)
        text = log.snapshot()
        chunks = [text[i:i + SNAPSHOT_CHUNK] for i in range(0, len(text), SNAPSHOT_CHUNK)]
        try:
            for i, chunk in enumerate(chunks):  # one INSERT each: a multi has Keeper's limit too
                call_table(self.table.create_new, {f"{head}:{i:04d}": chunk})
            call_table(self.table.create_new,
                       {head: json.dumps({"chunks": len(chunks), "at": time.time()})})
            if self.stale(log, time.monotonic()):
                return  # paused for long: a newer snapshot may be pointed at already
            call_table(self.table.put, self.keys.base(log.root), str(log.seq))
            listed = call_table(self.table.keys_with_prefix, self.keys.snapshot(log.root, None))
            self.drop_superseded(log, listed)
            self.trim(log, listed)
        except Exception as exc:  # noqa: BLE001 - see the docstring
            logger.warning("snapshot of %s at entry %d not stored or not trimmed: %s",
                           log.root, log.seq, exc)

    def drop_superseded(self, log: Log, listed: list[str]) -> None:
        """Delete the chunks of every snapshot below the one just stored at ``log.seq``
        (``listed``: the sink's snapshot keys); their heads stay until the trim, which
        needs their times. A reader that still follows an older pointer finds its chunks
        gone and loads the newest snapshot."""
        prefix = self.keys.snapshot(log.root, None)
        call_table(self.table.delete, [
            k for k in listed
            if ":" in k[len(prefix):] and int(k[len(prefix):].split(":")[0]) < log.seq])

    def _snapshots_below(self, root: str, upto: int, listed: list[str]) -> list[str]:
        """Every key of ``listed`` (the snapshots of ``root``) below ``upto``, chunks
        before heads (none left headless). Listed, not derived from the trimmed window: a
        snapshot stored late, by a writer paused past an earlier trim, is below every
        later window."""
        prefix = self.keys.snapshot(root, None)
        below = [k for k in listed if int(k[len(prefix):].split(":")[0]) < upto]
        return sorted(below, key=lambda k: (":" not in k[len(prefix):], k))

    def trim(self, log: Log, listed: list[str]) -> None:
        """Delete the entries, and every snapshot, below the newest snapshot older than
        the retention; at most :data:`TRIM_BATCH` entries at a time. ``listed``: the
        sink's snapshot keys, read once the newest snapshot was pointed at."""
        floor = self.keys.floor(log.root)
        if log.trimmed is None:
            log.trimmed = int(call_table(self.table.get_many, [floor]).get(floor) or 0)
        step = self.compact_every
        heads = {seq: self.keys.snapshot(log.root, seq) for seq in range(
            (log.trimmed // step + 1) * step, min(log.seq, log.trimmed + TRIM_BATCH), step)}
        raw = call_table(self.table.get_many, heads.values())
        found = {seq: json.loads(raw[key]) for seq, key in heads.items() if key in raw}
        deadline = time.time() - self.retain  # a head without a time is never old enough
        old = [seq for seq, head in found.items() if head.get("at", float("inf")) <= deadline]
        if not old:
            return
        upto = max(old)
        doomed = self._snapshots_below(log.root, upto, listed)
        doomed += [self.keys.entry(log.root, seq) for seq in range(log.trimmed + 1, upto + 1)]
        call_table(self.table.delete, doomed)
        call_table(self.table.put, floor, str(upto))
        log.trimmed = upto
