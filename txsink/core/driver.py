"""The driver side of an epoch: open the sink, commit, abort.

Where it runs: on the driver, never in a task: for the data source in Spark's driver-side
Python workers (the planner's for the opening, ``commit()``'s and ``abort()``'s for the
rest), for the ``mapInArrow`` ways and ``txsink.transaction()`` in the caller's process.

Contract (Spark's ``BatchWrite``/``StreamingWrite``, made exactly-once):

- :func:`open_sink`: once per batch write, before any task (the planner calls it). It
  bumps the sink's generation, fencing every older driver of the same sink (so two
  drivers never commit one sink at once), and recovers what an earlier driver left:
  ``Committing`` xids are published, undecided ones rolled back. :func:`open_xid` then
  begins the xid; it and :func:`decide` are the one start and the one commit of every
  batch writer, a job's and ``transaction()``'s alike. :func:`open_stream` is its
  streaming counterpart, run on every micro-batch (see there why it cannot fence).
- :func:`commit_epoch`: once every task succeeded, with the messages of the one attempt
  per partition Spark kept. It may be called again for the same epoch (Spark replays a
  micro-batch whose ``commits/N`` file was not written): a committed xid is a no-op.
  The decision is one compare-and-set in the store; after it the publish is retried
  until it succeeds, by this call or by a later recovery, and is never rolled back. One
  actor at a time finishes an xid (its publish lease); winners of different (server,
  table) pairs are published at once. With ``publish=pipelined`` the publish runs in
  the background while the next micro-batch's tasks run (``txsink.core.pipeline``).
- :func:`abort_epoch`: when a task failed (or the commit raised before its decision); it
  rolls back an undecided xid, and a decided one is left to recovery.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from typing import Any

import server_ext
from coordinator import (
    BranchRecord,
    Coordinator,
    Fenced,
    RecoveryIncomplete,
    UnknownXid,
    XidDecided,
    XidRecord,
    XidState,
)
from server_ext.sharding import ShardingError
from server_ext.sql import qualified_name
from server_ext.staging import check_partition_bound
from txsink.core import (
    attempt,
    carried_rows,
    combine,
    connections,
    crashpoints,
    payload,
    pipeline,
    quarantine_share,
)
from txsink.core.message_count import MessageCount, Meter, counting
from txsink.core.messages import BranchMessage, CarriedMessage, SkippedMessage, handed_xid
from txsink.core.metrics import EpochMetrics
from txsink.core.publisher import BranchPublisher, server_of
from txsink.core.retention_step import retain_after_commit
from txsink.core.settled_sinks import SETTLED, Settled, Sink
from txsink.core.tuning import DEFAULT_TUNING, Tuning
from txsink.core.write_plan import WritePlan
from txsink.options import INLINE, PIPELINED, SinkOptions

log = logging.getLogger(__name__)

# A writer starting after a crash waits the session timeout and this long for the dead
# driver's publish lease to expire with its session (a KeeperMap session ends 2 s after
# its expiry), then finishes its xid; a live holder keeps it.
HOLDER_WAIT_MARGIN = 5.0


def publisher_for(options: SinkOptions, coord: Coordinator,
                  tables: tuple[server_ext.TargetTable, ...] = (),
                  tuning: Tuning = DEFAULT_TUNING) -> BranchPublisher:
    return BranchPublisher(lambda url: connections.clickhouse(options, url), coord,
                           limits=tuning.limits, tables=tables,
                           release_workers=tuning.release_workers)


def open_sink(options: SinkOptions, sink_id: str) -> tuple[Coordinator, int]:
    """Fence older writers of ``sink_id`` and recover their unfinished xids (batch).

    The sink's tree is checked at every job's start, not only once per process: a
    record lost since the last job is refused before anything is staged. The recovery
    is skipped where nobody fenced the sink since this process's last batch commit of
    it (``settled_sinks``)."""
    coord = connections.coordinator(options, sink_id)
    coord.check_tree()
    known = SETTLED.forget(sink_key(options, sink_id))
    generation = coord.fence()
    # nobody fenced since this process's last batch commit of the sink: nothing to recover
    settled = known is not None and known.batch and known.generation == generation - 1
    if options.transaction.recover_on_start and not settled:
        _recover(options, coord, older_than_generation=None)
    return coord, generation


def open_stream(options: SinkOptions, sink_id: str) -> tuple[int | None, int] | None:
    """Finish every xid of the sink that an earlier driver decided but did not publish;
    then the sink's ``last_committed`` (epoch, node version), which the micro-batch's
    tasks check instead of reading it when they create its xid (None where skipped).

    Spark calls ``streamWriter()`` twice per micro-batch (task side and commit side),
    so nothing here may fence or roll back: the query's tasks fence once per run
    (:meth:`Coordinator.claim` with the run id), and an undecided xid is adopted by the
    replay of its micro-batch, whose commit rolls back the dead run's branches.

    Nor can it check that the sink's epochs belong to this query's checkpoint: this
    process sees only the options (no query id, no batch id). The tasks do, before
    anything is claimed or staged (:meth:`Coordinator.own_stream` in ``txsink/core/attempt.py``).
    A decided xid whose lease this driver's own pipelined publish holds is left to it
    at once (the next decision waits for it, ``txsink.core.pipeline``); any other holder
    is waited for, so that a restarted driver rolls forward what the dead one decided.

    Skipped where this process knows the sink (``settled_sinks``): the micro-batch's
    begin or commit then checks that it still does, under its generation.
    """
    if not options.transaction.recover_on_start or SETTLED.known(sink_key(options,
                                                                          sink_id)):
        return None
    coord = connections.coordinator(options, sink_id)
    _roll_forward(options, coord)
    return coord.last_committed()


def sink_key(options: SinkOptions, sink_id: str) -> Sink:
    """The sink as ``settled_sinks`` knows it."""
    return options.store.root_identity, sink_id


def batch_committed(options: SinkOptions, sink_id: str, generation: int) -> None:
    """A batch writer's xid ``Committed`` under ``generation``: its next start in this
    process need not recover, if nobody fenced the sink since (:func:`open_sink`)."""
    SETTLED.settled(sink_key(options, sink_id), generation, batch=True)


def _roll_forward(options: SinkOptions, coord: Coordinator) -> None:
    _recover(options, coord, older_than_generation=0, leave_to=pipeline.is_own)


def _rolled_forward_for(plan: WritePlan, coord: Coordinator, known: Settled | None,
                        generation: int) -> None:
    """Before a micro-batch under ``generation`` begins or decides: decided xids rolled
    forward unless this process settled the sink under that generation."""
    if ((known is None or known.generation != generation)
            and plan.options.transaction.recover_on_start):
        _roll_forward(plan.options, coord)


def wait_published(options: SinkOptions, sink_id: str, timeout: float = 60.0) -> None:
    """Return once every decided xid of the sink is ``Committed``: this process's
    background publishes are waited for, another live publisher (a pipelined commit's
    worker) for up to ``timeout`` seconds, and a decided xid nobody holds is published
    here. What a stream's last epoch needs after ``query.stop()`` or
    ``processAllAvailable()`` with ``publish=pipelined``; raises :class:`SinkBlocked`
    if one cannot be finished."""
    pipeline.wait_all(timeout)
    coord = connections.coordinator(options, sink_id)
    try:
        with publisher_for(options, coord) as publisher:
            report = coord.recover(publish=publisher.publish, rollback=publisher.rollback,
                                   older_than_generation=0, wait_for_holders=timeout)
    except RecoveryIncomplete as exc:
        raise SinkBlocked.of(exc) from exc
    still = [a for a in report.actions if a.action == "in_progress"]
    if still:
        raise TimeoutError(f"txsink sink={sink_id}: still being published after {timeout} s:"
                           f" {'; '.join(map(str, still))}")


def _recover(options: SinkOptions, coord: Coordinator, older_than_generation: int | None,
             leave_to: Callable[[str], bool] | None = None) -> None:
    try:
        with publisher_for(options, coord) as publisher:
            report = coord.recover(publish=publisher.publish, rollback=publisher.rollback,
                                   older_than_generation=older_than_generation,
                                   wait_for_holders=options.store.session_timeout
                                   + HOLDER_WAIT_MARGIN, leave_to=leave_to)
    except RecoveryIncomplete as exc:
        raise SinkBlocked.of(exc) from exc
    if report.actions:  # a pipelined writer's own publish in progress is not news
        expected = all(a.expected for a in report.actions)
        log.log(logging.DEBUG if expected else logging.WARNING,
                "txsink sink=%s recovered: %s", coord.sink_id, report)


class SinkBlocked(RecoveryIncomplete):
    """A writer cannot start: an xid of its sink is decided and its recovery cannot finish
    it. The message says what to run instead of a bare ``RecoveryIncomplete``.

    A decided xid is never rolled back, so a writer cannot skip it; only an operator can
    finish it (see ``docs/operations.md``, "Stuck Committing xids").
    """

    def __init__(self, message: str, report: object = None) -> None:
        Exception.__init__(self, message)  # the message is built, not the report's text
        self.report = report

    @classmethod
    def of(cls, exc: RecoveryIncomplete) -> SinkBlocked:
        report = exc.report
        sink_id = getattr(report, "sink_id", "?")
        epochs = sorted({a.epoch for a in getattr(report, "failed", [])})
        where = f" --epoch {epochs[0]}" if epochs else ""
        return cls(f"{exc}. The sink cannot start while a decided xid of it is unfinished; a "
                   f"decided xid is never aborted. Run `txsink recover --sink {sink_id}{where}` "
                   "(with this sink's --zk-root and its store: --zookeeper, or --coordinator "
                   "keepermap with --records-url and --records-table): it retries the publish and "
                   "prints what can be done (docs/operations.md, \"Stuck Committing xids\")",
                   report)


@dataclass(frozen=True)
class OpenedXid:
    """A batch writer's start: the sink fenced and recovered, its xid begun (``epoch``),
    or ``covered_by_txn``: the sink's ``txn_version`` covers this writer's, and it writes
    nothing (``epoch`` None)."""

    coord: Coordinator
    generation: int
    epoch: int | None
    covered_by_txn: int | None = None
    record: XidRecord | None = None  # the xid as begun


def open_xid(options: SinkOptions, sink_id: str, hold: str) -> OpenedXid:
    """The one start of every batch writer (a batch job's planner, ``transaction()``):
    fence and recover the sink, check its ``txn_version``, allocate the epoch and begin
    the xid, watched by this process's session under ``hold`` (a writer killed before
    its decision leaves an xid that ``txsink recover``/``gc`` roll back,
    ``coordinator/protocol/liveness.py``)."""
    coord, generation = open_sink(options, sink_id)
    covered = covered_txn_version(options, coord)
    if covered is not None:
        return OpenedXid(coord, generation, None, covered)
    epoch = coord.allocate_epoch()
    with taken_over_said(coord, generation):  # another writer started right after us
        coord.begin(epoch, generation, hold=hold, new=True)
    return OpenedXid(coord, generation, epoch, record=coord.begun(epoch))


@contextmanager
def taken_over_said(coord: Coordinator, generation: int) -> Iterator[None]:
    """Say "taken over by a newer writer" (``Coordinator.taken_over``) for a step a newer
    writer of the sink refused, instead of the bare ``Fenced``/``XidDecided``."""
    try:
        yield
    except (Fenced, XidDecided) as exc:
        taken = coord.taken_over(generation, exc)
        if taken is None:
            raise
        raise taken from exc


def decide(coord: Coordinator, epoch: int, generation: int, winners: list[str] | None,
           publisher: BranchPublisher, txn_version: int | None,
           prepared: Sequence[BranchRecord] = (),
           metrics: CommittedMetrics | None = None) -> XidRecord:
    """Decide the xid with ``winners`` (None: those selected by ``transaction()``'s
    writes) and publish; the record of the ``Committed`` xid. The one commit of every
    writer; ``publisher`` drains when the caller's ``with`` block ends. ``prepared``:
    winner records read since the xid began (not read again); ``metrics``: written with
    the ``Committed`` record."""
    with taken_over_said(coord, generation):
        return coord.commit(epoch, generation, winners, publish=publisher.publish,
                            rollback=publisher.rollback, txn_version=txn_version,
                            publish_groups=publisher.groups,
                            publish_group=publisher.publish_group, prepared=prepared,
                            metrics_of=metrics)


def covered_txn_version(options: SinkOptions, coord: Coordinator) -> int | None:
    """The sink's ``txn_version`` if it covers this job's (the job must write nothing),
    else None. Call after ``open_sink``: fenced and recovered, so a job that died after
    its decision is committed by now, and no older writer can decide meanwhile."""
    if options.transaction.txn_version is None:
        return None
    recorded = coord.txn_version()
    version = options.transaction.txn_version
    return recorded if recorded is not None and recorded >= version else None


def log_covered(sink_id: str, txn_version: int | None, covered_by: int | None) -> None:
    """The one line a job covered by the sink's ``txn_version`` leaves."""
    log.warning("txsink sink=%s txn_version=%s already committed (the sink's txn_version is "
                "%s): nothing written", sink_id, txn_version, covered_by)


