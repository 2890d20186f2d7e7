"""A durable key/value ledger under one branch, for the publish step's own records.

This is the store's implementation of ``server_ext.publish.PublishLedger``, the protocol the
publish step takes (structurally: ``coordinator`` and ``server_ext`` never import each
other). A publish that cannot make a step idempotent by itself (ClickHouse 18.x attaches a
partition into a plain MergeTree: running it twice duplicates the rows) keeps one record
per staging table here, next to the branch it publishes, keyed by the table's name: an
intent ``{"state": "attaching", "attaching": [...], "published": [...], "watermark": W}``
before the statement that makes rows visible, then ``{"state": "published"}``; a combined
branch also records ``{"state": "combined", "manifest": ...}`` under
``<combined table>.combined`` (``server_ext/publish/``, ``server_ext/publish/combined.py``).
The ledger lives and dies with its branch: pruning the xid removes it.

Contract: ``put`` is durable when it returns and is a compare-and-set against the version
this ledger last read or wrote (a key never read is read first), in one multi-op with the
check of the caller's publish lease. So an actor whose lease died, or that lost a race to
another writer of the same entry, cannot pass a write that leads to an ATTACH: it gets
:class:`PublishLeaseLost` or :class:`LedgerConflict` and stops. Without a lease (a
coordinator outside commit/recover/``publish_lease``) writes are refused. ``get`` returns
what the last ``put`` stored, or None. Values are JSON objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kazoo.exceptions import NoNodeError

from coordinator.errors import CoordinatorError, PublishLeaseLost, UnknownBranch
from coordinator.formats.records import decode, encode
from coordinator.plumbing.multi import Multi, MultiFailed
from coordinator.plumbing.paths import unescape
from coordinator.plumbing.store import SinkStore
from coordinator.protocol.publish_lease import LEASE, PublishLease


class LedgerConflict(CoordinatorError):
    """A ledger entry changed between this publisher's read and its write.

    Under a publish lease only a writer without the lease (an older release, a manual
    edit) can cause it; the publish stops rather than act on a stale record.
    """


class Ledger:
    """Per-branch durable records: implements ``server_ext.publish.PublishLedger`` (``get``,
    ``put``, ``confirm``) in ZooKeeper, fenced by the xid's publish lease.

    Usage (inside ``coord.publish_lease(41)``, or a commit/recover callback)::

        ledger = coord.ledger(41, "p0-a0-s0-1f2e3d4c")
        if ledger.get(staging_table) is None:
            ledger.put(staging_table, {"state": "attaching", "attaching": ["202401"],
                                       "published": [], "watermark": 118})
    """

    def __init__(self, store: SinkStore, epoch: int, branch_id: str,
                 lease: PublishLease | None = None, empty: bool = False) -> None:
        """``empty``: known to hold no entries (``PublishLease.fresh_ledger``), not read."""
        self.store = store
        self.epoch = epoch
        self.branch_id = branch_id
        self.lease = lease
        self.path = store.layout.ledger(epoch, branch_id)
        # every entry, read once (none to read in a ledger known empty)
        self._entries: dict[str, tuple[dict[str, Any], int]] | None = {} if empty else None
        self._node_exists = False

    def get(self, key: str) -> dict[str, Any] | None:
        """The entry as this ledger last read or wrote it: every entry is read at the
        first ``get`` (one listing, the entries pipelined; none for a branch without a
        ledger yet). Only the lease holder writes, so what it read stays true for it."""
        if self._entries is None:
            self._entries = self.store.run(self._read_all)
        found = self._entries.get(key)
        return found[0] if found is not None else None

    def put(self, key: str, value: dict[str, Any]) -> None:
        put_together([(self, key, value)])

    def confirm(self) -> None:
        """Raise :class:`PublishLeaseLost` unless the caller's lease lives right now."""
        if self.lease is None:
            raise PublishLeaseLost(f"xid {self.store.sink_id}/{self.epoch}: no publish lease")
        self.lease.check()

    def items(self) -> dict[str, dict[str, Any]]:
        """Every entry as stored now, for operators and the audit."""
        return self.store.run(self._items)

    def _entry(self, key: str) -> str:
        return self.store.layout.ledger_entry(self.epoch, self.branch_id, key)

    def _read_all(self) -> dict[str, tuple[dict[str, Any], int]]:
        try:
            names = self.store.client.get_children(self.path)
        except NoNodeError:
            return {}
        self._node_exists = True
        pending = [(n, self.store.client.get_async(f"{self.path}/{n}")) for n in names]
        entries = {}
        for name, result in pending:
            try:
                data, stat = result.get()
            except NoNodeError:
                continue
            entries[unescape(name)] = (decode(data), stat.version)
        return entries

    def _items(self) -> dict[str, dict[str, Any]]:
        return {key: value for key, (value, _) in self._read_all().items()}


