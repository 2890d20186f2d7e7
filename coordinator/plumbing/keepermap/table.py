"""The key-value table under the KeeperMap store, and the keys the store keeps in it.

:class:`KeyValueTable` is what the store needs of a table (``server_ext.ddl.records_table`` has the
SQL one; tests use a dict); :class:`TableKeys` names every key of one store's namespace;
:func:`call_table` turns a table error marked ``retryable`` into kazoo's ``ConnectionLoss``,
which the coordinator's retry policy retries. Stateless: safe from any thread.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from kazoo.exceptions import ConnectionLoss


class KeyValueTable(Protocol):
    """The key-value table the store writes through (``server_ext.ddl.records_table``).

    ``create_new`` creates all keys or none and says False when one existed; errors that
    may go away on a retry carry ``retryable = True``."""

    def get_many(self, keys: Iterable[str]) -> dict[str, str]: ...

    def create_new(self, rows: dict[str, str]) -> bool: ...

    def put(self, key: str, value: str) -> None: ...

    def keys_with_prefix(self, prefix: str) -> list[str]: ...

    def delete(self, keys: Iterable[str]) -> None: ...


def call_table(func: Any, *args: Any) -> Any:
    """Call the table; an error it marks ``retryable`` becomes kazoo's
    ``ConnectionLoss``, which the coordinator's retry policy retries."""
    try:
        return func(*args)
    except Exception as exc:
        if getattr(exc, "retryable", False) is True or isinstance(exc, ConnectionError):
            raise ConnectionLoss(str(exc)) from exc
        raise


class TableKeys:
    """The keys of one store's namespace (a prefix of every key: kazoo's chroot, for one
    table): a sink's log entries, snapshots, snapshot pointer, trim floor and index row."""

    def __init__(self, namespace: str = "") -> None:
        self.namespace = namespace

    def entry(self, root: str, seq: int | None) -> str:
        """The key of entry ``seq``; None: the prefix of every entry of ``root``."""
        return f"log:{self.namespace}{root}:{'' if seq is None else f'{seq:020d}'}"

    def index(self, root: str) -> str:
        return f"index:{self.namespace}{root}"

    def base(self, root: str) -> str:
        return f"base:{self.namespace}{root}"

    def snapshot(self, root: str, seq: int | None) -> str:
        """The head key of snapshot ``seq``; None: the prefix of every snapshot key."""
        return f"snap:{self.namespace}{root}:{'' if seq is None else f'{seq:020d}'}"

    def floor(self, root: str) -> str:
        return f"trim:{self.namespace}{root}"