def generation_of(plan: WritePlan, coord: Coordinator, messages: Sequence[object],
                  claimed_here: int | None = None) -> int:
    """The generation an epoch's decision is made under.

    Batch: the one the driver fenced with. Streaming: the one the run's tasks claimed,
    or the driver for those that carried their rows (``claimed_here``); a newer run has
    fenced it if it differs from the sink's current generation.
    """
    if plan.generation is not None:
        return plan.generation
    claimed = [m.generation for m in messages if isinstance(m, BranchMessage | SkippedMessage)]
    claimed += [claimed_here] if claimed_here is not None else []
    return max(claimed) if claimed else coord.generation()


def carried_run(plan: WritePlan, carried: Sequence[CarriedMessage]) -> attempt.Run | None:
    """The streaming run whose tasks carried their rows, or None (batch, or no carried
    message)."""
    if plan.generation is not None or not carried:
        return None
    return attempt.stream_run(plan, plan.stream_query or carried[0].query_id,
                              carried[0].run_id)


def join_run(coord: Coordinator, epoch: int, run: attempt.Run | None) -> int | None:
    """Streaming, on the driver: what a task does before it begins the xid (the tasks
    that carried their rows said nothing to the coordinator; a ``foreachBatch`` driver
    begins it for its tasks): the check that the sink's epochs are this query's, and the
    run's claim, once per run and process as a task's (``attempt.JoinedRuns``: the
    creating multi-op checks the generation). Its generation, or None (no run)."""
    if run is None:
        return None
    return attempt.JOINED.enter(run, coord, epoch)[0]


