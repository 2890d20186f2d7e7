"""The write plan: what the driver decided before any task runs.

The plan is built on the driver, pickled into every task and into ``commit``/``abort``.
Everything that can be checked without data (options, target table, schema, strategy,
fencing generation) is checked while building it, so bad input fails the job before
anything is staged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

import pyarrow as pa

import server_ext
from server_ext.sharding import (
    Shard,
    ShardLayout,
    layout_from_distributed,
    layout_from_urls,
    parse_shard_urls,
)
from txsink import connections
from txsink.options import OptionError, SinkOptions

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
    layout: ShardLayout | None = None  # None: the ``url`` server alone
    table: server_ext.TargetTable | None = None  # the local table as the driver saw it

    @property
    def target(self) -> str:
        """The table the branches stage for and publish into (on every shard)."""
        return self.shard_layout.local_table

    @property
    def shard_layout(self) -> ShardLayout:
        return self.layout or single_server(self.options)


def arrow_schema(spark_schema) -> pa.Schema:
    """The Arrow schema Spark will hand the Arrow writer for ``spark_schema``."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(spark_schema, timezone="UTC")


def send_columns(target, names: tuple[str, ...]) -> list:
    """The target's ``Column`` objects for the column names a plan sends, in that order."""
    by_name = {c.name: c for c in target.columns}
    return [by_name[name] for name in names]


@dataclass(frozen=True)
class CheckedTarget:
    """What :func:`check_target` found: the (first shard's) table, columns, strategy."""

    table: server_ext.TargetTable
    columns: tuple[str, ...]
    strategy: str
    layout: ShardLayout


def single_server(options: SinkOptions) -> ShardLayout:
    return layout_from_urls([[options.url]], options.table, None)


def resolve_layout(options: SinkOptions, client, table: server_ext.TargetTable) -> ShardLayout:
    """The shards the rows go to: a ``Distributed`` target's cluster, the ``shards``
    option, or the ``url`` server alone. ``sharding_key`` overrides a Distributed key."""
    given = parse_shard_urls(options.shards) if options.shards else None
    if table.engine == "Distributed":
        layout = layout_from_distributed(client, options.table, http_urls=given,
                                         http_port=urlsplit(options.url).port or 8123)
        if options.sharding_key:
            layout = replace(layout, sharding_key=options.sharding_key)
        return layout
    if given:
        return layout_from_urls(given, options.table, options.sharding_key)
    if options.sharding_key:
        raise OptionError("option sharding_key needs the shards option or a Distributed table")
    return single_server(options)


def describe_shards(options: SinkOptions,
                    layout: ShardLayout) -> tuple[server_ext.TargetTable, str]:
    """Describe the local table on one replica of every shard; all must agree.

    Every shard is asked before any staging exists, so a missing table or a shard with no
    reachable replica fails the job up front, naming the shard. Returns shard 1's table
    and the URL of the replica that answered for it.
    """
    first: tuple[server_ext.TargetTable, str] | None = None
    for shard in layout.shards:
        table, url = _describe_on_some_replica(options, layout.local_table, shard)
        if first is None:
            first = (table, url)
        elif [(c.name, c.type) for c in table.columns] != \
                [(c.name, c.type) for c in first[0].columns]:
            raise server_ext.SchemaMismatch(layout.local_table, [
                f"shard {shard.index + 1} has other columns or types than shard 1"])
    assert first is not None
    return first


def _describe_on_some_replica(options: SinkOptions, table: str,
                              shard: Shard) -> tuple[server_ext.TargetTable, str]:
    unreachable: list[str] = []
    for url in shard.replicas:
        try:
            return server_ext.describe_table(connections.clickhouse(options, url), table), url
        except server_ext.ServerUnreachable:
            unreachable.append(url)
    raise server_ext.ServerUnreachable(
        f"no replica of shard {shard.index + 1} answers ({', '.join(unreachable)})",
        purpose=f"describe table {table}")


def check_target(options: SinkOptions, spark_schema) -> CheckedTarget:
    """Describe the target, check the incoming schema against it, pick the strategy.

    Raises the server's typed errors (unknown table or database, unreachable server) and
    ``SchemaMismatch`` naming every bad column, all before any staging exists.
    """
    client = connections.clickhouse(options)
    table = server_ext.describe_table(client, options.table)
    layout = resolve_layout(options, client, table)
    server = options.url
    if layout.local_table != options.table or layout.shards[0].replicas != (options.url,):
        table, server = describe_shards(options, layout)
    columns = server_ext.check_arrow_schema(table, arrow_schema(spark_schema))
    caps = server_ext.detect_capabilities(connections.clickhouse(options, server))
    strategy = options.strategy
    if strategy == "auto":
        strategy = server_ext.choose_strategy(caps, table)
    return CheckedTarget(table, tuple(c.name for c in columns), strategy, layout)
