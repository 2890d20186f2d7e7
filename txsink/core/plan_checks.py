"""The plan's checks: the target, its shards, views and options, checked on the driver.

Every function here runs on the driver while a write is planned
(:func:`txsink.core.plan.plan_write`, and ``clickhouse_plain``'s and ``txsink.transaction()``'s
own planning), before the sink is opened or anything is staged: a refusal raised here leaves
nothing behind. They only read (describe tables, ask servers' capabilities and settings);
repeating one asks the servers again and finds the same.

Options a server must honour are checked against that server, every shard of it, before
the sink is opened (:func:`check_publish`, :func:`check_server_options`): a strategy the
server cannot run would otherwise be found only by the publish after the decision, and a
decided xid can never be rolled back, so one wrong option would block the sink.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

import server_ext
from server_ext.client import encoding_problem
from server_ext.ddl import ViewNode, ViewProblem, discover, tree_problem
from server_ext.old_server import memory_problem
from server_ext.publish import (
    Strategy,
    StrategyProblem,
    strategy_problem,
    supported_strategies,
    target_engine_problem,
)
from server_ext.sharding import (
    Shard,
    ShardLayout,
    ShardRouter,
    layout_from_distributed,
    layout_from_urls,
    parse_shard_urls,
    shown_url,
)
from server_ext.staging import publish_problem
from txsink.core import connections
from txsink.core.connections import Clients
from txsink.core.spark_arrow import arrow_schema
from txsink.core.write_plan import single_server
from txsink.options import OptionError, SinkOptions, insert_settings
from txsink.options.distributed_options import SHARDING_KEY_ALONE

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckedTarget:
    """What :func:`check_target` found: the (first shard's) table, columns, strategy.

    ``shard_tables`` holds, per shard, the local table and the server that described it.
    """

    table: server_ext.TargetTable
    columns: tuple[str, ...]
    strategy: Strategy
    layout: ShardLayout
    shard_tables: tuple[tuple[server_ext.TargetTable, str], ...] = ()
    views: tuple[ViewNode, ...] = ()  # shard 1's view tree (every shard has the same)
    view_strategies: tuple[Strategy, ...] = ()  # the publish strategy of each view's table


def _described_shards(options: SinkOptions, checked: CheckedTarget
                      ) -> tuple[tuple[server_ext.TargetTable, str], ...]:
    """Per shard, (local table, server that described it): ``checked.shard_tables``, or
    the target on the ``url`` server alone when none were recorded."""
    return checked.shard_tables or ((checked.table, options.connection.url),)


def resolve_layout(options: SinkOptions, client, table: server_ext.TargetTable) -> ShardLayout:
    """The shards the rows go to: a ``Distributed`` target's cluster, the ``shards``
    option, or the ``url`` server alone. ``sharding_key`` overrides a Distributed key."""
    given = parse_shard_urls(options.distributed.shards) if options.distributed.shards else None
    if table.engine == "Distributed":
        layout = layout_from_distributed(client, options.table, http_urls=given,
                                         http_port=urlsplit(options.connection.url).port or 8123)
        if options.distributed.sharding_key:
            layout = replace(layout, sharding_key=options.distributed.sharding_key)
        return layout
    if given:
        return layout_from_urls(given, options.table, options.distributed.sharding_key)
    if options.distributed.sharding_key:
        raise OptionError(SHARDING_KEY_ALONE)
    return single_server(options)


def describe_every_shard(clients: Clients, layout: ShardLayout
                         ) -> list[tuple[server_ext.TargetTable, str]]:
    """Describe the local table on one replica of every shard; all must agree.

    Every shard is asked before any staging exists, so a missing table or a shard with no
    reachable replica fails the job up front, naming the shard. Returns, per shard in
    order, its table and the URL of the replica that answered for it.
    """
    found: list[tuple[server_ext.TargetTable, str]] = []
    for shard in layout.shards:
        table, url = _describe_on_some_replica(clients, layout.local_table, shard)
        differences = _shape_differences(found[0][0], table) if found else []
        if differences:
            raise server_ext.SchemaMismatch(layout.local_table, [
                f"shard {shard.index + 1}'s local table differs from shard 1's: "
                + "; ".join(differences)])
        found.append((table, url))
    return found


def _shape_differences(first: server_ext.TargetTable, other: server_ext.TargetTable
                       ) -> list[str]:
    """How ``other`` differs from ``first`` in what a staging table copies from shard 1's
    description: a partition one server's staging holds must be one every shard's table
    takes (ATTACH and MOVE refuse another partition or sorting key), so a difference
    found at publish would leave the xid decided and half visible."""
    if [(c.name, c.type) for c in other.columns] != [(c.name, c.type) for c in first.columns]:
        return ["other columns or types"]
    return [f"{what} {mine!r} against {theirs!r}" for what, mine, theirs in (
        ("engine", other.engine.removeprefix("Replicated"),
         first.engine.removeprefix("Replicated")),
        ("partition key", other.partition_key, first.partition_key),
        ("sorting key", other.sorting_key, first.sorting_key),
        ("primary key", other.primary_key, first.primary_key),
        ("index_granularity", other.index_granularity, first.index_granularity),
    ) if mine != theirs]


def _describe_on_some_replica(clients: Clients, table: str,
                              shard: Shard) -> tuple[server_ext.TargetTable, str]:
    unreachable: list[str] = []
    for url in shard.replicas:
        try:
            return server_ext.describe_table(clients(url), table), url
        except server_ext.ServerUnreachable:
            unreachable.append(url)
    raise server_ext.ServerUnreachable(
        f"no replica of shard {shard.index + 1} answers ({', '.join(unreachable)})",
        purpose=f"describe table {table}")


def check_target(options: SinkOptions, spark_schema, *, views: bool = True,
                 clients: Clients | None = None) -> CheckedTarget:
    """Describe the target, check the incoming schema against it, pick the strategy.

    Raises the server's typed errors (unknown table or database, unreachable server) and
    ``SchemaMismatch`` naming every bad column, all before any staging exists.
    ``views``: discover the materialized views the target feeds (:func:`view_tree`); the
    at-least-once baseline, which inserts into the target itself, does not need them.
    ``clients``: the planner's (default: the options' own).
    """
    clients = connections.clients_for(options, clients)
    client = clients()
    table = server_ext.describe_table(client, options.table)
    layout = resolve_layout(options, client, table)
    url = options.connection.url
    shard_tables = [(table, url)]
    if layout.local_table != options.table or layout.shards[0].replicas != (url,):
        shard_tables = describe_every_shard(clients, layout)
    table, server = shard_tables[0]
    incoming = arrow_schema(spark_schema)
    columns = server_ext.check_arrow_schema(table, incoming)
    if len(layout.shards) > 1:  # the sharding key's errors before any xid, as the tasks see it
        ShardRouter(layout, incoming, {c.name: c.type for c in table.columns}, client)
    for url in dict.fromkeys(url for _, url in shard_tables):
        try:
            insert_settings.check_on_server(clients(url),
                                            options.connection.insert_settings, url)
        except insert_settings.SettingRefused as exc:
            raise OptionError(f"{exc}. Nothing was staged") from None
    caps = server_ext.detect_capabilities(clients(server))
    strategy = options.publish.strategy
    if strategy == "auto":
        strategy = server_ext.choose_strategy(caps, table)
    return CheckedTarget(table, tuple(c.name for c in columns), strategy, layout,
                         tuple(shard_tables),
                         view_tree(options, clients, layout, shard_tables) if views else ())


def view_tree(options: SinkOptions, clients: Clients, layout: ShardLayout,
              shard_tables: list[tuple[server_ext.TargetTable, str]]) -> tuple[ViewNode, ...]:
    """The materialized views the target feeds (``server_ext.ddl.views``), the same on every
    shard; ``()`` with ``materialized_views='ignore'``, logged.

    Refused before anything is staged, naming the view: a view the sink cannot stage, a
    view of a ``Distributed`` target (the sink writes into the shards' local tables, so
    it would never fire), and shards whose trees differ.
    """
    if layout.local_table != options.table:
        client = clients()
        above = server_ext.describe_table(client, options.table)
        found = discover(client, above)
        if found:
            raise server_ext.UnsupportedTarget(
                f"materialized view {found[0].view_name} reads the Distributed table "
                f"{above.database}.{above.name}; clickhouse_tx writes into the shards' "
                f"local tables ({layout.local_table}), so it would never fire. Make it read "
                "the local table on every shard")
    trees = []
    for index, (table, url) in enumerate(shard_tables):
        try:
            trees.append(discover(clients(url), table))
        except ViewProblem as exc:
            where = f" (shard {index + 1}, {url})" if len(shard_tables) > 1 else ""
            raise server_ext.UnsupportedTarget(f"cannot stage the views of {table.qualified}"
                                               f"{where}: {exc}. Nothing was staged") from None
    shapes = [_tree_shape(tree) for tree in trees]
    for index, shape in enumerate(shapes[1:], start=2):
        if shape != shapes[0]:
            raise server_ext.UnsupportedTarget(
                f"shard {index} of {layout.local_table} feeds other materialized views than "
                "shard 1; every shard's local table must feed the same views")
    tree = trees[0] if trees else ()
    if tree and options.target.materialized_views == "ignore":
        log.warning("materialized_views='ignore': %s feeds %s, which will not get the rows "
                    "of this write", layout.local_table,
                    ", ".join(node.view_name for node in tree))
        return ()
    _require_same_views_on_replicas(clients, layout, shard_tables, shapes)
    return tree


def _tree_shape(tree: tuple[ViewNode, ...]) -> list[tuple]:
    """What two servers' view trees must share: each view, its table and its SELECT."""
    return [(n.view, n.table.qualified, n.select) for n in tree]


