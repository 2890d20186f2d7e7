"""Typed errors of the coordinator.

Every refusal is a distinct type so the caller can tell "someone newer owns this sink"
(:class:`Fenced`) from "this xid was already decided" (:class:`XidDecided`) from a
programming error (:class:`InvalidTransition`). ZooKeeper outages that outlast the retry
policy surface as kazoo's own errors (``RetryFailedError``, ``ConnectionLoss``): no
coordinator state was changed by the failed call beyond what a re-run finishes.
"""

from __future__ import annotations


class CoordinatorError(Exception):
    """Base of every error the coordinator raises on purpose."""


class Fenced(CoordinatorError):
    """The caller's generation is not the sink's current one: a newer writer owns the sink.

    Like Kafka's ``ProducerFencedException``: the caller must stop; retrying with the same
    generation can never succeed.
    """


class XidDecided(CoordinatorError):
    """The xid is no longer ``Initialized``: its outcome is decided and cannot change.

    Raised to zombie tasks that register or prepare a branch after the decision, and to an
    ``abort`` of an xid that is ``Committing`` or ``Committed``.
    """


class XidAborted(XidDecided):
    """The xid (its current attempt) was aborted; nothing of it will ever be published."""


class InvalidTransition(CoordinatorError):
    """The requested change is not allowed from the record's current state."""


class UnknownXid(InvalidTransition):
    """The xid has no record: ``begin`` was never called for it (or it was pruned)."""


class UnknownBranch(InvalidTransition):
    """The branch was never registered under this xid."""


class WinnerNotPrepared(InvalidTransition):
    """A branch chosen as winner is not ``Prepared`` in the xid's current attempt."""


class RecordTooLarge(CoordinatorError):
    """A record (usually a manifest) does not fit in one znode (ZooKeeper's 1 MB limit)."""


class CallbackFailed(CoordinatorError):
    """A publish or rollback callback kept failing; the xid stays in its current state.

    The original exception is chained as ``__cause__``. Re-running ``commit``, ``abort``
    or ``recover`` resumes where this one stopped.
    """

    def __init__(self, message: str, *, xid: str, branch_id: str) -> None:
        super().__init__(message)
        self.xid = xid
        self.branch_id = branch_id


class PublishFailed(CallbackFailed):
    """Publishing a winner kept failing: the xid stays ``Committing`` (never rolled back)."""


class RollbackFailed(CallbackFailed):
    """Rolling back a branch kept failing: the xid stays ``Committing`` or ``Aborting``."""


class RecoveryIncomplete(CoordinatorError):
    """``recover`` could not finish every xid; ``report`` says which and why."""

    def __init__(self, report: object) -> None:
        super().__init__(f"recovery incomplete: {report}")
        self.report = report
