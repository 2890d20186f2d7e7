"""A batch job with a ``txn_version``, as an orchestrator would (re)run it.

``python -m tests.jobs.versioned_batch URL ZK TABLE SINK_ID TXN_VERSION FIRST COUNT [WAY]``
writes ids ``FIRST .. FIRST+COUNT-1`` in its own driver (``local[2]``) through
``clickhouse_tx`` (``WAY`` ``datasource``, the default) or ``txsink.write`` (``write``:
no data source, every PySpark from 3.5); a crash point armed in the environment kills it
where the test wants (the whole driver: start it with ``start_new_session=True``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

import txsink
from tests.harness.chaos.pipeline import die_with_crash_points
from tests.sinkutil import SHORT_SESSION, events_df


def main(url: str, zookeeper: str, table: str, sink_id: str, txn_version: str,
         first: str, count: str, way: str = "datasource") -> None:
    if os.environ.get("TXSINK_CRASH_ONCE_DIR"):
        die_with_crash_points(Path(os.environ["TXSINK_CRASH_ONCE_DIR"]))
    spark = (SparkSession.builder.master("local[2]").appName("txsink-versioned-batch")
             .config("spark.ui.enabled", "false").getOrCreate())
    df = events_df(spark, int(first), int(count))
    if way == "write":
        txsink.write(df, table=table, url=url, zookeeper=zookeeper, sink_id=sink_id,
                     txn_version=txn_version, **SHORT_SESSION)
    else:
        txsink.register(spark)
        (df.write.format("clickhouse_tx").option("url", url).option("zookeeper", zookeeper)
            .option("table", table).option("sink_id", sink_id)
            .option("txn_version", txn_version).options(**SHORT_SESSION).mode("append").save())
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:9])
