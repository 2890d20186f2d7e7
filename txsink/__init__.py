"""txsink: exactly-once writes from Apache Spark into ClickHouse.

Usage (every PySpark from 3.5)::

    import txsink
    txsink.write(df, table="db.events", url=url, zookeeper="127.0.0.1:2181")
    sdf.writeStream.foreachBatch(txsink.foreach_batch(table="db.events", url=url,
                                                      zookeeper="127.0.0.1:2181")).start()

or the data source (PySpark 4.0+; streaming 4.1+)::

    txsink.register(spark)   # only where Spark does not find "clickhouse_tx" by itself
    df.write.format("clickhouse_tx").option("url", url).option("table", "db.events") \\
        .option("zookeeper", "127.0.0.1:2181").mode("append").save()
"""

from __future__ import annotations

__version__ = "0.1.0"


def register(spark) -> None:
    """See :func:`txsink.spark.registration.register`."""
    from txsink.spark.registration import register as _register

    _register(spark)


def write(df, *, table: str, mode: str = "append", **options) -> None:
    """See :func:`txsink.spark.job.write`."""
    from txsink.spark.job import write as _write

    _write(df, table=table, mode=mode, **options)


def foreach_batch(*, table: str, **options):
    """See :func:`txsink.spark.job.foreach_batch`."""
    from txsink.spark.job import foreach_batch as _foreach_batch

    return _foreach_batch(table=table, **options)


def transaction(spark, **kwargs):
    """See :func:`txsink.spark.transaction.transaction`."""
    from txsink.spark.transaction import transaction as _transaction

    return _transaction(spark, **kwargs)


def wait_published(options, timeout: float = 60.0) -> None:
    """Wait until every epoch a streaming sink decided is visible (``publish=pipelined``
    publishes the last one in the background after ``processAllAvailable()`` or
    ``query.stop()`` returned). ``options``: the sink's writer options (with its
    ``sink_id`` or the query's ``checkpointLocation``)."""
    from txsink.core.driver import wait_published as _wait
    from txsink.options import parse_options

    parsed = parse_options(options, require_table=False)
    _wait(parsed, parsed.transaction.resolved_sink_id(streaming=True), timeout)


__all__ = ["register", "write", "foreach_batch", "transaction", "wait_published",
           "__version__"]
