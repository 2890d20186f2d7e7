"""txsink: exactly-once writes from Apache Spark into ClickHouse.

Usage::

    import txsink
    txsink.register(spark)   # only where Spark does not find "clickhouse_tx" by itself
    df.write.format("clickhouse_tx").option("url", url).option("table", "db.events") \\
        .option("zookeeper", "127.0.0.1:2181").mode("append").save()
"""

from __future__ import annotations

__version__ = "0.1.0"


def register(spark) -> None:
    """Register ``clickhouse_tx`` (and the at-least-once baseline ``clickhouse_plain``)
    and make ``spark`` the calling thread's active session.

    An installed txsink is found by Spark without it (``pyspark_txsink``), but not an
    editable install. And Spark looks a Python data source up in the *active* session of
    the thread that runs the write, also one it found by itself, and a new Python thread
    has none (measured with PySpark 4.3: ``save()`` then fails with
    ``DATA_SOURCE_NOT_FOUND``). So call it once in every thread that writes; repeating it,
    or calling it where Spark found the source, is harmless (Spark logs that it replaced
    the source).
    """
    from txsink.datasource import ClickHouseTxDataSource
    from txsink.plain import PlainDataSource

    jvm_session = getattr(spark, "_jsparkSession", None)
    if jvm_session is not None:  # classic PySpark (Spark Connect has no JVM session)
        spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(jvm_session)
    spark.dataSource.register(ClickHouseTxDataSource)
    spark.dataSource.register(PlainDataSource)


def transaction(spark, **kwargs):
    """See :func:`txsink.transactions.transaction`."""
    from txsink.transactions import transaction as _transaction

    return _transaction(spark, **kwargs)


__all__ = ["register", "transaction", "__version__"]
