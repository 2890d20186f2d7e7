"""The KeeperMap node store: the coordinator's tree in a KeeperMap table, one log per sink.

A second implementation of :class:`~coordinator.nodes.NodeStore` for deployments without a
ZooKeeper of their own (ClickHouse Cloud): every record the coordinator keeps lives in a
KeeperMap table of the ClickHouse the sink writes to, reached through a small key-value
table (:class:`KeyValueTable`; ``server_ext.keepermap.KeeperMapTable`` is the SQL one).

Why a log and not one row per node. KeeperMap gives exactly one atomic, conditional write
with an unambiguous answer: a strict INSERT of new keys (one Keeper multi of creates; a key
that exists fails it, "Node exists"). A conditional ``ALTER … UPDATE … WHERE _version = n``
is applied in one multi too, but a row that does not match is skipped silently, so its
caller cannot tell whether it applied; and no statement mixes creates, updates, deletes and
checks across rows. The coordinator's steps need exactly that mix (``check(generation)`` +
``check(xid)`` + ``create(branch)``). So each sink's tree is a replicated state machine:

- every multi-op is one **log entry**, the key ``log:<sink>:<seq>``, created by a strict
  INSERT at the sequence number after the last entry the writer has applied. The INSERT
  fails if another writer took that number first; the writer then reads the new entries,
  validates its operations again against the newer tree and retries at the next number.
  So a write needs no read before it: validated against the writer's own copy of the
  tree, it lands only if that copy was current (one round trip); a refusal is reported
  only after the writer has read the newest entries;
- the tree (data, version, children, ephemeral owner of every node) is the fold of the
  log, which is deterministic: an entry was validated against exactly the tree its
  predecessors make, so every reader folds it the same way. Checks write nothing, as in
  ZooKeeper: concurrent registrations of one xid conflict only on the sequence number,
  and a registration retried at the next number still passes its ``check(xid, v)``;
- a read first applies the entries written since the reader's last one (one point-lookup
  SELECT of the next few keys), so reads are linearizable like ZooKeeper's after a sync.

Everything of a sink (``<root>/sinks/<sink>`` and below) is one log, so sinks never
contend; ``<root>`` and ``<root>/sinks`` are implicit, and the sinks are listed from one
``index:<sink>`` row each.

Ephemeral nodes. A store instance is a *session* with an expiry, written into the log of
every sink where it owns ephemeral nodes: at creation, then refreshed every third of the
timeout by a heartbeat thread (a ``refresh`` entry). Any reader that finds a session past
its expiry (plus a clock margin) appends an ``expire`` entry, which deletes the session's
ephemeral nodes; from then on every refresh or ephemeral create of that session is refused
(kazoo's ``SessionExpiredError``) and the instance continues under a new session, as a
kazoo client does after an expiry. A lost lease is therefore exactly ZooKeeper's: the
holder's node is gone from the log order of the ``expire`` entry on, so its
``check(lease node)`` fails and ``PublishLease.check`` reports ``PublishLeaseLost``.
Holders' clocks must agree within :data:`CLOCK_MARGIN`.

Snapshots. The writer that appends an entry whose sequence number is a multiple of
:data:`COMPACT_EVERY` stores the folded tree at that number (``snap:<sink>:<seq>``: chunk
keys, then a head key naming their count and when it was written, each a strict INSERT)
and points ``base:<sink>`` at it. A process that meets a sink for the first time reads
the pointer with its first log read, loads the snapshot and folds only the entries after
it. Both are safe to repeat and to race: the fold at a sequence number is deterministic
and serialized canonically, so two writers store the same chunks (a chunk or head that
exists already is the same); a head is written only after all its chunks, so a head
found means a whole snapshot; and a pointer that a racing writer moves back to an older
snapshot only makes readers fold more entries (or, if that snapshot is gone, list the
heads and take the newest).

Retention. An existing key is what stops a writer with a stale copy of the tree from
appending at a number already taken (a strict INSERT refuses only keys that exist), so an
entry may be deleted only once no copy that old can still be used. The rule is one of
time, like the sessions': after storing a snapshot the writer deletes the entries and
older snapshots below the newest snapshot whose head is older than the retention
(:data:`RETAIN`, ``trim:<sink>`` remembers how far that went); and a copy of a log not
known current for half the retention (no read that found its end, no append) is not
trusted: the next read or write fetches the pointer with the entries and loads the
snapshot if it is newer than the copy. Every entry deleted was written after such a
copy was last current and at least a retention before the deletion, so a copy recent
enough to be used never skips a deleted entry. A sink's log therefore holds the entries
of about one retention (~1 MB of keys at a 1 s trigger) instead of growing for ever.

Limits: an entry is one Keeper node, so a record near the coordinator's 900 kB cap
(escaped once more inside its entry) may exceed Keeper's 1 MB node limit; the publish
lock is this module's own (:class:`KeeperMapLock`).
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any, Protocol

from kazoo.exceptions import (
    BadArgumentsError,
    BadVersionError,
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
    RuntimeInconsistency,
    SessionExpiredError,
)

from coordinator.errors import SinkTreeDamaged
from coordinator.nodes import SESSION_TIMEOUT

logger = logging.getLogger(__name__)

CLOCK_MARGIN = 2.0  # a session is expired by others this long after its own expiry
READ_AHEAD = 8  # log keys asked for per point-lookup SELECT
KEPT_IDS = 256  # ids of recent entries remembered, to recognise a write whose answer was lost
PIPELINE_GAP = 0.005  # seconds between reads of one pipelined batch
COMPACT_EVERY = 256  # entries between snapshots of a sink's tree
SNAPSHOT_CHUNK = 256_000  # characters per snapshot key, far below Keeper's 1 MB node limit
SNAPSHOT_FORMAT = 1
RETAIN = 600.0  # seconds a snapshot stands before the entries below it are deleted
TRIM_BATCH = 4096  # entries deleted by one trim at most (a long-untrimmed log: in steps)


class KeyValueTable(Protocol):
    """The key-value table the store writes through (``server_ext.keepermap``).

    ``create_new`` creates all keys or none and says False when one existed; errors that
    may go away on a retry carry ``retryable = True``."""

    def get_many(self, keys: Iterable[str]) -> dict[str, str]: ...

    def create_new(self, rows: dict[str, str]) -> bool: ...

    def put(self, key: str, value: str) -> None: ...

    def keys_with_prefix(self, prefix: str) -> list[str]: ...

    def delete(self, keys: Iterable[str]) -> None: ...


@dataclass(frozen=True)
class Stat:
    """A node's metadata, as kazoo's ``ZnodeStat`` names it."""

    version: int
    mtime: int
    ctime: int
    numChildren: int = 0  # noqa: N815 - kazoo's name
    ephemeralOwner: str | None = None  # noqa: N815 - kazoo's name


@dataclass
class _Node:
    data: bytes
    version: int
    ctime: int
    mtime: int
    owner: str | None = None
    children: frozenset[str] = frozenset()

    def stat(self) -> Stat:
        return Stat(self.version, self.mtime, self.ctime, len(self.children), self.owner)


@dataclass
class _Log:
    """One sink's folded log."""

    root: str
    seq: int = 0
    nodes: dict[str, _Node] = field(default_factory=dict)
    sessions: dict[str, float] = field(default_factory=dict)  # session -> expires at
    ended: set[str] = field(default_factory=set)
    recent: list[str] = field(default_factory=list)  # ids of the last entries
    synced: float = float("-inf")  # monotonic time this copy was last known current
    trimmed: int | None = None  # entries up to this number are deleted (None: not read)

    def snapshot(self) -> str:
        """The folded tree at ``seq``, serialized canonically (the same text from every
        writer that folded the same entries)."""
        nodes = {path: [_pack(n.data), n.version, n.ctime, n.mtime, n.owner,
                        sorted(n.children)] for path, n in self.nodes.items()}
        state = {"format": SNAPSHOT_FORMAT, "seq": self.seq, "nodes": nodes,
                 "sessions": self.sessions, "ended": sorted(self.ended),
                 "recent": self.recent}
        return json.dumps(state, separators=(",", ":"), sort_keys=True)

    def restore(self, text: str) -> None:
        """Replace the fold by a snapshot's (one taken at a later sequence number)."""
        state = json.loads(text)
        if state.get("format") != SNAPSHOT_FORMAT:
            raise RuntimeInconsistency(
                f"snapshot of {self.root} has format {state.get('format')!r}, not "
                f"{SNAPSHOT_FORMAT}: written by another release of txsink")
        self.nodes = {path: _Node(_unpack(data), version, ctime, mtime, owner,
                                  frozenset(children))
                      for path, (data, version, ctime, mtime, owner, children)
                      in state["nodes"].items()}
        self.sessions = {k: float(v) for k, v in state["sessions"].items()}
        self.ended = set(state["ended"])
        self.recent = list(state["recent"])
        self.seq = int(state["seq"])


