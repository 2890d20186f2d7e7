"""``bad_rows=quarantine``: bad rows kept in the quarantine table, exactly once.

The quarantine table is one more table of a branch's staged tree, as a materialized
view's table is (``server_ext.ddl.views``, ``ViewBranch`` in ``txsink/core/shard_branch.py``): each
task branch that meets a bad row gets a *quarantine share*, a branch of its own
(``<branch id>-q``) with its own staging table, registered before that table exists,
sealed against the count of rows sent, prepared with a ``StagedBranch`` payload and
listed in the task's commit message. From there nothing is special: the decision's
winners include the shares, the driver combines them per server and table, they are
published by the same strategies and recovery, and a losing or aborted branch's share
is rolled back with it. The writer inserts the bad rows into the share's staging
itself (``server_ext.staging.BranchWriter(on_bad_rows=…)``), no staging view.

Bound: each task counts its bad rows and fails early past ``max_bad_rows``; its commit
message carries the count, and the driver refuses to decide an xid whose tasks' sum is
past it (:func:`check_bound`), so the write is aborted with nothing visible.

On a sharded target each shard branch's share stages on that branch's server and is
published there, so a bad row lands in the quarantine table of the shard its branch
wrote to. The table is therefore needed on every replica of every shard: it is created
where missing, as a ``ReplicatedMergeTree`` on a shard of several replicas (so a row
published on one replica is read from any), after every server was checked.

Refused before any xid is opened: a quarantine table that feeds materialized views
(its share has no staged view tree, and a view must never miss rows silently), an
overwrite (its publish replaces whole partitions of every table it writes, the
quarantine table's too), a quarantine table of another schema
(``server_ext.ddl.ensure_quarantine_table``), a plain one on a shard of several replicas,
and a replicated one that cannot be created (no Keeper, no ``{shard}``/``{replica}``
macros): each naming the shard and server.

Where it runs: :func:`planned` on the driver while it plans (a repeat finds the table
made), :func:`check_bound` on the driver before its decision; a :class:`QuarantineShare`
in one task attempt, on that attempt's thread, like the branch it belongs to.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import pyarrow as pa

import server_ext
from server_ext.ddl import (
    REPLICA_MACROS,
    KeptRows,
    discover,
    ensure_quarantine_table,
    find_quarantine_table,
    quarantine_records,
    quarantine_schema_problem,
)
from server_ext.publish import Strategy, supported_strategies, target_engine_problem
from server_ext.sharding import ShardLayout
from server_ext.sql import shown_name
from server_ext.staging import publish_problem
from server_ext.types import BadRows
from txsink.core import connections
from txsink.core.messages import BranchMessage
from txsink.core.plan import WritePlan
from txsink.core.staged_table import StagedTable, create_staging, staging_name
from txsink.options import OptionError, SinkOptions

log = logging.getLogger(__name__)


#: Bad rows taken before their quarantine records are built and handed to the writer:
#: building them per batch costs ~1–2 ms a batch whatever its bad rows (JSON a column at
#: a time); this many at once keeps what waits in memory to a few MB of rows.
RECORD_ROWS = 10_000


class TooManyBadRows(ValueError):
    """A write has more bad rows than ``max_bad_rows``: it fails, nothing is visible."""


def planned(options: SinkOptions, layout: ShardLayout, overwrite: bool
            ) -> tuple[server_ext.TargetTable | None, Strategy | None]:
    """The quarantine table (created when missing on every replica of every shard of
    ``layout``) and its publish strategy, or ``(None, None)`` with ``bad_rows=fail``.
    Runs before any xid is opened; every server is checked before any table is created.
    """
    if options.bad_rows != "quarantine" or not options.quarantine_table:
        return None, None
    if overwrite:
        raise OptionError("option bad_rows=quarantine cannot be used with mode('overwrite'), "
                          "which replaces whole partitions of every table it publishes "
                          "into. Nothing was staged")
    name = options.quarantine_table
    several = sum(len(shard.replicas) for shard in layout.shards) > 1
    servers = [_Server(shard.index, url, len(shard.replicas) > 1, several)
               for shard in layout.shards for url in shard.replicas]
    found = {s.url: _checked(options, s, name) for s in servers}
    for server in servers:  # every server checked: now create what is missing
        if found[server.url] is None:
            found[server.url] = ensure_quarantine_table(server.client(options), name,
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

    def __init__(self, shard: int, url: str, replicated: bool, several: bool) -> None:
        self.url = url
        self.replicated = replicated  # its shard has several replicas
        self.where = f" on shard {shard + 1} ({url})" if several else ""  # alone: the url

    def client(self, options: SinkOptions):
        return connections.clickhouse(options, self.url)


def _checked(options: SinkOptions, server: _Server, name: str
             ) -> server_ext.TargetTable | None:
    """The quarantine table on ``server`` checked (None: missing, and creatable there)."""
    client = server.client(options)
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
    client = server.client(options)
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


def check_bound(options: SinkOptions, messages: Sequence[BranchMessage]) -> None:
    """Refuse the decision of a write whose tasks quarantined more than ``max_bad_rows``
    rows in all (each task counted its own)."""
    total = sum(m.bad_rows for m in messages)
    if options.bad_rows == "quarantine" and total > options.max_bad_rows:
        raise TooManyBadRows(bound_message(total, options.max_bad_rows))


def bound_message(count: int, bound: int, *, task: bool = False) -> str:
    where = "one task of this write has" if task else "this write has"
    return (f"{where} {count} bad rows, more than max_bad_rows={bound}: the write is "
            "aborted and none of its rows (good or bad) becomes visible. Fix the input or "
            "raise max_bad_rows")


class QuarantineShare(StagedTable):
    """A task branch's quarantine share: its bad rows, staged into a copy of the
    quarantine table (registered, then created, at the first bad row)."""

    def __init__(self, plan: WritePlan, epoch: int, parent_id: str, server: str) -> None:
        assert plan.quarantine is not None and plan.quarantine_strategy is not None
        self.plan = plan
        self.epoch = epoch
        self.table: server_ext.TargetTable = plan.quarantine
        self.strategy = plan.quarantine_strategy
        self.branch_id = f"{parent_id}-q"
        self.parent_id = parent_id
        self.server = server
        self.view = ""  # filled by the writer, not by a staging view
        self.staging = staging_name(plan, epoch, self.branch_id)
        self.client = connections.clickhouse(plan.options, server)
        self.writer: server_ext.BranchWriter | None = None
        self.count = 0
        self.pending: list[KeptRows] = []  # taken, not yet handed to the writer
        self.pending_rows = 0
        self.register: Callable[[QuarantineShare], None] = lambda share: None

    def keep(self, batch: pa.RecordBatch, bad: BadRows, first_row: int) -> None:
        """Take the bad rows of ``batch`` (whose first row is the task's
        ``first_row``-th) to be staged; fail at once past the write's bound. Their
        quarantine records are built for many batches at once (:meth:`_stage`)."""
        self.count += len(bad)
        bound = self.plan.options.max_bad_rows
        if self.count > bound:
            raise TooManyBadRows(bound_message(self.count, bound, task=True))
        if self.writer is None:
            self.register(self)  # before its staging exists, like every branch
            caps = server_ext.detect_capabilities(self.client)
            self.writer = create_staging(self.client, self.table, self.staging,
                                         caps).writer(self.plan)
        self.pending.append(KeptRows.of(bad, batch, first_row))
        self.pending_rows += len(bad)
        if self.pending_rows >= RECORD_ROWS:
            self._stage()

    def _stage(self) -> None:
        """Hand the pending bad rows to the writer as quarantine records."""
        if self.writer is not None and self.pending:
            self.writer.write(quarantine_records(self.pending, sink_id=self.plan.sink_id,
                                             epoch=self.epoch, task=self.parent_id))
        self.pending, self.pending_rows = [], 0

    def flush(self) -> None:
        self._stage()
        if self.writer is not None:
            self.writer.flush()

    def seal(self, partitions: dict[str, server_ext.PartitionManifest]
             ) -> server_ext.Manifest:
        """The manifest of the staged bad rows (``partitions``: its staging table's, as
        just read), checked against the count sent."""
        assert self.writer is not None
        return server_ext.seal(self.client, self.table, self.writer.staging_table,
                               expected_rows=self.writer.rows_sent, partitions=partitions)

    def drop(self) -> None:
        self.pending, self.pending_rows = [], 0
        if self.writer is not None:
            self.writer.abort()
        server_ext.rollback(self.client, self.staging)
