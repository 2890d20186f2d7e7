"""The benchmark rows and the table they go into.

Rows are those of ``bench_writer.py`` (a 64-bit id, a 20-character string, a float, a
timestamp: ~41 bytes per row in Native format) so the component and end-to-end figures
can be read together. They are computed by Spark from ``range`` (deterministic, never
cached: every variant reads exactly the same rows and pays the same generation cost).
The timestamp spreads rows over ``days`` days and the table is partitioned by day, so
each branch touches ``days`` partitions of the target: that is what the publish step
pays for.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from server_ext.sql import qualified_name
from sinkbench.environment import sql

#: 2026-01-01 00:00:00 UTC, the first day of the data.
FIRST_DAY = 1_767_225_600
DAYS = 4

COLUMNS_DDL = "id Int64, name String, score Float64, ts DateTime"


def create_target(url: str, table: str) -> None:
    """(Re)create the target: a MergeTree partitioned by day, as most event tables are."""
    qualified = qualified_name(*table.split(".", 1))
    sql(url, f"DROP TABLE IF EXISTS {qualified}")
    sql(url, f"CREATE TABLE {qualified} ({COLUMNS_DDL}) ENGINE = MergeTree() "
             "PARTITION BY toYYYYMMDD(ts) ORDER BY id")


def count(url: str, table: str) -> int:
    return int(sql(url, f"SELECT count() FROM {qualified_name(*table.split('.', 1))}").strip())


def rows_frame(spark, rows: int, partitions: int, days: int = DAYS):
    """``rows`` benchmark rows in ``partitions`` Spark partitions."""
    return spark.range(0, rows, 1, partitions).selectExpr(*row_expressions("id", days))


def row_expressions(id_column: str, days: int = DAYS) -> list[str]:
    """The SQL expressions that turn an id column into the benchmark columns."""
    return [
        f"{id_column} AS id",
        f"concat('user-', lpad(cast({id_column} AS string), 15, '0')) AS name",
        f"cast({id_column} % 100000 AS double) / 7 AS score",
        f"timestamp_seconds({FIRST_DAY} + ({id_column} % {days}) * 86400 "
        f"+ {id_column} % 86400) AS ts",
    ]


def arrow_rows(start: int, rows: int, days: int = DAYS) -> pa.RecordBatch:
    """The same rows as :func:`rows_frame`, built in Arrow (for the driver-side harness)."""
    ids = np.arange(start, start + rows, dtype=np.int64)
    digits = pc.utf8_lpad(pc.cast(pa.array(ids), pa.string()), 15, "0")
    seconds = FIRST_DAY + (ids % days) * 86_400 + ids % 86_400
    return pa.RecordBatch.from_pydict({
        "id": ids,
        "name": pc.binary_join_element_wise("user-", digits, ""),
        "score": (ids % 100_000) / 7,
        "ts": pa.array(seconds * 1_000_000, pa.timestamp("us", tz="UTC")),
    })
