"""All-or-nothing multi-ops of the store that say which operation failed.

Every state change of the coordinator is one multi-op: a ``check`` of the sink's
generation (fencing), ``check``/``set_data`` with the version the record was read at
(compare-and-set), and any ``create``/``delete`` that must happen in the same step.
kazoo reports a failed multi as a list of per-operation results; :class:`Multi` turns it
into one :class:`MultiFailed` naming the label of the operation that broke it, so the
caller can map "fence" to :class:`~coordinator.errors.Fenced` and "xid" to "re-read and
decide again". Only ``check``, ``create``, ``set_data`` and ``delete`` are used: the
subset ClickHouse Keeper implements too.
"""

from __future__ import annotations

from collections.abc import Iterator

from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
    RuntimeInconsistency,
)

from coordinator.errors import GaveUp
from coordinator.plumbing.nodes import NodeStore

_COLLATERAL = (RolledBackError, RuntimeInconsistency)  # "another op of the multi failed"

CHUNK_BYTES = 700_000  # keep each multi-op well under ZooKeeper's 1 MB packet limit
CONFLICT_RETRIES = 20  # re-reads after lost compare-and-sets before backing off
CAS_TRIES = 200  # a compare-and-set loop of one node gives up after this many lost tries


class MultiFailed(Exception):
    """One operation of a multi failed; none of them was applied."""

    def __init__(self, label: str, error: Exception) -> None:
        super().__init__(f"{label}: {type(error).__name__}")
        self.label = label
        self.error = error

    @property
    def conflict(self) -> bool:
        """A version mismatch or a node that appeared/vanished: someone else wrote first."""
        return isinstance(self.error, BadVersionError | NodeExistsError | NoNodeError)


class Multi:
    """A labelled kazoo transaction.

    Usage::

        multi = Multi(client)
        multi.check(layout.generation, generation, label="fence")
        multi.set_data(layout.xid(7), record.to_bytes(), record.version, label="xid")
        try:
            multi.commit()
        except MultiFailed as failed:
            if failed.label == "fence":
                ...  # a newer generation owns the sink
    """

    def __init__(self, client: NodeStore) -> None:
        self._client = client
        self._tx = client.transaction()
        self._labels: list[str] = []
        self.size = 0  # bytes of payload, to keep a multi under ZooKeeper's packet limit

    def __len__(self) -> int:
        return len(self._labels)

    def check(self, path: str, version: int, label: str) -> Multi:
        self._tx.check(path, version)
        return self._add(label, path, b"")

    def create(self, path: str, data: bytes = b"", label: str = "create",
               ephemeral: bool = False) -> Multi:
        self._tx.create(path, data, ephemeral=ephemeral)
        return self._add(label, path, data)

    def set_data(self, path: str, data: bytes, version: int, label: str) -> Multi:
        self._tx.set_data(path, data, version=version)
        return self._add(label, path, data)

    def write(self, path: str, data: bytes, version: int | None, label: str) -> Multi:
        """Compare-and-set a record read at ``version``; None: read as absent, create it."""
        if version is None:
            return self.create(path, data, label=label)
        return self.set_data(path, data, version, label=label)

    def delete(self, path: str, version: int = -1, label: str = "delete") -> Multi:
        self._tx.delete(path, version=version)
        return self._add(label, path, b"")

    def commit(self) -> list[object]:
        """Apply every operation or none; raise :class:`MultiFailed` for the culprit."""
        if not self._labels:
            return []
        results = self._tx.commit()
        for label, result in zip(self._labels, results, strict=False):
            if isinstance(result, Exception) and not isinstance(result, _COLLATERAL):
                raise MultiFailed(label, result)
        if any(isinstance(r, Exception) for r in results):
            raise MultiFailed("unknown", KazooException(f"multi failed: {results!r}"))
        return results

    def _add(self, label: str, path: str, data: bytes) -> Multi:
        self._labels.append(label)
        self.size += len(path) + len(data) + 32
        return self


def tries(what: str, count: int = CAS_TRIES) -> Iterator[int]:
    """Attempt numbers of a compare-and-set loop; once ``count`` are spent,
    :class:`~coordinator.errors.GaveUp` saying what the loop waited for (``what``), so
    no loop of the coordinator can spin forever."""
    yield from range(count)
    raise GaveUp(f"gave up after {count} tries {what}")
