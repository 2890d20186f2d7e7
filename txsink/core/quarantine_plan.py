"""``bad_rows=quarantine`` on the driver: the quarantine table planned on every server.

The table is needed on every replica of every shard the write goes to, since each shard
branch's quarantine share (``txsink.core.quarantine_share``) stages on that branch's
server and is published there: it is created where missing, as a ``ReplicatedMergeTree``
on a shard of several replicas (so a row published on one replica is read from any),
after every server was checked.

Refused before any xid is opened: a quarantine table that feeds materialized views
(its share has no staged view tree, and a view must never miss rows silently), an
overwrite (its publish replaces whole partitions of every table it writes, the
quarantine table's too), a quarantine table of another schema
(``server_ext.ddl.ensure_quarantine_table``), a plain one on a shard of several replicas,
and a replicated one that cannot be created (no Keeper, no ``{shard}``/``{replica}``
macros): each naming the shard and server.

Where it runs: :func:`quarantine_table_for` on the driver while it plans (``txsink.core.plan``); a
repeat finds the table made.
"""

from __future__ import annotations

import logging

import server_ext
from server_ext.ddl import (
    REPLICA_MACROS,
    discover,
    ensure_quarantine_table,
    find_quarantine_table,
    quarantine_schema_problem,
)
from server_ext.publish import Strategy, supported_strategies, target_engine_problem
from server_ext.sharding import ShardLayout
from server_ext.sql import shown_name
from server_ext.staging import publish_problem
from txsink.core import connections
from txsink.core.connections import Clients
from txsink.options import OptionError, SinkOptions

log = logging.getLogger(__name__)


def quarantine_table_for(options: SinkOptions, layout: ShardLayout, overwrite: bool, *,
            clients: Clients | None = None
            ) -> tuple[server_ext.TargetTable | None, Strategy | None]:
    """The quarantine table (created when missing on every replica of every shard of
    ``layout``) and its publish strategy, or ``(None, None)`` with ``bad_rows=fail``.
    Runs before any xid is opened; every server is checked before any table is created.
    ``clients``: the planner's (default: the options' own).
    """
    if options.bad_rows.mode != "quarantine" or not options.bad_rows.quarantine_table:
        return None, None
    if overwrite:
        raise OptionError("option bad_rows=quarantine cannot be used with mode('overwrite'), "
                          "which replaces whole partitions of every table it publishes "
                          "into. Nothing was staged")
    name = options.bad_rows.quarantine_table
    clients = connections.clients_for(options, clients)
    several = sum(len(shard.replicas) for shard in layout.shards) > 1
    servers = [_Server(shard.index, url, len(shard.replicas) > 1, several, clients(url))
               for shard in layout.shards for url in shard.replicas]
    found = {s.url: _checked(options, s, name) for s in servers}
    for server in servers:  # every server checked: now create what is missing
        if found[server.url] is None:
            found[server.url] = ensure_quarantine_table(server.client, name,
                                                    replicated=server.replicated)
            log.info("txsink bad_rows=quarantine: created %s%s", name, server.where)
    strategies: list[tuple[Strategy, list[Strategy]]] = []
    for server in servers:
        table = found[server.url]
        assert table is not None
        strategies.append(_publishable(options, server, table))
    return found[servers[0].url], _common_strategy(strategies, name)


class _Server:
    """One server the quarantine table must be on: a replica of a shard."""

    def __init__(self, shard: int, url: str, replicated: bool, several: bool,
                 client) -> None:
        self.url = url
        self.client = client
        self.replicated = replicated  # its shard has several replicas
        self.where = f" on shard {shard + 1} ({url})" if several else ""  # alone: the url


def _checked(options: SinkOptions, server: _Server, name: str
             ) -> server_ext.TargetTable | None:
    """The quarantine table on ``server`` checked (None: missing, and creatable there)."""
    client = server.client
    table = find_quarantine_table(client, name)
    if table is not None:
        problem = quarantine_schema_problem(table)
        if problem:
            raise server_ext.SchemaMismatch(shown_name(table.database, table.name), [
                f"{problem}{server.where}; nothing was created or staged"],
                purpose="check quarantine table")
        if server.replicated and not table.replicated:
            raise server_ext.UnsupportedTarget(
                f"cannot write bad rows into {table.qualified}{server.where}: the shard has "
                "several replicas and the table is not Replicated, so a bad row kept on one "
                "replica would be missing from the others. Make it a ReplicatedMergeTree on "
                "every replica of the shard, or drop it and let the sink create it. Nothing "
                "was staged")
        return table
    if server.replicated:
        missing = _missing_macros(client)
        if not server_ext.detect_capabilities(client).keeper or missing:
            lacks = (f"the server defines no macro {', '.join(missing)}" if missing
                     else "the server has no ZooKeeper/Keeper configured")
            raise server_ext.UnsupportedTarget(
                f"cannot create quarantine table {name}{server.where} as a "
                f"ReplicatedMergeTree shared by the shard's replicas: {lacks}. Create it "
                "yourself with the columns of docs/usage.md. Nothing was created or staged")
    return None


def _missing_macros(client) -> list[str]:
    rows = client.query_rows("SELECT macro FROM system.macros", purpose="list macros")
    defined = {row["macro"] for row in rows}
    return [m for m in REPLICA_MACROS if m not in defined]


def _publishable(options: SinkOptions, server: _Server, table: server_ext.TargetTable
                 ) -> tuple[Strategy, list[Strategy]]:
    """The strategy ``auto`` picks for ``table`` on ``server`` and every one it supports;
    refused by name when nothing can be published into it or it feeds views."""
    client = server.client
    caps = server_ext.detect_capabilities(client)
    strategy = server_ext.choose_strategy(caps, table)
    problem = target_engine_problem(table) or publish_problem(client, table, strategy)
    fed = discover(client, table)
    if fed and not problem:  # its share is staged without a view tree: never skip one
        problem = (f"it feeds materialized view {fed[0].view_name}, and bad rows are "
                   "staged without views; keep the quarantine table free of views")
    if problem:
        raise server_ext.UnsupportedTarget(
            f"cannot write bad rows into {table.qualified}{server.where}: {problem}. "
            "Nothing was staged")
    return strategy, supported_strategies(caps, table)


def _common_strategy(found: list[tuple[Strategy, list[Strategy]]], name: str) -> Strategy:
    """The first server's choice if every server supports it, else the first of its
    other strategies that every server supports."""
    first, ordered = found[0]
    for candidate in [first, *ordered]:
        if all(candidate in supported for _, supported in found):
            return candidate
    raise server_ext.UnsupportedTarget(f"no publish strategy serves the quarantine table "
                                       f"{name} on every shard. Nothing was staged")
