"""The xid, branch and stream records as the store keeps them (compact JSON, one node
each).

Records are immutable values: a change is a new record written with a versioned
compare-and-set against the ``version`` it was read at. ``version`` is the znode's data
version, not part of the JSON.

A record changes state only through ``moved_to`` (and keeps it through ``changed``), which
look the change up in the one table of ``coordinator/formats/states.py`` and raise
:class:`InvalidTransition` for anything it does not list; a record in ``Unknown`` (a new
one, not yet moved) is never written.

A znode holds at most ~1 MB (ZooKeeper's ``jute.maxbuffer``), and the final commit
rewrites several records in one multi-op, so a single record is capped at
:data:`MAX_RECORD_BYTES`; a larger manifest fails clearly with :class:`RecordTooLarge`
when it is prepared, never later at commit time.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from typing import Any

from coordinator.errors import InvalidTransition, MalformedRecord, RecordTooLarge
from coordinator.formats.states import (
    BranchState,
    XidState,
    require_branch_transition,
    require_xid_transition,
)

MAX_RECORD_BYTES = 900_000
HISTORY_LIMIT = 64  # newest entries kept; a record must not grow without bound


def encode(payload: dict[str, Any], what: str) -> bytes:
    """Compact, key-sorted UTF-8 JSON (stable bytes make diffs and audits readable)."""
    data = json.dumps(payload, separators=(",", ":"), sort_keys=True,
                      ensure_ascii=False).encode()
    if len(data) > MAX_RECORD_BYTES:
        raise RecordTooLarge(
            f"{what} is {len(data)} bytes as JSON; a ZooKeeper record holds at most "
            f"{MAX_RECORD_BYTES} bytes here (split the branch or shrink its manifest)"
        )
    return data


def decode(data: bytes, path: str = "a znode") -> dict[str, Any]:
    """The record ``data`` holds ({} for an empty node); :class:`MalformedRecord` naming
    ``path`` for anything but a JSON object, instead of a bare JSON error deep inside."""
    if not data:
        return {}
    try:
        found = json.loads(data.decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        found = None
    if not isinstance(found, dict):
        raise MalformedRecord(f"{path} does not hold a txsink record (found "
                              f"{data[:40]!r}); it was not written by txsink")
    return found


@dataclass(frozen=True)
class XidRecord:
    """One xid = (sink id, epoch): its state, generation, attempt and decision.

    ``generation`` is the generation that began (or last adopted) the current attempt;
    ``winners`` is the decision written with ``Committing``; ``selected`` accumulates
    branches chosen by :meth:`Coordinator.select` before the decision; ``history`` lists
    every state entered, with time, generation and attempt; ``txn_version`` is the batch
    job's idempotency version, written with the decision (None: not given);
    ``liveness`` is ``"session"`` when the writer that began the attempt holds a live
    node for it until the decision (``coordinator/protocol/liveness.py``), None when nobody does
    (a streaming xid, an adopted one, or one recorded before liveness existed).
    """

    sink_id: str
    epoch: int
    state: XidState
    generation: int
    attempt: int = 1
    created: float = 0.0
    updated: float = 0.0
    decided_at: float | None = None
    winners: tuple[str, ...] = ()
    selected: tuple[str, ...] = ()
    metrics: dict[str, Any] = field(default_factory=dict)
    history: tuple[dict[str, Any], ...] = ()
    txn_version: int | None = None
    liveness: str | None = None
    version: int = field(default=-1, compare=False)

    @property
    def xid(self) -> str:
        """Text form ``"<sink_id>/<epoch>"`` used in logs and errors."""
        return f"{self.sink_id}/{self.epoch}"

    def moved_to(self, state: XidState, by_generation: int, event: str | None = None,
                 **changes: Any) -> XidRecord:
        """A copy in ``state`` with a history entry naming the generation that moved it
        (and ``event`` when the state alone does not say what happened); the caller
        writes it with a compare-and-set.

        Raises :class:`InvalidTransition` unless ``states.XID_MOVES`` lists
        ``self.state → state`` with this ``event``.
        """
        require_xid_transition(self.state, state, self.xid, event)
        now = time.time()
        entry: dict[str, Any] = {"state": state.value, "at": now, "generation": by_generation,
                                 "attempt": changes.get("attempt", self.attempt)}
        if event:
            entry["event"] = event
        history = (*self.history, entry)[-HISTORY_LIMIT:]
        return replace(self, state=state, updated=now, history=history, **changes)

    def changed(self, event: str, **changes: Any) -> XidRecord:
        """A copy in the same state with ``changes`` and no history entry: an update
        (``select``, ``metrics``), which ``states.XID_MOVES`` must list for the current
        state, else :class:`InvalidTransition`. ``updated`` changes only if passed."""
        if "state" in changes or "history" in changes:
            raise InvalidTransition(f"xid {self.xid}: update {event!r} may not change the "
                                    "state or the history; use moved_to")
        require_xid_transition(self.state, self.state, self.xid, event, history=False)
        return replace(self, **changes)

    def to_bytes(self) -> bytes:
        _require_recorded(self.state, f"xid {self.xid}")
        return encode({
            "state": self.state.value, "generation": self.generation,
            "attempt": self.attempt, "created": self.created, "updated": self.updated,
            "decided_at": self.decided_at, "winners": list(self.winners),
            "selected": list(self.selected), "metrics": self.metrics,
            "history": list(self.history),
            **({"txn_version": self.txn_version} if self.txn_version is not None else {}),
            **({"liveness": self.liveness} if self.liveness is not None else {}),
        }, f"xid {self.xid}")

    @classmethod
    def from_bytes(cls, sink_id: str, epoch: int, data: bytes, version: int) -> XidRecord:
        raw = decode(data)
        return cls(
            sink_id=sink_id, epoch=epoch, state=XidState(raw["state"]),
            generation=int(raw["generation"]), attempt=int(raw.get("attempt", 1)),
            created=float(raw.get("created", 0.0)), updated=float(raw.get("updated", 0.0)),
            decided_at=raw.get("decided_at"), winners=tuple(raw.get("winners", ())),
            selected=tuple(raw.get("selected", ())), metrics=dict(raw.get("metrics", {})),
            history=tuple(raw.get("history", ())), txn_version=raw.get("txn_version"),
            liveness=raw.get("liveness"), version=version,
        )


@dataclass(frozen=True)
class BranchRecord:
    """One branch: a task attempt's share of an xid, with its owner and manifest.

    This is what the publish and rollback callbacks receive. ``owner`` is whatever the
    task recorded at registration (e.g. its staging table), so a branch that never got
    to prepare can still be rolled back; ``manifest`` is set by ``prepare``.
    """

    sink_id: str
    epoch: int
    branch_id: str
    state: BranchState
    generation: int
    attempt: int = 1
    owner: dict[str, Any] = field(default_factory=dict)
    manifest: dict[str, Any] | None = None
    created: float = 0.0
    updated: float = 0.0
    version: int = field(default=-1, compare=False)

    @property
    def xid(self) -> str:
        return f"{self.sink_id}/{self.epoch}"

    @property
    def rows(self) -> int | None:
        """The manifest's top-level ``rows`` (the only manifest key the audit reads)."""
        value = (self.manifest or {}).get("rows")
        return int(value) if isinstance(value, int | float) else None

    def moved_to(self, state: BranchState, **changes: Any) -> BranchRecord:
        """A copy in ``state``; :class:`InvalidTransition` unless ``states.BRANCH_MOVES``
        lists ``self.state → state``. The caller writes it with a compare-and-set."""
        require_branch_transition(self.state, state, f"{self.branch_id} of xid {self.xid}")
        return replace(self, state=state, updated=time.time(), **changes)

    def to_bytes(self) -> bytes:
        _require_recorded(self.state, f"branch {self.branch_id} of xid {self.xid}")
        return encode({
            "state": self.state.value, "generation": self.generation,
            "attempt": self.attempt, "owner": self.owner, "manifest": self.manifest,
            "created": self.created, "updated": self.updated,
        }, f"branch {self.branch_id} of xid {self.xid}")

    @classmethod
    def from_bytes(cls, sink_id: str, epoch: int, branch_id: str, data: bytes,
                   version: int) -> BranchRecord:
        raw = decode(data)
        return cls(
            sink_id=sink_id, epoch=epoch, branch_id=branch_id,
            state=BranchState(raw["state"]), generation=int(raw["generation"]),
            attempt=int(raw.get("attempt", 1)), owner=dict(raw.get("owner") or {}),
            manifest=raw.get("manifest"), created=float(raw.get("created", 0.0)),
            updated=float(raw.get("updated", 0.0)), version=version,
        )


