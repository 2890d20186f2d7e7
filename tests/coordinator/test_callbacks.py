"""The callback contract (``coordinator.protocol.callbacks``): each outcome, and how a
raised exception is judged, without a store."""

from __future__ import annotations

import logging

import pytest
from kazoo.exceptions import ConnectionLoss

from coordinator import (
    AlreadyDone,
    BranchRecord,
    CallbackPolicy,
    Done,
    Failed,
    PublishFailed,
    PublishLeaseLost,
    RetryLater,
    RollbackFailed,
    XidState,
)
from coordinator.formats.states import BranchState

POLICY = CallbackPolicy(attempts=3, initial_wait=0.001, max_wait=0.002)
BRANCH = BranchRecord(sink_id="sink", epoch=7, branch_id="p0-a1",
                      state=BranchState.PREPARED, generation=1)


def calls(*answers: object) -> tuple[list[int], object]:
    """A callback answering ``answers`` in turn (an exception is raised), and its calls."""
    made: list[int] = []

    def callback(_: BranchRecord) -> object:
        made.append(1)
        answer = answers[min(len(made), len(answers)) - 1]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    return made, callback


@pytest.mark.parametrize("answer", [None, Done(), AlreadyDone("partition 202401")])
def test_done_already_done_and_none_succeed_at_once(answer: object) -> None:
    made, callback = calls(answer)
    POLICY.call(callback, BRANCH, "publish", XidState.COMMITTING)
    assert len(made) == 1


def test_already_done_is_logged_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    _, callback = calls(AlreadyDone("partition 202401"))
    with caplog.at_level(logging.DEBUG, logger="coordinator.protocol.callbacks"):
        POLICY.call(callback, BRANCH, "publish", XidState.COMMITTING)
    (record,) = caplog.records
    assert record.levelno == logging.DEBUG and "already done" in record.getMessage()


def test_retry_later_is_retried_until_done() -> None:
    made, callback = calls(RetryLater("busy"), RetryLater("busy"), Done())
    POLICY.call(callback, BRANCH, "publish", XidState.COMMITTING)
    assert len(made) == 3


def test_retry_later_until_the_tries_run_out_fails_with_its_cause() -> None:
    cause = TimeoutError("read timed out")
    made, callback = calls(RetryLater("timed out", cause))
    with pytest.raises(PublishFailed, match="TimeoutError: read timed out") as failure:
        POLICY.call(callback, BRANCH, "publish", XidState.COMMITTING)
    assert len(made) == 3 and failure.value.__cause__ is cause


def test_failed_is_reported_at_once() -> None:
    made, callback = calls(Failed("schema changed"))
    with pytest.raises(RollbackFailed, match=r"\(schema changed\); the xid stays Aborting"):
        POLICY.call(callback, BRANCH, "rollback", XidState.ABORTING)
    assert len(made) == 1


def test_a_raised_error_is_failed_and_a_kazoo_connection_error_retried() -> None:
    made, callback = calls(ValueError("bad"))
    with pytest.raises(PublishFailed) as failure:
        POLICY.call(callback, BRANCH, "publish", XidState.COMMITTING)
    assert len(made) == 1 and isinstance(failure.value.__cause__, ValueError)
    made, callback = calls(ConnectionLoss(), Done())
    POLICY.call(callback, BRANCH, "publish", XidState.COMMITTING)
    assert len(made) == 2


def test_a_lost_lease_propagates_unjudged() -> None:
    lost = PublishLeaseLost("lease lost")
    _, callback = calls(lost)
    with pytest.raises(PublishLeaseLost):
        POLICY.call(callback, BRANCH, "publish", XidState.COMMITTING)
