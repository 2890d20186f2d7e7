"""Recovery of in-doubt xids: finish every decision a crashed writer left behind.

Run by a new writer right after ``fence()`` (and by operators on demand). The rule is the
one of every two-phase commit: a decided xid is finished in the direction it was
decided — ``Committing`` is published (never rolled back), ``Aborting`` is rolled back —
and an undecided one is aborted if its owner is gone, i.e. it belongs to a generation
older than the recovering writer's. Undecided xids of the current generation are live
work and are left alone, unless the caller asks for abandoned xids too (``txsink
recover`` and ``txsink gc`` do): then an xid whose writer's liveness holders are all gone
(``coordinator/protocol/liveness.py``) is rolled back as well, guarded by the version it was
judged at.

Recovery never takes a decided xid from a live actor: it finishes an xid only while it
holds the xid's publish lease, and reports an xid whose lease another live actor holds as
``in_progress`` (the driver that decided it, another recovery, an operator). That is what
makes ``txsink recover`` safe to run while writers run.

Only the open index (``<sink>/open``) is read, so recovery costs O(open xids), not
O(history). Every xid is attempted even if an earlier one fails; failures are reported,
never skipped silently.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace

from coordinator.errors import CoordinatorError, Fenced, PublishInProgress, RecoveryIncomplete
from coordinator.formats.records import XidRecord
from coordinator.formats.states import XidState
from coordinator.plumbing.store import SinkStore
from coordinator.protocol.callbacks import BranchCallback
from coordinator.protocol.completion import Completion
from coordinator.protocol.liveness import Verdict
from coordinator.protocol.publish_lease import PublishLease

log = logging.getLogger(__name__)

ROLLED_FORWARD = "rolled_forward"
ROLLED_BACK = "rolled_back"
IN_PROGRESS = "in_progress"  # another live actor holds the publish lease and finishes it
FAILED = "failed"

_ORDER = {XidState.COMMITTING: 0, XidState.ABORTING: 1, XidState.INITIALIZED: 2}

AbortIfOlder = Callable[[int, int, "int | None", BranchCallback, "int | None"],
                       "XidRecord | None"]
Judge = Callable[[XidRecord], Verdict]
LeaseFor = Callable[[int], AbstractContextManager[PublishLease]]


@dataclass(frozen=True)
class RecoveryAction:
    """What recovery did to one xid: ``(xid, from_state, action)`` plus details."""

    xid: str
    from_state: XidState
    action: str  # rolled_forward | rolled_back | in_progress | failed
    epoch: int
    detail: str = ""
    # in_progress, left at once to a holder the caller named (``leave_to``): what the
    # caller expects, not news (a pipelined writer's own background publish)
    expected: bool = False

    def __str__(self) -> str:
        text = f"{self.xid} {self.from_state.value} -> {self.action}"
        return f"{text} ({self.detail})" if self.detail else text


@dataclass
class RecoveryReport:
    """Every xid recovery touched; empty ``actions`` means there was nothing to do."""

    sink_id: str
    generation: int | None  # None: not read (nothing was open)
    actions: list[RecoveryAction] = field(default_factory=list)

    @property
    def failed(self) -> list[RecoveryAction]:
        return [a for a in self.actions if a.action == FAILED]

    @property
    def ok(self) -> bool:
        return not self.failed

    def __str__(self) -> str:
        body = "; ".join(str(a) for a in self.actions) or "nothing to recover"
        at = "" if self.generation is None else f" (generation {self.generation})"
        return f"sink {self.sink_id}{at}: {body}"


class Recovery:
    """One recovery pass over a sink's open xids.

    Usage (what :meth:`Coordinator.recover` does)::

        report = Recovery(store, completion, abort_if_older, lease_for).run(
            generation, publish, rollback, older_than=generation, raise_on_failure=True)
    """

    def __init__(self, store: SinkStore, completion: Completion,
                 abort_if_older: AbortIfOlder, lease_for: LeaseFor,
                 judge: Judge | None = None,
                 leave_to: Callable[[str], bool] | None = None) -> None:
        self.store = store
        self.completion = completion
        self.abort_if_older = abort_if_older
        self.lease_for = lease_for
        self.judge = judge  # None: the current generation's xids are all left alone
        self.leave_to = leave_to  # holders whose xids are expected in progress

    def run(self, generation: int, publish: BranchCallback, rollback: BranchCallback,
            older_than: int, raise_on_failure: bool,
            epochs: list[int] | None = None) -> RecoveryReport:
        """``epochs``: the open index as the caller read it (None: read here)."""
        report = RecoveryReport(self.store.sink_id, generation)
        if epochs is None:
            epochs = self.store.run(self.store.epochs, True)
        records = self.store.run(self.store.read_xids, epochs)
        for record in sorted(records, key=lambda r: (_ORDER.get(r.state, 3), r.epoch)):
            action = self._recover_one(record, generation, publish, rollback, older_than)
            if action is not None:
                log.log(logging.DEBUG if action.expected else logging.WARNING,
                        "recovery: %s", action)
                report.actions.append(action)
        if raise_on_failure and not report.ok:
            raise RecoveryIncomplete(report)
        return report

    def _recover_one(self, record: XidRecord, generation: int, publish: BranchCallback,
                     rollback: BranchCallback, older_than: int) -> RecoveryAction | None:
        try:
            if record.state in (XidState.COMMITTING, XidState.ABORTING):
                return self._finish(record, generation, publish, rollback)
            if record.state is XidState.INITIALIZED and record.generation < older_than:
                done = self.abort_if_older(record.epoch, generation, older_than, rollback, None)
                return None if done is None else self._action(
                    record, ROLLED_BACK, f"undecided, generation {record.generation}")
            if record.state is XidState.INITIALIZED and self.judge is not None:
                verdict = self.judge(record)
                if not verdict.abandoned:
                    return None
                done = self.abort_if_older(record.epoch, generation, None, rollback,
                                           record.version)
                return None if done is None else self._action(
                    record, ROLLED_BACK, f"{verdict.detail()}, {verdict.age_s:.0f} s old")
        except Fenced:
            raise  # a newer writer took over: it recovers, not us
        except PublishInProgress as exc:
            # holder None: the lease was released between the refused take and the read
            expected = (self.leave_to is not None and exc.holder is not None
                        and self.leave_to(exc.holder))
            return replace(self._action(record, IN_PROGRESS, f"held by {exc.holder}"),
                           expected=expected)
        except CoordinatorError as exc:
            return self._action(record, FAILED, f"{type(exc).__name__}: {exc}")
        return None

    def _finish(self, record: XidRecord, generation: int, publish: BranchCallback,
                rollback: BranchCallback) -> RecoveryAction | None:
        """Finish a decided xid under its lease, from a record read after taking it."""
        with self.lease_for(record.epoch) as lease:
            fresh = self.store.run(self.store.read_xid, record.epoch)
            if (fresh is None or fresh.state not in (XidState.COMMITTING, XidState.ABORTING)
                    or fresh.attempt != record.attempt):
                # its previous holder finished it, and a newer writer may have begun a new
                # attempt meanwhile: that attempt (Initialized) is not this one to finish
                return None
            if fresh.state is XidState.COMMITTING:
                self.completion.finish_commit(fresh, lease, generation, publish, rollback)
                return self._action(fresh, ROLLED_FORWARD)
            self.completion.finish_abort(fresh, lease, generation, rollback)
            return self._action(fresh, ROLLED_BACK)

    @staticmethod
    def _action(record: XidRecord, action: str, detail: str = "") -> RecoveryAction:
        return RecoveryAction(record.xid, record.state, action, record.epoch, detail)
