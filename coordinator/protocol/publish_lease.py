"""The publish lease: one actor at a time finishes a decided xid.

After the decision, an xid is finished (published or rolled back) by whoever holds its
lease: the driver that decided it, a second driver's recovery at job start, a restarted
stream replaying the epoch, or an operator's ``txsink recover``. The lease is two
ephemeral nodes under ``<xid>/publisher`` (made with the xid), created and deleted in one
multi-op: ``holder`` (a fixed name, so a second actor's create fails while it lives; its
data names the holder) and ``lease-<uuid>`` (this holder's own node, which every fenced
write checks). Both die with the holder's session of the store, so a crashed holder never
blocks anyone for longer than the session timeout, and a holder whose session expired can
pass no check of its own node, nor delete a successor's ``holder`` (the delete of its own
node, gone, fails the multi).

Taking it is one multi-op (its folder is made with the xid), which also raises the
folder's data version: version 1 after it says this is the xid's first lease ever, so no
holder before this one can have written a branch's publish ledger (``first``). The xid's
final write releases it (``release_in``), so finishing an xid costs one request for its
lease.

Contract:

- ``acquire()`` never waits; it returns False while another live session holds the lease
  (``holder()`` says who). An actor that does not hold the lease writes nothing about the
  xid's publish and sends no statement that publishes or drops its staging.
- ``guard(multi)`` adds ``check(<own lease node>)`` to a multi-op: every ledger write that
  leads to an ATTACH and the xid's final write pass only while this holder's node exists.
  A holder whose session expired has lost its node (its ephemeral node is deleted by the
  server), so it cannot pass any of them even if it has not noticed yet; a newer holder
  has a different node. The multi fails with label ``lease``.
- ``first`` is True only for the xid's first lease; ``fresh_ledger(branch)`` is True once
  per branch while it is (the ledger may start from "no entries" without reading them).
  Holders of releases that did not raise the version are not counted, which costs no
  safety: every ledger write is a compare-and-set that fails on an entry it did not read.
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
import uuid

from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError

from coordinator.errors import PublishLeaseLost, UnknownXid
from coordinator.plumbing.multi import Multi, MultiFailed
from coordinator.plumbing.store import SinkStore

LEASE = "lease"  # label of the lease check in a multi-op
HOLDER = "holder"  # the node whose existence is the lease (its data: the holder)


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
        self.identity = identity
        self.path = store.layout.publisher(epoch)
        self._own: str | None = None  # the own node's name while held
        self._tried: str | None = None  # the own node's name of the last take sent (a
        # take whose reply was lost is found by it)
        self.waited = False  # another holder was seen: the caller re-reads the xid
        self.first = False  # the xid's first lease ever (see the module contract)
        self._ledgers_handed: set[str] = set()

    @property
    def held(self) -> bool:
        return self._own is not None

    @property
    def node(self) -> str:
        if self._own is None:
            raise PublishLeaseLost(f"xid {self.store.sink_id}/{self.epoch}: lease not held")
        return f"{self.path}/{self._own}"

    def acquire(self) -> bool:
        """Take the lease if nobody holds it; idempotent for the holder."""
        if self._own is not None:
            return True
        return bool(self.store.run(self._acquire))

    def holder(self) -> str | None:
        """The identity of the live holder (None: nobody)."""
        try:
            return self.store.run(self.store.client.get, f"{self.path}/{HOLDER}")[0].decode()
        except NoNodeError:
            return None

    def fresh_ledger(self, branch_id: str) -> bool:
        """True the first time it is asked for ``branch_id`` under the xid's first lease:
        that branch's ledger holds no entries yet."""
        if not self.first or branch_id in self._ledgers_handed:
            return False
        self._ledgers_handed.add(branch_id)
        return True

    def guard(self, multi: Multi) -> Multi:
        """Add the lease check: the multi applies only while this holder's node lives."""
        return multi.check(self.node, 0, label=LEASE)

    def check(self) -> None:
        """Raise :class:`PublishLeaseLost` unless this holder's node exists now.

        Called right before a statement that makes rows visible.
        """
        if self.store.run(self.store.client.exists, self.node) is None:
            self._own = None
            raise PublishLeaseLost(
                f"xid {self.store.sink_id}/{self.epoch}: the publish lease was lost (ZooKeeper "
                "session expired); another actor may finish the xid")

    def release_in(self, multi: Multi) -> Multi:
        """Add the release to ``multi`` (after its :meth:`guard`); call :meth:`released`
        once it applied."""
        multi.delete(self.node, label=LEASE)
        return multi.delete(f"{self.path}/{HOLDER}", label=LEASE)

    def released(self) -> None:
        self._own = None

    def release(self) -> None:
        """Idempotent; a holder whose session is gone has nothing left to release."""
        if self._own is None:
            return
        try:
            self.release_in(Multi(self.store.client)).commit()
        except (KazooException, MultiFailed):
            pass  # the session is gone: so are its ephemeral nodes
        self._own = None

    def _acquire(self) -> bool:
        for _ in range(3):
            tried, self._tried = self._tried, f"lease-{uuid.uuid4().hex[:12]}"
            multi = Multi(self.store.client)
            multi.create(f"{self.path}/{HOLDER}", self.identity.encode(), label=LEASE,
                         ephemeral=True)
            multi.create(f"{self.path}/{self._tried}", label=LEASE, ephemeral=True)
            multi.set_data(self.path, b"", -1, label=LEASE)  # counts the takes
            try:
                results = multi.commit()
            except MultiFailed as failed:
                if isinstance(failed.error, NoNodeError):
                    self._ensure_dir()  # an xid made before its folder was
                    continue
                if not isinstance(failed.error, NodeExistsError):
                    raise failed.error from None
                # held: by this take, whose reply was lost, or by a session past its
                # expiry (a KeeperMap store expires it on this read), or by another actor
                if tried is not None and self.store.client.exists(
                        f"{self.path}/{tried}") is not None:
                    self._own = tried
                    return True
                if self.store.client.exists(f"{self.path}/{HOLDER}") is not None:
                    return False
                continue
            self._own = self._tried
            self.first = getattr(results[-1], "version", 0) == 1
            return True
        return False

    def _ensure_dir(self) -> None:
        """Create ``<xid>/publisher`` without re-creating a pruned xid on the way."""
        try:
            self.store.client.create(self.path)
        except NodeExistsError:
            pass
        except NoNodeError:
            raise UnknownXid(f"xid {self.store.sink_id}/{self.epoch} has no record") from None
