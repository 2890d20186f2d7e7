"""A durable key/value ledger under one branch, for the publish step's own records.

A publish strategy that cannot make a step idempotent by itself (ClickHouse 18.x attaches
a partition into a plain MergeTree: running it twice duplicates the rows) writes an intent
and a completion per partition here, next to the branch it publishes. The ledger lives and
dies with its branch: pruning the xid removes it.

Contract: ``put`` is durable when it returns and is an upsert (the last write wins; a
retried ``put`` of the same value is harmless); ``get`` returns what the last ``put``
stored, or None. Values are JSON objects.
"""

from __future__ import annotations

from typing import Any

from kazoo.exceptions import NodeExistsError, NoNodeError

from coordinator.errors import UnknownBranch
from coordinator.layout import unescape
from coordinator.records import decode, encode
from coordinator.store import SinkStore


class Ledger:
    """Per-branch durable records (the ``ledger`` protocol ``server_ext.publish`` takes).

    Usage::

        ledger = coord.ledger(41, "p0-a0-1f2e3d4c")
        if ledger.get("202401") is None:
            ledger.put("202401", {"intent": "attach", "watermark": 118})
    """

    def __init__(self, store: SinkStore, epoch: int, branch_id: str) -> None:
        self.store = store
        self.epoch = epoch
        self.branch_id = branch_id
        self.path = store.layout.ledger(epoch, branch_id)

    def get(self, key: str) -> dict[str, Any] | None:
        found = self.store.run(self.store.read_json, self._entry(key))
        return found[0] if found is not None else None

    def put(self, key: str, value: dict[str, Any]) -> None:
        data = encode(value, f"ledger entry {key!r} of branch {self.branch_id}")
        self.store.run(self._put, self._entry(key), data)

    def items(self) -> dict[str, dict[str, Any]]:
        """Every entry, for operators and the audit."""
        return self.store.run(self._items)

    def _entry(self, key: str) -> str:
        return self.store.layout.ledger_entry(self.epoch, self.branch_id, key)

    def _put(self, path: str, data: bytes) -> None:
        client = self.store.client
        while True:
            try:
                client.create(path, data)
                return
            except NodeExistsError:
                try:
                    client.set(path, data)
                    return
                except NoNodeError:
                    continue  # deleted in between (pruned); create again
            except NoNodeError:
                self._create_ledger_node()

    def _create_ledger_node(self) -> None:
        try:
            self.store.client.create(self.path)
        except NodeExistsError:
            return
        except NoNodeError:
            raise UnknownBranch(
                f"branch {self.branch_id} of xid {self.store.sink_id}/{self.epoch} "
                "has no record; a ledger lives under a registered branch"
            ) from None

    def _items(self) -> dict[str, dict[str, Any]]:
        try:
            names = self.store.client.get_children(self.path)
        except NoNodeError:
            return {}
        pending = [(n, self.store.client.get_async(f"{self.path}/{n}")) for n in names]
        entries = {}
        for name, result in pending:
            try:
                entries[unescape(name)] = decode(result.get()[0])
            except NoNodeError:
                continue
        return entries
