"""A staged table: one staging table of a task attempt, prepared as a branch of its own.

A task attempt stages three kinds of table (``txsink.core.shard_branch``: a shard's rows
and each materialized view's share; ``txsink.core.quarantine_share``: the bad rows); each
implements :class:`StagedTable`, which is all the attempt's prepare reads of it. They run
in the task attempt only, one thread each (the attempt's digests and contributions read
them from pool threads, never change them). :func:`create_staging` is where a table that
rows are inserted into gets its staging table and writer; creating it again finds the
table (``server_ext.staging.create_staging_table`` is idempotent).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import server_ext
from server_ext.capabilities import Capabilities
from server_ext.client import Client
from server_ext.publish import Strategy
from txsink.core.write_plan import WritePlan


class StagedTable(Protocol):
    """What a staged table records in its ``Prepared`` branch and what seals it."""

    branch_id: str  # its own branch in the coordinator
    table: server_ext.TargetTable  # the table it is published into
    staging: str  # its staging table's name (unquoted)
    strategy: Strategy  # the publish strategy of ``table``
    view: str  # the staging view that fills it; "" when rows are inserted into it


def staging_name(plan: WritePlan, epoch: int, branch_id: str) -> str:
    """The staging table of ``branch_id`` in ``epoch`` (unique per branch and sink)."""
    return server_ext.staging_table_name(plan.sink_id, epoch, branch_id,
                                         root=plan.options.store.root_identity)


@dataclass(frozen=True)
class Staging:
    """A created staging table that rows are inserted into, ready for its writer."""

    client: Client
    table: server_ext.TargetTable
    qualified: str  # the staging table, qualified and quoted
    caps: Capabilities
    dedup_token: str | None  # None: the server keeps no deduplication window

    def writer(self, plan: WritePlan, **options: Any) -> server_ext.BranchWriter:
        """The writer of the staging table, with the plan's block size and encoding;
        ``options``: the rest of ``BranchWriter``'s."""
        return server_ext.BranchWriter(
            self.client, self.table, self.qualified, self.caps,
            block_rows=plan.options.connection.insert_block_rows, dedup_token=self.dedup_token,
            encoding=plan.options.connection.compression, **options)


def create_staging(client: Client, table: server_ext.TargetTable, staging: str,
                   caps: Capabilities) -> Staging:
    """Create the staging table ``staging`` for ``table`` on ``client``'s server, of the
    target's engine, with a deduplication window where the server has one: a repeated
    INSERT (same token: the table's name) after a lost answer is then dropped."""
    dedup = caps.insert_deduplication_token and caps.non_replicated_deduplication_window
    qualified = server_ext.create_staging_table(client, table, staging, dedup_window=dedup,
                                                mirror_engine=True)
    return Staging(client, table, qualified, caps, staging if dedup else None)
