"""The target table as the server describes it: its columns, keys and engine.

``describe_table`` reads one table's description (a few queries, no cache),
``definitions`` in one query what tells whether it may have changed; a
``TargetTable`` is a frozen value that any process may keep and compare. Whether data fits
the table is checked by ``arrow_schema`` (types) and ``row_checks`` (values).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from server_ext.client.catalog import catalog_rows
from server_ext.client.client_protocol import SqlClient
from server_ext.errors import ClickHouseError
from server_ext.sql import (
    qualified_name,
    shown_name,
    split_table_name,
    sql_string,
    table_filter,
)
from server_ext.types.chtypes import ChType, parse_type

UNWRITABLE_DEFAULT_KINDS = ("MATERIALIZED", "ALIAS", "EPHEMERAL")
#: system.tables columns naming the views that read a table (the same on 18.16 and 26.x)
DEPENDENTS_COLUMNS = "dependencies_database AS dbs, dependencies_table AS names"


def dependents_of(row: dict) -> tuple[tuple[str, str], ...]:
    """(database, name) of the views a ``DEPENDENTS_COLUMNS`` row names, sorted."""
    return tuple(sorted(zip(row["dbs"], row["names"], strict=True)))


@dataclass(frozen=True)
class Column:
    """One target column: ``default_kind`` is '', DEFAULT, MATERIALIZED, ALIAS, EPHEMERAL."""

    name: str
    type: str
    default_kind: str = ""
    default_expression: str = ""
    chtype: ChType = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "chtype", parse_type(self.type))

    @property
    def writable(self) -> bool:
        """Whether an INSERT may supply this column."""
        return self.default_kind not in UNWRITABLE_DEFAULT_KINDS

    @property
    def may_be_omitted(self) -> bool:
        """Whether the server fills it when the data lacks it (a DEFAULT, or NULL)."""
        return bool(self.default_kind) or self.chtype.unwrap_low_cardinality().is_nullable


@dataclass(frozen=True)
class TargetTable:
    """What txsink needs to know about a target table to stage and publish into it."""

    database: str
    name: str
    columns: list[Column]
    partition_key: str
    sorting_key: str
    primary_key: str
    engine: str
    engine_full: str
    replicated: bool
    index_granularity: int
    create_table_query: str
    # (database, name) of the materialized views that read it, read with its description
    # (None: not read; view discovery then asks the server)
    views: tuple[tuple[str, str], ...] | None = field(default=None, compare=False)

    @property
    def qualified(self) -> str:
        """``\\`db\\`.\\`table\\``` for SQL."""
        return qualified_name(self.database, self.name)

    def column(self, name: str) -> Column:
        for column in self.columns:
            if column.name == name:
                return column
        raise KeyError(name)


def describe_table(client: SqlClient, table: str) -> TargetTable:
    """Describe ``db.table`` (or ``table`` in ``default``) from the server.

    Raises ``ClickHouseError`` named UNKNOWN_DATABASE or UNKNOWN_TABLE naming the table.
    """
    database, name = split_table_name(table)
    purpose = f"describe table {shown_name(database, name)}"
    found = catalog_rows(client,
        "SELECT engine, engine_full, partition_key, sorting_key, primary_key, "
        f"create_table_query, {DEPENDENTS_COLUMNS} FROM system.tables "
        f"WHERE {table_filter(database, name, name_column='name')}",
        purpose=purpose,
    )
    if not found:  # the database or the table: named by the first that is missing
        _require_exists(client, database, name, purpose)
        raise _unknown_table(database, name, purpose)  # created since: still not described
    meta = found[0]
    rows = client.query_rows(f"DESCRIBE TABLE {qualified_name(database, name)}", purpose=purpose)
    columns = [
        Column(row["name"], row["type"], row.get("default_type", ""),
               row.get("default_expression", ""))
        for row in rows
    ]
    return TargetTable(
        database=database, name=name, columns=columns,
        partition_key=meta["partition_key"], sorting_key=meta["sorting_key"],
        primary_key=meta["primary_key"], engine=meta["engine"],
        engine_full=meta["engine_full"], replicated=meta["engine"].startswith("Replicated"),
        index_granularity=_index_granularity(meta["engine_full"]),
        create_table_query=meta["create_table_query"],
        views=dependents_of(meta),
    )


def definitions(client: SqlClient, tables: Iterable[tuple[str, str]]) -> tuple:
    """One query's answer that changes whenever what :func:`describe_table` and view
    discovery read of ``tables`` (``(database, name)`` pairs) may have changed: each
    table's engine, definition, modification time and the views that read it, and the
    server's version. Equal answers mean an equal description; a dropped table drops out."""
    pairs = sorted(set(tables))
    where = " OR ".join(f"({table_filter(db, name, name_column='name')})" for db, name in pairs)
    rows = catalog_rows(client,
        "SELECT database, name, engine, create_table_query, "
        "toString(metadata_modification_time) AS modified, dependencies_database AS dbs, "
        f"dependencies_table AS names, version() AS server FROM system.tables WHERE {where} "
        "ORDER BY database, name", purpose="check the described tables unchanged")
    return tuple(tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in row.items())
                 for row in rows)


def _require_exists(client: SqlClient, database: str, name: str, purpose: str) -> None:
    """Raise a clear UNKNOWN_DATABASE / UNKNOWN_TABLE error instead of a DESCRIBE failure."""
    rows = catalog_rows(client,
        f"SELECT (SELECT count() FROM system.databases WHERE name = {sql_string(database)}) AS db, "
        "(SELECT count() FROM system.tables "
        f"WHERE {table_filter(database, name, name_column='name')}) AS tbl",
        purpose=purpose,
    )[0]
    if int(rows["db"]) == 0:
        raise ClickHouseError(f"database `{database}` does not exist", code=81, purpose=purpose)
    if int(rows["tbl"]) == 0:
        raise _unknown_table(database, name, purpose)


def _unknown_table(database: str, name: str, purpose: str) -> ClickHouseError:
    return ClickHouseError(f"table `{database}`.`{name}` does not exist", code=60,
                           purpose=purpose)


def _index_granularity(engine_full: str) -> int:
    match = re.search(r"index_granularity\s*=\s*(\d+)", engine_full)
    return int(match.group(1)) if match else 8192
