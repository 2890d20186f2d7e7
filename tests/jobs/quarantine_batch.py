"""A batch job with ``bad_rows=quarantine`` and a ``txn_version``, as an orchestrator
would (re)run it.

``python -m tests.jobs.quarantine_batch URL ZK TABLE QUARANTINE SINK_ID TXN_VERSION COUNT``
writes ids ``0 .. COUNT-1`` (``coded_df``: every id with ``id % 50 == 7`` carries a
``code`` out of UInt8's range) through ``clickhouse_tx`` in its own driver; a crash point
armed in the environment kills it where the test wants (start it with
``start_new_session=True``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

import txsink
from tests.harness.chaos.pipeline import die_with_crash_points

CODED_DDL = ("CREATE TABLE {table} (id UInt64, day Date, code UInt8, name String) "
             "ENGINE = MergeTree PARTITION BY toYYYYMM(day) ORDER BY id")


def is_bad(row_id: int) -> bool:
    """Whether ``coded_df`` gives row ``row_id`` a code UInt8 cannot hold."""
    return row_id % 50 == 7


def coded_df(spark, count: int, partitions: int = 4):
    """``count`` rows with unique ids over three months; ``code`` is 300 (out of UInt8's
    range) where :func:`is_bad`, else ``id % 200``."""
    return spark.range(0, count, numPartitions=partitions).selectExpr(
        "id",
        "date_add(DATE'2026-01-01', CAST(id % 90 AS INT)) AS day",
        "CAST(CASE WHEN id % 50 = 7 THEN 300 ELSE id % 200 END AS INT) AS code",
        "concat('e-', CAST(id AS STRING)) AS name",
    )


def main(url: str, zookeeper: str, table: str, quarantine: str, sink_id: str,
         txn_version: str, count: str) -> None:
    if os.environ.get("TXSINK_CRASH_ONCE_DIR"):
        die_with_crash_points(Path(os.environ["TXSINK_CRASH_ONCE_DIR"]))
    spark = (SparkSession.builder.master("local[2]").appName("txsink-quarantine-batch")
             .config("spark.ui.enabled", "false").getOrCreate())
    txsink.register(spark)
    (coded_df(spark, int(count), partitions=2).write.format("clickhouse_tx")
        .option("url", url).option("zookeeper", zookeeper).option("table", table)
        .option("sink_id", sink_id).option("txn_version", txn_version)
        .option("bad_rows", "quarantine").option("quarantine_table", quarantine)
        .mode("append").save())
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:8])
