"""A sink's log and its fold: the tree of nodes every reader of the log computes alike.

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

:class:`Log` is one process's folded copy of a sink's log; :class:`Overlay` validates a
multi-op against it and applies it only when the entry is written (or read). Pure data:
the store serializes every use under its lock.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field, replace
from typing import Any

from kazoo.exceptions import (
    BadArgumentsError,
    BadVersionError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RuntimeInconsistency,
    SessionExpiredError,
)

CLOCK_MARGIN = 2.0  # a session is expired by others this long after its own expiry
KEPT_IDS = 256  # ids of recent entries remembered, to recognise a write whose answer was lost
SNAPSHOT_FORMAT = 1


@dataclass(frozen=True)
class Stat:
    """A node's metadata, as kazoo's ``ZnodeStat`` names it."""

    version: int
    mtime: int
    ctime: int
    numChildren: int = 0  # noqa: N815 - kazoo's name
    ephemeralOwner: str | None = None  # noqa: N815 - kazoo's name


@dataclass
class Node:
    """A node of the folded tree."""

    data: bytes
    version: int
    ctime: int
    mtime: int
    owner: str | None = None
    children: frozenset[str] = frozenset()

    def stat(self) -> Stat:
        return Stat(self.version, self.mtime, self.ctime, len(self.children), self.owner)


@dataclass
class Log:
    """One sink's folded log."""

    root: str
    seq: int = 0
    nodes: dict[str, Node] = field(default_factory=dict)
    sessions: dict[str, float] = field(default_factory=dict)  # session -> expires at
    ended: set[str] = field(default_factory=set)
    recent: list[str] = field(default_factory=list)  # ids of the last entries
    synced: float = float("-inf")  # monotonic time this copy was last known current
    trimmed: int | None = None  # entries up to this number are deleted (None: not read)

    def snapshot(self) -> str:
        """The folded tree at ``seq``, serialized canonically (the same text from every
        writer that folded the same entries)."""
        nodes = {path: [pack(n.data), n.version, n.ctime, n.mtime, n.owner,
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
        self.nodes = {path: Node(unpack(data), version, ctime, mtime, owner,
                                  frozenset(children))
                      for path, (data, version, ctime, mtime, owner, children)
                      in state["nodes"].items()}
        self.sessions = {k: float(v) for k, v in state["sessions"].items()}
        self.ended = set(state["ended"])
        self.recent = list(state["recent"])
        self.seq = int(state["seq"])



def partition_of(path: str) -> str | None:
    """The sink node a path belongs to (``…/sinks/<sink>``), None above the sinks."""
    parts = path.split("/")
    if "sinks" not in parts[1:]:
        return None
    i = parts.index("sinks", 1)
    if len(parts) <= i + 1 or not parts[i + 1]:
        return None
    return "/".join(parts[:i + 2])


def parent_of(path: str) -> str:
    return path.rsplit("/", 1)[0]


def pack(data: bytes) -> list[str]:
    try:
        return ["t", data.decode("utf-8")]
    except UnicodeDecodeError:
        return ["b", base64.b64encode(data).decode()]


def unpack(packed: list[str]) -> bytes:
    kind, text = packed
    return text.encode("utf-8") if kind == "t" else base64.b64decode(text)


class Overlay:
    """Operations validated against a log's tree without changing it until applied."""

    def __init__(self, log: Log) -> None:
        self.log = log
        self.nodes: dict[str, Node | None] = {}
        self.sessions: dict[str, float] = {}
        self.ended: set[str] = set()

    def node(self, path: str) -> Node | None:
        return self.nodes[path] if path in self.nodes else self.log.nodes.get(path)

    def put(self, path: str, node: Node | None) -> None:
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
            self.put(op[1], replace(node, data=unpack(op[2]), version=node.version + 1,
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

    def _require(self, path: str, version: int) -> Node:
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
        parent_path = parent_of(path)
        parent = self.node(parent_path) if path != self.log.root else None
        if path != self.log.root:
            if parent is None:
                raise NoNodeError()
            if alone and parent.children:  # a lease node of logs of earlier releases
                raise NodeExistsError()
        if owner is not None:
            if self.ended_session(owner):
                raise SessionExpiredError()
            known = self.sessions.get(owner, self.log.sessions.get(owner, 0.0))
            self.sessions[owner] = max(known, expires)
        self.put(path, Node(unpack(packed), 0, at, at, owner))
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

    def _drop(self, path: str, node: Node) -> None:
        for child in node.children:
            child_node = self.node(f"{path}/{child}")
            if child_node is not None:
                self._drop(f"{path}/{child}", child_node)
        self.put(path, None)
        if path != self.log.root:
            parent = self.node(parent_of(path))
            if parent is not None:
                name = path.rsplit("/", 1)[1]
                self.put(parent_of(path), replace(parent, children=parent.children - {name}))

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
