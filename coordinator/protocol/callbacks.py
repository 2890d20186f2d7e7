"""Calling the caller's publish and rollback callbacks, with retries on transient errors.

The coordinator knows nothing about what publishing means; it only knows the callback's
contract: idempotent (it may be called again for the same branch after any crash, by this
process or by a later recovery) and raising on failure. An exception is *transient* when
it carries ``retryable = True`` (the convention of ``server_ext`` errors) or is a kazoo
connection error (the callback's own ledger writes hit a ZooKeeper hiccup); those are
retried with exponential back-off. Anything else fails at once: retrying a deterministic
error only delays the report.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from kazoo.exceptions import ConnectionLoss, OperationTimeoutError, SessionExpiredError
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from coordinator.errors import CallbackFailed, PublishFailed, PublishLeaseLost, RollbackFailed
from coordinator.formats.records import BranchRecord
from coordinator.formats.states import XidState

log = logging.getLogger(__name__)

BranchCallback = Callable[[BranchRecord], None]

_KAZOO_TRANSIENT = (ConnectionLoss, OperationTimeoutError, SessionExpiredError)


def is_retryable_callback_error(error: BaseException) -> bool:
    """Whether a publish or rollback callback's ``error`` is worth another try (module
    docstring); not ``server_ext.errors.is_transient``, which judges a server's answer."""
    return getattr(error, "retryable", False) is True or isinstance(error, _KAZOO_TRANSIENT)


@dataclass(frozen=True)
class CallbackPolicy:
    """How long a publish or rollback is retried before the coordinator gives up.

    The defaults (6 tries over about 3 s) ride out a ClickHouse restart-free hiccup; a
    longer outage leaves the xid where it is, for ``recover`` to finish later.
    """

    attempts: int = 6
    initial_wait: float = 0.1
    max_wait: float = 2.0

    def call(self, callback: BranchCallback, branch: BranchRecord, action: str,
             xid_state: XidState) -> None:
        """Run ``callback(branch)``; raise :class:`PublishFailed`/:class:`RollbackFailed`
        saying the xid stays in ``xid_state``."""
        retrying = Retrying(
            stop=stop_after_attempt(self.attempts),
            wait=wait_exponential(multiplier=self.initial_wait, max=self.max_wait),
            retry=retry_if_exception(is_retryable_callback_error),
            before_sleep=lambda state: log.warning(
                "xid %s: %s of branch %s failed (try %d), retrying: %s", branch.xid, action,
                branch.branch_id, state.attempt_number, state.outcome.exception()),
            reraise=True,
        )
        try:
            retrying(callback, branch)
        except PublishLeaseLost:
            raise  # not the callback's failure: this actor must stop finishing the xid
        except Exception as exc:  # noqa: BLE001 - any callback error becomes a typed one
            raise _failure(action, branch, exc, xid_state) from exc


def _failure(action: str, branch: BranchRecord, exc: Exception,
             xid_state: XidState) -> CallbackFailed:
    kind = PublishFailed if action == "publish" else RollbackFailed
    return kind(
        f"xid {branch.xid}: {action} of branch {branch.branch_id} failed "
        f"({type(exc).__name__}: {exc}); {_what_next(xid_state)}",
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
