"""A batch job whose partition 0 is slow on its first attempt, so Spark speculates.

Run as its own driver process against a standalone master (speculation never starts
with ``local[...]``): ``python -m tests.jobs.speculative_batch MASTER URL ZK TABLE [WAY]``,
through ``clickhouse_tx`` (``WAY`` ``datasource``, the default) or ``txsink.write``
(``write``: every PySpark from 3.5).
Prints the speculative attempts it saw, as JSON on the last line.
"""

from __future__ import annotations

import json
import sys
import time

from pyspark.sql import SparkSession

import txsink

ROWS = 4000


def slow_first_attempt(batches):
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx.partitionId() == 0 and ctx.attemptNumber() == 0:
        time.sleep(8)  # the speculative copy finishes and wins meanwhile
    yield from batches


def main(master: str, url: str, zookeeper: str, table: str, way: str = "datasource") -> None:
    spark = (
        SparkSession.builder.master(master).appName("txsink-speculation")
        .config("spark.ui.enabled", "false")
        .config("spark.speculation", "true")
        .config("spark.speculation.interval", "100ms")
        .config("spark.speculation.quantile", "0.5")
        .config("spark.speculation.multiplier", "1.5")
        .config("spark.speculation.minTaskRuntime", "1s")
        .config("spark.executor.cores", "1")
        .config("spark.cores.max", "2")
        .getOrCreate()
    )
    df = spark.range(0, ROWS, numPartitions=4).selectExpr(
        "id", "date_add(DATE'2026-01-01', CAST(id % 90 AS INT)) AS day",
        "concat('event-', CAST(id AS STRING)) AS name", "CAST(id AS DOUBLE) AS value",
    )
    slow = df.mapInArrow(slow_first_attempt, df.schema)
    if way == "write":
        txsink.write(slow, table=table, url=url, zookeeper=zookeeper, sink_id="speculation")
    else:
        txsink.register(spark)
        (slow.write.format("clickhouse_tx").option("url", url).option("zookeeper", zookeeper)
            .option("table", table).option("sink_id", "speculation").mode("append").save())
    spark.stop()
    print(json.dumps({"rows": ROWS}))


if __name__ == "__main__":
    main(*sys.argv[1:6])
