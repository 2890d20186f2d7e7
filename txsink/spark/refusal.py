"""A write refused while Spark plans it: the reason on the first line of the error.

Spark reports an exception raised while it creates a Python data source's writer as
``[PYTHON_DATA_SOURCE_ERROR] Failed to initialize Python data source writer:`` followed by
the Python traceback, so the reason (a missing table, a bad option) came last, after a
dozen lines of frames, in the error ``save()`` or ``start()`` raises. The planner worker
formats that traceback when the exception leaves it, and writes only the exception's own
line when ``SPARK_HIDE_TRACEBACK`` is set in its environment
(``pyspark.util.handle_worker_exception``, PySpark 4.3); Spark's
``spark.sql.pyspark.hideTraceback.enabled`` does not reach these workers (measured). The
worker exits after reporting the error, so setting the variable there for a refusal
changes nothing else. Unexpected errors (a bug) keep their traceback.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from coordinator.errors import CoordinatorError
from server_ext.ddl import ViewProblem
from server_ext.errors import ClickHouseError, ShardingError
from server_ext.staging import UnsupportedTarget
from txsink.core.connections import RecordsUnusable
from txsink.options import OptionError
from txsink.options.insert_settings import SettingRefused
from txsink.options.sink_options import SPARK_OPTIONS

#: What the sink raises to refuse a write, each naming what is wrong in its message.
REFUSALS: tuple[type[BaseException], ...] = (
    OptionError, ClickHouseError, CoordinatorError, UnsupportedTarget, ShardingError,
    ViewProblem, SettingRefused, RecordsUnusable)


def complete_mode_refused(way: str) -> str:
    """Why ``way`` refuses a complete-mode stream: Spark hands it the whole result each
    micro-batch, to replace the last one (the data source's ``overwrite``, the output
    mode of ``foreachBatch``'s query), and the sink appends. Update mode Spark itself
    refuses for every Python data source (PySpark 4.3)."""
    return (f"{way} cannot run outputMode('complete'): complete mode hands the sink the "
            "whole result table on every micro-batch, to replace the previous one, but "
            f"{way} appends each micro-batch's rows, so every batch would add the whole "
            "result again. Use outputMode('append') (for an aggregation, with a "
            "watermark), or write the result from foreachBatch as a batch write with "
            "mode('overwrite'), which replaces the partitions the result holds. Nothing "
            "was written")


def no_options_reached() -> str:
    """Why a write that reached ``clickhouse_tx`` with no option at all is refused: most
    often a catalog table's, whose OPTIONS this Spark hands to no Python data source
    (measured with PySpark 4.3: ``self.options`` is empty in ``writer()`` and
    ``commit()``), so its writes cannot know their server or table."""
    return ("no options reached clickhouse_tx (url and table are required, and zookeeper "
            "unless coordinator=keepermap). "
            "A table made by CREATE TABLE ... USING clickhouse_tx OPTIONS (...) keeps its "
            "options in Spark's catalog, and Spark hands a catalog table's options to no "
            "Python data source, so INSERT INTO, df.writeTo(...).append() and "
            "df.write.insertInto(...) of such a table cannot reach ClickHouse. A temporary "
            "view's options do reach it: CREATE TEMPORARY VIEW v USING clickhouse_tx "
            "OPTIONS (url 'http://...:8123', table 'db.events', zookeeper '...:2181'), "
            "then INSERT INTO v SELECT ...; with df.write.format('clickhouse_tx') give them "
            "as .option(...). Nothing was written")


#: How Spark names a catalog table's OPTIONS in the properties it hands ``schema()`` when
#: ``CREATE TABLE ... USING clickhouse_tx`` gives no column list (beside ``owner`` and
#: ``provider``; measured with PySpark 4.3). Its writes later get no option at all.
CATALOG_OPTION_PREFIX = "option."


def given(options: Mapping[str, str]) -> dict[str, str]:
    """``options`` as the sink takes them. Refused (:func:`no_options_reached`) when they
    hold none but Spark's own, or are a catalog table's properties: such a table could be
    created but never written, so it is refused when it is made."""
    names = [str(name).lower() for name in options]
    if not any(name not in SPARK_OPTIONS for name in names) or \
            any(name.startswith(CATALOG_OPTION_PREFIX) for name in names):
        raise OptionError(no_options_reached())
    return dict(options)


#: Read by PySpark's worker when it reports an exception to the JVM.
HIDE_TRACEBACK = "SPARK_HIDE_TRACEBACK"


@contextmanager
def reason_first() -> Iterator[None]:
    """Around the planning of a write in Spark's planner worker: a refusal leaving it is
    reported as its own line, without the traceback."""
    try:
        yield
    except REFUSALS:
        os.environ[HIDE_TRACEBACK] = "1"
        raise