def _require_recorded(state: XidState | BranchState, what: str) -> None:
    """``Unknown`` means "no record": a new record must move out of it before a write."""
    if state.value == XidState.UNKNOWN.value:
        raise InvalidTransition(f"{what} is {state.value}: a record is written only in a "
                                "state it reached by a move of the table")


STREAM_PAST_KEPT = 16  # earlier owners and resets kept in a stream record, newest last


@dataclass(frozen=True)
class StreamRecord:
    """Which streaming query a sink's epochs belong to (``<sink>/stream``).

    A streaming sink's epochs are a query's micro-batch ids, and those mean something only
    within the checkpoint that numbered them. Spark keeps a query id in the checkpoint
    (the same on every restart of it, new for a new checkpoint), so the sink records the
    id of the query whose batches its epochs are. ``query_id`` None means "the next query
    to write adopts the sink" (after ``txsink reset``). ``since_epoch`` is the micro-batch
    at which the owner took the sink; ``past`` lists earlier owners and resets (who, when,
    the last committed epoch then), newest last, at most :data:`STREAM_PAST_KEPT`.
    """

    sink_id: str
    query_id: str | None
    since_epoch: int | None = None
    updated: float = 0.0
    past: tuple[dict[str, Any], ...] = ()
    version: int = field(default=-1, compare=False)

    def handed_to(self, query_id: str | None, since_epoch: int | None,
                  event: dict[str, Any]) -> StreamRecord:
        """A copy owned by ``query_id``; ``event`` (why, by whom, the state then) joins
        ``past`` together with the owner it replaces. The caller writes it with a CAS."""
        now = time.time()
        entry = {"query_id": self.query_id, "since_epoch": self.since_epoch,
                 "until": now, **event}
        past = (*self.past, entry)[-STREAM_PAST_KEPT:]
        return replace(self, query_id=query_id, since_epoch=since_epoch, updated=now,
                       past=past)

    def to_bytes(self) -> bytes:
        return encode({"query_id": self.query_id, "since_epoch": self.since_epoch,
                       "updated": self.updated, "past": list(self.past)},
                      f"stream record of sink {self.sink_id}")

    @classmethod
    def from_bytes(cls, sink_id: str, data: bytes, version: int) -> StreamRecord:
        raw = decode(data)
        since = raw.get("since_epoch")
        return cls(sink_id=sink_id, query_id=raw.get("query_id"),
                   since_epoch=int(since) if since is not None else None,
                   updated=float(raw.get("updated", 0.0)), past=tuple(raw.get("past", ())),
                   version=version)
