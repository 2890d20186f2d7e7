"""The Distributed table ``create_table=if_missing`` creates above the shards' local
tables when ``distributed_table`` names one (docs/usage.md, "A Distributed table created
too"; the options are checked in ``txsink/options/distributed_options.py``).

Where: on the ``url`` server only. That is the server the sink reads a Distributed
target's layout from (``txsink.core.plan_checks.resolve_layout``), so it is the one the write needs;
the sink never writes rows through the Distributed table (it stages into the local
tables), so other servers need it only for queries, and creating it there is the
operator's (``ON CLUSTER``), as is the cluster itself.

Everything is checked on the ``url`` server before any statement of the write's table
setup runs (:func:`checked_statement`): the cluster is in its ``system.clusters`` with the shards
and replicas ``shards`` names, the database exists, and an existing table of that name
is a Distributed table over ``table``. The statement is built then too, with the local
table's columns as shard 1 has them (or will be created with). It runs after the local
tables exist (:func:`create`): ``CREATE TABLE IF NOT EXISTS``, so writers racing to
create it all succeed. Like the local tables it stays when the write then fails.

After it, the write proceeds exactly as one naming the Distributed table as ``table``
(:func:`written_through`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

import pyarrow as pa

import server_ext
from server_ext.ddl import (
    TableShape,
    cluster_shape,
    column_types,
    database_exists,
    distributed_table_sql,
    type_families,
)
from server_ext.errors import UNKNOWN_TABLE
from server_ext.sharding import (
    engine_arguments,
    layout_from_distributed,
    name_value,
    parse_shard_urls,
    table_text,
)
from server_ext.sql import split_table_name
from txsink.core import connections
from txsink.core.connections import Clients
from txsink.options import OptionError, SinkOptions

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class DistributedStatement:
    """The Distributed table's ``CREATE``, built before any statement runs."""

    table: str
    sql: str


def checked_statement(options: SinkOptions, schema: pa.Schema,
            clients: Clients | None = None) -> DistributedStatement | None:
    """Check the Distributed table on the ``url`` server and build its statement; None
    when no ``distributed_table`` is given or it exists already (checked). Runs nothing
    that changes a server."""
    if not options.distributed.distributed_table:
        return None
    name = options.distributed.distributed_table
    clients = connections.clients_for(options, clients)
    client = clients()
    shards = parse_shard_urls(options.distributed.shards or "")
    existing = _describe(client, name)
    if existing is not None:
        _check_existing(options, client, existing, shards)
        return None
    shape = cluster_shape(client, options.distributed.cluster or "")
    if not shape:
        raise OptionError(f"option cluster={options.distributed.cluster!r}: the url server "
                          f"({options.connection.url}) has no such cluster in system.clusters "
                          "(remote_servers); nothing was created or staged")
    given = [len(replicas) for replicas in shards]
    if shape != given:
        raise OptionError(
            f"option shards names {len(given)} shard(s) with {given} replica(s), but cluster "
            f"{options.distributed.cluster!r} has {len(shape)} shard(s) with {shape} "
            "replica(s); list every replica of every shard in the cluster's order. Nothing was "
            "created or staged")
    database = split_table_name(name)[0]
    if not database_exists(client, database):
        raise OptionError(f"option distributed_table={name!r}: database {database} does not "
                          f"exist on {options.connection.url}; nothing was created or staged")
    columns = _local_columns(options, schema, clients, shards[0][0])
    return DistributedStatement(name, distributed_table_sql(
        name, columns, options.distributed.cluster or "", options.table,
        options.distributed.sharding_key or ""))


def create(options: SinkOptions, statement: DistributedStatement | None,
           clients: Clients | None = None) -> None:
    """Run the statement :func:`checked_statement` built (the local tables exist by now)."""
    if statement is None:
        return
    connections.clients_for(options, clients)().execute(
        statement.sql, purpose=f"create Distributed table {statement.table}")
    log.info("txsink create_table=if_missing: Distributed table %s on %s over %s (cluster %s), "
             "unless a concurrent writer created it first", statement.table, options.connection.url,
             options.table, options.distributed.cluster)


def written_through(options: SinkOptions) -> SinkOptions:
    """The options the write proceeds with: those of a write into the Distributed table
    (its layout and key read back from it), when one is named."""
    if not options.distributed.distributed_table:
        return options
    return replace(options, table=options.distributed.distributed_table)


def _describe(client, name: str) -> server_ext.TargetTable | None:
    try:
        return server_ext.describe_table(client, name)
    except server_ext.ClickHouseError as exc:
        if exc.code == UNKNOWN_TABLE:
            return None
        raise


def _check_existing(options: SinkOptions, client, existing: server_ext.TargetTable,
                    shards: list[list[str]]) -> None:
    """An existing table of that name must be a Distributed table over ``table``, of
    ``cluster``, on the shards ``shards`` names (its key is the one ``sharding_key``
    overrides, as for any Distributed target)."""
    name = options.distributed.distributed_table
    if existing.engine != "Distributed":
        raise OptionError(f"option distributed_table={name!r} names a {existing.engine} table "
                          f"on {options.connection.url}, not a Distributed table; nothing was "
                          "staged")
    args = engine_arguments(existing.engine_full)
    cluster = name_value(args[0]) if args else None
    if cluster != options.distributed.cluster:
        raise OptionError(f"option distributed_table={name!r} exists over cluster "
                          f"{args[0] if args else '?'}, not "
                          f"cluster={options.distributed.cluster!r}; nothing was staged")
    layout = layout_from_distributed(client, name or "", http_urls=shards,
                                     http_port=urlsplit(options.connection.url).port or 8123)
    if layout.local_table != table_text(options.table):
        raise OptionError(
            f"option distributed_table={name!r} exists over {layout.local_table}, not over "
            f"the local table {options.table} (option table); nothing was staged")


def _local_columns(options: SinkOptions, schema: pa.Schema, clients: Clients, url: str
                   ) -> list[tuple[str, str]]:
    """The local table's columns on shard 1's first replica (``url``): as it has them, or
    as ``create_table`` will create them there."""
    client = clients(url)
    found = _describe(client, options.table)
    if found is not None:
        return [(c.name, c.type) for c in found.columns]
    target = options.target
    shape = TableShape(target.engine, target.order_by or "", target.partition_by or "")
    columns, problems = column_types(schema, type_families(client), shape.keys(schema.names))
    if problems:
        raise server_ext.SchemaMismatch(options.table, [
            *problems, f"create_table=if_missing cannot create it on {url}; nothing was "
                       "created or staged"])
    return columns
