"""The write plan: what the driver decided before any task runs.

:func:`plan_write` runs once per write, on the driver, before any task: it parses the
options, prepares and checks the target (``txsink.core.plan_checks``), makes the quarantine
table and opens the sink (batch: fences it and begins the xid). Any bad input raises there,
before anything is staged. The :class:`WritePlan` it returns is immutable and pickled into
every task attempt (which may run it again: retries, speculation) and into
``commit``/``abort``; nothing in it changes once built.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace

import server_ext
from server_ext.ddl import ViewNode
from server_ext.publish import (
    Strategy,
)
from server_ext.sharding import (
    ShardLayout,
    layout_from_urls,
)
from txsink.options import OptionError, SinkOptions, parse_options
from txsink.options.target_name import note_default_database


@dataclass(frozen=True)
class WritePlan:
    options: SinkOptions
    sink_id: str
    generation: int | None  # None for streaming: each run's tasks claim one
    strategy: Strategy
    overwrite: bool
    columns: tuple[str, ...]
    epoch: int | None = None  # None for streaming: the micro-batch id arrives per task
    layout: ShardLayout | None = None  # None: the ``url`` server alone
    table: server_ext.TargetTable | None = None  # the local table as the driver saw it
    covered_by_txn: int | None = None  # the sink's txn_version that makes this job a no-op
    views: tuple[ViewNode, ...] = ()  # the materialized views the target feeds, staged too
    view_strategies: tuple[Strategy, ...] = ()  # the publish strategy of each view's table
    # bad_rows=quarantine: the quarantine table (txsink/core/quarantine_share.py) and its strategy
    quarantine: server_ext.TargetTable | None = None
    quarantine_strategy: Strategy | None = None
    # streaming through foreachBatch: the query id, read on the driver (the data source's
    # tasks read it from their TaskContext); None: the tasks read it
    stream_query: str | None = None
    # This write's own: two writes of one table in a transaction share the xid, and each
    # needs a pre-combined table of its own (txsink.core.combine)
    write_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    @property
    def target(self) -> str:
        """The table the branches stage for and publish into (on every shard)."""
        return self.shard_layout.local_table

    @property
    def tables(self) -> tuple[server_ext.TargetTable, ...]:
        """The target, its views' tables and the quarantine table, as the driver
        described them."""
        return (*((self.table,) if self.table else ()), *(n.table for n in self.views),
                *((self.quarantine,) if self.quarantine else ()))

    @property
    def shard_layout(self) -> ShardLayout:
        return self.layout or single_server(self.options)


def send_columns(target, names: tuple[str, ...]) -> list:
    """The target's ``Column`` objects for the column names a plan sends, in that order."""
    by_name = {c.name: c for c in target.columns}
    return [by_name[name] for name in names]


def single_server(options: SinkOptions) -> ShardLayout:
    return layout_from_urls([[options.url]], options.table, None)


def plan_write(raw_options: dict[str, str], spark_schema, overwrite: bool, *,
               streaming: bool) -> WritePlan:
    """The driver's plan of one write, before any task runs: options parsed, the target
    created or evolved where asked, described and checked, strategies chosen, the
    quarantine table made, and (batch) the sink fenced and its xid begun — or found
    covered by the sink's ``txn_version``. Every way in calls this once per write; any
    bad input raises here, before anything is staged."""
    from txsink.core import driver, quarantine_share, xid_keeper
    from txsink.core.plan_checks import (
        check_insert_memory,
        check_publish,
        check_publishable,
        check_target,
        view_strategies,
    )
    from txsink.core.target_setup import prepare_target

    options = parse_options(raw_options)
    note_default_database(options.table)
    options = prepare_target(options, spark_schema)  # create_table, …: before describing
    checked = check_target(options, spark_schema)
    checked = replace(checked, strategy=check_publish(options, checked, overwrite),
                      view_strategies=view_strategies(options, checked))
    check_publishable(options, checked)
    check_insert_memory(options, checked)
    quarantined, quarantine_strategy = quarantine_share.planned(  # created before any xid
        options, checked.layout, overwrite=overwrite)
    sink_id = options.resolved_sink_id(streaming)
    covered_by_txn = None
    if options.in_transaction():
        generation, epoch = options.tx_generation, options.tx_epoch
    elif streaming:
        if options.txn_version is not None:
            raise OptionError("option txn_version is for batch jobs: a stream's "
                              "micro-batches are idempotent by their batch id already")
        driver.open_stream(options, sink_id)
        generation = epoch = None
    else:
        opened = driver.open_xid(options, sink_id, hold="batch driver")
        generation, epoch = opened.generation, opened.epoch
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
                     quarantine_strategy=quarantine_strategy)
