"""The sink's generation: the fencing token bumped by every new writer of the sink.

Kafka's producer epoch, in the store: the generation *is* the data version of the
``generation`` znode. Bumping it is one versioned write, and fencing costs nothing extra:
every decision or branch registration adds ``check(generation node, generation)`` to its
own multi-op, so a writer holding an older generation fails atomically, in the same step
it tried to write, with no window between "am I still the owner?" and the write itself.
"""

from __future__ import annotations

import os
import socket
import time

from kazoo.exceptions import BadVersionError, NoNodeError

from coordinator.errors import Fenced, SinkTakenOver, SinkTreeDamaged
from coordinator.formats.records import decode, encode
from coordinator.plumbing.multi import Multi, MultiFailed, tries
from coordinator.plumbing.store import SinkStore

FENCE = "fence"  # label of the generation check in every multi-op
PAST_OWNERS_KEPT = 64  # superseded run ids remembered, to refuse their late claims


class Generation:
    """Bump and read a sink's generation; add the fencing check to a multi-op.

    Usage::

        sink_generation = Generation(store)
        generation = sink_generation.bump()        # every older writer is now fenced
        generation = sink_generation.claim(run_id) # once per run: the same for its tasks
        multi = Multi(client)
        sink_generation.guard(multi, generation)   # fails with label "fence" if stale
    """

    def __init__(self, store: SinkStore) -> None:
        self.store = store
        self.path = store.layout.generation

    def bump(self) -> int:
        """Make the caller the sink's owner; returns the new generation (1 on the first
        call)."""
        return self.store.run(self._change_owner, None)

    def claim(self, owner: str) -> int:
        """Fence once per ``owner`` (a streaming run id): bump unless ``owner`` made the
        latest bump.

        For writers that cannot fence at start-up because they have no single start (a
        streaming query's tasks see only their run id): the first caller of a run fences
        every older run, later callers of the same run get the same generation. An ``owner``
        that a newer writer superseded gets :class:`SinkTakenOver` (a :class:`Fenced`)
        naming the writer that holds the sink: a zombie task of a dead run must not take
        the sink back (the last 64 superseded owners are remembered).
        """
        if not owner:
            raise ValueError("owner must be a non-empty string")
        return self.store.run(self._change_owner, owner)

    def current(self) -> int:
        """The sink's current generation (0 if no writer ever fenced it)."""
        return self.store.run(self._current)

    def taken_over(self, generation: int, cause: Exception | None = None
                   ) -> SinkTakenOver | None:
        """The error for a writer of ``generation`` if a newer writer took the sink over
        (None while ``generation`` is still current)."""
        found = self.store.run(self.store.read_json, self.path)
        if found is None or found[1] <= generation:
            return None
        record, current = found
        return SinkTakenOver(self.store.sink_id, generation, current, _taken_by(record), cause)

    def guard(self, multi: Multi, generation: int) -> Multi:
        """Add the fencing check: the multi applies only while ``generation`` is current."""
        return multi.check(self.path, generation, label=FENCE)

    def _current(self) -> int:
        stat = self.store.client.exists(self.path)
        return stat.version if stat is not None else 0  # no tree yet: never fenced

    def _change_owner(self, owner: str | None) -> int:
        """Bump the generation for a new owner (None: an anonymous writer, always
        bumps)."""
        ensured = False
        for _ in tries(f"to bump {self.path}: other writers changed it each time"):
            try:
                raw, stat = self.store.client.get(self.path)
            except NoNodeError:
                if ensured:  # ensure() made or completed the tree, yet it is gone again
                    raise SinkTreeDamaged(f"{self.path} vanished again after the sink's "
                                          "tree was created: is someone deleting it?") from None
                self.store.layout.ensure(self.store.client)
                ensured = True
                continue
            current = decode(raw, self.path)
            if owner is not None and current.get("owner") == owner:
                return stat.version  # another task of this run claimed it first
            past = [p for p in (*current.get("past_owners", []), current.get("owner")) if p]
            if owner is not None and owner in past:
                raise SinkTakenOver(self.store.sink_id, None, stat.version, _taken_by(current),
                                    Fenced(f"sink {self.store.sink_id}: {owner} was "
                                           "superseded by a newer writer"))
            generation = stat.version + 1
            data = encode({"generation": generation, "owner": owner, "fenced_at": time.time(),
                           "by": f"{socket.gethostname()}:{os.getpid()}",
                           "past_owners": past[-PAST_OWNERS_KEPT:]}, "generation")
            try:
                self.store.client.set(self.path, data, version=stat.version)
            except BadVersionError:
                continue  # another writer fenced at the same moment; look again
            return generation
        raise AssertionError("unreachable: tries() raises when spent")


def _taken_by(record: dict) -> str:
    """Who made the generation ``record`` describes: host:pid, and the run if any."""
    by = record.get("by") or "unknown"
    return f"{by}, run {record['owner']}" if record.get("owner") else by


def raise_if_fenced(failed: MultiFailed, generation: int, xid: str) -> None:
    """Turn a failed fencing check into :class:`Fenced`; leave other failures alone.

    A missing generation node (``NoNodeError``) is not fencing: the sink's tree does not
    exist yet and the caller creates it and tries again.
    """
    if failed.label == FENCE and isinstance(failed.error, BadVersionError):
        raise Fenced(
            f"xid {xid}: generation {generation} is no longer the sink's current generation; "
            "a newer writer owns the sink"
        ) from None


def settle(failed: MultiFailed, store: SinkStore, generation: int, xid: str) -> None:
    """After a failed multi-op: raise :class:`Fenced`, create a missing sink tree, or
    return so the caller re-reads and decides again (someone else wrote first)."""
    raise_if_fenced(failed, generation, xid)
    if failed.label == FENCE:  # NoNodeError: the sink's tree does not exist yet
        store.layout.ensure(store.client)
        return
    if not failed.conflict:
        raise failed.error
