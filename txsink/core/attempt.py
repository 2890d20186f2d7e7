"""The task side of an epoch: one task attempt writes one branch per shard it has rows for.

Where it runs: :func:`write_branch` in a Spark task attempt on an executor, once per
attempt, on the attempt's thread (its digests and contributions on small pools). Every
task of the epoch runs it at once, on any executors; a retried or speculative attempt of
the same task runs it again with new branch ids, and only the branches of the messages
the driver's commit receives (one attempt's per partition) are published, the others
rolled back as non-winners. It begins the xid (idempotent: every task does, or finds it
decided), routes the rows to the attempt's branches, opened per shard that gets rows,
and seals and prepares them. The branch kinds are in
``txsink.core.shard_branch`` and ``txsink.core.quarantine_share``, their common
interface in ``txsink.core.staged_table``.

Contract (what Spark's ``DataWriter`` asks, made exactly-once):

- A branch is registered in the store *before* its staging table exists, so every
  staging table a coordinator may have to drop is known to it. A registration after the
  xid is decided (a zombie or speculative loser) is refused; a staging table such a
  task creates anyway is left to the sweeper. An attempt that registered in time but
  learns at prepare that its xid was decided, or that a newer writer took the sink over,
  drops its own staging (``_Attempt.drop_staging``): the rollback of the decision (or of
  the newer writer's recovery) may have run before the table existed.
- Rows go only into the branch's own staging table: nothing is visible until the driver
  publishes. A failed or killed attempt leaves staging that the driver's commit (as a
  non-winner) or recovery drops.
- The manifest is recorded (branch ``Prepared``) before the commit message is returned,
  so a driver that crashes after the decision can publish from the store alone. It
  carries each partition's content digest (``server_ext.types.digest``), which ``txsink
  verify`` compares with the target's.
- In streaming, a task of a replayed micro-batch whose xid is already ``Committed``
  writes nothing and returns :class:`SkippedMessage`. Before that, every task checks
  that the sink's epochs are this query's micro-batches (``Coordinator.own_stream``): a
  deleted or replaced checkpoint, or a sink whose state was lost, is refused with
  ``StreamStateMismatch`` before anything is claimed or staged.
- On a sharded target each branch stages on one replica of its shard (``pick_replica``)
  and records that server; its publish and rollback go to the same server.
- A sealed branch of small parts in few partitions, of a task beyond the first
  ``direct_max_winners`` Spark partitions, is also *contributed* to its xid's
  pre-combined table on its server (``server_ext.publish.combined``) before it is
  prepared, so that the commit need not combine the winners' rows itself. That table is
  registered as a branch of its own (never prepared, so rolled back with the
  non-winners) before it exists. A contribution that fails in any way is only logged:
  the commit then reads the sources.
- The message carries the branches' records as prepare wrote them, for the commit to
  decide with instead of reading them.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import copy_context
from dataclasses import replace

import numpy as np
import pyarrow as pa

import server_ext
from coordinator import BranchRecord, Coordinator, Fenced, XidAborted, XidDecided, XidState
from server_ext.errors import ClickHouseError, PartitionLimitExceeded
from server_ext.sharding import ShardRouter
from server_ext.staging import (
    PartitionCounter,
)
from server_ext.types import ContentDigest
from txsink.core import carried_rows, combine, connections, crashpoints, payload
from txsink.core.message_count import counting
from txsink.core.messages import (
    BranchMessage,
    CarriedMessage,
    SkippedMessage,
    handed_begun,
    handed_over,
)
from txsink.core.payload import BranchOwner
from txsink.core.shard_branch import ShardBranch, new_branch_id, pick_replica
from txsink.core.staged_table import StagedTable
from txsink.core.write_plan import WritePlan, send_columns

log = logging.getLogger(__name__)
#: Spark's local property holding the running streaming query's id (kept in its checkpoint).
QUERY_ID_PROPERTY = "sql.streaming.queryId"
#: the streaming run's id: Spark's job group of the query, on its driver thread and tasks
RUN_ID_PROPERTY = "spark.jobGroup.id"


class XidNotWritable(RuntimeError):
    """The xid is being committed by another driver; this attempt must not add to it."""


def _task_identity() -> tuple[int, int, dict[str, object]]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return 0, 0, {"host": socket.gethostname(), "pid": os.getpid()}
    owner = {
        "host": socket.gethostname(), "pid": os.getpid(), "stage": ctx.stageId(),
        "partition": ctx.partitionId(), "attempt": ctx.attemptNumber(),
        "task_attempt_id": ctx.taskAttemptId(),
        "run_id": ctx.getLocalProperty(RUN_ID_PROPERTY),
    }
    return ctx.partitionId(), ctx.attemptNumber(), owner


def streaming_epoch() -> int:
    """The micro-batch id of the running streaming task (stable across restarts)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    batch_id = ctx.getLocalProperty("streaming.sql.batchId") if ctx else None
    if batch_id is None:
        raise RuntimeError("streaming.sql.batchId is not set: not a streaming task")
    return int(batch_id)


