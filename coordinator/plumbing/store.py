"""Reading a sink's records from the store, inside the retry policy.

Writes are not here: each state change is a :class:`~coordinator.plumbing.multi.Multi` built by
the module that owns that change. Reads of many records (all branches of an xid, all open
xids) are pipelined with kazoo's ``get_async`` so their cost is one round trip plus a few
hundred microseconds per record, not one round trip each.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from kazoo.exceptions import NoNodeError
from kazoo.retry import KazooRetry

from coordinator.formats.records import BranchRecord, XidRecord, decode
from coordinator.plumbing.nodes import NodeStore
from coordinator.plumbing.paths import SinkLayout, unescape

T = TypeVar("T")


def default_retry(client: NodeStore) -> KazooRetry:
    """Retry connection loss and session expiry for up to 60 s, backing off to 1 s.

    Long enough to ride out a ZooKeeper restart or a leader election; every coordinator
    operation re-reads and re-decides on each try, so a retry never applies a change twice.
    """
    return KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0, deadline=60.0,
                      ignore_expire=True, sleep_func=client.handler.sleep_func)


class SinkStore:
    """One sink's records: the kazoo client, the paths, the retry policy and reads.

    Usage::

        store = SinkStore(client, SinkLayout("/txsink", "orders"), default_retry(client))
        record = store.run(store.read_xid, 41)      # XidRecord | None
        branches = store.run(store.read_branches, 41)
    """

    def __init__(self, client: NodeStore, layout: SinkLayout, retry: KazooRetry) -> None:
        self.client = client
        self.layout = layout
        self.sink_id = layout.sink_id
        self._retry = retry

    def run(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call ``func`` under a fresh copy of the retry policy (copies are not shared
        between threads, so concurrent operations do not share a retry budget)."""
        return self._retry.copy()(func, *args, **kwargs)

    def read_json(self, path: str) -> tuple[dict[str, Any], int] | None:
        try:
            data, stat = self.client.get(path)
        except NoNodeError:
            return None
        return decode(data, path), stat.version

    def read_xid(self, epoch: int) -> XidRecord | None:
        try:
            data, stat = self.client.get(self.layout.xid(epoch))
        except NoNodeError:
            return None
        return XidRecord.from_bytes(self.sink_id, epoch, data, stat.version)

    def read_branch(self, epoch: int, branch_id: str) -> BranchRecord | None:
        try:
            data, stat = self.client.get(self.layout.branch(epoch, branch_id))
        except NoNodeError:
            return None
        return BranchRecord.from_bytes(self.sink_id, epoch, branch_id, data, stat.version)

    def branch_ids(self, epoch: int) -> list[str]:
        try:
            names = self.client.get_children(self.layout.branches(epoch))
        except NoNodeError:
            return []
        return sorted(unescape(n) for n in names)

    def read_branches(self, epoch: int, branch_ids: Iterable[str] | None = None
                      ) -> dict[str, BranchRecord]:
        """Branch records by id (all of the xid when ``branch_ids`` is None); pipelined."""
        ids = self.branch_ids(epoch) if branch_ids is None else list(branch_ids)
        pending = [(b, self.client.get_async(self.layout.branch(epoch, b))) for b in ids]
        found: dict[str, BranchRecord] = {}
        for branch_id, result in pending:
            try:
                data, stat = result.get()
            except NoNodeError:
                continue
            found[branch_id] = BranchRecord.from_bytes(
                self.sink_id, epoch, branch_id, data, stat.version)
        return found

    def epochs(self, open_only: bool = False) -> list[int]:
        """Epochs with a record (only those in the open index when ``open_only``)."""
        parent = self.layout.open if open_only else self.layout.xids
        try:
            return sorted(int(name) for name in self.client.get_children(parent))
        except NoNodeError:
            return []

    def read_xids(self, epochs: Iterable[int]) -> list[XidRecord]:
        """Xid records of ``epochs`` in order, skipping vanished ones; pipelined."""
        pending = [(e, self.client.get_async(self.layout.xid(e))) for e in epochs]
        records = []
        for epoch, result in pending:
            try:
                data, stat = result.get()
            except NoNodeError:
                continue
            records.append(XidRecord.from_bytes(self.sink_id, epoch, data, stat.version))
        return records


def list_sinks(client: NodeStore, root: str) -> list[str]:
    """Sink ids with a tree under ``root`` (unescaped), sorted."""
    try:
        names = client.get_children(f"{SinkLayout(root, 'x').sinks}")
    except NoNodeError:
        return []
    return sorted(unescape(n) for n in names)

