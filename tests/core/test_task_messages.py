"""A task attempt's commit message keeps what it hands the driver through its text form
(the ``mapInArrow`` ways in): the branch ids and the prepared branches' records."""

from __future__ import annotations

import json

from coordinator import BranchRecord, BranchState
from txsink.core.messages import BranchMessage, from_text, handed_over, to_text


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