class _Done:
    """A read answered already (``get_async`` of a store without pipelining)."""

    def __init__(self, value: Any = None, error: Exception | None = None) -> None:
        self._value, self._error = value, error

    def get(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value


def partition_of(path: str) -> str | None:
    """The sink node a path belongs to (``…/sinks/<sink>``), None above the sinks."""
    parts = path.split("/")
    if "sinks" not in parts[1:]:
        return None
    i = parts.index("sinks", 1)
    if len(parts) <= i + 1 or not parts[i + 1]:
        return None
    return "/".join(parts[:i + 2])


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0]


def _pack(data: bytes) -> list[str]:
    try:
        return ["t", data.decode("utf-8")]
    except UnicodeDecodeError:
        return ["b", base64.b64encode(data).decode()]


def _unpack(packed: list[str]) -> bytes:
    kind, text = packed
    return text.encode("utf-8") if kind == "t" else base64.b64decode(text)


class _Overlay:
    """Operations validated against a log's tree without changing it until applied."""

    def __init__(self, log: _Log) -> None:
        self.log = log
        self.nodes: dict[str, _Node | None] = {}
        self.sessions: dict[str, float] = {}
        self.ended: set[str] = set()

    def node(self, path: str) -> _Node | None:
        return self.nodes[path] if path in self.nodes else self.log.nodes.get(path)

    def put(self, path: str, node: _Node | None) -> None:
        self.nodes[path] = node

    def ended_session(self, session: str) -> bool:
        return session in self.ended or session in self.log.ended

    def apply(self, op: list[Any], at: int, now: float | None) -> Any:
        """Validate and stage one operation; ``now`` None: folding a logged entry (the
        writer validated its clock-based judgement already)."""
        kind = op[0]
        if kind == "check":
            self._require(op[1], op[2])
            return True
        if kind == "create":
            return self._create(op, at)
        if kind == "set":
            node = self._require(op[1], op[3])
            self.put(op[1], replace(node, data=_unpack(op[2]), version=node.version + 1,
                                    mtime=at))
            return self.node(op[1]).stat()
        if kind == "delete":
            return self._delete(op)
        if kind == "refresh":
            if self.ended_session(op[1]):
                raise SessionExpiredError()
            self.sessions[op[1]] = op[2]
            return True
        if kind == "expire":
            self._expire(op[1], now)
            return True
        raise BadArgumentsError(f"unknown operation {kind!r}")

    def _require(self, path: str, version: int) -> _Node:
        node = self.node(path)
        if node is None:
            raise NoNodeError()
        if version != -1 and node.version != version:
            raise BadVersionError()
        return node

    def _create(self, op: list[Any], at: int) -> str:
        _, path, packed, owner, expires, alone = op
        if self.node(path) is not None:
            raise NodeExistsError()
        parent_path = _parent(path)
        parent = self.node(parent_path) if path != self.log.root else None
        if path != self.log.root:
            if parent is None:
                raise NoNodeError()
            if alone and parent.children:
                raise NodeExistsError()
        if owner is not None:
            if self.ended_session(owner):
                raise SessionExpiredError()
            known = self.sessions.get(owner, self.log.sessions.get(owner, 0.0))
            self.sessions[owner] = max(known, expires)
        self.put(path, _Node(_unpack(packed), 0, at, at, owner))
        if parent is not None:
            name = path.rsplit("/", 1)[1]
            self.put(parent_path, replace(parent, children=parent.children | {name}))
        return path

    def _delete(self, op: list[Any]) -> bool:
        _, path, version, recursive, owner = op
        node = self._require(path, version)
        if owner is not None and node.owner != owner:
            raise NoNodeError()  # not ours (any more): as if gone
        if node.children and not recursive:
            raise NotEmptyError()
        self._drop(path, node)
        return True

    def _drop(self, path: str, node: _Node) -> None:
        for child in node.children:
            child_node = self.node(f"{path}/{child}")
            if child_node is not None:
                self._drop(f"{path}/{child}", child_node)
        self.put(path, None)
        if path != self.log.root:
            parent = self.node(_parent(path))
            if parent is not None:
                name = path.rsplit("/", 1)[1]
                self.put(_parent(path), replace(parent, children=parent.children - {name}))

    def _expire(self, session: str, now: float | None) -> None:
        if self.ended_session(session):
            return
        expires = self.sessions.get(session, self.log.sessions.get(session, 0.0))
        if now is not None and expires + CLOCK_MARGIN > now:
            raise BadVersionError()  # refreshed meanwhile: alive
        self.ended.add(session)
        owned = [p for p, n in self.log.nodes.items() if n.owner == session]
        owned += [p for p, n in self.nodes.items() if n is not None and n.owner == session]
        for path in sorted(set(owned), key=len, reverse=True):
            node = self.node(path)
            if node is not None:
                self._drop(path, node)

    def commit(self) -> None:
        for path, node in self.nodes.items():
            if node is None:
                self.log.nodes.pop(path, None)
            else:
                self.log.nodes[path] = node
        self.log.sessions.update(self.sessions)
        for session in self.ended:
            self.log.sessions.pop(session, None)
        self.log.ended |= self.ended