def _require_same_views_on_replicas(clients: Clients, layout: ShardLayout,
                                    shard_tables: list[tuple[server_ext.TargetTable, str]],
                                    shapes: list[list[tuple]]) -> None:
    """Refuse replicas of a shard whose local table feeds other views than the replica
    described: a branch staged on one would miss its views' rows, or fail. A replica that
    does not answer now is left to the task that picks it."""
    if len(shard_tables) != len(layout.shards):
        return
    for shard, (table, described) in zip(layout.shards, shard_tables, strict=True):
        for url in shard.replicas:
            if url == described:
                continue
            try:
                # the replica's own views, not those the described replica reported
                shape = _tree_shape(discover(clients(url), replace(table, views=None)))
            except server_ext.ServerUnreachable:
                log.warning("replica %s of shard %d does not answer: its views are not "
                            "compared with %s's", shown_url(url), shard.index + 1,
                            shown_url(described))
                continue
            except ViewProblem as exc:
                shape = [("unstageable", str(exc))]
            if shape != shapes[0]:
                raise server_ext.UnsupportedTarget(
                    f"replica {shown_url(url)} of shard {shard.index + 1} of "
                    f"{layout.local_table} feeds other materialized views than "
                    f"{shown_url(described)}; every replica's table must feed the same "
                    "views. Nothing was staged")


