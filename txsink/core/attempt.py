"""The task side of an epoch: one task attempt writes one branch per shard it has rows for.

Contract (what Spark's ``DataWriter`` asks, made exactly-once):

- A branch is registered in ZooKeeper *before* its staging table exists, so every
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
  so a driver that crashes after the decision can publish from ZooKeeper alone. It
  carries each partition's content digest (``server_ext.digest``), which ``txsink
  verify`` compares with the target's.
- In streaming, a task of a replayed micro-batch whose xid is already ``Committed``
  writes nothing and returns :class:`SkippedMessage`. Before that, every task checks
  that the sink's epochs are this query's micro-batches (``Coordinator.own_stream``): a
  deleted or replaced checkpoint, or a sink whose state was lost, is refused with
  ``StreamStateMismatch`` before anything is claimed or staged.
- On a sharded target each branch stages on one replica of its shard (``pick_replica``)
  and records that server; its publish and rollback go to the same server.
- A sealed branch of small parts is also *contributed* to its xid's pre-combined table
  on its server (``server_ext.consolidate``) before it is prepared, so that the commit
  need not combine the winners' rows itself. That table is registered as a branch of
  its own (never prepared, so rolled back with the non-winners) before it exists. A
  contribution that fails in any way is only logged: the commit then reads the sources.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from functools import cached_property

import numpy as np
import pyarrow as pa

import server_ext
from coordinator import Coordinator, Fenced, XidAborted, XidDecided, XidState
from server_ext import partition_bound
from server_ext.bad_values import BadRows
from server_ext.digest import ContentDigest
from server_ext.errors import ClickHouseError, PartitionLimitExceeded
from server_ext.partition_bound import PartitionCounter
from server_ext.sharding import Shard, ShardRouter
from server_ext.staging import merges_at_insert
from txsink.core import combine, connections, crashpoints, payload
from txsink.core.messages import BranchMessage, SkippedMessage
from txsink.core.payload import BranchOwner
from txsink.core.plan import WritePlan, send_columns
from txsink.core.quarantine_share import QuarantineShare

log = logging.getLogger(__name__)
DIGEST_WORKERS = 2  # staged tables of a task digested at once, beside its contributions
CONTRIBUTE_WORKERS = 4  # a task's staged tables contributed at once
StagedParts = dict[str, dict[str, server_ext.PartitionManifest]]  # staging table: parts


class XidNotWritable(RuntimeError):
    """The xid is being committed by another driver; this attempt must not add to it."""


def new_branch_id(partition: int, attempt: int, shard: int = 0) -> str:
    return f"p{partition}-a{attempt}-s{shard}-{uuid.uuid4().hex[:8]}"




def _task_identity() -> tuple[int, int, dict[str, object]]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return 0, 0, {"host": socket.gethostname(), "pid": os.getpid()}
    owner = {
        "host": socket.gethostname(), "pid": os.getpid(), "stage": ctx.stageId(),
        "partition": ctx.partitionId(), "attempt": ctx.attemptNumber(),
        "task_attempt_id": ctx.taskAttemptId(),
        "run_id": ctx.getLocalProperty("spark.jobGroup.id"),
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


def streaming_query_id() -> str:
    """The running streaming query's id: kept in its checkpoint, so the same on every
    restart of that checkpoint and new for a new one (the run id changes every restart)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    query_id = ctx.getLocalProperty("sql.streaming.queryId") if ctx else None
    if not query_id:
        raise RuntimeError("sql.streaming.queryId is not set: not a streaming task")
    return query_id


def pick_replica(shard: Shard, partition: int, attempt: int, choice: str,
                 overwrite: bool) -> str:
    """The replica a branch stages on (and is later published from).

    ``round_robin`` spreads a job's tasks over the replicas and moves a retried attempt
    to the next replica; ``random`` picks any. Overwrite pins every shard to its first
    replica: its publish combines all the shard's branches in one staging table.
    """
    if overwrite or len(shard.replicas) == 1:
        return shard.replicas[0]
    if choice == "random":
        return random.choice(shard.replicas)
    return shard.replicas[(partition + attempt + shard.index) % len(shard.replicas)]


