"""A writer that a crash point kills between its xid's begin and its decision.

``python -m tests.jobs.abandoned_writer KIND URL ZK TABLE COUNT [OPTIONS_JSON]`` writes
ids ``0 .. COUNT-1`` into ``TABLE`` through ``clickhouse_tx`` in its own driver
(``local[2]``), with the sink options ``OPTIONS_JSON`` adds (e.g. the KeeperMap store's;
``ZK`` empty: no ``zookeeper`` option):
KIND ``batch`` as one batch job with a generated sink id (nothing ever reruns it),
``transaction`` inside ``txsink.transaction()`` (sink id ``tx-abandoned``). The crash point
armed in the environment kills the whole driver (start it with
``start_new_session=True``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

import txsink
from tests.harness.chaos.pipeline import die_with_crash_points
from tests.sinkutil import events_df


def main(kind: str, url: str, zookeeper: str, table: str, count: str,
         extra: str = "{}") -> None:
    die_with_crash_points(Path(os.environ["TXSINK_CRASH_ONCE_DIR"]))
    spark = (SparkSession.builder.master("local[2]").appName("txsink-abandoned-writer")
             .config("spark.ui.enabled", "false").getOrCreate())
    txsink.register(spark)
    rows = events_df(spark, 0, int(count))
    options = {"url": url, **({"zookeeper": zookeeper} if zookeeper else {}),
               **json.loads(extra)}
    if kind == "batch":
        rows.write.format("clickhouse_tx").options(**options).option("table", table) \
            .mode("append").save()
    else:
        with txsink.transaction(spark, url=url, zookeeper=zookeeper,
                                sink_id="tx-abandoned") as tx:
            tx.write(rows, table)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:7])