def check_publish(options: SinkOptions, checked: CheckedTarget, overwrite: bool = False, *,
                  clients: Clients | None = None) -> str:
    """Check the target's engine and the ``strategy`` option against every shard's server;
    return the strategy the branches record.

    Runs before the sink is opened (no fence, no xid, no staging). Refuses, naming the
    table, the server and what to do instead:

    - a target no staged partition can be published into (not MergeTree-family, or the
      deprecated MergeTree syntax), a view tree that cannot be staged
      (``server_ext.ddl.tree_problem``: e.g. a view into a ``Distributed`` table, or an
      overwrite of a target that feeds views): ``server_ext.UnsupportedTarget``;
    - shards whose local tables disagree on being Replicated (no one strategy serves
      both): ``UnsupportedTarget``;
    - a ``compression`` some shard's server cannot read: :class:`OptionError`;
    - a ``strategy`` some shard's server cannot run for its table
      (``capabilities.strategy_problem``): :class:`OptionError` naming the option, the
      value, what the server lacks and the strategy to use.

    ``auto`` picks the strategy ``choose_strategy`` prefers for shard 1 if every shard
    supports it, else the next one every shard supports, so a cluster whose servers
    differ (one without MOVE PARTITION) gets a strategy all of them can run.
    """
    clients = connections.clients_for(options, clients)
    shards = _described_shards(options, checked)
    several = len(shards) > 1
    views = tree_problem(checked.views, overwrite)  # shard 1's tree, every shard's too
    for index, (table, server) in enumerate(shards):
        problem = (target_engine_problem(table) or views
                   or ("mode('overwrite') replaces partitions, and a Null table keeps none"
                       if overwrite and table.engine == "Null" else None))
        if problem:
            raise server_ext.UnsupportedTarget(
                f"cannot write into {table.qualified}{_on_shard(index, server, several)}: "
                f"{problem}. Nothing was staged")
    if len({table.replicated for table, _ in shards}) > 1:
        kinds = ", ".join(f"shard {i + 1}: {t.engine}" for i, (t, _) in enumerate(shards))
        raise server_ext.UnsupportedTarget(
            f"the shards of {checked.layout.local_table} disagree on being Replicated "
            f"({kinds}); one publish strategy cannot serve both kinds")
    if options.connection.compression:
        for index, (_, server) in enumerate(shards):
            problem = encoding_problem(clients(server),
                                       options.connection.compression)
            if problem:
                raise OptionError(f"option compression={options.connection.compression!r} "
                                  f"cannot be used{_on_shard(index, server, several)}: {problem}; "
                                  "use gzip (every server reads it) or none. Nothing was staged")
    if options.publish.strategy == "auto":
        return _auto_strategy(clients, shards, checked.layout.local_table)
    for index, (table, server) in enumerate(shards):
        caps = server_ext.detect_capabilities(clients(server))
        found = strategy_problem(caps, table, options.publish.strategy)
        if found is not None:
            raise OptionError(strategy_refusal(
                found, f"{table.qualified}{_on_shard(index, server, several)}"))
    return options.publish.strategy


