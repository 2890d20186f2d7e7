"""The planner: what the driver decides before any task runs.

:func:`plan_write` runs once per write, on the driver, before any task: it parses the
options, prepares and checks the target (``txsink.core.target_setup``,
``txsink.core.plan_checks``), makes the quarantine table (``txsink.core.quarantine_plan``)
and opens the sink through the driver (batch: fences it and begins the xid). Any bad input
raises there, before anything is staged. It returns a ``WritePlan``
(``txsink.core.write_plan``), the value every other module of the write core reads.

A stream's plan is kept in the planning process (:class:`StreamPlans`): Spark asks for it
twice per micro-batch, and every ``foreachBatch`` call asks again. A kept plan is reused
only after one query finds every table it described as it was before the plan was made
(``server_ext.types.definitions``: definitions, the views that read them, the server's
version); the sink is opened (decided xids rolled forward) on every call all the same.
Batch plans, a transaction's writes and sharded targets are planned afresh every time.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace

from server_ext.errors import ClickHouseError
from server_ext.sql import split_table_name
from server_ext.types import definitions
from txsink.core import connections, driver, quarantine_plan, xid_keeper
from txsink.core.message_count import counting
from txsink.core.plan_checks import (
    check_insert_memory,
    check_publish,
    check_publishable,
    check_target,
    view_strategies,
)
from txsink.core.target_setup import prepare_target
from txsink.core.write_plan import WritePlan
from txsink.options import OptionError, SinkOptions, parse_options
from txsink.options.target_name import note_default_database


@dataclass(frozen=True)
class _Kept:
    plan: WritePlan | None  # None: the tables are known, the plan is not kept yet
    tables: tuple[tuple[str, str], ...]  # the tables whose definitions are compared
    seen: tuple | None  # their definitions, read before ``plan`` was made


class StreamPlans:
    """The stream plans this process made, by options, schema and mode, each with the
    definitions (``server_ext.types.definitions``) of the tables it described, read
    *before* it was made: a change that lands while a plan is made shows at the next
    call. Callers on any thread; at most :attr:`KEPT` plans, the least recently used
    dropped first."""

    KEPT = 16

    def __init__(self) -> None:
        self._kept: OrderedDict[tuple, _Kept] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(raw_options: dict[str, str], spark_schema, overwrite: bool) -> tuple:
        return (tuple(sorted((str(k).lower(), str(v)) for k, v in raw_options.items())),
                spark_schema.json(), overwrite)

    def plan(self, key: tuple, options: SinkOptions,
             make: Callable[[], WritePlan]) -> tuple[WritePlan, bool]:
        """(the plan, whether it was kept): the one kept under ``key`` if its tables'
        definitions are what they were before it was made, else ``make()``'s, kept if
        its tables are those whose definitions were read first (a plan whose target
        gained a view is kept at the call after)."""
        with self._lock:
            kept = self._kept.get(key)
        tables = kept.tables if kept else (split_table_name(options.table),)
        try:
            seen = definitions(connections.clickhouse(options), tables)
        except ClickHouseError:  # planned afresh, which names the problem
            seen = None
        if kept and kept.plan is not None and seen is not None and seen == kept.seen:
            with self._lock:
                self._kept.move_to_end(key)
            return kept.plan, True
        plan = make()
        layout = plan.shard_layout
        if (len(layout.shards) != 1 or layout.shards[0].replicas != (options.connection.url,)
                or layout.local_table != options.table):
            return plan, False  # sharded: its shards and cluster are not among them
        if set(described(plan)) <= set(tables) and seen is not None:
            entry = _Kept(plan, tables, seen)
        else:
            entry = _Kept(None, tuple(sorted(set(described(plan)))), None)
        with self._lock:
            self._kept[key] = entry
            self._kept.move_to_end(key)
            while len(self._kept) > self.KEPT:
                self._kept.popitem(last=False)
        return plan, False


def described(plan: WritePlan) -> list[tuple[str, str]]:
    """The tables whose definitions the plan rests on: its target, its views, the views'
    tables and the quarantine table."""
    return [(t.database, t.name) for t in plan.tables] + [n.view for n in plan.views]


STREAM_PLANS = StreamPlans()


def plan_write(raw_options: dict[str, str], spark_schema, overwrite: bool, *,
               streaming: bool) -> WritePlan:
    """The driver's plan of one write, before any task runs: options parsed, the target
    created or evolved where asked, described and checked, strategies chosen, the
    quarantine table made, and (batch) the sink fenced and its xid begun — or found
    covered by the sink's ``txn_version``. Every way in calls this once per write; any
    bad input raises here, before anything is staged. A stream's plan may be one kept
    from an earlier call (:class:`StreamPlans`)."""
    options = parse_options(raw_options)
    note_default_database(options.table)
    with counting() as meter:
        if streaming and not options.transaction.in_transaction():
            plan, kept = STREAM_PLANS.plan(
                StreamPlans.key(raw_options, spark_schema, overwrite), options,
                lambda: plan_afresh(options, spark_schema, overwrite, streaming=True))
            if kept:
                plan = replace(plan, last_committed=driver.open_stream(plan.options,
                                                                       plan.sink_id))
        else:
            plan = plan_afresh(options, spark_schema, overwrite, streaming=streaming)
    return replace(plan, planned=meter.read())


def plan_afresh(options: SinkOptions, spark_schema, overwrite: bool, *,
                streaming: bool) -> WritePlan:
    """:func:`plan_write`'s plan made from the options, the server and the sink. The
    planning's ClickHouse clients are made once (``connections.Clients``) and handed to
    every check."""
    clients = connections.Clients(options)
    options = prepare_target(options, spark_schema,  # create_table, …: before describing
                             clients=clients)
    checked = check_target(options, spark_schema, clients=clients)
    checked = replace(checked,
                      strategy=check_publish(options, checked, overwrite, clients=clients),
                      view_strategies=view_strategies(options, checked, clients=clients))
    check_publishable(options, checked, clients=clients)
    check_insert_memory(options, checked, clients=clients)
    quarantined, quarantine_strategy = quarantine_plan.quarantine_table_for(
        options, checked.layout, overwrite=overwrite, clients=clients)  # before any xid
    sink_id = options.transaction.resolved_sink_id(streaming)
    covered_by_txn, begun, last_committed = None, None, None
    if options.transaction.in_transaction():
        generation, epoch = options.transaction.tx_generation, options.transaction.tx_epoch
    elif streaming:
        if options.transaction.txn_version is not None:
            raise OptionError("option txn_version is for batch jobs: a stream's "
                              "micro-batches are idempotent by their batch id already")
        last_committed = driver.open_stream(options, sink_id)
        generation = epoch = None
    else:
        opened = driver.open_xid(options, sink_id, hold="batch driver")
        generation, epoch, begun = opened.generation, opened.epoch, opened.record
        covered_by_txn = opened.covered_by_txn
        if covered_by_txn is None:
            xid_keeper.hand_over(options, opened.coord, epoch)  # outlives this planner
        else:
            epoch = None
    return WritePlan(options=options, sink_id=sink_id, generation=generation,
                     strategy=checked.strategy, overwrite=overwrite, columns=checked.columns,
                     epoch=epoch, layout=checked.layout, table=checked.table,
                     covered_by_txn=covered_by_txn, views=checked.views,
                     view_strategies=checked.view_strategies, quarantine=quarantined,
                     quarantine_strategy=quarantine_strategy, begun=begun,
                     last_committed=last_committed)
