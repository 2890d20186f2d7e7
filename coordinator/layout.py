"""Where each record lives in ZooKeeper.

One sink's tree (``root`` defaults to ``/txsink``; a kazoo chroot may sit above it)::

    <root>/sinks/<sink>                  {"sink_id": "..."}
      generation      {"generation": 7, ...}  its data version (7) is the fencing token
      last_committed  {"epoch": 41, "at": ...}
      next_epoch      {"next": 42}            batch epoch allocation
      pruned          {"committed": [[0, 30]], "aborted": [[12, 12]]}
      stream          {"query_id": "...", ...}  streaming query owning the epochs (stream.py)
      txn_version     {"version": 7, "at": ...}  highest committed txn_version (epochs.py)
      open/<epoch>    (empty) index of unfinished xids: all that recovery reads
      xids/<epoch>    xid record (state, generation, attempt, winners, metrics, history)
        publisher/<lock node>        publish lease (ephemeral; coordinator/publish_lease.py)
        branches/<branch>            branch record (state, attempt, owner, manifest)
          ledger/<key>               publish ledger entry (key: a staging table name)

Names are escaped (:func:`escape`) so any sink id, branch id or ledger key is one valid
znode name; epochs are zero-padded to 20 digits so that child order is epoch order.
Records are plain persistent znodes; the one ephemeral node is the publish lease, which
must die with its holder's session. No containers or TTL nodes: ClickHouse Keeper serves
the same tree.
"""

from __future__ import annotations

from urllib.parse import quote, unquote

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError
from kazoo.security import OPEN_ACL_UNSAFE

from coordinator.multi import Multi, MultiFailed
from coordinator.records import encode

EPOCH_DIGITS = 20


def escape(name: str) -> str:
    """A reversible, znode-safe form of ``name`` (percent-encoding; never "." or "..")."""
    if not name:
        raise ValueError("a sink id, branch id or ledger key must not be empty")
    escaped = quote(name, safe="")
    if escaped in (".", ".."):
        escaped = escaped.replace(".", "%2E")
    return escaped


def unescape(name: str) -> str:
    return unquote(name)


def epoch_name(epoch: int) -> str:
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        raise ValueError(f"an epoch is a non-negative integer, got {epoch!r}")
    return f"{epoch:0{EPOCH_DIGITS}d}"


def check_root(root: str) -> str:
    if not root.startswith("/") or (len(root) > 1 and root.endswith("/")):
        raise ValueError(f"root must be an absolute znode path without trailing '/': {root!r}")
    return root.rstrip("/") if root != "/" else ""


class SinkLayout:
    """Paths of one sink's tree, and its one-time creation.

    Usage::

        layout = SinkLayout("/txsink", "orders-stream")
        layout.xid(41)            # "/txsink/sinks/orders-stream/xids/00000000000000000041"
        layout.ensure(client)     # creates the sink's nodes if missing (idempotent)
    """

    def __init__(self, root: str, sink_id: str) -> None:
        self.root = check_root(root)
        self.sink_id = sink_id
        self.sinks = f"{self.root}/sinks"
        self.sink = f"{self.sinks}/{escape(sink_id)}"
        self.generation = f"{self.sink}/generation"
        self.last_committed = f"{self.sink}/last_committed"
        self.next_epoch = f"{self.sink}/next_epoch"
        self.pruned = f"{self.sink}/pruned"
        self.open = f"{self.sink}/open"
        self.xids = f"{self.sink}/xids"
        self.stream = f"{self.sink}/stream"  # absent until a streaming query writes
        self.txn_version = f"{self.sink}/txn_version"  # absent until a versioned commit

    def xid(self, epoch: int) -> str:
        return f"{self.xids}/{epoch_name(epoch)}"

    def open_marker(self, epoch: int) -> str:
        return f"{self.open}/{epoch_name(epoch)}"

    def publisher(self, epoch: int) -> str:
        return f"{self.xid(epoch)}/publisher"

    def branches(self, epoch: int) -> str:
        return f"{self.xid(epoch)}/branches"

    def branch(self, epoch: int, branch_id: str) -> str:
        return f"{self.branches(epoch)}/{escape(branch_id)}"

    def ledger(self, epoch: int, branch_id: str) -> str:
        return f"{self.branch(epoch, branch_id)}/ledger"

    def ledger_entry(self, epoch: int, branch_id: str, key: str) -> str:
        return f"{self.ledger(epoch, branch_id)}/{escape(key)}"

    def ensure(self, client: KazooClient) -> None:
        """Create the sink's nodes in one multi-op, so no process sees half a sink.

        The shared ancestors are created open whatever the client's default ACL: other
        sinks, with other credentials, must be able to add theirs (coordinator/auth.py).
        """
        client.ensure_path(self.sinks, acl=OPEN_ACL_UNSAFE)
        multi = Multi(client)
        multi.create(self.sink, encode({"sink_id": self.sink_id}, "sink"), label="sink")
        multi.create(self.generation, encode({"generation": 0}, "generation"))
        multi.create(self.last_committed, encode({"epoch": None}, "last_committed"))
        multi.create(self.next_epoch, encode({"next": 0}, "next_epoch"))
        multi.create(self.pruned, encode({"committed": [], "aborted": []}, "pruned"))
        multi.create(self.open)
        multi.create(self.xids)
        try:
            multi.commit()
        except MultiFailed as failed:
            if not (failed.label == "sink" and isinstance(failed.error, NodeExistsError)):
                raise
