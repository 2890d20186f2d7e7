"""The branch kinds of a task attempt: a shard's branch and its views' shares.

A :class:`ShardBranch` is the attempt's rows for one shard, staged on one replica
(:func:`pick_replica`) under a branch id of its own (:func:`new_branch_id`); each
materialized view the target feeds gets a :class:`ViewBranch` in it, a staging copy of the
view's table filled by a staging view, created before the first row so that every row
fires it; ``bad_rows=quarantine`` adds a ``QuarantineShare`` (``txsink.core.quarantine_share``).
Each is a :class:`~txsink.core.staged_table.StagedTable`. They live in one task attempt
(``txsink.core.attempt`` opens, seals and prepares them) and are used by its thread alone;
nothing they stage is visible before the driver publishes. Creating a staging table again
finds it; a seal reads what is staged and changes nothing; a drop of what is gone is a
no-op.
"""

from __future__ import annotations

import random
import uuid
from functools import cached_property

import pyarrow as pa

import server_ext
from server_ext.ddl import ViewNode, staging_view_ddl
from server_ext.sharding import Shard
from server_ext.staging import (
    expire_rows,
    merges_at_insert,
    partition_bound_settings,
    staging_qualified,
)
from server_ext.types import BadRows
from txsink.core import connections, crashpoints
from txsink.core.quarantine_share import QuarantineShare
from txsink.core.staged_table import StagedTable, create_staging, staging_name
from txsink.core.write_plan import WritePlan, send_columns

StagedParts = dict[str, dict[str, server_ext.PartitionManifest]]  # staging table: parts


def new_branch_id(partition: int, attempt: int, shard: int = 0) -> str:
    """A new branch id of a task attempt's branch for ``shard``."""
    return f"p{partition}-a{attempt}-s{shard}-{uuid.uuid4().hex[:8]}"


def pick_replica(shard: Shard, partition: int, attempt: int, choice: str,
                 overwrite: bool) -> str:
    """The replica a branch stages on (and is later published from).

    ``round_robin`` spreads a job's tasks over the replicas and moves a retried attempt
    to the next replica; ``random`` picks any. Overwrite pins every shard to its first
    replica: its publish combines all the shard's branches in one staging table.
    """
    if overwrite or len(shard.replicas) == 1:
        return shard.replicas[0]
    if choice == "random":
        return random.choice(shard.replicas)
    return shard.replicas[(partition + attempt + shard.index) % len(shard.replicas)]


class ViewBranch(StagedTable):
    """The share of one materialized view (``server_ext.ddl.ViewNode``) in a branch:
    a staging copy of the view's table, filled by a staging view over its source's
    staging table. A branch of its own in the coordinator, published into the view's
    table under the same decision."""

    def __init__(self, plan: WritePlan, epoch: int, parent_id: str,
                 node: ViewNode) -> None:
        self.node = node
        self.table = node.table
        self.strategy = plan.view_strategies[node.index]
        self.branch_id = f"{parent_id}-v{node.index}"
        self.staging = staging_name(plan, epoch, self.branch_id)
        self.view = staging_name(plan, epoch, f"{self.branch_id}-mv")


