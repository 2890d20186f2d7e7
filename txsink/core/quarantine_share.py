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
wrote to; the driver made that table on every server while it planned
(``txsink.core.quarantine_plan``, with the refusals).

Where it runs: :func:`check_bound` on the driver before its decision; a
:class:`QuarantineShare` in one task attempt, on that attempt's thread, like the branch it
belongs to.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pyarrow as pa

import server_ext
from server_ext.ddl import KeptRows, quarantine_records
from server_ext.types import BadRows
from txsink.core import connections
from txsink.core.messages import BranchMessage
from txsink.core.staged_table import StagedTable, create_staging, staging_name
from txsink.core.write_plan import WritePlan
from txsink.options import SinkOptions

#: Bad rows taken before their quarantine records are built and handed to the writer:
#: building them per batch costs ~1–2 ms a batch whatever its bad rows (JSON a column at
#: a time); this many at once keeps what waits in memory to a few MB of rows.
RECORD_ROWS = 10_000


class TooManyBadRows(ValueError):
    """A write has more bad rows than ``max_bad_rows``: it fails, nothing is visible."""


def check_bound(options: SinkOptions, messages: Sequence[BranchMessage]) -> None:
    """Refuse the decision of a write whose tasks quarantined more than ``max_bad_rows``
    rows in all (each task counted its own)."""
    total = sum(m.bad_rows for m in messages)
    if options.bad_rows.mode == "quarantine" and total > options.bad_rows.max_bad_rows:
        raise TooManyBadRows(bound_message(total, options.bad_rows.max_bad_rows))


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
        bound = self.plan.options.bad_rows.max_bad_rows
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
