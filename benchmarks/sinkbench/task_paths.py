"""One task body, run through Spark's two ways into Python: ``mapInArrow`` and a data source.

A Python data source's ``write`` is run by Spark as a ``mapInArrow`` function
(``pyspark/sql/worker/write_into_data_source.py``), so the two paths should cost the
same; this module lets a benchmark check it with real inserts. The body is either the
sink's task-side insert (``txsink.spark.plain.insert_directly``: ``clickhouse_plain``'s, the same
writer ``clickhouse_tx`` stages with) or the ``connect_executor`` baseline's
(``client_baseline.connect_insert_partition``: clickhouse-connect's ``insert_arrow``).
Each task appends its phases to a JSON-lines file: Spark runs the tasks in this machine's
worker processes (local mode), and a data source's commit messages never reach the
benchmark's own process.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

BODIES = ("sink", "connect")
PATHS = ("map", "source")


class _Timed:
    """The task's batches, with when the first and the last arrived."""

    def __init__(self, batches: Iterator[pa.RecordBatch]) -> None:
        self.batches = batches
        self.first: float | None = None
        self.last: float | None = None
        self.rows = 0

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        for batch in self.batches:
            if self.first is None:
                self.first = time.perf_counter()
            self.rows += batch.num_rows
            yield batch
        self.last = time.perf_counter()


def run_body(body: str, path: str, url: str, table: str, log: str,
             batches: Iterator[pa.RecordBatch]) -> int:
    """Insert the task's batches into ``table`` with ``body``; log its phases; the rows."""
    started = time.perf_counter()
    timed = _Timed(batches)
    if body == "sink":
        from txsink.options import parse_options
        from txsink.spark.plain import insert_directly

        options = parse_options({"url": url, "table": table, "zookeeper": "unused"})
        insert_directly(options, ("id", "name", "score", "ts"), iter(timed))
    else:
        from sinkbench.client_baseline import ConnectTarget, connect_insert_partition

        for _ in connect_insert_partition(ConnectTarget.at(url, table), iter(timed)):
            pass
    ended = time.perf_counter()
    first = timed.first or ended
    last = timed.last or ended
    with open(log, "a") as out:
        out.write(json.dumps({"variant": f"{path}-{body}", "rows": timed.rows,
                              "first_s": first - started, "arrive_s": last - first,
                              "insert_s": ended - last, "task_s": ended - started}) + "\n")
    return timed.rows


def map_function(body: str, url: str, table: str, log: str):
    """The ``mapInArrow`` function of the ``map`` path."""
    def insert(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        rows = run_body(body, "map", url, table, log, batches)
        yield pa.RecordBatch.from_pydict({"rows": [rows]})
    return insert


@dataclass(frozen=True)
class Inserted(WriterCommitMessage):
    rows: int


class TaskPathSource(DataSource):
    """``format("task_path_probe")``, options ``body``, ``url``, ``table``, ``log``."""

    @classmethod
    def name(cls) -> str:
        return "task_path_probe"

    def writer(self, schema, overwrite: bool) -> TaskPathWriter:
        return TaskPathWriter(dict(self.options))


class TaskPathWriter(DataSourceArrowWriter):
    def __init__(self, options: dict[str, str]) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Inserted:
        o = self.options
        return Inserted(run_body(o["body"], "source", o["url"], o["table"], o["log"], iterator))