class ShardBranch(StagedTable):
    """One branch: this attempt's rows for one shard, staged on one replica, with the
    shares of the materialized views the target feeds (``views``), created before the
    first row so that every row fires them."""

    def __init__(self, plan: WritePlan, epoch: int, branch_id: str, server: str) -> None:
        self.plan = plan
        self.epoch = epoch
        self.branch_id = branch_id
        self.server = server
        self.staging = staging_name(plan, epoch, branch_id)
        self.client = connections.clickhouse(plan.options, server)
        self.writer: server_ext.BranchWriter | None = None
        self.strategy = plan.strategy
        self.view = ""  # filled by the rows, not by a staging view
        self.views = [ViewBranch(plan, epoch, branch_id, node) for node in plan.views]
        # bad_rows=quarantine: the bad rows' share, a branch of its own (quarantine_share)
        self.quarantine = (QuarantineShare(plan, epoch, branch_id, server)
                           if plan.quarantine is not None else None)
        self.rows_seen = 0  # rows handed to write: the next batch's first row number

    @cached_property
    def table(self) -> server_ext.TargetTable:
        return self.plan.table or server_ext.describe_table(self.client, self.plan.target)

    def write(self, batch: pa.RecordBatch) -> None:
        if self.writer is None:
            target = self.table
            caps = server_ext.detect_capabilities(self.client)
            columns = send_columns(target, self.plan.columns)
            if self.quarantine is None:  # bad values fail before its staging table exists
                server_ext.checked_batch(columns, batch, caps.value_ranges)
            staging = create_staging(self.client, target, self.staging, caps)
            self.create_views(staging.qualified)
            crashpoints.hit(crashpoints.BRANCH_AFTER_VIEWS)
            given = dict(self.plan.options.connection.insert_settings)
            bound = partition_bound_settings(
                self.client, self.plan.options.publish.max_partitions_per_job, given)
            self.writer = staging.writer(
                self.plan, target_columns=columns, extra_settings={**given, **bound},
                repeat_inserts=not self.views,  # the views' shares have no count to seal
                on_bad_rows=self.keep_bad if self.quarantine is not None else None,
            )
        self.writer.write(batch)
        self.rows_seen += batch.num_rows

    def keep_bad(self, batch: pa.RecordBatch, bad: BadRows) -> None:
        """Hand the bad rows of the batch being written to the quarantine share."""
        assert self.quarantine is not None
        self.quarantine.keep(batch, bad, self.rows_seen)

    def create_views(self, staging: str) -> None:
        """Stage the view tree: each view's table, then the staging view that fills it
        from its source's staging table (parents first, so every source exists)."""
        tables = {-1: staging}
        for share in self.views:
            tables[share.node.index] = server_ext.create_staging_table(
                self.client, share.table, share.staging, mirror_engine=True)
            self.client.execute(staging_view_ddl(
                share.node, staging_qualified(share.view),
                tables[share.node.parent], tables[share.node.index]),
                purpose=f"create staging view for {share.node.view_name}")

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.send()  # the bad rows' INSERT goes while the server takes these
        if self.quarantine is not None:
            self.quarantine.flush()
        if self.writer is not None:
            self.writer.flush()

    def staged(self) -> list[StagedTable]:
        """This branch and its shares whose staging tables hold rows once flushed (the
        quarantine share may hold some when the branch got none: rows without a shard)."""
        parts: list[StagedTable] = [
            part for part in (self, *self.views)
            if self.writer is not None and part.table.engine != "Null"]
        if self.quarantine is not None and self.quarantine.writer is not None:
            parts.append(self.quarantine)
        return parts

    def quarantined(self, staged: StagedParts
                    ) -> list[tuple[QuarantineShare, server_ext.Manifest]]:
        """The sealed quarantine share, if this branch met bad rows."""
        if self.quarantine is None or self.quarantine.writer is None:
            return []
        return [(self.quarantine,
                 self.quarantine.seal(staged.get(self.quarantine.staging, {})))]

    @property
    def bad_rows(self) -> int:
        return self.quarantine.count if self.quarantine is not None else 0

    @property
    def shares(self) -> tuple[str, ...]:
        """The branch ids of its shares that are prepared: views', then quarantine's."""
        quarantined = self.quarantine is not None and self.quarantine.writer is not None
        return (*(share.branch_id for share in self.views),
                *((self.quarantine.branch_id,) if quarantined else ()))

    def read_staged(self) -> StagedParts:
        """The parts of every staging table of this branch that holds rows once flushed
        (its own, its views', its quarantine share's), read in one query for the seals."""
        names = [part.staging for part in self.staged()]
        return server_ext.read_staged_tables(self.client, server_ext.STAGING_DATABASE, names,
                                             purpose="seal branch")

    def seal(self, staged: StagedParts) -> tuple[server_ext.Manifest, int, int]:
        """(manifest, rows, bytes) of the flushed staging table (empty: no rows came, or
        a ``Null`` target, whose rows live only in its views); ``staged``: what
        :meth:`read_staged` read."""
        if self.writer is None or self.table.engine == "Null":
            manifest = server_ext.Manifest.empty(self.table, self.staging)
            return manifest, self.writer.rows_sent if self.writer else 0, 0
        rows = self.writer.rows_sent
        # a merging variant may keep fewer rows than were sent (staging.merges_at_insert)
        expected = None if merges_at_insert(self.writer.target) else rows
        partitions = staged.get(self.staging, {})
        expired = expire_rows(self.client, self.writer.target, self.writer.staging_table,
                              partitions, expected)
        if expired is not partitions:  # the TTL took rows: the manifest counts what is left
            partitions, expected = expired, None
        manifest = server_ext.seal(self.client, self.writer.target, self.writer.staging_table,
                                   expected_rows=expected, partitions=partitions)
        return manifest, manifest.rows if expected is None else rows, self.writer.bytes_sent

    def seal_views(self, staged: StagedParts) -> list[tuple[ViewBranch, server_ext.Manifest]]:
        """The manifest of each view's staging table: what the staging views wrote."""
        sealed = []
        for share in self.views:
            if self.writer is None or share.table.engine == "Null":
                manifest = server_ext.Manifest.empty(share.table, share.staging)
            else:
                partitions = expire_rows(self.client, share.table, share.staging,
                                         staged.get(share.staging, {}), None)
                manifest = server_ext.seal(self.client, share.table, share.staging,
                                           expected_rows=None, partitions=partitions)
            sealed.append((share, manifest))
        return sealed

    def drop(self) -> None:
        """Drop this branch's staging: the quarantine share's, the views' (view first),
        then its own."""
        if self.quarantine is not None:
            self.quarantine.drop()
        for share in reversed(self.views):
            server_ext.rollback(self.client, share.staging, view=share.view)
        server_ext.rollback(self.client, self.staging)
