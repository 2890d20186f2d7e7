"""The target made to fit the data before the plan describes it: ``create_table=if_missing``
creates a missing target, ``schema_evolution=add_columns`` adds the DataFrame columns it
lacks (docs/usage.md, "Creating the target and following new columns").

Why in planning, before :func:`txsink.core.plan_checks.check_target`: the plan describes the target
once and everything after it (the schema check, the staging tables, the staging views of
``server_ext.ddl.views``) is built from that description, so a table created or altered here
is then described and checked as any existing one. No xid is open yet (a
``txsink.transaction()``'s write: none of its rows is staged yet), and every refusal of
this step (a column no type of the server holds, a type change, an engine the sink cannot
publish into) comes before the first statement that changes a server.

Neither step is transactional: a created table or an added column stays when the write
then fails or its xid is aborted. Both are idempotent (``CREATE TABLE IF NOT EXISTS``;
``ADD COLUMN IF NOT EXISTS``, or a check that the column is there on servers without it),
so writers racing to make the same change all succeed.
"""

from __future__ import annotations

import logging

import pyarrow as pa

import server_ext
from server_ext.ddl import (
    TableShape,
    TypeNotMapped,
    add_column,
    column_type,
    column_types,
    create_table,
    engine_name,
    type_families,
)
from server_ext.errors import UNKNOWN_TABLE
from server_ext.sharding import parse_shard_urls
from server_ext.sql import identifier_text, qualified_name, split_table_name
from server_ext.types import flatten_schema, type_problem
from txsink.core import connections, distributed_target
from txsink.core.connections import Clients
from txsink.core.spark_arrow import arrow_schema
from txsink.options import OptionError, SinkOptions
from txsink.options.distributed_options import SHARDING_KEY_ALONE
from txsink.options.table_options import ADD_COLUMNS, IF_MISSING

log = logging.getLogger(__name__)



def prepare_target(options: SinkOptions, spark_schema, *,
                   clients: Clients | None = None) -> SinkOptions:
    """Create the target and add its missing columns as the options ask, on every server
    that holds it (the ``url`` server, or every replica of every shard of ``shards``),
    and the Distributed table above them that ``distributed_table`` names; return the
    options the write proceeds with (``distributed_target.written_through``). ``clients``:
    the planner's (default: the options' own)."""
    if options.target.create_table != IF_MISSING and options.target.schema_evolution != ADD_COLUMNS:
        return options
    clients = connections.clients_for(options, clients)
    schema = arrow_schema(spark_schema)
    # checked before any change
    distributed = distributed_target.checked_statement(options, schema, clients)
    servers = _servers(options)
    found = {url: _describe(options, clients(url)) for url in servers}
    missing = [url for url, table in found.items() if table is None]
    target = found.get(options.connection.url)
    if (options.distributed.sharding_key and not options.distributed.shards and distributed is None
            and (target is None or target.engine != "Distributed")):
        raise OptionError(f"{SHARDING_KEY_ALONE}. Nothing was created or changed")
    if missing and options.target.create_table == IF_MISSING:
        _create(options, clients, schema, missing)
        found.update({url: _describe(options, clients(url)) for url in missing})
    if options.target.schema_evolution == ADD_COLUMNS:
        _add_columns(options, clients, schema,
                     {url: t for url, t in found.items() if t is not None})
    distributed_target.create(options, distributed, clients)
    return distributed_target.written_through(options)


def _servers(options: SinkOptions) -> list[str]:
    if options.distributed.shards:
        return [url for shard in parse_shard_urls(options.distributed.shards) for url in shard]
    return [options.connection.url]


def _describe(options: SinkOptions, client) -> server_ext.TargetTable | None:
    try:
        return server_ext.describe_table(client, options.table)
    except server_ext.ClickHouseError as exc:
        if exc.code == UNKNOWN_TABLE:
            return None
        raise


def _qualified(options: SinkOptions) -> str:
    return qualified_name(*split_table_name(options.table))


