"""Carried rows: a task's few rows ride its commit message; the driver stages them.

A task attempt whose rows take at most ``carry_max_bytes`` Arrow bytes (and whose
partition is one of the first :data:`CARRY_MAX_TASKS`) stages nothing and says nothing to
the coordinator: it returns its rows inside its :class:`~txsink.core.messages.CarriedMessage`.
Spark hands the driver's commit exactly one message per partition, from the attempt it
chose, so the rows of a retried, speculative or zombie attempt never reach a commit.
The commit (``txsink.core.driver.commit_epoch``) then stages all carried rows of the
epoch as one attempt of its own (``txsink.core.attempt.stage_attempt``: registered before
its staging exists, sealed, digested and prepared like a task's) and publishes it with
the task branches. A task whose rows cross the bound stages them itself, from its first
row, as every task does without the option.

The driver holds at most ``CARRY_MAX_TASKS × carry_max_bytes`` of carried rows per epoch.
Values are checked against the target by the driver's writer, before the decision.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Sequence

import pyarrow as pa

from txsink.core.messages import CarriedMessage
from txsink.core.write_plan import WritePlan

#: Only the tasks of the first partitions carry their rows: the driver's memory bound.
CARRY_MAX_TASKS = 32


def carry(plan: WritePlan, epoch: int, batches: Iterator[pa.RecordBatch], partition: int,
          stream: tuple[str, str] = ("", "")) -> CarriedMessage | Iterator[pa.RecordBatch]:
    """This attempt's rows as a message if they fit (``stream``: its query and run id),
    else every batch, those read to find out first, for the task to stage."""
    bound = plan.options.publish.carry_max_bytes
    if bound <= 0 or partition >= CARRY_MAX_TASKS:
        return batches
    kept: list[pa.RecordBatch] = []
    size = 0
    started = None
    for batch in batches:
        if started is None:
            started = time.time()
        if not batch.num_rows:
            continue
        kept.append(batch)
        size += batch.nbytes
        if size > bound:
            return itertools.chain(kept, batches)
    return CarriedMessage(epoch=epoch, rows=sum(b.num_rows for b in kept),
                          arrow=_ipc(kept), started_at=started or time.time(),
                          query_id=stream[0], run_id=stream[1])


def _ipc(batches: list[pa.RecordBatch]) -> bytes:
    if not batches:
        return b""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batches[0].schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def carried_batches(messages: Sequence[CarriedMessage]) -> Iterator[pa.RecordBatch]:
    """Every carried row of ``messages``, batch by batch, in the messages' order."""
    for message in messages:
        if message.arrow:
            yield from pa.ipc.open_stream(message.arrow)
