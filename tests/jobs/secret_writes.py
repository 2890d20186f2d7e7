"""A driver that writes with ClickHouse credentials while Spark keeps an event log.

``python -m tests.jobs.secret_writes URL ZK DB EVENT_LOG_DIR`` writes into ``DB.t``
(``id UInt64, day Date, name String, value Float64``, created by the caller) through
``clickhouse_tx`` as the services' ``txsink_secret`` user, with ``spark.eventLog.enabled``
into ``EVENT_LOG_DIR`` (uncompressed) and the sink's log at INFO on stderr (in the Python
workers too when their ``logging`` is configured, e.g. by a ``sitecustomize`` module on
the ``PYTHONPATH``):
a batch job and a ``txsink.transaction()`` that succeed, then writes that fail with the
password in the url's query string, in its userinfo, with an unknown table, and in a
task (a null into a non-Nullable column). Prints ``refused: <error>`` per failure.
"""

from __future__ import annotations

import logging
import sys

from pyspark.sql import SparkSession

import txsink
from tests.harness.services import SECRET_PASSWORD, SECRET_USER
from tests.sinkutil import events_df


def main(url: str, zookeeper: str, db: str, event_log: str) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    spark = (SparkSession.builder.master("local[2]").appName("txsink-credential-writes")
             .config("spark.ui.enabled", "false")
             .config("spark.eventLog.enabled", "true").config("spark.eventLog.dir", event_log)
             .config("spark.eventLog.compress", "false")  # greppable as written
             .getOrCreate())
    txsink.register(spark)
    credentials = {"user": SECRET_USER, "password": SECRET_PASSWORD}
    good = {"url": url, "zookeeper": zookeeper, "table": f"{db}.t", **credentials}
    rows = events_df(spark, 0, 100)
    rows.write.format("clickhouse_tx").options(**good).mode("append").save()
    with txsink.transaction(spark, url=url, zookeeper=zookeeper, sink_id="secretive",
                            **credentials) as tx:
        tx.write(events_df(spark, 100, 100), f"{db}.t")
    host = url.partition("//")[2].rstrip("/")
    failing = {
        "query string": {**good, "url": f"{url}/?user={SECRET_USER}&password={SECRET_PASSWORD}"},
        "userinfo": {**good, "url": f"http://{SECRET_USER}:{SECRET_PASSWORD}@{host}/"},
        "unknown table": {**good, "table": f"{db}.no_such_table"},
    }
    for case, options in failing.items():
        try:
            rows.write.format("clickhouse_tx").options(**options).mode("append").save()
        except Exception as exc:  # noqa: BLE001 - every failure is printed for the caller
            print(f"refused ({case}): {exc}", flush=True)
    nulls = rows.selectExpr("id", "day", "CAST(NULL AS STRING) AS name", "value")
    try:
        nulls.write.format("clickhouse_tx").options(**good).mode("append").save()
    except Exception as exc:  # noqa: BLE001
        print(f"refused (in a task): {exc}", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:5])
