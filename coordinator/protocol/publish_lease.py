"""The publish lease: one actor at a time finishes a decided xid.

After the decision, an xid is finished (published or rolled back) by whoever holds its
lease: the driver that decided it, a second driver's recovery at job start, a restarted
stream replaying the epoch, or an operator's ``txsink recover``. The lease is kazoo's
``Lock`` recipe on ``<xid>/publisher``: an ephemeral sequential znode, so it dies with its
holder's session of the store and a crashed holder never blocks anyone for longer than the
session timeout.

Contract:

- ``acquire()`` never waits; it returns False while another live session holds the lease
  (``holder()`` says who). An actor that does not hold the lease writes nothing about the
  xid's publish and sends no statement that publishes or drops its staging.
- ``guard(multi)`` adds ``check(<own lease node>)`` to a multi-op: every ledger write that
  leads to an ATTACH and the xid's final write pass only while this holder's node exists.
  A holder whose session expired has lost its node (its ephemeral node is deleted by the
  server), so it cannot pass any of them even if it has not noticed yet; a newer holder
  has a different node. The multi fails with label ``lease``.
- ``release()`` is idempotent. Leases are per process and per xid: callers hold one while
  they finish the xid and release it in a ``finally``.

What the lease cannot fence: a statement the old holder already sent to ClickHouse. The
``attach_marked`` repeat waits for such statements (``server_ext.publish``) before it
decides, and a holder checks its lease right before each ATTACH, so the remaining window is
a process pause longer than the store's session timeout between that check and the
statement reaching the server (see docs/design.md, "Publish ownership").

Usage::

    lease = PublishLease(store, epoch=41, identity="host:6549 generation 7")
    if not lease.acquire():
        raise PublishInProgress(..., holder=lease.holder())
    try:
        multi = lease.guard(Multi(store.client))
        ...
    finally:
        lease.release()
"""

from __future__ import annotations

import json
import os
import socket
import time

from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError

from coordinator.errors import PublishLeaseLost, UnknownXid
from coordinator.plumbing.multi import Multi
from coordinator.plumbing.store import SinkStore

LEASE = "lease"  # label of the lease check in a multi-op


def actor_identity(role: str, generation: int | None = None) -> str:
    """Who holds a lease, as shown to operators: role, host, pid, generation."""
    detail = {"role": role, "host": socket.gethostname(), "pid": os.getpid(),
              "since": round(time.time(), 3)}
    if generation is not None:
        detail["generation"] = generation
    return json.dumps(detail, sort_keys=True, separators=(",", ":"))


class PublishLease:
    """The publish lease of one xid (see the module contract)."""

    def __init__(self, store: SinkStore, epoch: int, identity: str) -> None:
        self.store = store
        self.epoch = epoch
        self.path = store.layout.publisher(epoch)
        self._lock = store.client.Lock(self.path, identifier=identity)
        self.waited = False  # another holder was seen: the caller re-reads the xid

    @property
    def held(self) -> bool:
        return self._lock.is_acquired

    @property
    def node(self) -> str:
        if not self._lock.is_acquired or self._lock.node is None:
            raise PublishLeaseLost(f"xid {self.store.sink_id}/{self.epoch}: lease not held")
        return f"{self.path}/{self._lock.node}"

    def acquire(self) -> bool:
        """Take the lease if nobody holds it; idempotent for the holder."""
        if self._lock.is_acquired:
            return True
        self.store.run(self._ensure_dir)
        return bool(self._lock.acquire(blocking=False))

    def holder(self) -> str | None:
        """The identity of the live holder (None: nobody)."""
        self._lock.assured_path = True  # never create the path just to look
        try:
            contenders = self.store.run(self._lock.contenders)
        except NoNodeError:
            return None
        return contenders[0] if contenders else None

    def guard(self, multi: Multi) -> Multi:
        """Add the lease check: the multi applies only while this holder's node lives."""
        return multi.check(self.node, 0, label=LEASE)

    def check(self) -> None:
        """Raise :class:`PublishLeaseLost` unless this holder's node exists now.

        Called right before a statement that makes rows visible.
        """
        if self.store.run(self.store.client.exists, self.node) is None:
            self._lock.is_acquired = False
            raise PublishLeaseLost(
                f"xid {self.store.sink_id}/{self.epoch}: the publish lease was lost (ZooKeeper "
                "session expired); another actor may finish the xid")

    def release(self) -> None:
        if not self._lock.is_acquired:
            return
        try:
            self._lock.release()
        except KazooException:
            pass  # the session is gone: so is the ephemeral node

    def _ensure_dir(self) -> None:
        """Create ``<xid>/publisher`` without re-creating a pruned xid on the way."""
        try:
            self.store.client.create(self.path)
        except NodeExistsError:
            pass
        except NoNodeError:
            raise UnknownXid(f"xid {self.store.sink_id}/{self.epoch} has no record") from None
        self._lock.assured_path = True
