"""The node store: the one surface through which the coordinator keeps its records.

The coordinator's records form a tree of versioned nodes, and every change to them is an
all-or-nothing multi-op of ``check``/``create``/``set_data``/``delete`` (``multi.py``).
:class:`NodeStore` names exactly what of a store the coordinator uses, so that the same
transitions, fencing, liveness and publish lease run over either store:

- ZooKeeper (or ClickHouse Keeper): a started kazoo ``KazooClient`` *is* a node store, as
  it is; nothing wraps it, so the default path costs nothing extra;
- KeeperMap tables of the ClickHouse the sink writes to (``coordinator/plumbing/keepermap/``):
  the same tree, kept as an ordered log of multi-ops in a KeeperMap table.

Errors are kazoo's exception classes for both stores (``NoNodeError``,
``NodeExistsError``, ``BadVersionError``, ``RolledBackError``, ``ConnectionLoss``,
``SessionExpiredError``): one vocabulary, so ``multi.py``, the steps' conflict handling
and the retry policy (``store.default_retry``) are the same code for both.

Ephemeral nodes (liveness holders, the publish lease) die with their holder's *session*:
a ZooKeeper session, or a KeeperMap store's lease with an expiry its holder refreshes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

#: Seconds a session outlives a holder that stopped refreshing it (a killed process): the
#: default of both stores' sessions; the sink's option ``session_timeout`` sets it.
SESSION_TIMEOUT = 10.0


class NodeStat(Protocol):
    """What the coordinator reads of a node's metadata."""

    version: int  # the data version: the compare-and-set token
    mtime: int  # last modification, milliseconds since the epoch


class AsyncRead(Protocol):
    """A read sent before its answer is needed (pipelining)."""

    def get(self) -> Any: ...


class MultiOpRequest(Protocol):
    """An all-or-nothing multi-op (kazoo's ``TransactionRequest``); ``commit`` returns one
    result per operation, a failed operation's result being its exception (kazoo's
    convention)."""

    def check(self, path: str, version: int) -> None: ...

    def create(self, path: str, value: bytes = b"", acl: Any = None,
               ephemeral: bool = False, sequence: bool = False) -> None: ...

    def set_data(self, path: str, value: bytes, version: int = -1) -> None: ...

    def delete(self, path: str, version: int = -1) -> None: ...

    def commit(self) -> list[Any]: ...


class Handler(Protocol):
    sleep_func: Callable[[float], None]


class NodeStore(Protocol):
    """The narrow kazoo surface the coordinator uses (see the module docstring)."""

    handler: Handler  # its sleep function paces the retry policy
    default_acl: Any  # kazoo's ACL of new nodes (None: open; KeeperMap: always None)

    def get(self, path: str) -> tuple[bytes, NodeStat]: ...

    def get_async(self, path: str) -> AsyncRead: ...

    def get_children(self, path: str) -> list[str]: ...

    def exists(self, path: str) -> NodeStat | None: ...

    def create(self, path: str, value: bytes = b"", acl: Any = None,
               ephemeral: bool = False, sequence: bool = False,
               makepath: bool = False) -> str: ...

    def ensure_path(self, path: str, acl: Any = None) -> bool: ...

    def set(self, path: str, value: bytes, version: int = -1) -> NodeStat: ...

    def delete(self, path: str, version: int = -1, recursive: bool = False) -> Any: ...

    def transaction(self) -> MultiOpRequest: ...

