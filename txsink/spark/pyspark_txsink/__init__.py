"""``clickhouse_tx`` for Spark to find by itself, without ``txsink.register(spark)``.

Spark 4 looks for Python data sources once per JVM: it imports every top-level module on
the Python path named ``pyspark_*`` (``pkgutil.iter_modules``) and registers its
``DefaultSource`` under ``DefaultSource.name()`` for all sessions. Spark still resolves the
name through the *active* session of the writing thread, so a new thread needs
``txsink.register`` anyway. This folder is installed as the top-level package
``pyspark_txsink`` (``[tool.setuptools.package-dir]`` in pyproject.toml) because the
repository has no room for another top-level folder. An editable install is not found:
setuptools serves it through an import hook, which ``pkgutil.iter_modules`` does not list.

Spark imports this module in every application that looks up a data source where txsink is
installed, also in those that never write to ClickHouse. So it imports nothing but pyspark
(well under a millisecond once pyspark is loaded; the sink's own modules take ~0.45 s), and
it must never fail to import: Spark would skip the whole lookup with a warning, and no
``pyspark_*`` data source would be found, this one or another. The sink is imported when a
write is planned.

The at-least-once baseline ``clickhouse_plain`` is left out on purpose: it exists to be
compared with, and a job should not get duplicates because it found it by a typo.
``txsink.register`` registers it.

PySpark 3.5 has no data source API and never looks for this module; it still imports
(its ``DefaultSource`` is then a plain class that nothing uses).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

try:
    from pyspark.sql.datasource import DataSource
except ImportError:  # PySpark 3.5: no data source API, nothing looks for this module
    DataSource = object  # type: ignore[assignment,misc]

if TYPE_CHECKING:
    from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter
    from pyspark.sql.types import StructType


class DefaultSource(DataSource):
    """``format("clickhouse_tx")``: hands each write to ClickHouseTxDataSource, which is
    imported only then."""

    @classmethod
    def name(cls) -> str:
        return "clickhouse_tx"

    def schema(self) -> str:
        return self._sink().schema()

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return self._sink().writer(schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return self._sink().streamWriter(schema, overwrite)

    def _sink(self) -> DataSource:
        from txsink.spark.datasource import ClickHouseTxDataSource

        return ClickHouseTxDataSource(self.options)
