"""``clickhouse_plain``: the at-least-once baseline, for contrast and benchmarks.

The same Arrow → ClickHouse writer as ``clickhouse_tx``, inserting straight into the
target with no staging, no ZooKeeper and no commit protocol: what loading ClickHouse from
Spark usually looks like. A retried task or a replayed micro-batch writes its rows again,
and a failed job leaves the rows its finished tasks inserted. Never use it where
exactly-once matters; it exists to measure what the transaction layer costs and to show
what it prevents.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

import server_ext
from server_ext.sql import qualified_name
from txsink.core import connections
from txsink.core.plan import check_target, send_columns
from txsink.core.target_setup import prepare_target
from txsink.options import OptionError, SinkOptions, parse_options
from txsink.spark.versions import has_stream_arrow_writer, no_stream_arrow_writer

if has_stream_arrow_writer():  # PySpark 4.1 and later; 4.0 refuses streamWriter()
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase
else:
    _StreamWriterBase = DataSourceStreamWriter


@dataclass(frozen=True)
class RowsWritten(WriterCommitMessage):
    rows: int


def insert_directly(options: SinkOptions, columns: tuple[str, ...],
                    batches: Iterator[pa.RecordBatch]) -> RowsWritten:
    client = connections.clickhouse(options)
    target = server_ext.describe_table(client, options.table)
    writer = server_ext.BranchWriter(
        client, target, qualified_name(target.database, target.name),
        server_ext.detect_capabilities(client), block_rows=options.insert_block_rows,
        target_columns=send_columns(target, columns),
        extra_settings=dict(options.insert_settings), encoding=options.compression,
    )
    for batch in batches:
        if batch.num_rows:
            writer.write(batch)
    writer.flush()
    return RowsWritten(writer.rows_sent)


class PlainDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "clickhouse_plain"

    def _plan(self, schema: StructType) -> tuple[SinkOptions, tuple[str, ...]]:
        raw = {**self.options}
        raw.setdefault("zookeeper", "unused")
        options = parse_options(raw)
        if options.bad_rows != "fail":  # never ignored silently
            raise OptionError("option bad_rows=quarantine is clickhouse_tx's: "
                              "clickhouse_plain fails the write on a bad value")
        options = prepare_target(options, schema)  # create_table, …: as clickhouse_tx
        return options, check_target(options, schema, views=False).columns

    def writer(self, schema: StructType, overwrite: bool) -> PlainWriter:
        return PlainWriter(*self._plan(schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> PlainStreamWriter:
        if not has_stream_arrow_writer():
            raise OptionError(no_stream_arrow_writer().replace("clickhouse_tx",
                                                               "clickhouse_plain"))
        return PlainStreamWriter(*self._plan(schema))


class PlainWriter(DataSourceArrowWriter):
    def __init__(self, options: SinkOptions, columns: tuple[str, ...]) -> None:
        self.options, self.columns = options, columns

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return insert_directly(self.options, self.columns, iterator)


class PlainStreamWriter(_StreamWriterBase):
    def __init__(self, options: SinkOptions, columns: tuple[str, ...]) -> None:
        self.options, self.columns = options, columns

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return insert_directly(self.options, self.columns, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass
