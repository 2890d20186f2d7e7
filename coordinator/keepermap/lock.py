"""The publish lease's lock over the KeeperMap store: kazoo's ``Lock`` surface.

Taken without waiting (``acquire(blocking=False)``), by any process; one holder at a time,
because the holder's node is created only while the lock's path has no other child, in
one log entry. A holder whose session expired loses its node (``log.py``).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from kazoo.exceptions import BadArgumentsError, NodeExistsError, NoNodeError

if TYPE_CHECKING:
    from coordinator.keepermap.log_store import KeeperMapNodes


class KeeperMapLock:
    """The publish lease over the KeeperMap store: kazoo's ``Lock`` surface, non-blocking.

    The holder's node ``<path>/lease-<uuid>`` is ephemeral and created only while
    ``<path>`` has no other child (one log entry), so there is one holder at a time; its
    unique name means a holder whose session expired can neither pass a check of its
    node nor delete a successor's."""

    def __init__(self, store: KeeperMapNodes, path: str, identifier: str) -> None:
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
            self.store._ephemeral_once_more(lambda: self.store._one(self.store._create_op(
                f"{self.path}/{name}", self.identifier.encode(), ephemeral=True,
                sequence=False, alone=True)))

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
            self.store._one(["delete", f"{self.path}/{self.node}", -1, False,
                             self.store.session])
        except NoNodeError:
            pass
        self.is_acquired, self.node = False, None
        return True
