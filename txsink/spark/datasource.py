"""The ``clickhouse_tx`` PySpark data source: Arrow writers for batch and streaming.

Thin adapters from Spark's writer contract to :mod:`txsink.core.plan` (driver, before any
task), :mod:`txsink.core.attempt` (each task attempt) and :mod:`txsink.core.driver` (commit and
abort); each method says where Spark calls it and how often. Spark pickles the writer
object into every task and into ``commit``; only the immutable
:class:`~txsink.core.write_plan.WritePlan` travels with it.

Needs PySpark 4.0 (batch) or 4.1 (streaming: 4.0 has no Arrow stream writer, and its
``streamWriter()`` refuses naming ``txsink.foreach_batch``); importing it on 3.5 fails, so
only ``txsink.spark.registration`` imports it, after asking ``txsink.spark.versions``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from txsink.core import driver, pipeline
from txsink.core.attempt import streaming_epoch, write_branch
from txsink.core.messages import SkippedMessage, TaskMessage
from txsink.core.plan import plan_write
from txsink.core.target_schema import describe_schema
from txsink.core.write_plan import WritePlan
from txsink.options import OptionError
from txsink.spark.refusal import complete_mode_refused, given, reason_first
from txsink.spark.versions import has_stream_arrow_writer, no_stream_arrow_writer

if has_stream_arrow_writer():  # PySpark 4.1 and later
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase
else:  # 4.0: streamWriter() refuses (versions.no_stream_arrow_writer); never instantiated
    _StreamWriterBase = DataSourceStreamWriter

class ClickHouseTxDataSource(DataSource):
    """Exactly-once writes into a ClickHouse table: ``format("clickhouse_tx")``."""

    @classmethod
    def name(cls) -> str:
        return "clickhouse_tx"

    def schema(self) -> str:
        """The target's columns (``target_schema``): asked by Spark for a view or a read
        that names no column list, on the driver."""
        with reason_first():
            return describe_schema(given(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """Called on the driver (Spark's planner worker) once per batch write: plans it,
        so a bad option or schema fails before any task, and begins its xid."""
        with reason_first():
            return BatchWriter(plan_write(given(self.options), schema, overwrite,
                                          streaming=False))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """Called on the driver twice per micro-batch (for its tasks and for its commit):
        plans it each time (a stream's plan is kept, ``txsink.core.plan``); no xid yet."""
        with reason_first():
            options = given(self.options)
            if not has_stream_arrow_writer():
                raise OptionError(no_stream_arrow_writer())
            if overwrite:  # what Spark passes for outputMode('complete') (measured, 4.3)
                raise OptionError(complete_mode_refused("clickhouse_tx"))
            return StreamWriter(plan_write(options, schema, overwrite, streaming=True))


@dataclass(frozen=True)
class AttemptMessage(WriterCommitMessage):
    """Spark's carrier of one attempt's :data:`~txsink.core.messages.TaskMessage`."""

    message: TaskMessage


def _unwrapped(messages: list[WriterCommitMessage | None]) -> list[TaskMessage | None]:
    return [m.message if isinstance(m, AttemptMessage) else None for m in messages]


class BatchWriter(DataSourceArrowWriter):
    """One batch job = one xid; Spark's authorised attempt per partition wins."""

    def __init__(self, plan: WritePlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        """Called once per task attempt, on an executor: stages the partition's rows and
        returns the attempt's message. A retried or speculative attempt calls it again;
        Spark hands ``commit`` one attempt's message per partition."""
        if self.plan.epoch is None:  # covered by the sink's txn_version: write nothing
            return AttemptMessage(SkippedMessage(-1, self.plan.generation or 0))
        return AttemptMessage(write_branch(self.plan, self.plan.epoch, iterator))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Invoked on the driver once every task succeeded: decides and publishes the
        xid (``driver.commit_epoch``)."""
        if self.plan.epoch is None:
            driver.log_covered(self.plan.sink_id, self.plan.options.transaction.txn_version,
                               self.plan.covered_by_txn)
            return
        driver.commit_epoch(self.plan, self.plan.epoch, _unwrapped(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Invoked on the driver when a task failed or ``commit`` raised: rolls back the
        undecided xid (a decided one is left to recovery)."""
        if self.plan.epoch is not None:
            driver.abort_epoch(self.plan, self.plan.epoch, _unwrapped(messages))


class StreamWriter(_StreamWriterBase):
    """One micro-batch = one xid whose epoch is the batch id (stable across restarts)."""

    def __init__(self, plan: WritePlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        """Called once per task attempt of a micro-batch, on an executor; the epoch is
        the batch id the task reads from its context. Retried attempts as in batch."""
        return AttemptMessage(write_branch(self.plan, streaming_epoch(), iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Invoked on the driver once every task of micro-batch ``batchId`` succeeded,
        and again for a replayed micro-batch whose commit Spark did not record (its
        committed xid is then a no-op)."""
        # publish=pipelined: the background publish lives in this commit worker, which
        # Spark reuses for the next micro-batch's commit (txsink.core.pipeline)
        driver.commit_epoch(self.plan, batchId, _unwrapped(messages),
                            publish=pipeline.worker_mode(self.plan.options))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Invoked on the driver when a task of micro-batch ``batchId`` failed."""
        driver.abort_epoch(self.plan, batchId, _unwrapped(messages))
