"""Typed errors of the coordinator.

Every refusal is a distinct type so the caller can tell "someone newer owns this sink"
(:class:`Fenced`) from "this xid was already decided" (:class:`XidDecided`) from a
programming error (:class:`InvalidTransition`). Outages of the store that outlast the retry
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


class SinkTakenOver(Fenced):
    """Another writer of the same sink (a newer batch job, a restarted stream, a second
    driver) took the sink over; this writer's work was or will be rolled back.

    Raised instead of the lower-level refusal (:class:`Fenced`, :class:`XidAborted`,
    :class:`XidDecided`) whenever the sink's generation moved past the writer's, so a
    superseded job fails with one message saying who took over and what to do.
    """

    def __init__(self, sink_id: str, generation: int | None, current: int, by: str,
                 cause: Exception | None = None) -> None:
        writer = (f"generation {generation}" if generation is not None
                  else "a run that never held the sink after it")
        super().__init__(
            f"sink {sink_id} was taken over by another writer (generation {current}, "
            f"started by {by}); this writer ({writer}) stops and its "
            "undecided rows are rolled back. Only one job or stream may write a sink id "
            "at a time: if the other writer is unintended, stop it; otherwise nothing to do"
            + (f" ({type(cause).__name__}: {cause})" if cause else ""))
        self.sink_id = sink_id
        self.generation = generation
        self.current = current


class XidDecided(CoordinatorError):
    """The xid is no longer ``Initialized``: its outcome is decided and cannot change.

    Raised to zombie tasks that register or prepare a branch after the decision, and to an
    ``abort`` of an xid that is ``Committing`` or ``Committed``.
    """


class XidAborted(XidDecided):
    """The xid (its current attempt) was aborted; nothing of it will ever be published."""


class SinkTreeDamaged(CoordinatorError):
    """A node of the sink's record tree is missing or is not what txsink writes there,
    and it cannot be proven to be the sink's own half-made creation: nothing is repaired
    (guessing a generation or a committed epoch would break fencing or exactly-once)."""


class MalformedRecord(SinkTreeDamaged, ValueError):
    """A znode of the sink's tree does not hold a txsink record (JSON object)."""


class GaveUp(CoordinatorError):
    """A compare-and-set loop lost every one of its tries to other writers; the message
    says which node it waited for. Nothing was changed by the failed call."""


class InvalidTransition(CoordinatorError):
    """The requested change is not allowed from the record's current state."""


class UnknownXid(InvalidTransition):
    """The xid has no record: ``begin`` was never called for it (or it was pruned)."""


class UnknownBranch(InvalidTransition):
    """The branch was never registered under this xid."""


class WinnerNotPrepared(InvalidTransition):
    """A branch chosen as winner is not ``Prepared`` in the xid's current attempt."""


class PublishInProgress(CoordinatorError):
    """Another live actor holds the xid's publish lease and is finishing it.

    Not a failure: the xid is in good hands. ``holder`` says who (role, host, pid).
    """

    def __init__(self, message: str, *, xid: str, holder: str | None) -> None:
        super().__init__(message)
        self.xid = xid
        self.holder = holder


class PublishLeaseLost(CoordinatorError):
    """This actor's publish lease died (its ZooKeeper session expired) while it published.

    It must stop at once: another actor may already be finishing the xid. Nothing it wrote
    is lost; the xid stays decided and its next holder finishes it.
    """


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


class StreamStateMismatch(CoordinatorError):
    """A streaming query's checkpoint and the sink's state disagree; nothing was written.

    The sink's epochs are one query's micro-batch ids. When the checkpoint and the sink no
    longer describe the same history, writing would either skip new rows (taken for
    batches already committed) or write committed rows again, so the micro-batch is
    refused before anything is claimed, staged or decided. The message says what happened
    and what to do; ``txsink reset`` is the explicit way out. Attributes: ``sink_id``,
    ``query_id`` (the writing query), ``epoch`` (its micro-batch), ``owner`` (the query
    the sink's epochs belong to, if known) and ``last_committed``.
    """

    def __init__(self, message: str, *, sink_id: str, query_id: str, epoch: int,
                 owner: str | None, last_committed: int | None) -> None:
        super().__init__(message)
        self.sink_id = sink_id
        self.query_id = query_id
        self.epoch = epoch
        self.owner = owner
        self.last_committed = last_committed


class CheckpointReplaced(StreamStateMismatch):
    """The sink has committed epochs of another query, or more epochs than the checkpoint
    knows: the checkpoint was deleted, replaced or restored from an older copy."""


class SinkStateLost(StreamStateMismatch):
    """The checkpoint says micro-batches were committed that the sink has no record of:
    the sink's ZooKeeper state was deleted or restored from an older copy."""


class ResetRefused(CoordinatorError):
    """``txsink reset`` cannot run now (open xids, or a request that contradicts the
    sink's state); nothing was changed."""
