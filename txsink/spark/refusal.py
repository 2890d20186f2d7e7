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
from collections.abc import Iterator
from contextlib import contextmanager

from coordinator.errors import CoordinatorError
from server_ext.ddl import ViewProblem
from server_ext.errors import ClickHouseError, ShardingError
from server_ext.staging import UnsupportedTarget
from txsink.core.connections import RecordsUnusable
from txsink.options import OptionError
from txsink.options.insert_settings import SettingRefused

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