@contextmanager
def refused_in_run(plan: WritePlan, epoch: int, run: attempt.Run | None) -> Iterator[None]:
    """A step that failed after the run was joined earlier in this process: the run is
    forgotten (the next step checks and claims again), and the stream checked to say
    why, if that is why."""
    try:
        yield
    except Exception:
        if run is not None and attempt.JOINED.generation(run) is not None:
            attempt.JOINED.forget(run)
            connections.coordinator(plan.options, plan.sink_id).own_stream(run[2], epoch)
        raise


def begin_micro_batch(plan: WritePlan, epoch: int, run_id: str) -> WritePlan:
    """``foreachBatch``: the micro-batch's xid begun on the driver before its job, in the
    query's run (:func:`join_run`), and handed to its tasks and its commit in the plan
    (``WritePlan.begun``), who then read neither it nor ``last_committed``: one creating
    multi-op instead of every task's reads and their race to create it. A replayed
    micro-batch finds its xid as the tasks would (``Committed``: they write nothing)."""
    run = attempt.stream_run(plan, plan.stream_query or "", run_id)
    coord = connections.coordinator(plan.options, plan.sink_id)
    sink = sink_key(plan.options, plan.sink_id)
    known = SETTLED.forget(sink)
    with counting() as meter, refused_in_run(plan, epoch, run):
        generation = join_run(coord, epoch, run)
        assert generation is not None
        _rolled_forward_for(plan, coord, known, generation)
        SETTLED.settled(sink, generation)
        with taken_over_said(coord, generation):
            coord.begin(epoch, generation, new=True)
    crashpoints.hit(crashpoints.DRIVER_AFTER_BEGIN)
    return replace(plan, begun=coord.begun(epoch), planned=plan.planned + meter.read())


