"""Where each record lives in the store.

One sink's tree (``root`` defaults to ``/txsink``; a kazoo chroot may sit above it)::

    <root>/sinks/<sink>                  {"sink_id": "..."}
      generation      {"generation": 7, ...}  its data version (7) is the fencing token
      last_committed  {"epoch": 41, "at": ...}
      next_epoch      {"next": 42}            batch epoch allocation
      pruned          {"committed": [[0, 30]], "aborted": [[12, 12]]}
      summary         {"folded": [[0, 30]], "partitions": {...}}  what pruned xids wrote
      stream          {"query_id": "...", ...}  streaming query owning the epochs (stream.py)
      txn_version     {"version": 7, "at": ...}  highest committed txn_version (epochs.py)
      open/<epoch>    (empty) index of unfinished xids: all that recovery reads
      live/<epoch>.<holder>  (ephemeral) an open xid's writer is alive (liveness.py)
      xids/<epoch>    xid record (state, generation, attempt, winners, metrics, history)
        publisher/holder, lease-<id> publish lease (ephemeral; publish_lease.py)
        branches/<branch>            branch record (state, attempt, owner, manifest)
          ledger/<key>               publish ledger entry (key: a staging table name)

Names are escaped (:func:`escape`) so any sink id, branch id or ledger key is one valid
znode name; epochs are zero-padded to 20 digits so that child order is epoch order.
Records are plain persistent znodes; the ephemeral nodes are the publish lease and the
writers' liveness holders, which must die with their holder's session. ``live`` is
created on first use (trees made before it existed lack it), so it is not part of
:meth:`SinkLayout.initial`; nor is ``summary``, written by the first retention pass.
No containers or TTL nodes: ClickHouse Keeper serves the same tree.
"""

from __future__ import annotations

import logging
from urllib.parse import quote, unquote

from kazoo.exceptions import NodeExistsError, NoNodeError
from kazoo.security import OPEN_ACL_UNSAFE

from coordinator.errors import SinkTreeDamaged
from coordinator.formats.records import decode, encode
from coordinator.plumbing.auth import require_acl, sink_acl
from coordinator.plumbing.multi import Multi, MultiFailed
from coordinator.plumbing.nodes import NodeStore

log = logging.getLogger(__name__)

#: The root of a sink's records when none is given (the option ``zk_root``'s default).
DEFAULT_ROOT = "/txsink"

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


