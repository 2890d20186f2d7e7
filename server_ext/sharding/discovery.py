"""Cluster discovery: the shard layout of a ``Distributed`` table, read from the server.

The engine arguments give the cluster, the remote database and table and the sharding key;
``system.clusters`` gives the shards, their weights and replicas (in the server's order),
so the layout cannot drift from the cluster config. ``{macro}`` cluster names are expanded
as the server does.
"""

from __future__ import annotations

import itertools
import re

from server_ext.client.catalog import catalog_rows
from server_ext.client.client_protocol import SqlClient
from server_ext.errors import ClickHouseError, ShardingError
from server_ext.sharding.engine_args import engine_arguments, name_value
from server_ext.sharding.shard_layout import Shard, ShardLayout
from server_ext.sharding.urls import check_url, reject_duplicates, url_host
from server_ext.sql import identifier_text, split_table_name, sql_string, table_filter

_MACRO_RE = re.compile(r"\{([A-Za-z0-9_]+)\}")


def layout_from_distributed(client: SqlClient, table: str,
                            http_urls: list[list[str]] | None = None,
                            http_port: int | None = None) -> ShardLayout:
    """The layout of the ``Distributed`` table ``table`` on the server of ``client``.

    Reads the engine arguments (cluster, database, table, sharding key) and the cluster's
    shards, weights and replicas from ``system.clusters``. ``system.clusters`` knows only
    the native TCP port, so the replicas' HTTP URLs come from ``http_urls`` (per shard,
    per replica, in ``system.clusters`` order) or are ``http://{host_name}:{http_port}``.

    The remote database must be known for certain: '' is resolved to the replicas'
    ``<default_database>`` (all equal, not empty); ``currentDatabase()`` is refused, since
    18.16 evaluates it when the table is loaded (the creating session's database after
    CREATE, the replicas' default database after a restart) and records neither.
    """
    database, name = split_table_name(table)
    purpose = f"read shard layout of {database}.{name}"
    args = _distributed_args(client, database, name, purpose)
    cluster = _expand_macros(client, _literal_or_name(args[0], "cluster", table), purpose)
    replicas = _cluster_rows(client, cluster, table, purpose)
    remote_db = _remote_database(args[1], replicas, table, cluster)
    remote_table = _literal_or_name(args[2], "table", table)
    key = args[3].strip() if len(args) > 3 else None
    urls = _replica_urls(replicas, http_urls, http_port, cluster)
    shards = tuple(
        Shard(index, _shard_weight(rows), tuple(urls[index]))
        for index, rows in enumerate(replicas)
    )
    return ShardLayout(shards, f"{identifier_text(remote_db)}.{identifier_text(remote_table)}", key)


def _distributed_args(client: SqlClient, database: str, name: str, purpose: str) -> list[str]:
    rows = catalog_rows(client,
        "SELECT engine, engine_full FROM system.tables "
        f"WHERE {table_filter(database, name, name_column='name')}",
        purpose=purpose,
    )
    if not rows:
        raise ClickHouseError(f"table `{database}`.`{name}` does not exist", code=60,
                              purpose=purpose)
    if rows[0]["engine"] != "Distributed":
        raise ShardingError(f"{database}.{name} is a {rows[0]['engine']} table, not a "
                            "Distributed table")
    args = engine_arguments(rows[0]["engine_full"])
    if not 3 <= len(args) <= 5:
        raise ShardingError(f"cannot read the Distributed arguments of {database}.{name}: "
                            f"{rows[0]['engine_full']}")
    return args


def _literal_or_name(arg: str, what: str, table: str) -> str:
    """An engine argument that is a string literal or an (optionally quoted) identifier."""
    value = name_value(arg)
    if value is None or (what != "database" and not value):
        raise ShardingError(f"the {what} argument of Distributed table {table} is {arg}; "
                            "txsink reads only a name or a string literal there")
    return value


