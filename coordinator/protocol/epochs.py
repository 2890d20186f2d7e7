"""Epoch allocation for batch jobs, and the sink's ``last_committed`` epoch.

Streaming sinks take their epoch from Spark (the micro-batch id); batch jobs allocate one
here. Allocation is a versioned increment of ``next_epoch`` (kazoo's Counter recipe, with
JSON data): every epoch is handed out once, even after its xid was pruned, because the
counter itself is never pruned. Do not mix allocated and caller-chosen epochs in one sink.

``last_committed`` only moves forward: the commit that finishes an xid sets it to
``max(last_committed, epoch)`` in the same multi-op that marks the xid ``Committed``.

``txn_version`` (a batch job's idempotency version, like Delta's ``txnVersion``) moves the
same way: an xid decided with a version records it in its own record, and its
``Committed`` multi-op sets the sink's ``txn_version`` node to the highest version
committed so far.
"""

from __future__ import annotations

import time
import weakref
from typing import Any, ClassVar

from kazoo.exceptions import BadVersionError

from coordinator.errors import SinkTreeDamaged
from coordinator.formats.records import encode
from coordinator.formats.states import XidState
from coordinator.plumbing.multi import Multi, tries
from coordinator.plumbing.store import SinkStore

LAST_COMMITTED = "last_committed"  # label of the last_committed write in a multi-op
TXN_VERSION = "txn_version"  # label of the txn_version write in a multi-op


class EpochCounter:
    """Hand out monotonic epochs, never reused.

    Usage::

        counter = EpochCounter(store)
        epoch = counter.allocate()     # 0, 1, 2, ... across processes and restarts
    """

    def __init__(self, store: SinkStore) -> None:
        self.store = store
        self.path = store.layout.next_epoch

    def allocate(self) -> int:
        return self.store.run(self._allocate)

    def _allocate(self) -> int:
        ensured = False
        for _ in tries(f"to allocate an epoch from {self.path}: other jobs took each one"):
            found = self.store.read_json(self.path)
            if found is None:
                if ensured:
                    raise SinkTreeDamaged(f"{self.path} vanished again after the sink's "
                                          "tree was created: is someone deleting it?")
                self.store.layout.ensure(self.store.client)
                ensured = True
                continue
            data, version = found
            epoch = int(data.get("next", 0))
            try:
                self.store.client.set(self.path, encode({"next": epoch + 1}, "next_epoch"),
                                      version=version)
            except BadVersionError:
                continue  # another job allocated concurrently; take the next one
            return epoch
        raise AssertionError("unreachable: tries() raises when spent")