def stage_carried(plan: WritePlan, coord: Coordinator, epoch: int, generation: int,
                  carried: Sequence[CarriedMessage]) -> BranchMessage | None:
    """The epoch's carried rows staged and prepared as the driver's own attempt (None: no
    row was carried), before the decision; its message counts from the tasks' start."""
    if not any(m.rows for m in carried):
        return None
    staged = attempt.stage_attempt(plan, coord, epoch, generation,
                                   carried_rows.carried_batches(carried), contributes=False)
    return replace(staged, started_at=min(m.started_at for m in carried))





def epoch_metrics(messages: Sequence[BranchMessage], commit_started: float,
                  committed_at: float | None = None,
                  decided_at: float | None = None) -> EpochMetrics:
    """The epoch's figures, from its tasks' messages (``EpochMetrics`` says what each
    timing spans); ``committed_at``: the xid's ``Committed`` write, ``decided_at`` its
    decision."""
    return EpochMetrics.timed(
        commit_started, committed_at or time.time(), decided_at=decided_at,
        began=min((m.started_at for m in messages), default=commit_started),
        rows=sum(m.rows for m in messages), bytes=sum(m.bytes for m in messages),
        branches=sum(len(m.branch_ids) for m in messages),
        partitions=sum(m.partitions for m in messages),
        stage_ms=round(max((m.stage_ms for m in messages), default=0.0), 1),
        seal_ms=round(max((m.seal_ms for m in messages), default=0.0), 1))


