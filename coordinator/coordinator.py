"""The transaction coordinator of one sink: xids, branches, decisions, fencing.

Contract (what a caller may assume; every method may be called again after a crash or a
lost reply, from this process or another):

- ``fence()`` makes the caller the sink's writer and returns its generation; every
  decision and branch registration made with an older generation fails with
  :class:`Fenced`, atomically with the write it attempted.
- ``begin`` is idempotent and says what the caller may do: ``Initialized`` → write;
  ``Committed`` → the epoch is done, write nothing; ``Committing``/``Aborting`` → finish
  it first (``commit`` or ``recover``). An ``Aborted`` xid begun by a *newer* generation
  than the one that owned the aborted attempt starts a new attempt.
- ``register_branch`` and ``prepare_branch`` are idempotent for the same branch and are
  refused with :class:`XidDecided` once the xid is decided: a zombie task cannot add to
  a decided xid, because the registration checks the xid's version in the same multi-op.
- ``commit`` writes ``Committing`` with the winners in ONE compare-and-set that also
  checks the generation, before any publish. From then on the xid is never rolled back:
  publish failures leave it ``Committing`` for ``commit`` or ``recover`` to finish, and
  the publish callback must be idempotent. Of concurrent deciders exactly one wins.
- ``abort`` of an undecided xid rolls back every branch; of a decided one it refuses.

Usage::

    coord = Coordinator(kazoo_client, "orders-stream")
    generation = coord.fence()
    coord.recover(publish=publish, rollback=rollback)     # what a dead driver left
    if coord.begin(epoch, generation) is XidState.INITIALIZED:
        coord.register_branch(epoch, "p0-a0-1f2e3d4c", generation, owner={"staging": s})
        coord.prepare_branch(epoch, "p0-a0-1f2e3d4c", manifest)
        coord.commit(epoch, generation, ["p0-a0-1f2e3d4c"], publish, rollback)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from kazoo.client import KazooClient
from kazoo.retry import KazooRetry

from coordinator.callbacks import BranchCallback, CallbackPolicy
from coordinator.completion import Completion
from coordinator.epochs import EpochCounter, LastCommitted
from coordinator.fencing import Generation
from coordinator.layout import SinkLayout
from coordinator.ledger import Ledger
from coordinator.records import BranchRecord, XidRecord
from coordinator.recovery import Recovery, RecoveryReport
from coordinator.retention import Retention
from coordinator.states import XidState
from coordinator.store import SinkStore, default_retry, list_sinks
from coordinator.transitions import Transitions

StepHook = Callable[[str], None]


class Coordinator:
    """Two-phase-commit coordinator for one sink, backed by ZooKeeper (or Keeper).

    ``on_step(name)`` is called at every crash point of commit and abort
    (``commit.after_decision``, ``commit.after_branch_published``, ``commit.after_publish``,
    ``commit.after_committed``, ``abort.after_decision``, ``abort.after_rollback``); a
    fault test makes it raise to simulate a crash at exactly that step.
    """

    def __init__(self, client: KazooClient, sink_id: str, root: str = "/txsink",
                 retry: KazooRetry | None = None, on_step: StepHook | None = None,
                 callback_policy: CallbackPolicy | None = None) -> None:
        if not isinstance(sink_id, str) or not sink_id:
            raise ValueError("sink_id must be a non-empty string")
        self.client = client
        self.sink_id = sink_id
        self.layout = SinkLayout(root, sink_id)
        self.store = SinkStore(client, self.layout, retry or default_retry(client))
        self.on_step = on_step
        self._generation = Generation(self.store)
        self._epochs = EpochCounter(self.store)
        self._last = LastCommitted(self.store)
        self._completion = Completion(self.store, self._generation, self._last,
                                      callback_policy or CallbackPolicy(), self._step)
        self._steps = Transitions(self.store, self._generation)
        self._token: int | None = None  # the generation this instance fenced with

    # -- sink ------------------------------------------------------------------------

    @staticmethod
    def sinks(client: KazooClient, root: str = "/txsink") -> list[str]:
        """Every sink id with a tree under ``root``."""
        return list_sinks(client, root)

    def fence(self) -> int:
        """Bump the sink's generation: this writer now owns the sink (Kafka's
        ``initTransactions``). Returns the new generation."""
        self._token = self._generation.bump()
        return self._token

    def claim(self, owner: str) -> int:
        """Fence once per ``owner`` (a streaming run id: every task of a run calls this,
        the first one bumps the generation). The same ``owner`` gets the same generation;
        an ``owner`` a newer writer superseded gets :class:`Fenced`."""
        self._token = self._generation.claim(owner)
        return self._token

    def generation(self) -> int:
        """The sink's current generation (0 if never fenced)."""
        return self._generation.current()

    def allocate_epoch(self) -> int:
        """A new epoch for a batch job: monotonic, never handed out twice."""
        return self._epochs.allocate()

    # -- xid -------------------------------------------------------------------------

    def begin(self, epoch: int, generation: int) -> XidState:
        """Create the xid (``Unknown → Initialized``) or report its state; idempotent.

        ``Initialized`` of an older generation is adopted by this one (so recovery by
        this generation leaves it alone). ``Aborted`` becomes a new attempt when
        ``generation`` is newer than the generation that owned the aborted attempt,
        else :class:`XidAborted`. A stale ``generation`` that would write raises
        :class:`Fenced`.
        """
        return self._steps.begin(epoch, generation)

    def register_branch(self, epoch: int, branch_id: str, generation: int,
                        owner: dict[str, Any]) -> None:
        """Record a branch (``Initialized``) before it stages anything.

        Refused with :class:`Fenced` under a stale generation and :class:`XidDecided`
        once the xid is no longer ``Initialized`` (a zombie task); idempotent for the
        same branch id. ``owner`` should say how to roll the branch back (its staging).
        """
        self._steps.register(epoch, branch_id, generation, owner)

    def prepare_branch(self, epoch: int, branch_id: str, manifest: dict[str, Any]) -> None:
        """Seal a branch: ``Initialized → Prepared`` with its manifest.

        Idempotent for the same manifest; a different manifest for a prepared branch is
        :class:`InvalidTransition`; after the decision :class:`XidDecided`. A manifest
        over ~900 kB is :class:`RecordTooLarge`.
        """
        self._steps.prepare(epoch, branch_id, manifest)

    def select(self, epoch: int, generation: int, branch_ids: Iterable[str]) -> None:
        """Add prepared branches to the winners a later ``commit(winners=None)`` uses,
        without deciding (one xid spanning several writes). Idempotent, accumulates."""
        self._steps.select(epoch, generation, list(branch_ids))

    def commit(self, epoch: int, generation: int, winners: list[str] | None,
               publish: BranchCallback, rollback: BranchCallback,
               metrics: dict[str, Any] | None = None) -> XidRecord:
        """Decide ``Committing`` with ``winners`` (None: the selected branches), publish
        them, roll back every other branch, mark ``Committed``; returns the record.

        On an xid already ``Committing`` the recorded decision is finished (``winners``
        is ignored); on a ``Committed`` one nothing happens. ``Aborted`` raises
        :class:`XidAborted`; a winner that is not ``Prepared`` raises before deciding.
        A publish that keeps failing raises :class:`PublishFailed` with the xid left
        ``Committing``.
        """
        record, decided_now, known = self._steps.decide_commit(epoch, generation, winners)
        if record.state is XidState.COMMITTED:
            return record
        if decided_now:
            self._step("commit.after_decision")
        return self._completion.finish_commit(record, generation, publish, rollback,
                                              metrics, known)

    def abort(self, epoch: int, generation: int, rollback: BranchCallback) -> XidRecord:
        """``Initialized → Aborting``, roll back every branch, ``Aborted``; idempotent.

        Raises :class:`XidDecided` when the xid is ``Committing`` or ``Committed``.
        """
        record, decided_now = self._steps.decide_abort(epoch, generation)
        if record.state is XidState.ABORTED:
            return record
        if decided_now:
            self._step("abort.after_decision")
        return self._completion.finish_abort(record, generation, rollback)

    def recover(self, publish: BranchCallback, rollback: BranchCallback,
                older_than_generation: int | None = None,
                raise_on_failure: bool = True) -> RecoveryReport:
        """Finish what crashed writers left: roll every ``Committing`` xid forward, finish
        every ``Aborting`` one, roll back every ``Initialized`` xid of a generation older
        than ``older_than_generation`` (default: this writer's generation).

        Every xid is attempted; if some could not be finished, :class:`RecoveryIncomplete`
        carries the report (or, with ``raise_on_failure=False``, the report lists them).
        """
        token = self._token if self._token is not None else self.generation()
        recovery = Recovery(self.store, self._completion, self._abort_if_older)
        return recovery.run(token, publish, rollback,
                            token if older_than_generation is None else older_than_generation,
                            raise_on_failure)

    # -- reads -----------------------------------------------------------------------

    def is_committed(self, epoch: int) -> bool:
        """True if the xid is ``Committed`` (also after its record was pruned)."""
        record = self.store.run(self.store.read_xid, epoch)
        if record is not None:
            return record.state is XidState.COMMITTED
        return Retention(self.store).was_pruned_committed(epoch)

    def last_committed(self) -> int | None:
        """The highest committed epoch (None before the first commit); never decreases."""
        return self.store.run(self._last.read)[0]

    def xid(self, epoch: int) -> XidRecord | None:
        """The xid's record as stored now (None if never begun or pruned)."""
        return self.store.run(self.store.read_xid, epoch)

    def xids(self, states: Iterable[XidState] | None = None) -> list[XidRecord]:
        """Xid records in epoch order, optionally only those in ``states`` (open states
        are answered from the open index, without listing every xid)."""
        wanted = set(states) if states is not None else None
        open_only = wanted is not None and all(s.is_open for s in wanted)
        epochs = self.store.run(self.store.epochs, open_only)
        records = self.store.run(self.store.read_xids, epochs)
        return [r for r in records if wanted is None or r.state in wanted]

    def branches(self, epoch: int) -> list[BranchRecord]:
        """Every branch of the xid (all attempts), by branch id."""
        found = self.store.run(self.store.read_branches, epoch)
        return [found[b] for b in sorted(found)]

    def ledger(self, epoch: int, branch_id: str) -> Ledger:
        """The durable key/value ledger of one branch (for the publish step)."""
        return Ledger(self.store, epoch, branch_id)

    def record_metrics(self, epoch: int, metrics: dict[str, Any]) -> None:
        """Merge ``metrics`` into the xid's record (any state), for operators."""
        self._steps.record_metrics(epoch, metrics)

    def prune(self, max_age_seconds: float) -> list[int]:
        """Remove finished xids last updated more than ``max_age_seconds`` ago; returns
        their epochs. ``last_committed``, the epoch counter and ``is_committed`` answers
        survive (pruned epochs are remembered as ranges)."""
        return Retention(self.store).prune(max_age_seconds)

    # -- internals -------------------------------------------------------------------

    def _step(self, name: str) -> None:
        if self.on_step is not None:
            self.on_step(name)

    def _abort_if_older(self, epoch: int, token: int, older_than: int,
                        rollback: BranchCallback) -> XidRecord | None:
        """Recovery's abort: only while the xid still belongs to an older generation."""
        record, decided_now = self._steps.decide_abort(epoch, token, older_than)
        if record.state is XidState.INITIALIZED:
            return None
        if decided_now:
            self._step("abort.after_decision")
        if record.state is XidState.ABORTED:
            return record
        return self._completion.finish_abort(record, token, rollback)