def check_root(root: str, label: str = "root") -> str:
    """``root`` if it can hold sinks: an absolute znode path of printable characters,
    without empty, ``.`` or ``..`` parts (ZooKeeper refuses those with a bare
    ``BadArgumentsError``), not ``/`` (every sink's tree beside ZooKeeper's own) and not
    under ``/zookeeper`` (ZooKeeper's reserved tree). ValueError names ``label`` and the
    rule broken."""
    named = f"{label}={root!r}" if root.isprintable() else f"{label}={ascii(root)}"
    if not root.startswith("/") or root == "/" or root.endswith("/"):
        raise ValueError(f"{named} must be an absolute znode path other than '/', without "
                         "trailing '/'")
    if not root.isprintable():
        raise ValueError(f"{named} must consist of printable characters")
    parts = root.split("/")[1:]
    if any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"{named} must not have empty, '.' or '..' parts")
    if parts[0] == "zookeeper":
        raise ValueError(f"{named} must not be under /zookeeper, ZooKeeper's reserved tree")
    return root


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
        self.live = f"{self.sink}/live"  # absent until a writer holds an xid (liveness.py)
        self.summary = f"{self.sink}/summary"  # absent until retention folds (retention.py)

    def xid(self, epoch: int) -> str:
        return f"{self.xids}/{epoch_name(epoch)}"

    def open_marker(self, epoch: int) -> str:
        return f"{self.open}/{epoch_name(epoch)}"

    def live_holder(self, epoch: int, holder: str) -> str:
        return f"{self.live}/{epoch_name(epoch)}.{escape(holder)}"

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

    def initial(self) -> dict[str, bytes]:
        """Every node a new sink has, parent first, with its first content."""
        return {
            self.sink: encode({"sink_id": self.sink_id}, "sink"),
            self.generation: encode({"generation": 0}, "generation"),
            self.last_committed: encode({"epoch": None}, "last_committed"),
            self.next_epoch: encode({"next": 0}, "next_epoch"),
            self.pruned: encode({"committed": [], "aborted": []}, "pruned"),
            self.open: b"",
            self.xids: b"",
        }

    def ensure(self, client: NodeStore) -> None:
        """Create the sink's nodes in one multi-op, so no process sees half a sink; an
        existing tree is checked instead (:meth:`check`), so a half-made or foreign tree
        is completed or refused rather than retried forever.

        The shared ancestors are created open whatever the client's default ACL: other
        sinks, with other credentials, must be able to add theirs (coordinator/plumbing/auth.py).
        """
        client.ensure_path(self.sinks, acl=OPEN_ACL_UNSAFE)
        multi = Multi(client)
        for path, data in self.initial().items():
            multi.create(path, data, label="sink" if path == self.sink else "create")
        try:
            multi.commit()
            return  # created here, with this client's ACL: nothing to check
        except MultiFailed as failed:
            if not (failed.label == "sink" and isinstance(failed.error, NodeExistsError)):
                raise
        self.check(client)

    def damage(self, client: NodeStore) -> str | None:
        """What :meth:`check` would refuse the tree for (None: nothing), only reading."""
        try:
            children = set(client.get_children(self.sink))
        except NoNodeError:
            return None
        missing = [p for p in self.initial()
                   if p != self.sink and p.rsplit("/", 1)[1] not in children]
        return self._lost(client, missing) if missing else None

    def _lost(self, client: NodeStore, missing: list[str]) -> str | None:
        """The refusal of a tree lacking ``missing`` once xids were begun under it."""
        begun = [p for p in (self.open, self.xids) if p not in missing and _has_children(
            client, p)]
        if not begun:
            return None
        return (f"sink {self.sink_id!r}'s tree lacks {', '.join(missing)} although xids were "
                f"begun under {', '.join(begun)}: its state cannot be rebuilt safely. "
                "Restore the tree from a backup, or remove it (txsink status shows what it "
                "held) and let the next writer start the sink afresh")

    def check(self, client: NodeStore, _again: bool = True) -> None:
        """Check the shape (and, for a client with credentials, the ACL of every node) of
        an existing sink tree.

        A tree is repaired only when it is provably this sink's own half-made creation:
        the sink node holds this sink's record and no xid was ever begun under it, so every
        missing child's first content is known. Anything else raises
        :class:`SinkTreeDamaged` naming the path (re-creating ``generation`` or
        ``last_committed`` of a sink with history would reopen fencing or forget commits).
        Returns quietly when the sink does not exist (yet).
        """
        try:
            data, stat = client.get(self.sink)
            children = set(client.get_children(self.sink))
        except NoNodeError:
            return
        if decode(data, self.sink).get("sink_id") != self.sink_id:
            raise SinkTreeDamaged(
                f"{self.sink} exists but does not hold sink {self.sink_id!r}'s record (found "
                f"{data[:60]!r}): txsink did not create it. Delete it if nothing uses it "
                f"(zkCli: deleteall {self.sink}), or write under another sink_id or zk_root")
        expected = sink_acl(client)
        if expected is not None:  # credentials protect only what is created with them
            require_acl(client, self.sink, expected)
        initial = self.initial()
        missing = [p for p in initial if p != self.sink and p.rsplit("/", 1)[1] not in children]
        if not missing:
            return
        problem = self._lost(client, missing)
        if problem:
            raise SinkTreeDamaged(problem)
        multi = Multi(client).check(self.sink, stat.version, label="sink")
        for path in missing:
            multi.create(path, initial[path])
        try:
            multi.commit()
        except MultiFailed as failed:  # another writer completed or changed it meanwhile
            if not (_again and failed.conflict):
                raise
            self.check(client, _again=False)
            return
        log.warning("sink %s: completed its half-made tree (created %s)", self.sink_id,
                    ", ".join(missing))


def _has_children(client: NodeStore, path: str) -> bool:
    try:
        return bool(client.get_children(path))
    except NoNodeError:
        return False