def put_together(entries: Sequence[tuple[Ledger, str, dict[str, Any]]]) -> None:
    """Write entries of one or more ledgers of one xid in one fenced multi-op, each as a
    compare-and-set against what its ledger last read (a ledger's node created with its
    first entry): all are written or none. Raises as ``Ledger.put`` says; the ledgers
    must share one lease (a coordinator's ledgers of the xid do)."""
    if not entries:
        return
    first = entries[0][0]
    if first.lease is None or any(ledger.lease is not first.lease for ledger, _, _ in entries):
        raise PublishLeaseLost(
            f"ledger of branch {first.branch_id} (xid {first.store.sink_id}/{first.epoch}): "
            "a write needs the xid's publish lease")
    writes = []
    for ledger, key, value in entries:
        ledger.get(key)
        assert ledger._entries is not None
        found = ledger._entries.get(key)
        writes.append((ledger, key, encode(value, f"ledger entry {key!r} of branch "
                                                  f"{ledger.branch_id}"),
                       found[1] if found else None))
    versions = first.store.run(_write, first.lease, writes)
    for (ledger, key, data, _), version in zip(writes, versions, strict=True):
        ledger._node_exists = True
        assert ledger._entries is not None
        ledger._entries[key] = (decode(data), version)


def _write(lease: PublishLease, writes: list[tuple[Ledger, str, bytes, int | None]]
           ) -> list[int]:
    """One fenced multi-op of ``writes`` (ledger, key, data, version read); the entries'
    new versions."""
    store = writes[0][0].store
    multi = lease.guard(Multi(store.client))
    created = set()
    for ledger, key, data, version in writes:
        if not ledger._node_exists and ledger.path not in created:
            multi.create(ledger.path, label="ledger")
            created.add(ledger.path)
        multi.write(ledger._entry(key), data, version, label="entry")
    try:
        multi.commit()
    except MultiFailed as failed:
        ledger, key = writes[0][0], writes[0][1]
        if failed.label == LEASE:
            raise PublishLeaseLost(
                f"xid {store.sink_id}/{ledger.epoch}: publish lease lost before writing "
                f"ledger entry {key!r} of branch {ledger.branch_id}") from None
        if failed.label == "ledger" and isinstance(failed.error, NoNodeError):
            raise UnknownBranch(
                f"a branch of xid {store.sink_id}/{ledger.epoch} has no record; a ledger "
                "lives under a registered branch") from None
        if not failed.conflict:
            raise failed.error from None
        # the node or an entry written meanwhile, or by our own try whose reply was lost
        versions = []
        for ledger, key, data, _ in writes:
            ledger._node_exists = True
            found = store.read_json(ledger._entry(key))
            if found is None or encode(found[0], key) != data:
                raise LedgerConflict(
                    f"ledger entry {key!r} of branch {ledger.branch_id} (xid "
                    f"{store.sink_id}/{ledger.epoch}) was changed by another writer") from None
            versions.append(found[1])
        return versions
    return [0 if version is None else version + 1 for *_, version in writes]