class LastCommitted:
    """Read the sink's highest committed epoch; add its forward-only update to a multi.

    Usage::

        last = LastCommitted(store)
        epoch, version = last.read()           # (None, 0) before the first commit
        last.advance(multi, 41, epoch, version)

    The process remembers what it last wrote to each sink's node
    (:meth:`remembered_below`), so that a writer committing one epoch after another need
    not read it again: the remembered version is only ever used in a compare-and-set (a
    check or a versioned write in the multi-op that relies on it), so a stale memory
    fails that multi-op, and the caller forgets it, reads the node and tries again. (What
    a process only read is not remembered: a task's worker reads the node that the
    driver then moves, every epoch.)
    """

    #: (epoch, version) by client and node path: what this process last wrote.
    _seen: ClassVar[weakref.WeakKeyDictionary[Any, dict[str, tuple[int | None, int]]]] = \
        weakref.WeakKeyDictionary()

    def __init__(self, store: SinkStore) -> None:
        self.store = store
        self.path = store.layout.last_committed

    def read(self) -> tuple[int | None, int]:
        found = self.store.read_json(self.path)
        if found is None:
            return None, -1
        data, version = found
        epoch = data.get("epoch")
        return (int(epoch) if epoch is not None else None), version

    def require(self) -> tuple[int | None, int]:
        """:meth:`read` for the ``Committed`` write, after the publish: a missing node is
        :class:`SinkTreeDamaged` (every sink is created with it; guessing it would forget
        commits)."""
        epoch, version = self.read()
        if version < 0:
            raise SinkTreeDamaged(
                f"{self.path} is missing: the sink's record of its last committed epoch was "
                "lost. This xid's rows are published (its decision stands); it cannot be "
                "marked Committed until the node is back: nothing is to be copied or given "
                "up. Restore the node from a backup, or recreate it holding the highest "
                'committed epoch (`txsink status` lists them): {"epoch": N}; then run '
                "txsink recover again")
        return epoch, version

    def remembered_below(self, epoch: int) -> tuple[int | None, int] | None:
        """What this process last wrote to the node, if it lies below ``epoch``
        (an epoch at or below it is read afresh: a reset may have lowered the node).
        For a compare-and-set of its version only."""
        seen = self._seen.get(self.store.client, {}).get(self.path)
        if seen is None or (seen[0] is not None and seen[0] >= epoch):
            return None
        return seen

    def forget(self) -> None:
        self._seen.get(self.store.client, {}).pop(self.path, None)

    def check(self, multi: Multi, version: int) -> None:
        """Add the check that the node is still at ``version`` (as remembered)."""
        multi.check(self.path, version, label=LAST_COMMITTED)

    @staticmethod
    def moves(epoch: int, current: int | None) -> bool:
        """Whether committing ``epoch`` moves the node from ``current``."""
        return current is None or current < epoch

    def advance(self, multi: Multi, epoch: int, current: int | None, version: int) -> None:
        """Add ``last_committed := max(current, epoch)`` (nothing if it would not move;
        once the multi-op applied, call :meth:`advanced`)."""
        if not self.moves(epoch, current):
            return  # it only ever grows, so no check is needed to keep it >= epoch
        multi.set_data(self.path, encode({"epoch": epoch, "at": time.time()}, LAST_COMMITTED),
                       version, label=LAST_COMMITTED)

    def advanced(self, epoch: int, version: int) -> None:
        """Remember the node as an applied :meth:`advance` from ``version`` left it."""
        self._seen.setdefault(self.store.client, {})[self.path] = (epoch, version + 1)


class TxnVersion:
    """Read the sink's highest committed ``txn_version``; add its forward-only update to a
    multi. The node is created by the first commit that carries a version.

    Usage::

        versions = TxnVersion(store)
        version, node_version = versions.read()     # (None, -1) before any
        versions.advance(multi, 7, version, node_version)
    """

    def __init__(self, store: SinkStore) -> None:
        self.store = store
        self.path = store.layout.txn_version

    def read(self) -> tuple[int | None, int]:
        found = self.store.read_json(self.path)
        if found is None:
            return None, -1
        data, version = found
        return int(data["version"]), version

    def advance(self, multi: Multi, txn_version: int, current: int | None,
                node_version: int) -> None:
        """Add ``txn_version := max(current, txn_version)``; a concurrent change of the
        node fails the multi (the caller re-reads and retries)."""
        if current is not None and current >= txn_version:
            return
        data = encode({"version": txn_version, "at": time.time()}, TXN_VERSION)
        if node_version < 0:
            multi.create(self.path, data, label=TXN_VERSION)
        else:
            multi.set_data(self.path, data, node_version, label=TXN_VERSION)

    def require_not_lost(self) -> None:
        """Refuse a sink without a ``txn_version`` node whose retained xids committed one:
        the node was lost, and a job would rewrite what an earlier run of it committed.
        Read only while the node is absent (a sink's first versioned job)."""
        records = self.store.run(self.store.read_xids, self.store.run(self.store.epochs, False))
        versioned = [r for r in records
                     if r.state is XidState.COMMITTED and r.txn_version is not None]
        if versioned:
            newest = max(versioned, key=lambda r: r.txn_version or 0)
            raise SinkTreeDamaged(
                f"{self.path} is missing although xid {newest.xid} committed "
                f"txn_version {newest.txn_version}: the sink's record of its committed "
                "versions was lost, and a versioned job cannot tell whether it ran. Nothing "
                "was written. Restore the node from a backup, or recreate it holding the "
                f'highest committed version: {{"version": {newest.txn_version}}}')