def _expand_macros(client: SqlClient, cluster: str, purpose: str) -> str:
    """``{name}`` macros in a cluster name, as the server expands them."""
    names = _MACRO_RE.findall(cluster)
    if not names:
        return cluster
    rows = client.query_rows("SELECT macro, substitution FROM system.macros", purpose=purpose)
    macros = {row["macro"]: row["substitution"] for row in rows}
    missing = [name for name in names if name not in macros]
    if missing:
        raise ShardingError(f"cluster name {cluster!r} uses macro(s) {', '.join(missing)} "
                            "that the server does not define")
    return _MACRO_RE.sub(lambda match: macros[match.group(1)], cluster)


def _cluster_rows(client: SqlClient, cluster: str, table: str,
                  purpose: str) -> list[list[dict]]:
    """system.clusters rows of ``cluster``, grouped per shard in shard and replica order."""
    rows = client.query_rows(
        "SELECT shard_num, shard_weight, replica_num, host_name, host_address, port, "
        f"default_database FROM system.clusters WHERE cluster = {sql_string(cluster)} "
        "ORDER BY shard_num, replica_num",
        purpose=purpose,
    )
    if not rows:
        raise ShardingError(f"cluster {cluster!r} of Distributed table {table} is not in "
                            f"system.clusters of {getattr(client, 'url', 'the server')}")
    return [list(group) for _, group in itertools.groupby(rows, key=lambda r: r["shard_num"])]


def _remote_database(arg: str, shards: list[list[dict]], table: str, cluster: str) -> str:
    if arg.strip().lower().replace(" ", "") == "currentdatabase()":
        raise ShardingError(
            f"Distributed table {table} names its database as currentDatabase(): the server "
            "fixed that when it loaded the table (the creating session's database after "
            "CREATE, the replicas' default database after a restart) and does not show "
            "which, so txsink cannot tell where rows belong. Recreate the table with the "
            "database written out"
        )
    database = _literal_or_name(arg, "database", table)
    if database:
        return database
    defaults = {row.get("default_database") or "" for rows in shards for row in rows}
    if len(defaults) == 1 and "" not in defaults:
        return defaults.pop()
    found = ", ".join(repr(name) for name in sorted(defaults))
    raise ShardingError(
        f"Distributed table {table} names no database (''), so each replica's default "
        f"database applies; cluster {cluster!r} gives {found}. txsink needs one database "
        "written in the cluster config as every replica's <default_database>, or the "
        "database written in the table definition"
    )


def _shard_weight(rows: list[dict]) -> int:
    return int(rows[0]["shard_weight"])


def _replica_urls(shards: list[list[dict]], http_urls: list[list[str]] | None,
                  http_port: int | None, cluster: str) -> list[list[str]]:
    if http_urls is not None:
        _check_url_shape(shards, http_urls, cluster)
        for urls in http_urls:
            for url in urls:
                check_url(url)
        reject_duplicates(http_urls)
        return [list(urls) for urls in http_urls]
    if http_port is None:
        raise ShardingError(f"system.clusters gives only the native TCP ports of cluster "
                            f"{cluster!r}; give the replicas' http_urls or their http_port")
    urls = [[f"http://{url_host(row['host_name'])}:{int(http_port)}" for row in rows]
            for rows in shards]
    try:
        reject_duplicates(urls)
    except ShardingError as exc:
        raise ShardingError(f"{exc}: replicas of cluster {cluster!r} share a host, so one "
                            "http_port cannot reach them all; give http_urls") from None
    return urls


def _check_url_shape(shards: list[list[dict]], http_urls: list[list[str]],
                     cluster: str) -> None:
    expected = [len(rows) for rows in shards]
    given = [len(urls) for urls in http_urls]
    if expected != given:
        raise ShardingError(
            f"http_urls has {len(given)} shard(s) with {given} replica(s); cluster {cluster!r} "
            f"has {len(expected)} shard(s) with {expected} replica(s)"
        )