class _ViewBranch:
    """The share of one materialized view (``server_ext.views.ViewNode``) in a branch:
    a staging copy of the view's table, filled by a staging view over its source's
    staging table. A branch of its own in the coordinator, published into the view's
    table under the same decision."""

    def __init__(self, plan: WritePlan, epoch: int, parent_id: str,
                 node: server_ext.ViewNode) -> None:
        self.node = node
        self.table = node.table
        self.strategy = plan.view_strategies[node.index]
        self.branch_id = f"{parent_id}-v{node.index}"
        self.staging = server_ext.staging_table_name(plan.sink_id, epoch, self.branch_id,
                                                     root=plan.options.root_identity)
        self.view = server_ext.staging_table_name(plan.sink_id, epoch, f"{self.branch_id}-mv",
                                                  root=plan.options.root_identity)


class _ShardBranch:
    """One branch: this attempt's rows for one shard, staged on one replica, with the
    shares of the materialized views the target feeds (``views``), created before the
    first row so that every row fires them."""

    def __init__(self, plan: WritePlan, epoch: int, branch_id: str, server: str) -> None:
        self.plan = plan
        self.epoch = epoch
        self.branch_id = branch_id
        self.server = server
        self.staging = server_ext.staging_table_name(plan.sink_id, epoch, branch_id,
                                                     root=plan.options.root_identity)
        self.client = connections.clickhouse(plan.options, server)
        self.writer: server_ext.BranchWriter | None = None
        self.strategy = plan.strategy
        self.view = ""  # filled by the rows, not by a staging view
        self.views = [_ViewBranch(plan, epoch, branch_id, node) for node in plan.views]
        # bad_rows=quarantine: the bad rows' share, a branch of its own (quarantine_share)
        self.quarantine = (QuarantineShare(plan, epoch, branch_id, server)
                           if plan.quarantine is not None else None)
        self.rows_seen = 0  # rows handed to write: the next batch's first row number

    @cached_property
    def table(self) -> server_ext.TargetTable:
        return self.plan.table or server_ext.describe_table(self.client, self.plan.target)

    def write(self, batch: pa.RecordBatch) -> None:
        if self.writer is None:
            target = self.table
            caps = server_ext.detect_capabilities(self.client)
            columns = send_columns(target, self.plan.columns)
            if self.quarantine is None:  # bad values fail before its staging table exists
                server_ext.checked_batch(columns, batch, caps.value_ranges)
            dedup = caps.insert_deduplication_token and caps.non_replicated_deduplication_window
            qualified = server_ext.create_staging(self.client, target, self.staging,
                                                  dedup_window=dedup, mirror_engine=True)
            self.create_views(qualified)
            crashpoints.hit(crashpoints.BRANCH_AFTER_VIEWS)
            given = dict(self.plan.options.insert_settings)
            bound = partition_bound.insert_settings(
                self.client, self.plan.options.max_partitions_per_job, given)
            self.writer = server_ext.BranchWriter(
                self.client, target, qualified, caps,
                block_rows=self.plan.options.insert_block_rows, target_columns=columns,
                extra_settings={**given, **bound},
                dedup_token=self.staging if dedup else None,
                encoding=self.plan.options.compression,
                repeat_inserts=not self.views,  # the views' shares have no count to seal
                on_bad_rows=self.keep_bad if self.quarantine is not None else None,
            )
        self.writer.write(batch)
        self.rows_seen += batch.num_rows

    def keep_bad(self, batch: pa.RecordBatch, bad: BadRows) -> None:
        """Hand the bad rows of the batch being written to the quarantine share."""
        assert self.quarantine is not None
        self.quarantine.keep(batch, bad, self.rows_seen)

    def create_views(self, staging: str) -> None:
        """Stage the view tree: each view's table, then the staging view that fills it
        from its source's staging table (parents first, so every source exists)."""
        tables = {-1: staging}
        for share in self.views:
            tables[share.node.index] = server_ext.create_staging(
                self.client, share.table, share.staging, mirror_engine=True)
            self.client.execute(server_ext.views.staging_view_ddl(
                share.node, server_ext.staging.staging_qualified(share.view),
                tables[share.node.parent], tables[share.node.index]),
                purpose=f"create staging view for {share.node.view_name}")

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.send()  # the bad rows' INSERT goes while the server takes these
        if self.quarantine is not None:
            self.quarantine.flush()
        if self.writer is not None:
            self.writer.flush()

    def staged(self) -> list[_ShardBranch | _ViewBranch | QuarantineShare]:
        """This branch and its shares whose staging tables hold rows once flushed (the
        quarantine share may hold some when the branch got none: rows without a shard)."""
        parts: list[_ShardBranch | _ViewBranch | QuarantineShare] = [
            part for part in (self, *self.views)
            if self.writer is not None and part.table.engine != "Null"]
        if self.quarantine is not None and self.quarantine.writer is not None:
            parts.append(self.quarantine)
        return parts

    def quarantined(self, staged: StagedParts
                    ) -> list[tuple[QuarantineShare, server_ext.Manifest]]:
        """The sealed quarantine share, if this branch met bad rows."""
        if self.quarantine is None or self.quarantine.writer is None:
            return []
        return [(self.quarantine,
                 self.quarantine.seal(staged.get(self.quarantine.staging, {})))]

    @property
    def bad_rows(self) -> int:
        return self.quarantine.count if self.quarantine is not None else 0

    @property
    def shares(self) -> tuple[str, ...]:
        """The branch ids of its shares that are prepared: views', then quarantine's."""
        quarantined = self.quarantine is not None and self.quarantine.writer is not None
        return (*(share.branch_id for share in self.views),
                *((self.quarantine.branch_id,) if quarantined else ()))

    def read_staged(self) -> StagedParts:
        """The parts of every staging table of this branch that holds rows once flushed
        (its own, its views', its quarantine share's), read in one query for the seals."""
        names = [part.staging for part in self.staged()]
        return server_ext.read_staged_tables(self.client, server_ext.STAGING_DATABASE, names,
                                             purpose="seal branch")

    def seal(self, staged: StagedParts) -> tuple[server_ext.Manifest, int, int]:
        """(manifest, rows, bytes) of the flushed staging table (empty: no rows came, or
        a ``Null`` target, whose rows live only in its views); ``staged``: what
        :meth:`read_staged` read."""
        if self.writer is None or self.table.engine == "Null":
            manifest = server_ext.Manifest.empty(self.table, self.staging)
            return manifest, self.writer.rows_sent if self.writer else 0, 0
        rows = self.writer.rows_sent
        # a merging variant may keep fewer rows than were sent (staging.merges_at_insert)
        expected = None if merges_at_insert(self.writer.target) else rows
        manifest = server_ext.seal(self.client, self.writer.target, self.writer.staging_table,
                                   expected_rows=expected,
                                   partitions=staged.get(self.staging, {}))
        return manifest, manifest.rows if expected is None else rows, self.writer.bytes_sent

    def seal_views(self, staged: StagedParts) -> list[tuple[_ViewBranch, server_ext.Manifest]]:
        """The manifest of each view's staging table: what the staging views wrote."""
        sealed = []
        for share in self.views:
            if self.writer is None or share.table.engine == "Null":
                manifest = server_ext.Manifest.empty(share.table, share.staging)
            else:
                manifest = server_ext.seal(self.client, share.table, share.staging,
                                           expected_rows=None,
                                           partitions=staged.get(share.staging, {}))
            sealed.append((share, manifest))
        return sealed

    def drop(self) -> None:
        """Drop this branch's staging: the quarantine share's, the views' (view first),
        then its own."""
        if self.quarantine is not None:
            self.quarantine.drop()
        for share in reversed(self.views):
            server_ext.rollback(self.client, share.staging, view=share.view)
        server_ext.rollback(self.client, self.staging)


