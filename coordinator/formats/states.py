"""The xid and branch state machines, as one table each: the single statement of what is
legal.

Why a table: every writer (commit, abort, recovery, a task registering a branch, an
operator's reset) asks the same question — "may this record go from A to B?" — and must
get the same answer. The records ask it themselves: ``XidRecord.moved_to`` /
``XidRecord.changed`` and ``BranchRecord.moved_to`` (``coordinator/formats/records.py``) look the
change up here and raise :class:`InvalidTransition` for anything not listed, whichever
step attempts it, and a record is only ever written in a state it reached that way. The
steps raise their own typed errors first (:class:`Fenced`, :class:`XidDecided`,
:class:`XidAborted`, :class:`WinnerNotPrepared`, ...); the table is the last line of
defence. docs/design.md ("States") shows the same table; a test compares the two.

xid (per attempt)::

    Unknown ─begin─▶ Initialized ─commit─▶ Committing ─▶ Committed
                         │
                         └─abort─▶ Aborting ─▶ Aborted ─begin (newer generation)─▶ Initialized

``Committing`` is the decision: once written it is never undone, only finished.
``Aborted → Initialized`` starts a new *attempt* of the same xid (a replayed streaming
batch under a newer generation); the branches of the old attempt stay ``Aborted``.
Besides, ``Initialized → Initialized`` is a newer generation adopting the xid,
``Unknown → Committed`` the marker xid of ``txsink reset --committed-through``, and two
updates keep the state without a history entry: ``select`` (``Initialized``) and
``metrics`` (any recorded state).

branch::

    Unknown ──register──▶ Initialized ──prepare──▶ Prepared ──▶ Committed
                              │                       │
                              └───────────────────────┴──▶ Aborted
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple

from coordinator.errors import InvalidTransition


class XidState(StrEnum):
    """State of one xid (its current attempt)."""

    UNKNOWN = "Unknown"  # no record in ZooKeeper
    INITIALIZED = "Initialized"
    COMMITTING = "Committing"
    COMMITTED = "Committed"
    ABORTING = "Aborting"
    ABORTED = "Aborted"

    @property
    def is_open(self) -> bool:
        """Not yet finished: recovery may still have work to do."""
        return self in _OPEN

    @property
    def is_decided(self) -> bool:
        """The outcome can no longer change within this attempt."""
        return self in _DECIDED


class BranchState(StrEnum):
    """State of one branch (one task attempt's share of an xid)."""

    UNKNOWN = "Unknown"  # no record in ZooKeeper
    INITIALIZED = "Initialized"
    PREPARED = "Prepared"
    COMMITTED = "Committed"
    ABORTED = "Aborted"


#: The states recovery may still have work in, in the order an xid passes them.
OPEN_STATES = (XidState.INITIALIZED, XidState.COMMITTING, XidState.ABORTING)
_OPEN = frozenset(OPEN_STATES)
_DECIDED = frozenset(
    {XidState.COMMITTING, XidState.COMMITTED, XidState.ABORTING, XidState.ABORTED}
)


class Move(NamedTuple):
    """One legal change of a record: ``source → target``.

    ``event`` names a move the two states alone do not tell apart (``adopted``,
    ``new_attempt``, ``reset``, and the updates); a move's event is written to the xid's
    history. ``history`` False marks an *update*: the state is kept and no history entry
    is added (``select``, ``metrics``).
    """

    source: XidState | BranchState
    target: XidState | BranchState
    event: str | None = None
    history: bool = True


_X = XidState
_B = BranchState

#: Every legal change of an xid record. Anything not listed raises InvalidTransition.
XID_MOVES: tuple[Move, ...] = (
    Move(_X.UNKNOWN, _X.INITIALIZED),                       # begin: a new xid
    Move(_X.INITIALIZED, _X.INITIALIZED, "adopted"),        # begin of a newer generation
    Move(_X.INITIALIZED, _X.INITIALIZED, "select", history=False),  # select
    Move(_X.INITIALIZED, _X.COMMITTING),                    # commit: the decision
    Move(_X.INITIALIZED, _X.ABORTING),                      # abort (or recovery's)
    Move(_X.COMMITTING, _X.COMMITTED),                      # the end of commit
    Move(_X.ABORTING, _X.ABORTED),                          # the end of abort
    Move(_X.ABORTED, _X.INITIALIZED, "new_attempt"),        # begin of a newer generation
    Move(_X.UNKNOWN, _X.COMMITTED, "reset"),                # txsink reset --committed-through
    *(Move(state, state, "metrics", history=False)          # record_metrics
      for state in XidState if state is not XidState.UNKNOWN),
)

#: Every legal change of a branch record. Anything not listed raises InvalidTransition.
BRANCH_MOVES: tuple[Move, ...] = (
    Move(_B.UNKNOWN, _B.INITIALIZED),   # register_branch
    Move(_B.INITIALIZED, _B.PREPARED),  # prepare_branch
    Move(_B.INITIALIZED, _B.ABORTED),   # the end of commit (not a winner) or of abort
    Move(_B.PREPARED, _B.COMMITTED),    # the end of commit (a winner)
    Move(_B.PREPARED, _B.ABORTED),      # the end of commit (not a winner) or of abort
)

_XID_MOVES = frozenset(XID_MOVES)
_BRANCH_MOVES = frozenset(BRANCH_MOVES)

#: Derived from the moves, for readers: the states a record may reach in one move
#: (updates, which keep the state, are not counted).
XID_TRANSITIONS: dict[XidState, frozenset[XidState]] = {
    state: frozenset(XidState(m.target) for m in XID_MOVES if m.source is state and m.history)
    for state in XidState
}
BRANCH_TRANSITIONS: dict[BranchState, frozenset[BranchState]] = {
    state: frozenset(BranchState(m.target) for m in BRANCH_MOVES if m.source is state)
    for state in BranchState
}


def xid_may(source: XidState, target: XidState, event: str | None = None,
            history: bool = True) -> bool:
    """Whether the table lists ``source → target`` (named ``event``; an update when
    ``history`` is False)."""
    return Move(source, target, event, history) in _XID_MOVES


def branch_may(source: BranchState, target: BranchState) -> bool:
    return Move(source, target) in _BRANCH_MOVES


def require_xid_transition(source: XidState, target: XidState, xid: str,
                           event: str | None = None, history: bool = True) -> None:
    """Raise :class:`InvalidTransition` unless the table lists the change."""
    if not xid_may(source, target, event, history):
        kind = "update" if not history else "move"
        named = f" ({kind} {event!r})" if event or not history else ""
        raise InvalidTransition(
            f"xid {xid}: {source.value} → {target.value}{named} is not allowed")


def require_branch_transition(source: BranchState, target: BranchState, branch: str) -> None:
    """Raise :class:`InvalidTransition` unless ``source → target`` is in the table."""
    if not branch_may(source, target):
        raise InvalidTransition(
            f"branch {branch}: {source.value} → {target.value} is not allowed"
        )
