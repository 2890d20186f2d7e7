"""The task side of an epoch: one task attempt writes one branch.

Contract (what Spark's ``DataWriter`` asks, made exactly-once):

- A branch is registered in ZooKeeper *before* its staging table exists, so every
  staging table a coordinator may have to drop is known to it. A registration after the
  xid is decided (a zombie or speculative loser) is refused; a staging table such a
  task creates anyway is left to the sweeper.
- Rows go only into the branch's own staging table: nothing is visible until the driver
  publishes. A failed or killed attempt leaves staging that the driver's commit (as a
  non-winner) or recovery drops.
- The manifest is recorded (branch ``Prepared``) before the commit message is returned,
  so a driver that crashes after the decision can publish from ZooKeeper alone.
- In streaming, a task of a replayed micro-batch whose xid is already ``Committed``
  writes nothing and returns :class:`SkippedMessage`.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator

import pyarrow as pa

import server_ext
from coordinator import XidState
from txsink import connections, crashpoints
from txsink.messages import BranchMessage, SkippedMessage
from txsink.plan import WritePlan, send_columns


class XidNotWritable(RuntimeError):
    """The xid is being committed by another driver; this attempt must not add to it."""


def new_branch_id(partition: int, attempt: int) -> str:
    return f"p{partition}-a{attempt}-{uuid.uuid4().hex[:8]}"


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


def write_branch(
    plan: WritePlan, epoch: int, batches: Iterator[pa.RecordBatch]
) -> BranchMessage | SkippedMessage:
    """Stage this task attempt's rows, seal them and record the branch as Prepared."""
    coord = connections.coordinator(plan.options, plan.sink_id)
    partition, attempt, owner = _task_identity()
    generation = plan.generation
    if generation is None:  # streaming: the first task of a run fences older runs
        generation = coord.claim(str(owner.get("run_id") or owner["host"]))
    state = coord.begin(epoch, generation)
    if state == XidState.COMMITTED:
        return SkippedMessage(epoch, generation)
    if state != XidState.INITIALIZED:
        raise XidNotWritable(f"xid {plan.sink_id}/{epoch} is {state.value}; not writable")

    branch_id = new_branch_id(partition, attempt)
    staging = server_ext.staging_table_name(plan.sink_id, epoch, branch_id)
    owner["staging"] = staging
    coord.register_branch(epoch, branch_id, generation, owner=owner)
    crashpoints.hit("branch.after_register")

    started = time.time()
    client = connections.clickhouse(plan.options)
    target = server_ext.describe_table(client, plan.target)
    caps = server_ext.detect_capabilities(client)
    writer = None
    for batch in batches:
        if batch.num_rows == 0:
            continue
        if writer is None:
            qualified = server_ext.create_staging(client, target, staging)
            writer = server_ext.BranchWriter(
                client, target, qualified, caps, block_rows=plan.options.insert_block_rows,
                target_columns=send_columns(target, plan.columns),
            )
        writer.write(batch)
    rows = bytes_sent = 0
    if writer is not None:
        writer.flush()
        rows, bytes_sent = writer.rows_sent, writer.bytes_sent
    crashpoints.hit("branch.after_staging_write")
    stage_ms = (time.time() - started) * 1000

    sealed = time.time()
    if writer is not None:
        manifest = server_ext.seal(client, target, writer.staging_table, expected_rows=rows)
    else:
        manifest = server_ext.Manifest.empty(target, staging)
    crashpoints.hit("branch.after_seal")
    coord.prepare_branch(epoch, branch_id, {
        "manifest": manifest.to_dict(), "strategy": plan.strategy,
        "overwrite": plan.overwrite, "staging": staging, "rows": rows,
    })
    crashpoints.hit("branch.after_prepare")
    return BranchMessage(
        epoch=epoch, generation=generation, branch_id=branch_id, rows=rows, bytes=bytes_sent,
        partitions=len(manifest.partitions), started_at=started, stage_ms=stage_ms,
        seal_ms=(time.time() - sealed) * 1000,
    )
