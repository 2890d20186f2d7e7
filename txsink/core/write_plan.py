"""The write plan's value: what the driver decided before any task runs.

A :class:`WritePlan` is made once per write by the planner (:mod:`txsink.core.plan`) and
is immutable: it is pickled into every task attempt (which may run it again: retries,
speculation) and into ``commit``/``abort``; nothing in it changes once built. This module
imports nothing of the write core, so every module of it can read a plan.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import server_ext
from coordinator import XidRecord
from server_ext.ddl import ViewNode
from server_ext.publish import Strategy
from server_ext.sharding import ShardLayout, layout_from_urls
from txsink.core.message_count import MessageCount
from txsink.core.tuning import DEFAULT_TUNING, Tuning
from txsink.options import SinkOptions


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
    # bad_rows=quarantine: the quarantine table (txsink/core/quarantine_plan.py) and its strategy
    quarantine: server_ext.TargetTable | None = None
    quarantine_strategy: Strategy | None = None
    # streaming through foreachBatch: the query id, read on the driver (the data source's
    # tasks read it from their TaskContext); None: the tasks read it
    stream_query: str | None = None
    # This write's own: two writes of one table in a transaction share the xid, and each
    # needs a pre-combined table of its own (txsink.core.combine)
    write_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    # the sizes and pools its tasks and its commit share (txsink/core/tuning.py)
    tuning: Tuning = DEFAULT_TUNING
    # the messages this plan's making sent (a kept stream plan: this call's checks)
    planned: MessageCount = MessageCount()
    # the xid as the driver began it (a batch job, a foreachBatch micro-batch): its tasks'
    # begin and the commit's take it instead of reading it (``Coordinator.begin``'s known)
    begun: XidRecord | None = None
    # a stream's: the sink's last_committed (epoch, node version) as its planner read it,
    # which the task creating the micro-batch's xid checks instead of reading
    last_committed: tuple[int | None, int] | None = None

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
    return layout_from_urls([[options.connection.url]], options.table, None)
