"""The KeeperMap node store: each sink's tree as a log of multi-ops in a key-value table.

:class:`KeeperMapNodes` serves :class:`~coordinator.plumbing.nodes.NodeStore` (kazoo's surface) over
a :class:`~coordinator.plumbing.keepermap.table.KeyValueTable`: a multi-op is validated against the
writer's folded copy of the sink's log (``log.py``) and appended as the next entry by a
strict INSERT; a read first folds the entries written since. One instance serves many
threads (one lock), and any number of processes share a table.

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
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from types import SimpleNamespace
from typing import Any

from kazoo.exceptions import (
    BadArgumentsError,
    BadVersionError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
    RuntimeInconsistency,
    SessionExpiredError,
)

from coordinator.errors import SinkTreeDamaged
from coordinator.plumbing.keepermap.heartbeat import Heartbeat
from coordinator.plumbing.keepermap.log import (
    CLOCK_MARGIN,
    KEPT_IDS,
    Log,
    Overlay,
    Stat,
    pack,
    parent_of,
    partition_of,
)
from coordinator.plumbing.keepermap.snapshot import COMPACT_EVERY, RETAIN, Snapshots
from coordinator.plumbing.keepermap.table import KeyValueTable, TableKeys, call_table
from coordinator.plumbing.nodes import SESSION_TIMEOUT

READ_AHEAD = 8  # log keys asked for per point-lookup SELECT
PIPELINE_GAP = 0.005  # seconds between reads of one pipelined batch


class _Done:
    """A read answered already (``get_async`` of a store without pipelining)."""

    def __init__(self, value: Any = None, error: Exception | None = None) -> None:
        self._value, self._error = value, error

    def get(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value



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
        self.ops.append(["set", path, pack(value), version])

    def delete(self, path: str, version: int = -1) -> None:
        self.ops.append(["delete", path, version, False, None])

    def commit(self) -> list[Any]:
        return self.store._commit(self.ops)


class KeeperMapNodes:
    """The coordinator's node store in a KeeperMap table (see the package docstring).

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
        self.keys = TableKeys(namespace)
        self.snapshots = Snapshots(table, self.keys, compact_every, retain)
        self.handler = SimpleNamespace(sleep_func=time.sleep)
        self.session = uuid.uuid4().hex
        self._logs: dict[str, Log] = {}
        self._mutex = threading.RLock()
        self._held: dict[str, set[str]] = {}  # sink -> ephemeral paths of this session
        self._heartbeat = Heartbeat(session_timeout / 3, self._beat)
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
            self.ensure_path(parent_of(path))
        return self._ephemeral_once_more(
            lambda: self._one(self._create_op(path, value, ephemeral, sequence)))

    def set(self, path: str, value: bytes, version: int = -1) -> Stat:
        return self._one(["set", path, pack(value), version])

    def delete(self, path: str, version: int = -1, recursive: bool = False) -> bool:
        root = partition_of(path)
        if root is None:  # above the sinks: every sink below it, when recursive
            if not recursive:
                raise BadArgumentsError(f"{path} is implicit in the KeeperMap store")
            for key in call_table(self.table.keys_with_prefix, self.keys.index(f"{path}/")):
                sink = key[len(self.keys.index("")):]
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
        keys = [self.keys.index(root), self.keys.base(root), self.keys.floor(root)]
        for prefix in (self.keys.entry(root, None), self.keys.snapshot(root, None)):
            keys += call_table(self.table.keys_with_prefix, prefix)
        call_table(self.table.delete, keys)
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

    # -- the session -------------------------------------------------------------------

    def stop(self) -> None:
        """End this session: its ephemeral nodes (liveness holders, leases) go at once,
        as when a ZooKeeper client closes."""
        self._heartbeat.stop()
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

    def _create_op(self, path: str, value: bytes, ephemeral: bool, sequence: bool
                   ) -> list[Any]:
        if sequence:
            raise BadArgumentsError("the KeeperMap store has no sequential nodes")
        owner = self.session if ephemeral else None
        expires = time.time() + self.session_timeout if ephemeral else 0.0
        return ["create", path, pack(value), owner, expires, False]  # False: see log.py

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

    def _get(self, path: str, log: Log | None) -> tuple[bytes, Stat]:
        if log is None:
            return b"", Stat(0, 0, 0)  # <root>, <root>/sinks: implicit
        node = log.nodes.get(path)
        if node is None:
            raise NoNodeError()
        return node.data, node.stat()

    def _children_above(self, path: str) -> list[str]:
        prefix = self.keys.index(f"{path.rstrip('/')}/")
        names = {k[len(prefix):].split("/", 1)[0] for k in call_table(
            self.table.keys_with_prefix, prefix)}
        return sorted(n for n in names if n)

    def _log(self, root: str) -> Log:
        log = self._logs.get(root)
        if log is None:
            log = self._logs[root] = Log(root)
        return log

    def _synced(self, path: str, fresh: bool = False) -> Log | None:
        root = partition_of(path)
        if root is None:
            return None
        log = self._log(root)
        if not fresh:
            self._catch_up(log)
            self._reap(log)
        return log

    def _catch_up(self, log: Log) -> None:
        started = time.monotonic()
        # a copy new to this process, or not known current for half the retention, may
        # lack entries deleted since: read the snapshot pointer too (``snapshot.py``)
        rebase = log.seq == 0 or self.snapshots.stale(log, started)
        rebased = False
        while True:
            # one key past the window, so that a gap at its end shows too
            keys = [self.keys.entry(log.root, log.seq + i) for i in range(1, READ_AHEAD + 2)]
            base = self.keys.base(log.root)
            found = call_table(self.table.get_many, [*keys, base] if rebase else keys)
            if rebase:
                rebase, rebased = False, True
                if int(found.get(base) or 0) > log.seq:
                    self.snapshots.load(log, int(found[base]))
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

    def _fold(self, log: Log, entry: dict[str, Any]) -> None:
        overlay = Overlay(log)
        for op in entry["ops"]:
            overlay.apply(op, entry["at"], None)
        overlay.commit()
        log.seq += 1
        log.recent = [*log.recent[-KEPT_IDS + 1:], entry["id"]]

    def _reap(self, log: Log) -> None:
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
            caught_up = self.snapshots.stale(log, time.monotonic())
            if caught_up:
                self._catch_up(log)
            while True:
                overlay = Overlay(log)
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
                if call_table(self.table.create_new, {self.keys.entry(root, log.seq + 1): text}):
                    overlay.commit()
                    log.seq += 1
                    log.synced = sent
                    log.recent = [*log.recent[-KEPT_IDS + 1:], entry_id]
                    self._track(root, ops)
                    if any(op[0] == "create" and op[1] == root for op in ops):
                        call_table(self.table.put, self.keys.index(root), "")
                    if log.seq % self.snapshots.compact_every == 0:
                        self.snapshots.compact(log)
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
                self._heartbeat.start()
            elif op[0] == "delete":
                self._held.get(root, set()).discard(op[1])

    def _own_expired(self, log: Log) -> bool:
        return self.session in log.ended

    def _new_session(self) -> None:
        """Continue under a new session after this one was expired (kazoo does the same
        when its session expires): the old one's ephemeral nodes are gone already."""
        self.session = uuid.uuid4().hex
        self._held = {}
        self._suspended = False

    def _beat(self) -> None:
        """One beat of the heartbeat: refresh this session in every sink where it holds
        ephemeral nodes (none while suspended)."""
        if self._suspended:
            return
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