def view_strategies(options: SinkOptions, checked: CheckedTarget, *,
                    clients: Clients | None = None) -> tuple[str, ...]:
    """The strategy each view's table is published with (aligned with ``checked.views``):
    ``auto``'s choice for that table on every shard, whatever the ``strategy`` option
    says of the target (a Replicated target may feed a plain MergeTree rollup)."""
    clients = connections.clients_for(options, clients)
    shards = _described_shards(options, checked)
    return tuple(_auto_strategy(clients, [(node.table, server) for _, server in shards],
                                f"{node.table.database}.{node.table.name}")
                 for node in checked.views)


def check_publishable(options: SinkOptions, checked: CheckedTarget, *,
                      clients: Clients | None = None) -> None:
    """Refuse, before anything is staged, a target or view table that would refuse the
    partitions of its staging tables (``server_ext.staging.publish_problem``), on every
    shard: found after the decision, it would leave the xid ``Committing`` for good."""
    clients = connections.clients_for(options, clients)
    shards = _described_shards(options, checked)
    several = len(shards) > 1
    for index, (table, server) in enumerate(shards):
        client = clients(server)
        for each, strategy, view in ((table, checked.strategy, None),
                                     *((n.table, s, n) for n, s in zip(checked.views,
                                                                       checked.view_strategies,
                                                                       strict=True))):
            problem = publish_problem(client, each, strategy)
            if problem:
                raise server_ext.UnsupportedTarget(
                    f"cannot write into {_named(each, view)}"
                    f"{_on_shard(index, server, several)}: {problem}. Nothing was staged")


def check_insert_memory(options: SinkOptions, checked: CheckedTarget, *,
                        clients: Clients | None = None) -> None:
    """Refuse, before any xid is opened or anything staged, a target (or view table) too
    wide for one staging INSERT within its server's per-query memory limit
    (``server_ext.old_server.insert_memory``: 18.16 holds ~2 MiB per column file, so its
    4 GB limit takes ~1,900 plain columns), on every shard. Found by the tasks, it would fail every
    attempt after the xid was opened, with only the server's "Memory limit exceeded"."""
    clients = connections.clients_for(options, clients)
    shards = _described_shards(options, checked)
    several = len(shards) > 1
    for index, (table, server) in enumerate(shards):
        client = clients(server)
        for each, view in ((table, None), *((node.table, node) for node in checked.views)):
            problem = memory_problem(client, each)
            if problem:
                raise server_ext.UnsupportedTarget(
                    f"cannot write into {_named(each, view)}"
                    f"{_on_shard(index, server, several)}: {problem}. Nothing was staged")


def _named(table: server_ext.TargetTable, view: ViewNode | None) -> str:
    """A table as a refusal names it: a view's table with the view that fills it."""
    if view is None:
        return table.qualified
    return f"{table.qualified} (the table of materialized view {view.view_name})"


def _auto_strategy(clients: Clients, tables, name: str) -> str:
    """The strategy ``choose_strategy`` prefers for the first (table, server) if every
    one supports it, else the next one every one supports."""
    caps = [(table, server_ext.detect_capabilities(clients(server)))
            for table, server in tables]
    first_table, first_caps = caps[0]
    for candidate in supported_strategies(first_caps, first_table):
        if all(strategy_problem(c, t, candidate) is None for t, c in caps):
            return candidate
    raise OptionError(f"option strategy='auto' finds no publish strategy that every "
                      f"shard of {name} supports")


def check_server_options(options: SinkOptions) -> None:
    """The checks that need no table, against the ``url`` server: for a multi-table
    transaction before it begins its xid (each write then checks its own table)."""
    if options.publish.strategy == "auto":
        return
    caps = server_ext.detect_capabilities(connections.clickhouse(options))
    found = strategy_problem(caps, None, options.publish.strategy)
    if found is not None:
        raise OptionError(strategy_refusal(found, f"any table on {options.connection.url}"))


def strategy_refusal(problem: StrategyProblem, where: str) -> str:
    """The refusal of a ``strategy`` option: option, value, what is lacking, what instead."""
    return (f"option strategy={problem.strategy!r} cannot publish into {where}: "
            f"{problem.lacks}; use strategy={problem.instead!r} (or 'auto', which picks a "
            "strategy the server supports). Nothing was staged")


def _on_shard(index: int, server: str, several: bool) -> str:
    return f" on shard {index + 1} ({server})" if several else f" on {server}"