def _create(options: SinkOptions, clients: Clients, schema: pa.Schema,
            servers: list[str]) -> None:
    """Build every server's statement first (a refusal then leaves no server changed),
    then create the table on each."""
    target = options.target
    shape = TableShape(target.engine, target.order_by or "", target.partition_by or "")
    keys = shape.keys(schema.names)
    statements = []
    for url in servers:
        client = clients(url)
        columns, problems = column_types(schema, type_families(client), keys)
        if problems:
            raise server_ext.SchemaMismatch(
                options.table, [*problems, f"create_table=if_missing cannot create it on "
                                           f"{url}; nothing was created or staged"])
        if engine_name(shape.engine).startswith("Replicated") and \
                not server_ext.detect_capabilities(client).keeper:
            raise server_ext.UnsupportedTarget(
                f"cannot create {options.table} on {url} with engine {shape.engine}: the "
                "server has no ZooKeeper/Keeper configured. Nothing was created or staged")
        statements.append((url, client, columns))
    for url, client, columns in statements:
        create_table(client, _qualified(options), columns, shape)
        log.info("txsink create_table=if_missing: %s on %s (engine %s, %d columns), unless "
                 "a concurrent writer created it first", options.table, url, shape.engine,
                 len(columns))


def _add_columns(options: SinkOptions, clients: Clients, schema: pa.Schema,
                 found: dict[str, server_ext.TargetTable]) -> None:
    """Check every server's table against the DataFrame, then add what each lacks."""
    planned: list[tuple[str, object, str, str]] = []
    for url, table in found.items():
        new, problems = column_changes(table, schema)
        client = clients(url)
        families = type_families(client) if new else frozenset()
        for field in new:
            try:
                planned.append((url, client, field.name, column_type(field, families)))
            except TypeNotMapped as exc:
                problems.append(f"column `{field.name}`: {exc}")
        if problems:
            raise server_ext.SchemaMismatch(
                options.table, [*problems, f"on {url}; no column was added, nothing staged"])
    for url, client, name, ch_type in planned:
        add_column(client, _qualified(options), name, ch_type,
                   exists=lambda c=client, n=name: _has_column(options, c, n))
        log.warning("txsink schema_evolution=add_columns: added column %s %s to %s on %s "
                    "(not transactional: it stays if this write fails)",
                    identifier_text(name), ch_type, options.table, url)


def column_changes(table: server_ext.TargetTable,
                   schema: pa.Schema) -> tuple[list[pa.Field], list[str]]:
    """The DataFrame fields ``table`` lacks, and why it cannot follow the others: a type
    the existing column cannot take (both named: add_columns never changes a type), a
    name that differs from a column's only in case, a Distributed table."""
    flat, _ = flatten_schema([(c.name, c.chtype) for c in table.columns], schema)
    by_name = {c.name: c for c in table.columns}
    problems: list[str] = []
    new: list[pa.Field] = []
    for field in flat:
        column = by_name.get(field.name)
        same_but_case = [n for n in by_name if n.lower() == field.name.lower()]
        if column is None and same_but_case:
            problems.append(f"column `{field.name}` differs from the table's "
                            f"`{same_but_case[0]}` only in case; rename it in Spark "
                            "(add_columns would add a second column)")
        elif column is None:
            new.append(field)
        elif type_problem(field.type, column.chtype):
            problems.append(
                f"column `{field.name}`: the table has {column.type}, the DataFrame has "
                f"{field.type}; schema_evolution=add_columns adds columns and never "
                "changes a type (cast the column in Spark)")
    if new and table.engine == "Distributed":
        problems.append(f"{table.database}.{table.name} is a Distributed table: add "
                        f"{', '.join(f.name for f in new)} to it and to its local tables "
                        "yourself, or name the local table with shards")
    return new, problems


def _has_column(options: SinkOptions, client, name: str) -> bool:
    table = server_ext.describe_table(client, options.table)
    return any(c.name == name for c in table.columns)
