"""txsink: exactly-once writes from Apache Spark into ClickHouse.

Usage::

    import txsink
    txsink.register(spark)   # data source "clickhouse_tx"
    df.write.format("clickhouse_tx").option("url", url).option("table", "db.events") \\
        .option("zookeeper", "127.0.0.1:2181").mode("append").save()
"""

from __future__ import annotations

__version__ = "0.1.0"


def register(spark) -> None:
    """Register ``clickhouse_tx`` (and the at-least-once baseline ``clickhouse_plain``)."""
    from txsink.datasource import ClickHouseTxDataSource
    from txsink.plain import PlainDataSource

    spark.dataSource.register(ClickHouseTxDataSource)
    spark.dataSource.register(PlainDataSource)


def transaction(spark, **kwargs):
    """See :func:`txsink.transactions.transaction`."""
    from txsink.transactions import transaction as _transaction

    return _transaction(spark, **kwargs)


__all__ = ["register", "transaction", "__version__"]
