"""Calling the caller's publish and rollback callbacks, and judging what they answer.

The coordinator knows nothing about what publishing means; it only knows the contract
of a :data:`BranchCallback` (as Flink's ``Committer.CommitRequest``):

- it is handed one :class:`BranchRecord` and everything it needs is in that record;
- it is idempotent: it may be called again for the same branch after any crash, by this
  process or by a later recovery, and for a winner only under the xid's publish lease;
- it may be called concurrently for different branches (winners of different publish
  groups, non-winners' rollbacks), never twice at once for one branch by one actor;
- a :data:`GroupCallback` publishes several winners at once (the caller's way of sharing
  their work); it keeps the same contract for each of them;
- it answers with an :data:`Outcome`: :class:`Done`, :class:`AlreadyDone` (a repeat found
  the work done: success, logged at debug), :class:`RetryLater` (transient: called again
  with exponential back-off, up to :class:`CallbackPolicy`'s tries) or :class:`Failed`
  (reported at once: retrying a deterministic error only delays the report). Returning
  None means ``Done``. An exception it raises is ``Failed``, except a kazoo connection
  error (the callback's own ledger writes hit a store hiccup), which is ``RetryLater``,
  and :class:`PublishLeaseLost`, which is not the callback's failure and propagates.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

from kazoo.exceptions import ConnectionLoss, OperationTimeoutError, SessionExpiredError
from tenacity import Retrying, retry_if_result, stop_after_attempt, wait_exponential

from coordinator.errors import CallbackFailed, PublishFailed, PublishLeaseLost, RollbackFailed
from coordinator.formats.records import BranchRecord
from coordinator.formats.states import XidState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Done:
    """The branch is published (or rolled back) by this call."""


@dataclass(frozen=True)
class AlreadyDone:
    """A repeat: the work was already done by an earlier call; success."""

    reason: str = ""


@dataclass(frozen=True)
class RetryLater:
    """A transient failure: calling again may succeed. ``error``: what was raised, if
    anything (the cause of the report once the tries run out)."""

    reason: str
    error: BaseException | None = None


@dataclass(frozen=True)
class Failed:
    """A failure with a known reason that another call would repeat."""

    reason: str
    error: BaseException | None = None


Outcome = Done | AlreadyDone | RetryLater | Failed
BranchCallback = Callable[[BranchRecord], "Outcome | None"]
GroupCallback = Callable[[list[BranchRecord]], "Outcome | None"]

_KAZOO_TRANSIENT = (ConnectionLoss, OperationTimeoutError, SessionExpiredError)


def outcome_of(callback: BranchCallback, branch: BranchRecord) -> Outcome:
    """What ``callback(branch)`` answered, a raised exception judged as the module
    docstring says."""
    try:
        outcome = callback(branch)
    except PublishLeaseLost:
        raise  # not the callback's failure: this actor must stop finishing the xid
    except _KAZOO_TRANSIENT as exc:
        return RetryLater(str(exc), exc)
    except Exception as exc:  # noqa: BLE001 - any other callback error is a failure
        return Failed(str(exc), exc)
    return Done() if outcome is None else outcome


@dataclass(frozen=True)
class CallbackPolicy:
    """How long a publish or rollback is retried before the coordinator gives up.

    The defaults (6 tries over about 3 s) ride out a ClickHouse restart-free hiccup; a
    longer outage leaves the xid where it is, for ``recover`` to finish later.
    """

    attempts: int = 6
    initial_wait: float = 0.1
    max_wait: float = 2.0

    def call_group(self, callback: GroupCallback, group: list[BranchRecord], action: str,
                   xid_state: XidState) -> None:
        """:meth:`call` of a group callback; reports name every branch of the group."""
        named = replace(group[0], branch_id="+".join(b.branch_id for b in group))
        self.call(lambda _: callback(group), named, action, xid_state)

    def call(self, callback: BranchCallback, branch: BranchRecord, action: str,
             xid_state: XidState) -> None:
        """Run ``callback(branch)`` until it is done; raise
        :class:`PublishFailed`/:class:`RollbackFailed` saying the xid stays in
        ``xid_state`` when it fails or keeps asking to be retried."""
        retrying = Retrying(
            stop=stop_after_attempt(self.attempts),
            wait=wait_exponential(multiplier=self.initial_wait, max=self.max_wait),
            retry=retry_if_result(lambda outcome: isinstance(outcome, RetryLater)),
            before_sleep=lambda state: log.warning(
                "xid %s: %s of branch %s failed (try %d), retrying: %s", branch.xid, action,
                branch.branch_id, state.attempt_number, _said(state.outcome.result())),
            retry_error_callback=lambda state: state.outcome.result(),
        )
        outcome = retrying(outcome_of, callback, branch)
        if isinstance(outcome, AlreadyDone):
            log.debug("xid %s: %s of branch %s was already done%s", branch.xid, action,
                      branch.branch_id, f": {outcome.reason}" if outcome.reason else "")
        elif isinstance(outcome, RetryLater | Failed):
            raise _failure(action, branch, outcome, xid_state) from outcome.error


def _said(outcome: RetryLater | Failed) -> str:
    """An outcome's reason as reports print it: the exception's type and text if any."""
    if outcome.error is not None:
        return f"{type(outcome.error).__name__}: {outcome.error}"
    return outcome.reason


def _failure(action: str, branch: BranchRecord, outcome: RetryLater | Failed,
             xid_state: XidState) -> CallbackFailed:
    kind = PublishFailed if action == "publish" else RollbackFailed
    return kind(
        f"xid {branch.xid}: {action} of branch {branch.branch_id} failed "
        f"({_said(outcome)}); {_what_next(xid_state)}",
        xid=branch.xid, branch_id=branch.branch_id,
    )


def _what_next(xid_state: XidState) -> str:
    """What can still be done with an xid left in ``xid_state``: a decided xid only moves
    in the direction it was decided, so ``Committing`` is never offered an abort."""
    if xid_state is XidState.COMMITTING:
        return ("the xid stays Committing: it is decided and can only be published, never "
                "aborted; run commit or recover again once the cause is fixed (recovery "
                "reports what can be done when it can never succeed)")
    if xid_state is XidState.ABORTING:
        return "the xid stays Aborting until abort or recover is run again"
    return f"the xid stays {xid_state.value} until commit, abort or recover is run again"