def check_partitions(plan: WritePlan, records: Sequence[BranchRecord]) -> None:
    """Refuse the write, before its decision, if the union of its task branches' partitions
    of the target (the views' shares aside) crosses ``max_partitions_per_job``: each task
    counted only its own rows (``server_ext.staging.partition_bound``)."""
    staged = [p for p in (payload.from_record(r.manifest) for r in records)
              if isinstance(p, payload.StagedBranch) and not p.view
              and not _quarantined(plan, p)]
    if not staged:
        return
    first = staged[0].manifest
    check_partition_bound(
        qualified_name(first.target_database, first.target_table),
        plan.options.publish.max_partitions_per_job,
        ((p.partition_id, p.value) for s in staged for p in s.manifest.partitions),
        option="max_partitions_per_job")


def check_sharded_overwrite(plan: WritePlan, records: Sequence[BranchRecord]) -> None:
    """Refuse, before the decision, an overwrite of a sharded target that would keep old
    rows: each shard replaces the partitions its own rows fall in, so a partition of the
    data that no row of some shard falls in would keep that shard's old rows of it."""
    layout = plan.layout
    if not plan.overwrite or layout is None or len(layout.shards) < 2:
        return
    shard_of = {url.rstrip("/"): shard.index for shard in layout.shards
                for url in shard.replicas}
    shards_of: dict[str, set[int]] = {}
    for record in records:
        staged = payload.from_record(record.manifest)
        shard = shard_of.get((server_of(record) or "").rstrip("/"))
        if (not isinstance(staged, payload.StagedBranch) or staged.view or shard is None
                or _quarantined(plan, staged)):
            continue
        for partition in staged.manifest.partitions:
            shards_of.setdefault(partition.partition_id, set()).add(shard)
    everyone = {shard.index for shard in layout.shards}
    short = {pid: everyone - found for pid, found in sorted(shards_of.items())
             if found != everyone}
    if short:
        examples = "; ".join(
            f"partition {pid!r}: no row for shard(s) "
            + ", ".join(str(i + 1) for i in sorted(missing))
            for pid, missing in list(short.items())[:5])
        raise ShardingError(
            f"mode overwrite of {layout.local_table} on {len(layout.shards)} shards would "
            f"keep old rows: a shard replaces only the partitions its own new rows fall in "
            f"({examples}{'; ...' if len(short) > 5 else ''}). Nothing was written; "
            "overwrite these partitions with rows for every shard, or delete them first "
            "(ALTER TABLE ... DROP PARTITION on every shard) and append")


