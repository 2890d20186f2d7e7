"""The write plan: what the driver decided before any task runs.

The plan is built on the driver, pickled into every task and into ``commit``/``abort``.
Everything that can be checked without data (options, target table, schema, strategy,
fencing generation) is checked while building it, so bad input fails the job before
anything is staged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pyarrow as pa

import server_ext
from txsink import connections
from txsink.options import SinkOptions

log = logging.getLogger("txsink")


@dataclass(frozen=True)
class WritePlan:
    options: SinkOptions
    sink_id: str
    generation: int | None  # None for streaming: each run's tasks claim one
    strategy: str
    overwrite: bool
    columns: tuple[str, ...]
    epoch: int | None = None  # None for streaming: the micro-batch id arrives per task

    @property
    def target(self) -> str:
        return self.options.table


def arrow_schema(spark_schema) -> pa.Schema:
    """The Arrow schema Spark will hand the Arrow writer for ``spark_schema``."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(spark_schema, timezone="UTC")


def send_columns(target, names: tuple[str, ...]) -> list:
    """The target's ``Column`` objects for the column names a plan sends, in that order."""
    by_name = {c.name: c for c in target.columns}
    return [by_name[name] for name in names]


def check_target(options: SinkOptions, spark_schema) -> tuple[object, tuple[str, ...], str]:
    """Describe the target, check the incoming schema against it, pick the strategy.

    Raises the server's typed errors (unknown table or database, unreachable server) and
    ``SchemaMismatch`` naming every bad column, all before any staging exists.
    """
    client = connections.clickhouse(options)
    target = server_ext.describe_table(client, options.table)
    columns = server_ext.check_arrow_schema(target, arrow_schema(spark_schema))
    caps = server_ext.detect_capabilities(client)
    strategy = options.strategy
    if strategy == "auto":
        strategy = server_ext.choose_strategy(caps, target)
    return target, tuple(c.name for c in columns), strategy
