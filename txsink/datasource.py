"""The ``clickhouse_tx`` PySpark data source: Arrow writers for batch and streaming.

Thin adapters from Spark's writer contract to :mod:`txsink.plan` (driver, before any
task), :mod:`txsink.branch` (each task attempt) and :mod:`txsink.driver` (commit and
abort). Spark pickles the writer object into every task and into ``commit``; only the
immutable :class:`~txsink.plan.WritePlan` travels with it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from txsink import driver, keeper, quarantine
from txsink.branch import streaming_epoch, write_branch
from txsink.messages import SkippedMessage
from txsink.options import OptionError, parse_options
from txsink.plan import (
    WritePlan,
    check_insert_memory,
    check_publish,
    check_publishable,
    check_target,
    view_strategies,
)
from txsink.refusal import reason_first
from txsink.target_name import note_default_database
from txsink.target_setup import prepare_target

#: Spark hands a sink in complete mode the whole result each micro-batch, to replace the
#: last one; update mode Spark itself refuses for every Python data source (PySpark 4.3).
COMPLETE_MODE_REFUSED = (
    "clickhouse_tx cannot run outputMode('complete'): complete mode hands the sink the "
    "whole result table on every micro-batch, to replace the previous one, but "
    "clickhouse_tx appends each micro-batch's rows, so every batch would add the whole "
    "result again. Use outputMode('append') (for an aggregation, with a watermark), or "
    "write the result from foreachBatch as a batch write with mode('overwrite'), which "
    "replaces the partitions the result holds. Nothing was written")


class ClickHouseTxDataSource(DataSource):
    """Exactly-once writes into a ClickHouse table: ``format("clickhouse_tx")``."""

    @classmethod
    def name(cls) -> str:
        return "clickhouse_tx"

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        with reason_first():
            return BatchWriter(self._plan(schema, overwrite, streaming=False))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        with reason_first():
            if overwrite:  # what Spark passes for outputMode('complete') (measured, 4.3)
                raise OptionError(COMPLETE_MODE_REFUSED)
            return StreamWriter(self._plan(schema, overwrite, streaming=True))

    def _plan(self, schema: StructType, overwrite: bool, streaming: bool) -> WritePlan:
        options = parse_options(self.options)
        note_default_database(options.table)
        options = prepare_target(options, schema)  # create_table, …: before describing
        checked = check_target(options, schema)
        checked = replace(checked, strategy=check_publish(options, checked, overwrite),
                          view_strategies=view_strategies(options, checked))
        check_publishable(options, checked)
        check_insert_memory(options, checked)
        quarantined, quarantine_strategy = quarantine.planned(  # created before any xid
            options, checked.layout, overwrite=overwrite)
        sink_id = options.resolved_sink_id(streaming)
        if options.in_transaction():
            generation, epoch = options.tx_generation, options.tx_epoch
        elif streaming:
            if options.txn_version is not None:
                raise OptionError("option txn_version is for batch jobs: a stream's "
                                  "micro-batches are idempotent by their batch id already")
            driver.open_stream(options, sink_id)
            generation = epoch = None
        else:
            opened = driver.open_xid(options, sink_id, hold="batch driver")
            generation, epoch = opened.generation, opened.epoch
            if opened.covered_by_txn is not None:
                return WritePlan(options, sink_id, generation, checked.strategy, overwrite,
                                 checked.columns, None, checked.layout, checked.table,
                                 covered_by_txn=opened.covered_by_txn, views=checked.views,
                                 view_strategies=checked.view_strategies,
                                 quarantine=quarantined,
                                 quarantine_strategy=quarantine_strategy)
            keeper.hand_over(options, opened.coord, epoch)  # outlives this planner worker
        return WritePlan(options, sink_id, generation, checked.strategy, overwrite,
                         checked.columns, epoch, checked.layout, checked.table,
                         views=checked.views, view_strategies=checked.view_strategies,
                         quarantine=quarantined, quarantine_strategy=quarantine_strategy)


class BatchWriter(DataSourceArrowWriter):
    """One batch job = one xid; Spark's authorised attempt per partition wins."""

    def __init__(self, plan: WritePlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        if self.plan.epoch is None:  # covered by the sink's txn_version: write nothing
            return SkippedMessage(-1, self.plan.generation or 0)
        return write_branch(self.plan, self.plan.epoch, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.plan.epoch is None:
            driver.log_covered(self.plan.sink_id, self.plan.options.txn_version,
                               self.plan.covered_by_txn)
            return
        driver.commit_epoch(self.plan, self.plan.epoch, messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.plan.epoch is not None:
            driver.abort_epoch(self.plan, self.plan.epoch, messages)


class StreamWriter(DataSourceStreamArrowWriter):
    """One micro-batch = one xid whose epoch is the batch id (stable across restarts)."""

    def __init__(self, plan: WritePlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return write_branch(self.plan, streaming_epoch(), iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        driver.commit_epoch(self.plan, batchId, messages)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        driver.abort_epoch(self.plan, batchId, messages)