def _quarantined(plan: WritePlan, staged: payload.StagedBranch) -> bool:
    """Whether ``staged`` is a quarantine share (``txsink.core.quarantine_share``)."""
    table = plan.quarantine
    return table is not None and (staged.manifest.target_database,
                                  staged.manifest.target_table) == (table.database, table.name)


def commit_epoch(plan: WritePlan, epoch: int, messages: Sequence[object],
                 publish: str | None = None) -> None:
    """Decide and publish xid (sink, epoch) with the branches Spark authorised.

    ``publish`` (default: the option of that name) is for streaming only: ``pipelined``
    returns once the decision is durable and leaves the publish to this process's
    background :class:`~txsink.core.pipeline.Pipeline`, after waiting for the previous
    epoch to be ``Committed``; a batch job, a transaction's write and ``inline`` return
    after the ``Committed`` write. The messages it sends are counted into the epoch's
    metrics (``message_count``)."""
    run = carried_run(plan, [m for m in messages if isinstance(m, CarriedMessage)])
    sink = sink_key(plan.options, plan.sink_id)
    known = SETTLED.forget(sink)
    with counting() as meter, refused_in_run(plan, epoch, run):
        generation = _commit_epoch(plan, epoch, messages, publish, meter, run, known)
    if not plan.options.transaction.in_transaction():
        SETTLED.settled(sink, generation, batch=plan.generation is not None)


