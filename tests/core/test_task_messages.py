"""A task attempt's commit message keeps what it hands the driver through its text form
(the ``mapInArrow`` ways in): the branch ids, the prepared branches' records and the xid's
record as the attempt's begin left it."""

from __future__ import annotations

import json
from dataclasses import replace

from coordinator import BranchRecord, BranchState, XidRecord, XidState
from txsink.core.messages import (
    BranchMessage,
    from_text,
    handed_begun,
    handed_over,
    handed_xid,
    to_text,
)


def _prepared(branch_id: str) -> BranchRecord:
    return BranchRecord(sink_id="s", epoch=4, branch_id=branch_id, state=BranchState.PREPARED,
                        generation=2, owner={"staging": branch_id},
                        manifest={"rows": 7, "staging": branch_id}, version=1)


def _message(*records: BranchRecord) -> BranchMessage:
    return BranchMessage(epoch=4, generation=2, branch_ids=tuple(r.branch_id for r in records),
                         rows=7, bytes=70, partitions=1, started_at=1.0, stage_ms=2.0,
                         seal_ms=3.0, prepared=handed_over(records))


def test_a_branch_message_keeps_its_prepared_records_through_its_text_form():
    message = _message(_prepared("p0-a0-1"), _prepared("p0-a0-1-v0"))
    text = to_text(message)
    assert json.loads(text)["kind"] == "branch"
    assert from_text(text) == message


def test_the_handed_records_are_the_prepared_ones_with_their_versions():
    records = [_prepared("p0-a0-1"), _prepared("p0-a0-1-v0")]
    handed = _message(*records).handed_records("s")
    assert handed == records
    assert [r.version for r in handed] == [1, 1]


def _begun(version: int) -> XidRecord:
    return XidRecord(sink_id="s", epoch=4, state=XidState.INITIALIZED, generation=2,
                     created=1.0, updated=1.0, version=version)


def test_a_branch_message_keeps_the_xid_record_its_begin_left_through_its_text_form():
    message = replace(_message(_prepared("p0-a0-1")), begun=handed_begun(_begun(3)))
    assert from_text(to_text(message)) == message
    assert handed_xid([from_text(to_text(message))], "s").version == 3


def test_the_handed_xid_is_the_newest_record_the_messages_carry():
    older = replace(_message(_prepared("p0-a0-1")), begun=handed_begun(_begun(0)))
    newer = replace(_message(_prepared("p1-a0-1")), begun=handed_begun(_begun(2)))
    none = _message(_prepared("p2-a0-1"))
    found = handed_xid([older, none, newer], "s")
    assert found == _begun(2) and found.version == 2
    assert handed_xid([none], "s") is None
