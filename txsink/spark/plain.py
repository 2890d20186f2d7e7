"""``clickhouse_plain``: the at-least-once baseline, for contrast and benchmarks.

The same Arrow → ClickHouse writer as ``clickhouse_tx``, inserting straight into the
target with no staging, no coordinator store and no commit protocol: what loading ClickHouse from
Spark usually looks like. A retried task or a replayed micro-batch writes its rows again,
and a failed job leaves the rows its finished tasks inserted. Never use it where
exactly-once matters; it exists to measure what the transaction layer costs and to show
what it prevents. The same inserts as a ``foreachBatch`` function, on every PySpark:
``txsink.spark.plain_batches``.
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

from txsink.options import OptionError, SinkOptions
from txsink.spark.plain_batches import insert_rows, plan_plain
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
    return RowsWritten(insert_rows(options, columns, batches))


class PlainDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "clickhouse_plain"

    def _plan(self, schema: StructType) -> tuple[SinkOptions, tuple[str, ...]]:
        return plan_plain({**self.options}, schema)

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