def task_query_id() -> str:
    """In a streaming task, the running query's id: kept in its checkpoint, so the same
    on every restart of that checkpoint and new for a new one (the run id changes every
    restart)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    query_id = ctx.getLocalProperty(QUERY_ID_PROPERTY) if ctx else None
    if not query_id:
        raise RuntimeError(f"{QUERY_ID_PROPERTY} is not set: not a streaming task")
    return query_id


# A sealed staging table of an attempt: (its branch, the part it stages for: the branch
# itself or one of its shares, its manifest, its rows)
SealedTable = tuple[ShardBranch, StagedTable, server_ext.Manifest, int]


class _Attempt:
    """This task attempt's branches, opened lazily per shard that gets rows."""

    def __init__(self, plan: WritePlan, coord: Coordinator, epoch: int, generation: int,
                 contributes: bool = True) -> None:
        self.plan = plan
        self.epoch = epoch
        self.generation = generation
        self.coord = coord
        self.contributes = contributes
        self.partition, self.attempt, self.owner = _task_identity()
        self.branches: dict[int, ShardBranch] = {}
        self.router: ShardRouter | None = None
        self.counter: PartitionCounter | None = None
        self.rows_in = 0  # rows handed to write: the next batch's first row in the task
        self.prepared: list[BranchRecord] = []  # as prepare wrote them, for the message

    def write(self, batch: pa.RecordBatch) -> None:
        if self.router is None:
            types = {c.name: c.type for c in self.plan.table.columns} if self.plan.table else None
            self.router = ShardRouter(self.plan.shard_layout, batch.schema, types,
                                      connections.clickhouse(self.plan.options))
            if self.plan.table is not None:
                self.counter = self.count_partitions(self.plan.table)
        if self.counter is not None:
            self.counter.admit(batch)  # a batch that crosses the bound is never sent
        first_row, self.rows_in = self.rows_in, self.rows_in + batch.num_rows
        if self.plan.quarantine is not None:
            batch = self.keep_keyless(batch, first_row)
        for shard, rows in self.router.split(batch).items():
            branch = self.branches.get(shard) or self.open(shard)
            branch.write(rows)

    def keep_keyless(self, batch: pa.RecordBatch, first_row: int) -> pa.RecordBatch:
        """``bad_rows=quarantine``: the rows no shard can take (a null in the sharding
        key) kept by the first shard's branch, as bad rows; the others returned."""
        assert self.router is not None
        bad = self.router.keyless(batch)
        if bad is None:
            return batch
        branch = self.branches.get(0) or self.open(0)
        assert branch.quarantine is not None
        branch.quarantine.keep(batch, bad, first_row)
        keep = np.ones(batch.num_rows, bool)
        keep[bad.rows] = False
        return batch.filter(pa.array(keep))

    def count_partitions(self, table: server_ext.TargetTable) -> PartitionCounter:
        """The counter of this attempt's partitions against the write's bound."""
        return PartitionCounter(table, send_columns(table, self.plan.columns),
                                self.plan.options.publish.max_partitions_per_job,
                                option="max_partitions_per_job")

    def refused(self, exc: ClickHouseError) -> PartitionLimitExceeded | None:
        """The bound's error for a server's refusal of a block that crossed it."""
        if self.counter is None:
            return None
        return self.counter.refused(exc, tuple(n.table.qualified for n in self.plan.views))

    def open(self, index: int) -> ShardBranch:
        """Register the branch in ZooKeeper before its staging table exists."""
        shard = self.plan.shard_layout.shards[index]
        server = pick_replica(shard, self.partition, self.attempt,
                              self.plan.options.distributed.replica_choice, self.plan.overwrite)
        branch = ShardBranch(self.plan, self.epoch,
                              new_branch_id(self.partition, self.attempt, index), server)
        owner = BranchOwner(branch.staging, server, shard=index, task=self.owner)
        self.coord.register_branch(self.epoch, branch.branch_id, self.generation,
                                   owner=owner.to_record())
        for share in branch.views:
            self.coord.register_branch(self.epoch, share.branch_id, self.generation,
                                       owner=replace(owner, staging=share.staging,
                                                     view=share.view).to_record())
        if branch.quarantine is not None:  # at its first bad row, before its staging
            branch.quarantine.register = lambda share: self.coord.register_branch(
                self.epoch, share.branch_id, self.generation,
                owner=replace(owner, staging=share.staging).to_record())
        crashpoints.hit(crashpoints.BRANCH_AFTER_REGISTER)
        self.branches[index] = branch
        return branch

    def prepare(self) -> tuple[int, int, int]:
        """Seal every branch and record it ``Prepared``: (rows, bytes, partitions)."""
        for branch in self.branches.values():
            branch.flush()
        crashpoints.hit(crashpoints.BRANCH_AFTER_STAGING_WRITE)
        # the digests scan the staged rows while they are sealed and contributed: all read.
        # A Replicated table's seal may merge its parts (and a merging variant's rows):
        # digested once sealed
        with ThreadPoolExecutor(self.plan.tuning.digest_workers,
                                thread_name_prefix="txsink-digest") as pool:
            def digest(branch: ShardBranch, part: StagedTable
                       ) -> Future[dict[str, ContentDigest] | None]:
                return pool.submit(copy_context().run, server_ext.staged_digests,
                                   branch.client, part.table, part.staging)

            digesting = {part.staging: digest(branch, part) for branch in self.branches.values()
                         for part in branch.staged() if not part.table.replicated}
            staged_parts = {i: branch.read_staged() for i, branch in self.branches.items()}
            sealed = [(branch, *branch.seal(staged_parts[i]))
                      for i, branch in self.branches.items()]
            if sealed:  # any partition key: what the server made of the rows, every shard
                counter = self.counter or self.count_partitions(sealed[0][0].table)
                counter.sealed((p.partition_id, p.value) for _, manifest, _, _ in sealed
                               for p in manifest.partitions)
            views = [(branch, share, manifest) for i, branch in self.branches.items()
                     for share, manifest in (*branch.seal_views(staged_parts[i]),
                                             *branch.quarantined(staged_parts[i]))]
            crashpoints.hit(crashpoints.BRANCH_AFTER_SEAL)
            # every staged table: the branch's own, then its views' shares
            staged = [(branch, branch, manifest, rows) for branch, manifest, rows, _ in sealed]
            staged += [(branch, share, manifest, manifest.rows)
                       for branch, share, manifest in views]
            digesting.update((part.staging, digest(branch, part))
                             for branch, part, manifest, _ in staged
                             if manifest.partitions and part.staging not in digesting)
            contributed = self.contribute_all(staged)
            digested = [server_ext.digested(manifest, digesting[part.staging].result())
                        if manifest.partitions else manifest
                        for _, part, manifest, _ in staged]
        crashpoints.hit(crashpoints.BRANCH_AFTER_CONTRIBUTE)
        for (branch, part, _, rows), manifest, precombined in zip(staged, digested, contributed,
                                                                  strict=True):
            written = self.coord.prepare_branch(self.epoch, part.branch_id, payload.to_record(
                payload.StagedBranch(manifest=manifest, strategy=part.strategy,
                                     staging=part.staging, server=branch.server, rows=rows,
                                     overwrite=self.plan.overwrite, contributed=precombined,
                                     view=part.view)))
            self.prepared += [written] if written is not None else []
        crashpoints.hit(crashpoints.BRANCH_AFTER_PREPARE)
        return (sum(s[2] for s in sealed), sum(s[3] for s in sealed),
                sum(len(s[1].partitions) for s in sealed))

    def drop_staging(self) -> None:
        """Drop this attempt's staging tables once its xid was decided without it (or a
        newer writer took the sink over).

        None of its branches can be published: a winner's task returned its message
        before the decision, and a newer writer never publishes an older generation's
        undecided branches. The rollback that decided so may have run before a table
        existed (registered, then staged after the rollback dropped nothing). A drop that
        fails is left to the sweeper.
        """
        for branch in self.branches.values():
            if branch.writer is not None:
                branch.writer.abort()
            try:
                branch.drop()
            except ClickHouseError as exc:
                log.warning("xid %s/%d decided without branch %s; its staging %s is left for "
                            "txsink gc: %s", self.plan.sink_id, self.epoch, branch.branch_id,
                            branch.staging, exc)

    def contribute_all(self, staged: list[SealedTable]) -> list[str]:
        """Each sealed staging table's contribution (:meth:`contribute`), in order. The
        tables are different ones, and so are their pre-combined tables: they contribute
        at once."""
        def contribute(item: SealedTable) -> str:
            branch, part, manifest, _ = item
            return self.contribute(branch, manifest, part.table)

        if len(staged) < 2:
            return [contribute(item) for item in staged]
        with ThreadPoolExecutor(min(len(staged), self.plan.tuning.contribute_workers),
                                thread_name_prefix="txsink-contribute") as pool:
            return [f.result() for f in [pool.submit(copy_context().run, contribute, item)
                                         for item in staged]]

    def contribute(self, branch: ShardBranch, manifest: server_ext.Manifest,
                   table: server_ext.TargetTable) -> str:
        """A sealed staging table's share of the pre-combined table of ``table``
        (:func:`txsink.core.combine.contribute`)."""
        if branch.writer is None or not self.contributes:
            return ""
        return combine.contribute(self.plan, self.coord, self.epoch, self.generation,
                                  branch.server, branch.client, manifest, table,
                                  self.partition)


def write_branch(
    plan: WritePlan, epoch: int, batches: Iterator[pa.RecordBatch]
) -> BranchMessage | SkippedMessage | CarriedMessage:
    """Stage this task attempt's rows (one branch per shard), seal them and record every
    branch as Prepared; or, few enough, carry them in the message (``carried_rows``). A
    staging attempt's message counts the messages it sent."""
    with counting() as meter:
        message = _write_or_carry(plan, epoch, batches)
    if not isinstance(message, BranchMessage):
        return message
    sent = meter.read()
    return replace(message, store_requests=sent.store_requests, statements=sent.statements)


def _write_or_carry(plan: WritePlan, epoch: int, batches: Iterator[pa.RecordBatch]
                    ) -> BranchMessage | SkippedMessage | CarriedMessage:
    partition, _, owner = _task_identity()
    if plan.options.publish.carry_max_bytes:
        stream = (("", "") if plan.generation is not None else
                  (plan.stream_query or task_query_id(), run_of(owner)))
        carried = carried_rows.carry(plan, epoch, batches, partition, stream)
        if isinstance(carried, CarriedMessage):
            return carried
        batches = carried
    coord = connections.coordinator(plan.options, plan.sink_id)
    generation, run, joined = plan.generation, None, None
    if generation is None:  # streaming: the first task of a run fences older runs
        run = stream_run(plan, plan.stream_query or task_query_id(), run_of(owner))
        generation, joined = JOINED.enter(run, coord, epoch)
    try:
        return _write_branch(plan, coord, epoch, generation, batches)
    except Exception as exc:
        if run is not None:
            JOINED.forget(run)
            if joined:  # the stream was checked by an earlier attempt
                coord.own_stream(run[2], epoch)  # its refusal, if that is why
        # A refused step, or staging dropped under us, after another writer took the
        # sink over or an operator rolled the xid back: say so instead of the low-level
        # error.
        taken = coord.taken_over(generation, exc) or _rolled_back(plan, coord, epoch, exc)
        if taken is None:
            raise
        raise taken from exc


