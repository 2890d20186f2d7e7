"""Dynamic partition overwrite: replace every partition present in the written data.

Each partition present in the winning branches' data is replaced as a whole with
``REPLACE PARTITION ... FROM``, which is idempotent; partitions that several branches
staged are first combined in one staging table per xid. Partitions absent from the data
are left untouched, and no partition is ever empty in between.
"""

from __future__ import annotations

import time

from server_ext.client.client_protocol import SqlClient
from server_ext.errors import StagingChanged
from server_ext.old_server.leftover_clones import repeat_past_leftover_clones
from server_ext.publish.publish_ledger import PUBLISHED, PublishLedger, PublishRecord, ledger_key
from server_ext.publish.publish_steps import (
    STEP_AFTER_ATTACH,
    STEP_AFTER_DROP,
    STEP_AFTER_MARK,
    STEP_BEFORE_PARTITION,
    PublishReport,
    StepHook,
    alter_in_chunks,
    drop_partitions,
    no_step,
)
from server_ext.sql import qualified_name, sql_string
from server_ext.staging.manifest import Manifest, PartitionManifest
from server_ext.staging.seal import require_sealed
from server_ext.staging.staging_tables import create_staging_table, rollback
from server_ext.types.target_table import describe_table


def publish_overwrite(
    client: SqlClient,
    manifests: list[Manifest],
    combined_staging_table: str | None,
    ledger: PublishLedger,
    *,
    on_step: StepHook | None = None,
) -> PublishReport:
    """Replace every partition present in the winning branches' data (dynamic overwrite).

    ``manifests`` are all winning branches of one xid, for one target.
    ``combined_staging_table`` (required with more than one manifest) names the xid's
    publish record in the ledger and, when a partition was staged by several branches, the
    table in the staging database where it is assembled first: ``REPLACE PARTITION`` from
    the first branch, ``ATTACH PARTITION`` from the others, so that a repeat rebuilds it
    from scratch. Then one ``REPLACE PARTITION`` per partition into the target, which a
    repeat may do again with the same result. Partitions absent from every manifest are
    left untouched. Re-runnable after any crash.
    """
    if len(manifests) > 1 and not combined_staging_table:
        raise ValueError("publish_overwrite of several manifests needs combined_staging_table")
    if not manifests:
        return PublishReport("replace", "")
    return _OverwritePublisher(client, manifests, combined_staging_table, ledger,
                               on_step or no_step).run()


Sources = dict[str, list[tuple[Manifest, PartitionManifest]]]


class _OverwritePublisher:
    def __init__(self, client: SqlClient, manifests: list[Manifest], combined: str | None,
                 ledger: PublishLedger, on_step: StepHook) -> None:
        targets = {(m.target_database, m.target_table) for m in manifests}
        if len(targets) > 1:
            raise ValueError(f"manifests of one overwrite must share a target, got {targets}")
        self.client = client
        self.manifests = manifests
        self.combined = combined
        self.ledger = ledger
        self.on_step = on_step
        self.key = ledger_key(combined or manifests[0].staging_table)
        self.database, self.table = next(iter(targets))
        self.target = qualified_name(self.database, self.table)

    def sources(self) -> Sources:
        by_partition: Sources = {}
        for manifest in self.manifests:
            for partition in manifest.partitions:
                by_partition.setdefault(partition.partition_id, []).append((manifest, partition))
        return dict(sorted(by_partition.items()))

    def run(self) -> PublishReport:
        started = time.perf_counter()
        report = PublishReport("replace", self.target)
        sources = self.sources()
        if not sources:
            return report
        record = PublishRecord.load(self.ledger, self.key)
        if record is not None and record.is_published:
            report.already_published = list(sources)
        else:
            # never REPLACE from a source that lost its rows: that would empty the target
            require_sealed(self.client, self.manifests,
                           purpose="read staged parts before overwrite")
            self.on_step(STEP_BEFORE_PARTITION)

            def replace(_: bool) -> None:  # assembling and replacing repeat as a whole
                commands = [f"REPLACE PARTITION ID {sql_string(pid)} FROM {origin}"
                            for pid, origin in self.assemble(sources).items()]
                alter_in_chunks(self.client, self.target, commands,
                                purpose="replace partitions of target", retry=True)

            repeat_past_leftover_clones(replace, self.target)
            self.on_step(STEP_AFTER_ATTACH)
            PublishRecord(PUBLISHED).store(self.ledger, self.key)
            self.on_step(STEP_AFTER_MARK)
            report.published = list(sources)
            report.rows = sum(p.rows for parts in sources.values() for _, p in parts)
        self.drop_sources()
        self.on_step(STEP_AFTER_DROP)
        report.seconds = time.perf_counter() - started
        return report

    def assemble(self, sources: Sources) -> dict[str, str]:
        """Per partition, the quoted table holding exactly its staged rows of all branches."""
        origin = {pid: qualified_name(parts[0][0].staging_database, parts[0][0].staging_table)
                  for pid, parts in sources.items()}
        shared = {pid: parts for pid, parts in sources.items() if len(parts) > 1}
        if not shared:
            return origin
        assert self.combined is not None
        combined = create_staging_table(self.client, describe_table(
            self.client, f"{self.database}.{self.table}"), self.combined)
        first, others = [], []
        for pid, parts in shared.items():
            for index, (manifest, _) in enumerate(parts):
                command = (f"{'REPLACE' if index == 0 else 'ATTACH'} PARTITION ID "
                           f"{sql_string(pid)} FROM "
                           f"{qualified_name(manifest.staging_database, manifest.staging_table)}")
                (first if index == 0 else others).append(command)
            origin[pid] = combined
        alter_in_chunks(self.client, combined, first, purpose="reset combined partitions",
                        retry=True)
        alter_in_chunks(self.client, combined, others, purpose="combine branches' partitions",
                        retry=False)
        self.check_combined(combined, shared)
        return origin

    def check_combined(self, combined: str, shared: Sources) -> None:
        rows = self.client.query_rows(
            f"SELECT _partition_id AS pid, count() AS n FROM {combined} GROUP BY _partition_id",
            purpose="count combined partitions",
        )
        found = {row["pid"]: int(row["n"]) for row in rows}
        wrong = [pid for pid, parts in shared.items()
                 if found.get(pid, 0) != sum(p.rows for _, p in parts)]
        if wrong:
            raise StagingChanged(
                f"combined staging {combined} does not hold the staged rows of {wrong}",
                target=self.target, staging=combined, partition_ids=wrong,
            )

    def drop_sources(self) -> None:
        for manifest in self.manifests:
            drop_partitions(self.client,
                            qualified_name(manifest.staging_database, manifest.staging_table),
                            manifest.partition_ids)
        if self.combined:
            rollback(self.client, self.combined)