class _MultiOpRequest:
    """kazoo's ``TransactionRequest`` for the KeeperMap store."""

    def __init__(self, store: KeeperMapNodes) -> None:
        self.store = store
        self.ops: list[list[Any]] = []

    def check(self, path: str, version: int) -> None:
        self.ops.append(["check", path, version])

    def create(self, path: str, value: bytes = b"", acl: Any = None,
               ephemeral: bool = False, sequence: bool = False) -> None:
        self.ops.append(self.store._create_op(path, value, ephemeral, sequence))

    def set_data(self, path: str, value: bytes, version: int = -1) -> None:
        self.ops.append(["set", path, _pack(value), version])

    def delete(self, path: str, version: int = -1) -> None:
        self.ops.append(["delete", path, version, False, None])

    def commit(self) -> list[Any]:
        return self.store._commit(self.ops)


class KeeperMapNodes:
    """The coordinator's node store in a KeeperMap table (see the module docstring).

    Usage::

        nodes = KeeperMapNodes(KeeperMapTable(client, "txsink", "records"))
        coord = Coordinator(nodes, "orders")       # the same coordinator as over kazoo
        ...
        nodes.stop()                               # ends the session: its leases go
    """

    default_acl = None
    connected = True

    def __init__(self, table: KeyValueTable, session_timeout: float = SESSION_TIMEOUT,
                 namespace: str = "", compact_every: int = COMPACT_EVERY,
                 retain: float = RETAIN) -> None:
        self.table = table
        self.namespace = namespace  # a prefix of every key: kazoo's chroot, for one table
        self.session_timeout = session_timeout
        self.compact_every = compact_every
        self.retain = retain
        self.handler = SimpleNamespace(sleep_func=time.sleep)
        self.session = uuid.uuid4().hex
        self._logs: dict[str, _Log] = {}
        self._mutex = threading.RLock()
        self._held: dict[str, set[str]] = {}  # sink -> ephemeral paths of this session
        self._heartbeat: threading.Thread | None = None
        self._stopping = threading.Event()
        self._last_async: str | None = None  # pipelined reads share one catch-up
        self._last_async_at = 0.0
        self._reaping = False
        self._suspended = False  # a frozen process (fault tests): no refreshes

    def __repr__(self) -> str:
        return f"KeeperMapNodes({self.table!r})"

    def operator_flags(self) -> str:
        """The ``txsink`` command-line flags that reach this store (its table's, if it
        says them)."""
        flags = getattr(self.table, "operator_flags", None)
        return flags() if flags is not None else "--coordinator keepermap"

    # -- reads -------------------------------------------------------------------------

    def get(self, path: str) -> tuple[bytes, Stat]:
        with self._mutex:
            self._last_async = None
            return self._get(path, self._synced(path))

    def get_async(self, path: str) -> _Done:
        """A read answered at once; reads sent back to back (a pipelined batch: within
        :data:`PIPELINE_GAP` of the previous one, of the same sink) share one catch-up,
        as kazoo's pipelined reads share one round trip."""
        with self._mutex:
            root = partition_of(path)
            now = time.monotonic()
            fresh = (root is not None and self._last_async == root
                     and now - self._last_async_at < PIPELINE_GAP)
            try:
                value = self._get(path, self._synced(path, fresh=fresh))
            except NoNodeError as exc:
                return _Done(error=exc)
            finally:
                self._last_async, self._last_async_at = root, time.monotonic()
            return _Done(value)

    def exists(self, path: str) -> Stat | None:
        try:
            return self.get(path)[1]
        except NoNodeError:
            return None

    def get_children(self, path: str) -> list[str]:
        with self._mutex:
            self._last_async = None
            log = self._synced(path)
            if log is None:
                return self._children_above(path)
            node = log.nodes.get(path)
            if node is None:
                raise NoNodeError()
            return sorted(node.children)

    # -- writes ------------------------------------------------------------------------

    def transaction(self) -> _MultiOpRequest:
        return _MultiOpRequest(self)

    def create(self, path: str, value: bytes = b"", acl: Any = None,
               ephemeral: bool = False, sequence: bool = False,
               makepath: bool = False) -> str:
        if makepath:
            self.ensure_path(_parent(path))
        return self._ephemeral_once_more(
            lambda: self._one(self._create_op(path, value, ephemeral, sequence)))

    def set(self, path: str, value: bytes, version: int = -1) -> Stat:
        return self._one(["set", path, _pack(value), version])

    def delete(self, path: str, version: int = -1, recursive: bool = False) -> bool:
        root = partition_of(path)
        if root is None:  # above the sinks: every sink below it, when recursive
            if not recursive:
                raise BadArgumentsError(f"{path} is implicit in the KeeperMap store")
            for key in self._call(self.table.keys_with_prefix, self._index(f"{path}/")):
                sink = key[len(self._index("")):]
                try:
                    self.delete(sink, recursive=True)
                except NoNodeError:  # deleted before, its keys not (an interrupted delete)
                    self._forget_log(sink)
            return True
        done = self._one(["delete", path, version, recursive, None])
        if path == root:
            self._forget_log(root)
        return done

    def _forget_log(self, root: str) -> None:
        """Delete every key of a sink deleted whole: its log, snapshots, pointers and index
        row. Only sinks that nobody writes again are deleted whole
        (``Retention.forget_sink``), so no copy of the log is appended to after this."""
        keys = [self._index(root), self._base(root), self._floor(root)]
        for prefix in (self._key(root, None), self._snapshot_key(root, None)):
            keys += self._call(self.table.keys_with_prefix, prefix)
        self._call(self.table.delete, keys)
        with self._mutex:
            self._logs.pop(root, None)
            self._held.pop(root, None)  # its ephemeral nodes went with it: no more refreshes

    def ensure_path(self, path: str, acl: Any = None) -> bool:
        root = partition_of(path)
        if root is None:
            return True  # <root> and <root>/sinks are implicit
        parts = path[len(root):].split("/")[1:]
        for i in range(len(parts) + 1):
            sub = "/".join([root, *parts[:i]])
            if self.exists(sub) is None:
                try:
                    self.create(sub)
                except NodeExistsError:
                    pass
        return True

    def Lock(self, path: str, identifier: str | None = None) -> KeeperMapLock:  # noqa: N802
        return KeeperMapLock(self, path, identifier or "")

    # -- the session -------------------------------------------------------------------

    def stop(self) -> None:
        """End this session: its ephemeral nodes (liveness holders, leases) go at once,
        as when a ZooKeeper client closes."""
        self._stopping.set()
        with self._mutex:
            held, self._held = self._held, {}
            for root in held:
                try:
                    self._commit_in(root, [["expire", self.session]], now=None)
                except Exception:  # noqa: BLE001 - best effort; expiry takes them anyway
                    pass

    def close(self) -> None:
        """kazoo's pair to :meth:`stop`: nothing more to release."""

    def suspend_heartbeat(self) -> None:
        """Stop refreshing this session (a process that froze); for fault tests. A new
        session (after this one's expiry) or :meth:`resume_heartbeat` refreshes again."""
        self._suspended = True

    def resume_heartbeat(self) -> None:
        self._suspended = False

    # -- internals ---------------------------------------------------------------------

    def _create_op(self, path: str, value: bytes, ephemeral: bool, sequence: bool,
                   alone: bool = False) -> list[Any]:
        if sequence:
            raise BadArgumentsError("the KeeperMap store has no sequential nodes")
        owner = self.session if ephemeral else None
        expires = time.time() + self.session_timeout if ephemeral else 0.0
        return ["create", path, _pack(value), owner, expires, alone]

    def _ephemeral_once_more(self, call: Any) -> Any:
        """``call`` again if it failed because this session had been expired: the store
        continues under a new session then, as a kazoo client reconnects with one."""
        session = self.session
        try:
            return call()
        except SessionExpiredError:
            if self.session == session:
                raise
            return call()

    def _one(self, op: list[Any]) -> Any:
        result = self._commit([op])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def _get(self, path: str, log: _Log | None) -> tuple[bytes, Stat]:
        if log is None:
            return b"", Stat(0, 0, 0)  # <root>, <root>/sinks: implicit
        node = log.nodes.get(path)
        if node is None:
            raise NoNodeError()
        return node.data, node.stat()

    def _children_above(self, path: str) -> list[str]:
        prefix = self._index(f"{path.rstrip('/')}/")
        names = {k[len(prefix):].split("/", 1)[0] for k in self._call(
            self.table.keys_with_prefix, prefix)}
        return sorted(n for n in names if n)

    def _log(self, root: str) -> _Log:
        log = self._logs.get(root)
        if log is None:
            log = self._logs[root] = _Log(root)
        return log

    def _synced(self, path: str, fresh: bool = False) -> _Log | None:
        root = partition_of(path)
        if root is None:
            return None
        log = self._log(root)
        if not fresh:
            self._catch_up(log)
            self._reap(log)
        return log

    def _catch_up(self, log: _Log) -> None:
        started = time.monotonic()
        # a copy new to this process, or not known current for half the retention, may
        # lack entries deleted since: read the snapshot pointer too (module docstring)
        rebase = log.seq == 0 or self._stale(log, started)
        rebased = False
        while True:
            # one key past the window, so that a gap at its end shows too
            keys = [self._key(log.root, log.seq + i) for i in range(1, READ_AHEAD + 2)]
            base = self._base(log.root)
            found = self._call(self.table.get_many, [*keys, base] if rebase else keys)
            if rebase:
                rebase, rebased = False, True
                if int(found.get(base) or 0) > log.seq:
                    self._load_snapshot(log, int(found[base]))
                    continue
            applied = 0
            for key in keys[:READ_AHEAD]:
                raw = found.get(key)
                if raw is None:
                    break
                self._fold(log, json.loads(raw))
                applied += 1
            if applied < READ_AHEAD:
                later = [key for key in keys[applied + 1:] if key in found]
                if later and not rebased:  # entries trimmed below a newer snapshot?
                    rebase = True
                    continue
                if later:
                    raise SinkTreeDamaged(
                        f"the records table {self.table!r} lacks entry {keys[applied]} "
                        f"although {later[0]} exists: a row was deleted, and the records of "
                        f"{log.root} after it cannot be read. Nothing was written; restore "
                        "the row from a backup")
                log.synced = started
                return

    def _stale(self, log: _Log, now: float) -> bool:
        return now - log.synced > self.retain / 2

    def _load_snapshot(self, log: _Log, seq: int) -> None:
        head = self._snapshot_key(log.root, seq)
        found = self._call(self.table.get_many, [head])
        if head not in found:  # a pointer put back by a writer paused past the retention
            head = self._newest_head(log.root)
            found = self._call(self.table.get_many, [head])
        count = int(json.loads(found[head])["chunks"])
        chunks = [f"{head}:{i:04d}" for i in range(count)]
        found = self._call(self.table.get_many, chunks)
        if any(key not in found for key in chunks):  # superseded long ago, deleted meanwhile
            raise ConnectionLoss(f"snapshot {head} was deleted while it was read")
        log.restore("".join(found[key] for key in chunks))

    def _newest_head(self, root: str) -> str:
        prefix = self._snapshot_key(root, None)
        heads = [k for k in self._call(self.table.keys_with_prefix, prefix)
                 if ":" not in k[len(prefix):]]
        if not heads:
            raise RuntimeInconsistency(f"the snapshot pointer of {root} names no snapshot")
        return max(heads)

    def _compact(self, log: _Log) -> None:
        """Store the fold at ``log.seq``, point the sink's readers at it and trim what an
        older snapshot made redundant (module docstring, "Snapshots", "Retention"). Best
        effort: the entry is written already, and a failed snapshot or trim only leaves
        readers more entries to fold."""
        head = self._snapshot_key(log.root, log.seq)
        text = log.snapshot()
        chunks = [text[i:i + SNAPSHOT_CHUNK] for i in range(0, len(text), SNAPSHOT_CHUNK)]
        try:
            for i, chunk in enumerate(chunks):  # one INSERT each: a multi has Keeper's limit too
                self._call(self.table.create_new, {f"{head}:{i:04d}": chunk})
            self._call(self.table.create_new,
                       {head: json.dumps({"chunks": len(chunks), "at": time.time()})})
            if self._stale(log, time.monotonic()):
                return  # paused for long: a newer snapshot may be pointed at already
            self._call(self.table.put, self._base(log.root), str(log.seq))
            self._trim(log)
        except Exception as exc:  # noqa: BLE001 - see the docstring
            logger.warning("snapshot of %s at entry %d not stored or not trimmed: %s",
                           log.root, log.seq, exc)

    def _trim(self, log: _Log) -> None:
        """Delete the entries, and the snapshots, below the newest snapshot older than
        the retention; at most :data:`TRIM_BATCH` entries at a time."""
        floor = self._floor(log.root)
        if log.trimmed is None:
            log.trimmed = int(self._call(self.table.get_many, [floor]).get(floor) or 0)
        step = self.compact_every
        heads = {seq: self._snapshot_key(log.root, seq) for seq in range(
            (log.trimmed // step + 1) * step, min(log.seq, log.trimmed + TRIM_BATCH), step)}
        raw = self._call(self.table.get_many, heads.values())
        found = {seq: json.loads(raw[key]) for seq, key in heads.items() if key in raw}
        deadline = time.time() - self.retain  # a head without a time is never old enough
        old = [seq for seq, head in found.items() if head.get("at", float("inf")) <= deadline]
        if not old:
            return
        upto = max(old)
        doomed = [key for seq, head in found.items() if seq < upto
                  for key in (*(f"{heads[seq]}:{i:04d}" for i in range(head["chunks"])),
                              heads[seq])]  # chunks before their head: none left headless
        doomed += [self._key(log.root, seq) for seq in range(log.trimmed + 1, upto + 1)]
        self._call(self.table.delete, doomed)
        self._call(self.table.put, floor, str(upto))
        log.trimmed = upto

    def _fold(self, log: _Log, entry: dict[str, Any]) -> None:
        overlay = _Overlay(log)
        for op in entry["ops"]:
            overlay.apply(op, entry["at"], None)
        overlay.commit()
        log.seq += 1
        log.recent = [*log.recent[-KEPT_IDS + 1:], entry["id"]]

    def _reap(self, log: _Log) -> None:
        """Expire other sessions of this log that are past their expiry."""
        if self._reaping:
            return
        now = time.time()
        dead = [s for s, expires in log.sessions.items()
                if s != self.session and expires + CLOCK_MARGIN < now]
        if not dead:
            return
        self._reaping = True
        try:
            for session in dead:
                self._commit_in(log.root, [["expire", session]], now=time.time())
        finally:
            self._reaping = False

    def _commit(self, ops: list[list[Any]]) -> list[Any]:
        if not ops:
            return []
        roots = {partition_of(op[1]) for op in ops}
        if len(roots) != 1 or None in roots:
            raise BadArgumentsError(
                "a multi-op of the KeeperMap store must stay within one sink's records")
        return self._commit_in(roots.pop(), ops, now=time.time())

    def _commit_in(self, root: str, ops: list[list[Any]], now: float | None) -> list[Any]:
        with self._mutex:
            self._last_async = None
            log = self._log(root)
            entry_id = uuid.uuid4().hex
            # optimistic: the sequence number proves the tree current, if the copy is
            # recent enough that no entry after it can have been deleted
            caught_up = self._stale(log, time.monotonic())
            if caught_up:
                self._catch_up(log)
            while True:
                overlay = _Overlay(log)
                at = int(time.time() * 1000)  # the entry's time: the writer's own tree too
                results: list[Any] = []
                failed: list[Any] | None = None
                for i, op in enumerate(ops):
                    try:
                        results.append(overlay.apply(op, at, now))
                    except (NoNodeError, NodeExistsError, BadVersionError, NotEmptyError,
                            SessionExpiredError, BadArgumentsError) as exc:
                        failed = ([RolledBackError()] * i + [exc]
                                  + [RuntimeInconsistency()] * (len(ops) - i - 1))
                        break
                if failed is not None:
                    if not caught_up:  # refused by a tree that may be stale: read first
                        self._catch_up(log)
                        caught_up = True
                        continue
                    if isinstance(failed[len(results)], SessionExpiredError) and \
                            self._own_expired(log):
                        self._new_session()
                    return failed
                entry = {"id": entry_id, "at": at, "ops": ops}
                text = json.dumps(entry, separators=(",", ":"), sort_keys=True)
                sent = time.monotonic()
                if self._call(self.table.create_new, {self._key(root, log.seq + 1): text}):
                    overlay.commit()
                    log.seq += 1
                    log.synced = sent
                    log.recent = [*log.recent[-KEPT_IDS + 1:], entry_id]
                    self._track(root, ops)
                    if any(op[0] == "create" and op[1] == root for op in ops):
                        self._call(self.table.put, self._index(root), "")
                    if log.seq % self.compact_every == 0:
                        self._compact(log)
                    return results
                self._catch_up(log)  # another writer took the number: validate again
                caught_up = True
                if entry_id in log.recent:  # ours after all (an answer lost on the way)
                    self._track(root, ops)
                    return results

    def _track(self, root: str, ops: list[list[Any]]) -> None:
        """Remember where this session owns ephemeral nodes (for its heartbeat)."""
        for op in ops:
            if op[0] == "create" and op[3] == self.session:
                self._held.setdefault(root, set()).add(op[1])
                self._start_heartbeat()
            elif op[0] == "delete":
                self._held.get(root, set()).discard(op[1])

    def _own_expired(self, log: _Log) -> bool:
        return self.session in log.ended

    def _new_session(self) -> None:
        """Continue under a new session after this one was expired (kazoo does the same
        when its session expires): the old one's ephemeral nodes are gone already."""
        self.session = uuid.uuid4().hex
        self._held = {}
        self._suspended = False

    def _start_heartbeat(self) -> None:
        if self._heartbeat is None or not self._heartbeat.is_alive():
            if self._stopping.is_set():
                return
            self._heartbeat = threading.Thread(target=self._beat, daemon=True,
                                               name="txsink-keepermap-session")
            self._heartbeat.start()

    def _beat(self) -> None:
        while not self._stopping.wait(self.session_timeout / 3):
            if self._suspended:
                continue
            with self._mutex:
                for root in [r for r, paths in self._held.items() if paths]:
                    try:
                        result = self._commit_in(
                            root, [["refresh", self.session,
                                    time.time() + self.session_timeout]], now=time.time())
                    except Exception:  # noqa: BLE001 - transient: the next beat tries again
                        continue
                    if isinstance(result[0], SessionExpiredError):
                        self._new_session()
                        break

    def _call(self, func: Any, *args: Any) -> Any:
        """Call the table; an error it marks ``retryable`` becomes kazoo's
        ``ConnectionLoss``, which the coordinator's retry policy retries."""
        try:
            return func(*args)
        except Exception as exc:
            if getattr(exc, "retryable", False) is True or isinstance(exc, ConnectionError):
                raise ConnectionLoss(str(exc)) from exc
            raise

    def _key(self, root: str, seq: int | None) -> str:
        """The key of entry ``seq``; None: the prefix of every entry of ``root``."""
        return f"log:{self.namespace}{root}:{'' if seq is None else f'{seq:020d}'}"

    def _index(self, root: str) -> str:
        return f"index:{self.namespace}{root}"

    def _base(self, root: str) -> str:
        return f"base:{self.namespace}{root}"

    def _snapshot_key(self, root: str, seq: int | None) -> str:
        """The head key of snapshot ``seq``; None: the prefix of every snapshot key."""
        return f"snap:{self.namespace}{root}:{'' if seq is None else f'{seq:020d}'}"

    def _floor(self, root: str) -> str:
        return f"trim:{self.namespace}{root}"


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
