"""The transition tables, pair by pair, and the records that enforce them (pure logic: no
server needed).

The table in ``coordinator/formats/states.py`` is the one statement of what is legal: the records'
``moved_to``/``changed`` consult it, so every illegal move raises wherever it is attempted.
These tests walk every (from, to, event) of both enums at the record level, check that no
module of ``coordinator/`` changes a record's state around the records, and compare the
table with the one in docs/design.md.
"""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

import pytest

from coordinator import BranchRecord, BranchState, InvalidTransition, XidRecord, XidState
from coordinator.formats.states import (
    BRANCH_MOVES,
    BRANCH_TRANSITIONS,
    XID_MOVES,
    XID_TRANSITIONS,
    Move,
    branch_may,
    require_branch_transition,
    require_xid_transition,
    xid_may,
)

X = XidState
B = BranchState
ROOT = Path(__file__).resolve().parents[2]
RECORDED = [s for s in X if s is not X.UNKNOWN]

#: The xid moves, written out once more by hand: (from, to, event).
ALLOWED_XID_MOVES = {
    (X.UNKNOWN, X.INITIALIZED, None),
    (X.INITIALIZED, X.INITIALIZED, "adopted"),  # begin of a newer generation
    (X.INITIALIZED, X.COMMITTING, None),
    (X.INITIALIZED, X.ABORTING, None),
    (X.COMMITTING, X.COMMITTED, None),
    (X.ABORTING, X.ABORTED, None),
    (X.ABORTED, X.INITIALIZED, "new_attempt"),  # a new attempt under a newer generation
    (X.UNKNOWN, X.COMMITTED, "reset"),  # txsink reset --committed-through
}
#: The xid updates (state kept, no history entry): (state, event).
ALLOWED_XID_UPDATES = {(X.INITIALIZED, "select"), *((s, "metrics") for s in RECORDED)}
ALLOWED_BRANCH = {
    (B.UNKNOWN, B.INITIALIZED),
    (B.INITIALIZED, B.PREPARED),
    (B.INITIALIZED, B.ABORTED),
    (B.PREPARED, B.COMMITTED),
    (B.PREPARED, B.ABORTED),
}
EVENTS = [None, "adopted", "new_attempt", "reset", "select", "metrics", "bogus"]


def xid_record(state: X, attempt: int = 1) -> XidRecord:
    return XidRecord("s", 1, state, generation=3, attempt=attempt, created=1.0, updated=1.0)


def branch_record(state: B) -> BranchRecord:
    return BranchRecord("s", 1, "p0-a0-s0-00000000", state, generation=3, created=1.0,
                        updated=1.0)


# -- the table ---------------------------------------------------------------------------

def test_the_xid_table_is_exactly_the_listed_moves_and_updates() -> None:
    moves = {(m.source, m.target, m.event) for m in XID_MOVES if m.history}
    updates = {(m.source, m.event) for m in XID_MOVES if not m.history}
    assert moves == ALLOWED_XID_MOVES
    assert updates == ALLOWED_XID_UPDATES
    assert all(m.source is m.target for m in XID_MOVES if not m.history)
    assert len(set(XID_MOVES)) == len(XID_MOVES)


def test_the_branch_table_is_exactly_the_listed_moves() -> None:
    assert {(m.source, m.target) for m in BRANCH_MOVES} == ALLOWED_BRANCH
    assert all(m.event is None and m.history for m in BRANCH_MOVES)


@pytest.mark.parametrize(("source", "target", "event"),
                         list(itertools.product(X, X, EVENTS)), ids=str)
def test_xid_move_is_allowed_exactly_when_listed(source: X, target: X,
                                                 event: str | None) -> None:
    allowed = (source, target, event) in ALLOWED_XID_MOVES
    assert xid_may(source, target, event) is allowed
    if allowed:
        require_xid_transition(source, target, "s/1", event)
    else:
        with pytest.raises(InvalidTransition, match=f"{source.value} → {target.value}"):
            require_xid_transition(source, target, "s/1", event)


@pytest.mark.parametrize(("source", "target"), list(itertools.product(B, B)), ids=str)
def test_branch_transition_is_allowed_exactly_when_listed(source: B, target: B) -> None:
    allowed = (source, target) in ALLOWED_BRANCH
    assert branch_may(source, target) is allowed
    if allowed:
        require_branch_transition(source, target, "p0")
    else:
        with pytest.raises(InvalidTransition):
            require_branch_transition(source, target, "p0")


def test_derived_views_follow_the_moves() -> None:
    assert XID_TRANSITIONS[X.COMMITTED] == frozenset()
    assert XID_TRANSITIONS[X.COMMITTING] == {X.COMMITTED}
    assert XID_TRANSITIONS[X.INITIALIZED] == {X.INITIALIZED, X.COMMITTING, X.ABORTING}
    assert BRANCH_TRANSITIONS[B.COMMITTED] == frozenset()
    assert BRANCH_TRANSITIONS[B.ABORTED] == frozenset()


def test_open_states_are_the_ones_recovery_looks_at() -> None:
    assert {s for s in X if s.is_open} == {X.INITIALIZED, X.COMMITTING, X.ABORTING}


def test_decided_states_are_those_after_the_decision() -> None:
    assert {s for s in X if s.is_decided} == {X.COMMITTING, X.COMMITTED, X.ABORTING,
                                              X.ABORTED}


# -- the records enforce it --------------------------------------------------------------

@pytest.mark.parametrize(("source", "target", "event"),
                         list(itertools.product(X, X, EVENTS)), ids=str)
