"""The transition tables, pair by pair (pure logic: no server needed)."""

from __future__ import annotations

import itertools

import pytest

from coordinator import BranchState, InvalidTransition, XidState
from coordinator.states import (
    BRANCH_TRANSITIONS,
    XID_TRANSITIONS,
    branch_may,
    require_branch_transition,
    require_xid_transition,
    xid_may,
)

X = XidState
B = BranchState

ALLOWED_XID = {
    (X.UNKNOWN, X.INITIALIZED),
    (X.INITIALIZED, X.COMMITTING),
    (X.INITIALIZED, X.ABORTING),
    (X.COMMITTING, X.COMMITTED),
    (X.ABORTING, X.ABORTED),
    (X.ABORTED, X.INITIALIZED),  # a new attempt under a newer generation
}
ALLOWED_BRANCH = {
    (B.UNKNOWN, B.INITIALIZED),
    (B.INITIALIZED, B.PREPARED),
    (B.INITIALIZED, B.ABORTED),
    (B.PREPARED, B.COMMITTED),
    (B.PREPARED, B.ABORTED),
}


@pytest.mark.parametrize(("source", "target"), list(itertools.product(X, X)),
                         ids=lambda s: s.value)
def test_xid_transition_is_allowed_exactly_when_listed(source: X, target: X) -> None:
    allowed = (source, target) in ALLOWED_XID
    assert xid_may(source, target) is allowed
    if allowed:
        require_xid_transition(source, target, "s/1")
    else:
        with pytest.raises(InvalidTransition, match=f"{source.value} → {target.value}"):
            require_xid_transition(source, target, "s/1")


@pytest.mark.parametrize(("source", "target"), list(itertools.product(B, B)),
                         ids=lambda s: s.value)
def test_branch_transition_is_allowed_exactly_when_listed(source: B, target: B) -> None:
    allowed = (source, target) in ALLOWED_BRANCH
    assert branch_may(source, target) is allowed
    if allowed:
        require_branch_transition(source, target, "p0")
    else:
        with pytest.raises(InvalidTransition):
            require_branch_transition(source, target, "p0")


def test_committed_is_terminal_and_committing_only_finishes() -> None:
    assert XID_TRANSITIONS[X.COMMITTED] == frozenset()
    assert XID_TRANSITIONS[X.COMMITTING] == {X.COMMITTED}


def test_a_decided_branch_never_changes_again() -> None:
    assert BRANCH_TRANSITIONS[B.COMMITTED] == frozenset()
    assert BRANCH_TRANSITIONS[B.ABORTED] == frozenset()


def test_open_states_are_the_ones_recovery_looks_at() -> None:
    assert {s for s in X if s.is_open} == {X.INITIALIZED, X.COMMITTING, X.ABORTING}


def test_decided_states_are_those_after_the_decision() -> None:
    assert {s for s in X if s.is_decided} == {X.COMMITTING, X.COMMITTED, X.ABORTING,
                                              X.ABORTED}
