"""The publish lease's lock over the KeeperMap store: kazoo's ``Lock`` surface.

Taken without waiting (``acquire(blocking=False)``), by any process; one holder at a time,
because the holder's node is created only while the lock's path has no other child, in
one log entry. A holder whose session expired loses its node (``log.py``). Built only on
the store's public operations (:class:`LockStore`, which ``KeeperMapNodes`` serves)::

    lock = nodes.Lock(SinkLayout("/txsink", "orders").publisher(7), "driver-1")
    if lock.acquire(blocking=False):  # False: another session holds it
        try:
            ...  # publish
        finally:
            lock.release()
"""

from __future__ import annotations

import uuid
from typing import Any, Protocol

from kazoo.exceptions import BadArgumentsError, NodeExistsError, NoNodeError


class LockStore(Protocol):
    """The operations of the KeeperMap store that the lock uses."""

    def create_alone(self, path: str, value: bytes = b"") -> str: ...

    def delete_own(self, path: str) -> bool: ...

    def exists(self, path: str) -> Any: ...

    def get(self, path: str) -> tuple[bytes, Any]: ...

    def get_children(self, path: str) -> list[str]: ...


class KeeperMapLock:
    """The publish lease over the KeeperMap store: kazoo's ``Lock`` surface, non-blocking.

    The holder's node ``<path>/lease-<uuid>`` is ephemeral and created only while
    ``<path>`` has no other child (one log entry), so there is one holder at a time; its
    unique name means a holder whose session expired can neither pass a check of its
    node nor delete a successor's."""

    def __init__(self, store: LockStore, path: str, identifier: str) -> None:
        self.store = store
        self.path = path
        self.identifier = identifier
        self.is_acquired = False
        self.node: str | None = None
        self.assured_path = False

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        if blocking:
            raise BadArgumentsError("the KeeperMap lease is taken without waiting")
        name = f"lease-{uuid.uuid4().hex[:12]}"

        def take() -> None:
            self.store.create_alone(f"{self.path}/{name}", self.identifier.encode())

        try:
            take()
        except NodeExistsError:  # held: unless by a session past its expiry
            self.store.exists(self.path)  # catches up and expires dead holders
            try:
                take()
            except NodeExistsError:
                return False
        self.node, self.is_acquired = name, True
        return True

    def contenders(self) -> list[str]:
        children = self.store.get_children(self.path)
        found = []
        for child in children:
            try:
                found.append(self.store.get(f"{self.path}/{child}")[0].decode())
            except NoNodeError:
                continue
        return found

    def release(self) -> bool:
        if not self.is_acquired or self.node is None:
            return False
        try:
            self.store.delete_own(f"{self.path}/{self.node}")
        except NoNodeError:
            pass
        self.is_acquired, self.node = False, None
        return True
