"""The at-least-once baseline as plain functions, on every PySpark from 3.5.

``plain_foreach_batch`` is what a ``foreachBatch`` writer without a commit protocol looks
like: each micro-batch's rows are inserted straight into the target by the tasks of one
``mapInArrow`` job, as ``clickhouse_plain`` does. A retried task, a replayed micro-batch
or a rerun job inserts its rows again, and a failed job leaves the rows its finished
tasks inserted. Never use it where exactly-once matters: it exists to show what
``txsink.foreach_batch`` prevents (the demo on a PySpark without the data source) and to
measure what the transaction layer costs. :func:`insert_rows` and :func:`plan_plain` are
``clickhouse_plain``'s too (``txsink.spark.plain``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

import server_ext
from server_ext.sql import qualified_name
from txsink.core import connections
from txsink.core.plan_checks import check_target
from txsink.core.target_setup import prepare_target
from txsink.core.write_plan import send_columns
from txsink.options import OptionError, SinkOptions, parse_options
from txsink.spark.job import collect_arrow, job_options

_ROWS_SCHEMA = "rows long"
_ROWS_ARROW = pa.schema([pa.field("rows", pa.int64())])


def plan_plain(raw: dict[str, str], schema) -> tuple[SinkOptions, tuple[str, ...]]:
    """The options and the columns to send of a plain write of ``schema``: the target
    created or checked as ``clickhouse_tx`` does (no views are fed twice: none checked)."""
    raw = dict(raw)
    raw.setdefault("zookeeper", "unused")
    options = parse_options(raw)
    if options.bad_rows.mode != "fail":  # never ignored silently
        raise OptionError("option bad_rows=quarantine is clickhouse_tx's: "
                          "clickhouse_plain fails the write on a bad value")
    options = prepare_target(options, schema)  # create_table, …: as clickhouse_tx
    return options, check_target(options, schema, views=False).columns


def insert_rows(options: SinkOptions, columns: tuple[str, ...],
                batches: Iterator[pa.RecordBatch]) -> int:
    """INSERT ``batches`` into the target directly; the number of rows sent."""
    client = connections.clickhouse(options)
    target = server_ext.describe_table(client, options.table)
    writer = server_ext.BranchWriter(
        client, target, qualified_name(target.database, target.name),
        server_ext.detect_capabilities(client), block_rows=options.connection.insert_block_rows,
        target_columns=send_columns(target, columns),
        extra_settings=dict(options.connection.insert_settings),
        encoding=options.connection.compression,
    )
    for batch in batches:
        if batch.num_rows:
            writer.write(batch)
    writer.flush()
    return writer.rows_sent


@dataclass(frozen=True)
class _InsertTask:
    """What ``mapInArrow`` runs in each task: insert the partition, return its count."""

    options: SinkOptions
    columns: tuple[str, ...]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        rows = insert_rows(self.options, self.columns, batches)
        yield pa.RecordBatch.from_pydict({"rows": [rows]}, schema=_ROWS_ARROW)


@dataclass(frozen=True)
class PlainForeachBatch:
    """``fn(batch_df, batch_id)`` inserting every micro-batch directly (at-least-once)."""

    raw: dict[str, str]

    def __call__(self, batch_df, batch_id: int) -> None:
        options, columns = plan_plain(self.raw, batch_df.schema)
        collect_arrow(batch_df, _InsertTask(options, columns), _ROWS_SCHEMA)


def plain_foreach_batch(*, table: str, **options: object) -> PlainForeachBatch:
    """The function to hand ``writeStream.foreachBatch`` for the at-least-once baseline
    (``clickhouse_plain``'s options); called with any DataFrame and id, it inserts once."""
    return PlainForeachBatch(job_options(table, options))