def _commit_epoch(plan: WritePlan, epoch: int, messages: Sequence[object], publish: str | None,
                  meter: Meter, run: attempt.Run | None, known: Settled | None) -> int:
    """:func:`commit_epoch`'s work; returns the generation it was decided under.
    ``known``: the sink as this process knew it (a stream's: :func:`_rolled_forward_for`)."""
    pipelined = ((publish or plan.options.publish.mode) == PIPELINED and plan.generation is None
                 and not plan.options.transaction.in_transaction())
    coord = connections.coordinator(plan.options, plan.sink_id,
                                    role=pipeline.role() if pipelined else "driver")
    branch_messages = [m for m in messages if isinstance(m, BranchMessage)]
    carried = [m for m in messages if isinstance(m, CarriedMessage)]
    started = time.time()
    generation = generation_of(plan, coord, messages, join_run(coord, epoch, run))
    if plan.generation is None and not plan.options.transaction.in_transaction():
        _rolled_forward_for(plan, coord, known, generation)
    with taken_over_said(coord, generation):
        # a micro-batch with no task still gets its xid; one whose tasks staged nothing
        # (they carried their rows, or had none) expects to create it
        state = coord.begin(epoch, generation,
                            known=plan.begun or handed_xid(branch_messages, plan.sink_id),
                            new=plan.begun is None
                            and not any(isinstance(m, BranchMessage | SkippedMessage)
                                        for m in messages))
    if state is XidState.COMMITTED:  # a replay (also of an epoch whose record was pruned)
        log.info("txsink sink=%s epoch=%d already committed; nothing to do", plan.sink_id, epoch)
        finish_clean_up(plan, coord, epoch)
        return generation
    if pipelined:  # N+1's decision waits until N is Committed
        pipeline.settle(plan.options, coord, epoch,
                        lambda previous: _finish_decided(plan, coord, previous, generation))
    with (ExitStack() as held,
          publisher_for(plan.options, coord, plan.tables, plan.tuning) as publisher):
        records: list[BranchRecord] = []  # the winners, read once: the decision trusts them
        with taken_over_said(coord, generation):
            if state is XidState.INITIALIZED:  # a decided xid's carried rows are not staged
                staged = stage_carried(plan, coord, epoch, generation, carried)
                branch_messages += [staged] if staged is not None else []
            winners = [b for m in branch_messages for b in m.branch_ids]
            if winners:
                quarantine_share.check_bound(plan.options, branch_messages)  # nothing visible yet
                records = coord.winner_records(
                    epoch, winners, [r for m in branch_messages
                                     for r in m.handed_records(plan.sink_id)])
                check_partitions(plan, records)  # before the decision: nothing is visible
                check_sharded_overwrite(plan, records)
                winners = combine.combined_branches(plan, coord, epoch, generation, records,
                                                    publisher)
            if plan.options.transaction.in_transaction():
                coord.select(epoch, generation, winners)
                return generation
            if pipelined:
                held.enter_context(coord.publish_lease(epoch, generation, coord.lease_wait))
                decided = coord.decide(epoch, generation, winners,
                                       plan.options.transaction.txn_version, prepared=records)
        metrics = CommittedMetrics(plan, branch_messages, started,
                                   PIPELINED if pipelined else INLINE, meter)
        if pipelined and decided.state is XidState.COMMITTING:
            lease = held.pop_all()  # from here on the background publish releases it
            pipeline.pipeline_for(plan.options, plan.sink_id).start(
                epoch, lambda: _publish_in_background(plan, coord, epoch, generation, lease,
                                                      metrics))
            return generation
        final = decide(coord, epoch, generation, winners, publisher,
                       plan.options.transaction.txn_version, records, metrics)
    metrics.logged(coord, final)
    # after Committed: off the decision's path
    retain_after_commit(plan.options, coord, plan.tuning)
    return generation


def _publish_in_background(plan: WritePlan, coord: Coordinator, epoch: int, generation: int,
                           lease: ExitStack, metrics: CommittedMetrics) -> None:
    """A pipelined epoch's publish, under the lease its commit took (the ``Committed``
    write, which carries the epoch's metrics, releases it; this process's
    ``wait_published`` waits for this thread)."""
    with lease:
        final = _finish_decided(plan, coord, epoch, generation, metrics)
    metrics.logged(coord, final)
    retain_after_commit(plan.options, coord, plan.tuning)


def _finish_decided(plan: WritePlan, coord: Coordinator, epoch: int, generation: int,
                    metrics: CommittedMetrics | None = None) -> XidRecord:
    """Publish a ``Committing`` xid's recorded decision and mark it ``Committed`` (a
    ``Committed`` one is returned as it is)."""
    with publisher_for(plan.options, coord, plan.tables, plan.tuning) as publisher:
        return coord.commit(epoch, generation, None, publish=publisher.publish,
                            rollback=publisher.rollback, publish_groups=publisher.groups,
                            publish_group=publisher.publish_group, metrics_of=metrics)


