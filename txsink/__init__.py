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
    """See :func:`txsink.spark.registration.register`."""
    from txsink.spark.registration import register as _register

    _register(spark)


def transaction(spark, **kwargs):
    """See :func:`txsink.spark.transaction.transaction`."""
    from txsink.spark.transaction import transaction as _transaction

    return _transaction(spark, **kwargs)


__all__ = ["register", "transaction", "__version__"]