Run = tuple[str, str, str, str]  # a streaming run: store root, sink, query, run id


def stream_run(plan: WritePlan, query_id: str, run_id: str) -> Run:
    """The streaming run of ``plan``'s sink that a query's run id names."""
    return (plan.options.store.root_identity, plan.sink_id, query_id, run_id)


class JoinedRuns:
    """The streaming runs this process's task attempts joined, each with the generation
    it claimed, by (store root, sink, query, run).

    The first attempt of a run in the process checks that the sink's epochs are its
    query's micro-batches (``Coordinator.own_stream``: StreamStateMismatch otherwise)
    and claims the run's generation, before anything is begun or staged. Later attempts
    of the run skip both (three requests): their registration's multi-op checks the
    generation, so a newer run, a reset or any other fence still refuses them before
    they stage, and a refused attempt checks the stream again to say why (and forgets
    the run). Callers on any thread."""

    KEPT = 64

    def __init__(self) -> None:
        self._runs: dict[Run, int] = {}
        self._lock = threading.Lock()

    def generation(self, run: Run) -> int | None:
        with self._lock:
            return self._runs.get(run)

    def enter(self, run: Run, coord: Coordinator, epoch: int) -> tuple[int, bool]:
        """The run's generation, joining it first where this process has not yet; and
        whether it had."""
        joined = self.generation(run)
        return (joined, True) if joined is not None else (self.join(run, coord, epoch), False)

    def join(self, run: Run, coord: Coordinator, epoch: int) -> int:
        coord.own_stream(run[2], epoch)
        generation = coord.claim(run[3])
        with self._lock:
            if len(self._runs) >= self.KEPT:
                self._runs.clear()
            self._runs[run] = generation
        return generation

    def forget(self, run: Run) -> None:
        with self._lock:
            self._runs.pop(run, None)