class CommittedMetrics:
    """A writer's metrics of its epoch, computed from the xid's ``Committed`` record and
    written with it (:meth:`Coordinator.commit`'s ``metrics_of``): whoever reads a
    ``Committed`` record reads its writer's figures. ``cleanup_ms`` is not among them
    (the clean-up follows that write); the log line has it."""

    def __init__(self, plan: WritePlan, messages: Sequence[BranchMessage], started: float,
                 publish: str, meter: Meter) -> None:
        self.plan, self.messages, self.started, self.publish = plan, messages, started, publish
        self.meter = meter  # the commit's count so far
        self.written: dict[str, Any] | None = None

    def __call__(self, final: XidRecord) -> dict[str, Any]:
        sent = sum((MessageCount(m.store_requests, m.statements) for m in self.messages),
                   # and the Committed write itself
                   self.plan.planned + self.meter.read() + MessageCount(store_requests=1))
        metrics = replace(epoch_metrics(self.messages, self.started, final.updated,
                                        final.decided_at), publish=self.publish, cleanup_ms=None,
                          store_requests=sent.store_requests, statements=sent.statements)
        if self.plan.quarantine is not None:  # what status shows per epoch
            metrics = replace(metrics, quarantined=sum(m.bad_rows for m in self.messages))
        self.written = metrics.to_dict()
        return self.written

    def logged(self, coord: Coordinator, final: XidRecord) -> None:
        """The log line of a ``Committed`` xid; its metrics recorded now if another actor
        wrote that record (this writer's commit found it ``Committed``)."""
        written = self.written
        if written is None or any(final.metrics.get(k) != v for k, v in written.items()):
            written = self(final)
            coord.record_metrics(final.epoch, written, known=final)
        metrics = EpochMetrics.from_dict(written)
        log.info(
            "txsink sink=%s epoch=%d committed rows=%d branches=%d partitions=%d "
            "stage_ms=%.0f seal_ms=%.0f commit_ms=%.0f visibility_lag_ms=%.0f cleanup_ms=%.0f "
            "latency_ms=%.0f publish=%s",
            self.plan.sink_id, final.epoch, metrics.rows, metrics.branches, metrics.partitions,
            metrics.stage_ms, metrics.seal_ms, metrics.commit_ms, metrics.visibility_lag_ms or 0,
            (time.time() - final.updated) * 1000, metrics.latency_ms, self.publish)


def finish_clean_up(plan: WritePlan, coord: Coordinator, epoch: int) -> None:
    """Drop every staging table a ``Committed`` xid may have left.

    Spark replays a micro-batch whose commit it did not record: the committing driver
    died after the ``Committed`` write, before its clean-up dropped the non-winners'
    staging (and before the background drops of the winners'). Once the xid is
    ``Committed`` no branch's staging is needed any more, and a drop of a table that is
    gone costs one ``DROP TABLE IF EXISTS``.
    """
    with publisher_for(plan.options, coord, tuning=plan.tuning) as publisher:
        for record in coord.branches(epoch):
            publisher.drop_staging(record)


def abort_epoch(plan: WritePlan, epoch: int, messages: Sequence[object]) -> None:
    """Roll back an undecided xid; a decided one is finished by recovery, never undone."""
    if plan.options.transaction.in_transaction():
        return  # the transaction block aborts the whole xid
    SETTLED.forget(sink_key(plan.options, plan.sink_id))
    coord = connections.coordinator(plan.options, plan.sink_id)
    publisher = publisher_for(plan.options, coord, tuning=plan.tuning)
    try:
        coord.abort(epoch, generation_of(plan, coord, messages), rollback=publisher.rollback)
        log.warning("txsink sink=%s epoch=%d aborted", plan.sink_id, epoch)
    except UnknownXid:
        return  # refused before its xid began: nothing to roll back
    except (XidDecided, Fenced) as exc:
        log.warning("txsink sink=%s epoch=%d not aborted: %s", plan.sink_id, epoch, exc)