# A sealed staging table of an attempt: (its branch, the part it stages for: the branch
# itself or one of its shares, its manifest, its rows)
SealedTable = tuple[_ShardBranch, _ShardBranch | _ViewBranch | QuarantineShare,
                    server_ext.Manifest, int]


class _Attempt:
    """This task attempt's branches, opened lazily per shard that gets rows."""

    def __init__(self, plan: WritePlan, epoch: int, generation: int) -> None:
        self.plan = plan
        self.epoch = epoch
        self.generation = generation
        self.coord = connections.coordinator(plan.options, plan.sink_id)
        self.partition, self.attempt, self.owner = _task_identity()
        self.branches: dict[int, _ShardBranch] = {}
        self.router: ShardRouter | None = None
        self.counter: PartitionCounter | None = None
        self.rows_in = 0  # rows handed to write: the next batch's first row in the task

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
                                self.plan.options.max_partitions_per_job,
                                option="max_partitions_per_job")

    def refused(self, exc: ClickHouseError) -> PartitionLimitExceeded | None:
        """The bound's error for a server's refusal of a block that crossed it."""
        if self.counter is None:
            return None
        return self.counter.refused(exc, tuple(n.table.qualified for n in self.plan.views))

    def open(self, index: int) -> _ShardBranch:
        """Register the branch in ZooKeeper before its staging table exists."""
        shard = self.plan.shard_layout.shards[index]
        server = pick_replica(shard, self.partition, self.attempt,
                              self.plan.options.replica_choice, self.plan.overwrite)
        branch = _ShardBranch(self.plan, self.epoch,
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
        with ThreadPoolExecutor(DIGEST_WORKERS, thread_name_prefix="txsink-digest") as pool:
            def digest(branch: _ShardBranch, part: _ShardBranch | _ViewBranch | QuarantineShare
                       ) -> Future[dict[str, ContentDigest] | None]:
                return pool.submit(server_ext.staged_digests, branch.client, part.table,
                                   part.staging)

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
            self.coord.prepare_branch(self.epoch, part.branch_id, payload.to_record(
                payload.StagedBranch(manifest=manifest, strategy=part.strategy,
                                     staging=part.staging, server=branch.server, rows=rows,
                                     overwrite=self.plan.overwrite, contributed=precombined,
                                     view=part.view)))
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
        with ThreadPoolExecutor(min(len(staged), CONTRIBUTE_WORKERS),
                                thread_name_prefix="txsink-contribute") as pool:
            return list(pool.map(contribute, staged))

    def contribute(self, branch: _ShardBranch, manifest: server_ext.Manifest,
                   table: server_ext.TargetTable) -> str:
        """A sealed staging table's share of the pre-combined table of ``table``
        (:func:`txsink.core.combine.contribute`)."""
        if branch.writer is None:
            return ""
        return combine.contribute(self.plan, self.coord, self.epoch, self.generation,
                                  branch.server, branch.client, manifest, table)

def write_branch(
    plan: WritePlan, epoch: int, batches: Iterator[pa.RecordBatch]
) -> BranchMessage | SkippedMessage:
    """Stage this task attempt's rows (one branch per shard), seal them and record every
    branch as Prepared."""
    coord = connections.coordinator(plan.options, plan.sink_id)
    generation = plan.generation
    if generation is None:  # streaming: the first task of a run fences older runs
        _, _, owner = _task_identity()
        # Before anything is claimed, begun or staged: the sink's epochs must be this
        # query's micro-batches (StreamStateMismatch otherwise; coordinator/stream.py).
        coord.own_stream(plan.stream_query or streaming_query_id(), epoch)
        generation = coord.claim(str(owner.get("run_id") or owner["host"]))
    try:
        return _write_branch(plan, coord, epoch, generation, batches)
    except Exception as exc:
        # A refused step, or staging dropped under us, after another writer took the
        # sink over or an operator rolled the xid back: say so instead of the low-level
        # error.
        taken = coord.taken_over(generation, exc) or _rolled_back(plan, coord, epoch, exc)
        if taken is None:
            raise
        raise taken from exc


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


def _write_branch(plan: WritePlan, coord: Coordinator, epoch: int, generation: int,
                  batches: Iterator[pa.RecordBatch]) -> BranchMessage | SkippedMessage:
    state = coord.begin(epoch, generation)
    if state in (XidState.COMMITTED, XidState.COMMITTING):
        # Decided by an earlier run: the replay adds nothing; its commit finishes the xid.
        return SkippedMessage(epoch, generation)
    if state != XidState.INITIALIZED:
        raise XidNotWritable(f"xid {plan.sink_id}/{epoch} is {state.value}; not writable")

    started = time.time()
    attempt = _Attempt(plan, epoch, generation)
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
        seal_ms=(time.time() - sealed) * 1000,
    )