JOINED = JoinedRuns()


def _rolled_back(plan: WritePlan, coord: Coordinator, epoch: int, exc: Exception
                 ) -> XidAborted | None:
    """:class:`XidAborted` if the xid was rolled back while this attempt wrote it (an
    operator's ``txsink recover``/``gc`` judging it abandoned, or another driver's
    recovery): its staging was dropped under the attempt. None when it was not, or the
    coordinator cannot say."""
    if isinstance(exc, XidAborted):
        return None  # says so already
    try:
        record = coord.xid(epoch)
    except Exception:  # noqa: BLE001 - the original error stands
        return None
    if record is None or record.state not in (XidState.ABORTING, XidState.ABORTED):
        return None
    return XidAborted(f"xid {plan.sink_id}/{epoch} was rolled back while this task attempt "
                      f"wrote it (by txsink recover or gc, which judge an xid nobody watches "
                      f"by its age, or by another writer's recovery); nothing of it will be "
                      f"published, and a restart writes the rows again. The step it broke: "
                      f"{type(exc).__name__}: {exc}")


def run_of(owner: dict[str, object]) -> str:
    """The streaming run a task attempt belongs to (what :meth:`Coordinator.claim` takes)."""
    return str(owner.get("run_id") or owner["host"])


def _write_branch(plan: WritePlan, coord: Coordinator, epoch: int, generation: int,
                  batches: Iterator[pa.RecordBatch]) -> BranchMessage | SkippedMessage:
    # a stream's task: its first partition expects to create the xid (the others to find
    # it), and the creation rides its first branch's registration
    stream = plan.begun is None and plan.last_committed is not None
    state = coord.begin(epoch, generation, known=plan.begun,
                        new=stream and _task_identity()[0] == 0,
                        last_committed=plan.last_committed, defer=plan.begun is None)
    if state in (XidState.COMMITTED, XidState.COMMITTING):
        # Decided by an earlier run: the replay adds nothing; its commit finishes the xid.
        return SkippedMessage(epoch, generation)
    if state != XidState.INITIALIZED:
        raise XidNotWritable(f"xid {plan.sink_id}/{epoch} is {state.value}; not writable")
    return stage_attempt(plan, coord, epoch, generation, batches)


def stage_attempt(plan: WritePlan, coord: Coordinator, epoch: int, generation: int,
                  batches: Iterator[pa.RecordBatch], contributes: bool = True
                  ) -> BranchMessage:
    """Stage, seal and prepare ``batches`` as one attempt of the ``Initialized`` xid: a
    task's, or the driver's of the epoch's carried rows (which contribute to no
    pre-combined table: they are one branch per shard already)."""
    started = time.time()
    attempt = _Attempt(plan, coord, epoch, generation, contributes)
    try:
        if len(plan.shard_layout.shards) == 1:
            attempt.open(0)  # at once: an attempt that starts after the decision fails here
        for batch in batches:
            if batch.num_rows:
                attempt.write(batch)
        stage_ms = (time.time() - started) * 1000
        sealed = time.time()
        rows, bytes_sent, partitions = attempt.prepare()
    except (XidDecided, Fenced):  # decided, or by a newer writer's recovery, without it
        attempt.drop_staging()
        raise
    except ClickHouseError as exc:  # a block beyond the partition bound: say it so
        refused = attempt.refused(exc)
        if refused is None:
            raise
        raise refused from exc
    return BranchMessage(
        epoch=epoch, generation=generation,
        branch_ids=tuple(i for b in attempt.branches.values() for i in (b.branch_id, *b.shares)),
        rows=rows, bad_rows=sum(b.bad_rows for b in attempt.branches.values()),
        bytes=bytes_sent, partitions=partitions, started_at=started, stage_ms=stage_ms,
        seal_ms=(time.time() - sealed) * 1000, prepared=handed_over(attempt.prepared),
        begun=handed_begun(coord.begun(epoch)),
    )
