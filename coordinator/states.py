"""The xid and branch state machines, as one table each.

Why a table: every writer (commit, abort, recovery, a task registering a branch) asks the
same question — "may this record go from A to B?" — and must get the same answer. Keeping
the answer in one place makes the protocol reviewable at a glance, and the tests can walk
every pair of states.

xid (per attempt)::

    Unknown ─begin─▶ Initialized ─commit─▶ Committing ─▶ Committed
                         │
                         └─abort─▶ Aborting ─▶ Aborted ─begin (newer generation)─▶ Initialized

``Committing`` is the decision: once written it is never undone, only finished.
``Aborted → Initialized`` starts a new *attempt* of the same xid (a replayed streaming
batch under a newer generation); the branches of the old attempt stay ``Aborted``.

branch::

    Unknown ──register──▶ Initialized ──prepare──▶ Prepared ──▶ Committed
                              │                       │
                              └───────────────────────┴──▶ Aborted
"""

from __future__ import annotations

from enum import StrEnum

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

    UNKNOWN = "Unknown"
    INITIALIZED = "Initialized"
    PREPARED = "Prepared"
    COMMITTED = "Committed"
    ABORTED = "Aborted"


_OPEN = frozenset({XidState.INITIALIZED, XidState.COMMITTING, XidState.ABORTING})
_DECIDED = frozenset(
    {XidState.COMMITTING, XidState.COMMITTED, XidState.ABORTING, XidState.ABORTED}
)

#: Allowed xid transitions. Anything not listed is refused.
XID_TRANSITIONS: dict[XidState, frozenset[XidState]] = {
    XidState.UNKNOWN: frozenset({XidState.INITIALIZED}),
    XidState.INITIALIZED: frozenset({XidState.COMMITTING, XidState.ABORTING}),
    XidState.COMMITTING: frozenset({XidState.COMMITTED}),
    XidState.COMMITTED: frozenset(),
    XidState.ABORTING: frozenset({XidState.ABORTED}),
    XidState.ABORTED: frozenset({XidState.INITIALIZED}),  # a new attempt
}

#: Allowed branch transitions. Anything not listed is refused.
BRANCH_TRANSITIONS: dict[BranchState, frozenset[BranchState]] = {
    BranchState.UNKNOWN: frozenset({BranchState.INITIALIZED}),
    BranchState.INITIALIZED: frozenset({BranchState.PREPARED, BranchState.ABORTED}),
    BranchState.PREPARED: frozenset({BranchState.COMMITTED, BranchState.ABORTED}),
    BranchState.COMMITTED: frozenset(),
    BranchState.ABORTED: frozenset(),
}


def xid_may(source: XidState, target: XidState) -> bool:
    return target in XID_TRANSITIONS[source]


def branch_may(source: BranchState, target: BranchState) -> bool:
    return target in BRANCH_TRANSITIONS[source]


def require_xid_transition(source: XidState, target: XidState, xid: str) -> None:
    """Raise :class:`InvalidTransition` unless ``source → target`` is in the table."""
    if not xid_may(source, target):
        raise InvalidTransition(f"xid {xid}: {source.value} → {target.value} is not allowed")


def require_branch_transition(source: BranchState, target: BranchState, branch: str) -> None:
    """Raise :class:`InvalidTransition` unless ``source → target`` is in the table."""
    if not branch_may(source, target):
        raise InvalidTransition(
            f"branch {branch}: {source.value} → {target.value} is not allowed"
        )