def test_an_xid_record_moves_only_as_the_table_says(source: X, target: X,
                                                    event: str | None) -> None:
    record = xid_record(source)
    if (source, target, event) in ALLOWED_XID_MOVES:
        moved = record.moved_to(target, 7, event=event)
        assert moved.state is target
        entry = moved.history[-1]
        assert entry["state"] == target.value and entry["generation"] == 7
        assert entry.get("event") == event
    else:
        with pytest.raises(InvalidTransition, match=f"{source.value} → {target.value}"):
            record.moved_to(target, 7, event=event)


@pytest.mark.parametrize(("state", "event"), list(itertools.product(X, EVENTS)), ids=str)
def test_an_xid_record_is_updated_only_as_the_table_says(state: X, event: str | None
                                                        ) -> None:
    record = xid_record(state)
    if (state, event) in ALLOWED_XID_UPDATES:
        assert event is not None
        changed = record.changed(event, metrics={"rows": 1})
        assert changed.state is state and changed.history == record.history
        assert changed.updated == record.updated  # only when passed
    else:
        with pytest.raises(InvalidTransition):
            record.changed(event, metrics={"rows": 1})  # type: ignore[arg-type]


@pytest.mark.parametrize("state", RECORDED, ids=str)
def test_an_update_cannot_change_the_state(state: X) -> None:
    for target in X:
        with pytest.raises(InvalidTransition):
            xid_record(state).changed("metrics", state=target)


@pytest.mark.parametrize(("source", "target"), list(itertools.product(B, B)), ids=str)
def test_a_branch_record_moves_only_as_the_table_says(source: B, target: B) -> None:
    record = branch_record(source)
    if (source, target) in ALLOWED_BRANCH:
        assert record.moved_to(target).state is target
    else:
        with pytest.raises(InvalidTransition, match=f"{source.value} → {target.value}"):
            record.moved_to(target)


def test_a_record_in_unknown_is_never_written() -> None:
    with pytest.raises(InvalidTransition):
        xid_record(X.UNKNOWN).to_bytes()
    with pytest.raises(InvalidTransition):
        branch_record(B.UNKNOWN).to_bytes()
    xid_record(X.UNKNOWN).moved_to(X.INITIALIZED, 1).to_bytes()
    branch_record(B.UNKNOWN).moved_to(B.INITIALIZED).to_bytes()


def test_a_new_attempt_round_trips_with_its_history() -> None:
    aborted = xid_record(X.INITIALIZED).moved_to(X.ABORTING, 3).moved_to(X.ABORTED, 3)
    again = aborted.moved_to(X.INITIALIZED, 4, event="new_attempt", generation=4, attempt=2)
    read = XidRecord.from_bytes("s", 1, again.to_bytes(), 5)
    assert read == again
    assert [h["state"] for h in read.history] == ["Aborting", "Aborted", "Initialized"]
    assert read.history[-1] == {**read.history[-1], "event": "new_attempt", "attempt": 2}


# -- nothing in coordinator/ goes around the records --------------------------------------

def _state_argument(call: ast.Call, position: int) -> ast.expr | None:
    for keyword in call.keywords:
        if keyword.arg == "state":
            return keyword.value
    return call.args[position] if len(call.args) > position else None


def test_no_module_of_the_coordinator_changes_a_state_around_the_table() -> None:
    """``dataclasses.replace(record, state=...)`` only inside the records' ``moved_to``,
    and a record is only constructed in ``Unknown`` (then moved) or read from bytes."""
    offences = []
    for path in sorted((ROOT / "coordinator").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for function in [n for n in ast.walk(tree)
                         if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]:
            for call in [n for n in ast.walk(function) if isinstance(n, ast.Call)]:
                name = getattr(call.func, "id", getattr(call.func, "attr", None))
                where = f"{path.name}:{call.lineno} ({function.name})"
                if name == "replace" and any(k.arg == "state" for k in call.keywords):
                    if not (path.name == "records.py" and function.name == "moved_to"):
                        offences.append(f"{where}: replace(..., state=...)")
                position = {"XidRecord": 2, "BranchRecord": 3}.get(name or "")
                if position is not None:
                    state = _state_argument(call, position)
                    if not (isinstance(state, ast.Attribute) and state.attr == "UNKNOWN"):
                        offences.append(f"{where}: {name}(...) not in UNKNOWN")
    assert offences == []


# -- the table is the one docs/design.md shows --------------------------------------------

def _design_table() -> tuple[set[Move], set[Move]]:
    text = (ROOT / "docs" / "design.md").read_text()
    section = text.split("### States: one table", 1)[1].split("\n### ", 1)[0]
    rows = [line for line in section.splitlines()
            if line.startswith("| xid |") or line.startswith("| branch |")]
    assert rows, "docs/design.md has no state table under '### States: one table'"
    xid: set[Move] = set()
    branch: set[Move] = set()
    for row in rows:
        record, source, target, event, _ = [c.strip() for c in row.strip("|").split("|")]
        update = "(update)" in event
        event_name = re.sub(r"\(update\)|`", "", event).strip() or None
        enum = X if record == "xid" else B
        sources = RECORDED if source == "any recorded state" else [enum(source)]
        for state in sources:
            move = Move(state, state if target == "the same" else enum(target), event_name,
                        not update)
            (xid if record == "xid" else branch).add(move)
    return xid, branch


def test_the_tables_are_the_ones_in_the_design_document() -> None:
    xid, branch = _design_table()
    assert xid == set(XID_MOVES)
    assert branch == set(BRANCH_MOVES)
