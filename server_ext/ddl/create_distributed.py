"""The ``Distributed`` table a write creates above its shards' local tables
(``create_table=if_missing`` with ``distributed_table``).

Why here, as text: the statement is built, with every other statement of the write's
table setup, before any of them runs, so a refusal leaves no server changed; fast tests
check it. The engine's arguments are written out in full (the cluster, the local table's
database and name as string literals, the sharding key), never ``currentDatabase()``,
so that ``server_ext.sharding.discovery`` reads back exactly where every row belongs.

:func:`cluster_shape` reads the cluster from the server's ``system.clusters``, so a
cluster the server does not know, or one whose shards and replicas differ from the
servers the local tables are created on, is refused before anything is created.
"""

from __future__ import annotations

from server_ext.client.client_protocol import SqlClient
from server_ext.ddl.create_table import key_clause
from server_ext.sql import qualified_name, quote_identifier, split_table_name, sql_string


def distributed_table_sql(table: str, columns: list[tuple[str, str]], cluster: str,
                          local_table: str, sharding_key: str) -> str:
    """``CREATE TABLE IF NOT EXISTS`` of the Distributed ``table`` over ``local_table``
    (``database.table`` on every shard of ``cluster``), rows routed by ``sharding_key``.

    Idempotent: writers racing to create it all succeed, and a repeat finds it."""
    local_db, local_name = split_table_name(local_table)
    names = [name for name, _ in columns]
    body = ", ".join(f"{quote_identifier(name)} {ch_type}" for name, ch_type in columns)
    key = key_clause(sharding_key, names)
    return (f"CREATE TABLE IF NOT EXISTS {qualified_name(*split_table_name(table))} "
            f"({body}) ENGINE = Distributed({sql_string(cluster)}, {sql_string(local_db)}, "
            f"{sql_string(local_name)}, {key})")


def cluster_shape(client: SqlClient, cluster: str) -> list[int]:
    """The number of replicas of each shard of ``cluster`` in the server's
    ``system.clusters`` (shard order); ``[]`` when the server does not know it."""
    rows = client.query_rows(
        "SELECT shard_num, count() AS replicas FROM system.clusters "
        f"WHERE cluster = {sql_string(cluster)} GROUP BY shard_num ORDER BY shard_num",
        purpose=f"read cluster {cluster}")
    return [int(row["replicas"]) for row in rows]


def database_exists(client: SqlClient, database: str) -> bool:
    rows = client.query_rows(
        f"SELECT count() AS n FROM system.databases WHERE name = {sql_string(database)}",
        purpose=f"find database {database}")
    return int(rows[0]["n"]) > 0
