"""``bench_noop_arrow``: a Python Arrow data source that only counts rows.

The ceiling for every Python sink: Spark converts each partition to Arrow record batches
and ships them to a Python worker exactly as it does for ``clickhouse_tx``, and this
writer then does nothing with them. Whatever a real sink achieves beyond this figure is
impossible; the gap to it is what the sink's own work (encoding, HTTP, ZooKeeper) costs.

Spark workers import this module by name when they unpickle the writer, so the
``benchmarks/`` directory must be on their ``PYTHONPATH`` (see
:func:`sinkbench.session.start_spark`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

NAME = "bench_noop_arrow"


@dataclass(frozen=True)
class Counted(WriterCommitMessage):
    rows: int
    batches: int


class NoopArrowDataSource(DataSource):
    """``format("bench_noop_arrow")``: batch writes only, every row counted, none kept."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return CountingWriter()


class CountingWriter(DataSourceArrowWriter):
    """Touches each record batch once (its row count) so nothing is optimised away."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        rows = batches = 0
        for batch in iterator:
            rows += batch.num_rows
            batches += 1
        return Counted(rows, batches)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        return None

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        return None
