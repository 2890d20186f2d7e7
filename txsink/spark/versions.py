"""What the running PySpark offers the sink, asked of its public modules, never its version.

- ``pyspark.sql.datasource`` (the Python data source API, ``format("clickhouse_tx")``):
  PySpark 4.0 and later; open-source 3.5 has none.
- ``DataSourceStreamArrowWriter`` (a streaming writer fed Arrow batches): 4.1 and later;
  4.0's streaming writers get Rows only.
- ``DataFrame.mapInArrow`` (``txsink.write``, ``txsink.foreach_batch``,
  ``txsink.transaction``): every supported PySpark (3.3 and later).

The refusals below name the way in that works instead.
"""

from __future__ import annotations

import importlib.util

#: The forms that work on every PySpark from 3.5 (docs/usage.md, "Which way in").
EVERY_SPARK_FORMS = (
    "txsink.write(df, table=..., mode='append', url=..., zookeeper=...) for a batch job, "
    "and sdf.writeStream.foreachBatch(txsink.foreach_batch(table=..., url=..., "
    "zookeeper=...)) for a stream")


def has_data_source() -> bool:
    """Whether this PySpark has the Python data source API (4.0 and later)."""
    return importlib.util.find_spec("pyspark.sql.datasource") is not None


def has_stream_arrow_writer() -> bool:
    """Whether this PySpark's streaming writers can take Arrow batches (4.1 and later)."""
    if not has_data_source():
        return False
    import pyspark.sql.datasource as api

    return hasattr(api, "DataSourceStreamArrowWriter")


def pyspark_version() -> str:
    import pyspark

    return pyspark.__version__


def no_data_source() -> str:
    """Why ``format("clickhouse_tx")`` and ``txsink.register`` cannot work here."""
    return (f"the clickhouse_tx data source needs PySpark 4.0 or later (this is "
            f"{pyspark_version()}, which has no Python data source API); use "
            f"{EVERY_SPARK_FORMS}: the same exactly-once writes, through mapInArrow")


def no_stream_arrow_writer() -> str:
    """Why ``writeStream.format("clickhouse_tx")`` is refused on PySpark 4.0."""
    return (f"writeStream.format('clickhouse_tx') needs PySpark 4.1 or later (this is "
            f"{pyspark_version()}, whose streaming data source writers get Rows, not Arrow "
            "batches, and would run about ten times slower); use "
            "sdf.writeStream.foreachBatch(txsink.foreach_batch(table=..., url=..., "
            "zookeeper=...)) instead: the same exactly-once micro-batches, through "
            "mapInArrow. Nothing was written")
