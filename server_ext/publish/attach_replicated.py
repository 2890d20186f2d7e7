"""The ``attach_replicated`` strategy: ``ATTACH PARTITION ... FROM`` into a Replicated target.

A repeat relies on the server dropping blocks it already attached (block ids under the
table's ``/blocks``), so it must come within the deduplication window: a repeat after
``replicated_deduplication_window_seconds`` (less a margin) is ``InDoubtPublish``. Parts
the server drops as byte-identical to earlier ones are counted against the first intent's
block ids and copied with ``INSERT ... SELECT`` under their own intent and watermark
(not into a table that views read). Reasons: ``docs/design.md``, "``attach_replicated``
and content deduplication".
"""

from __future__ import annotations

import logging
import time

from server_ext.capabilities import known_settings
from server_ext.client.catalog import catalog_value
from server_ext.errors import KEEPER_EXCEPTION, ClickHouseError, InDoubtPublish, PartsDeduplicated
from server_ext.publish.attach_decision import AttachDecider, partition_watermarks
from server_ext.publish.publish_ledger import PublishRecord
from server_ext.publish.publish_steps import (
    STEP_AFTER_ATTACH,
    STEP_AFTER_INSERT,
    STEP_AFTER_INSERT_INTENT,
    alter_in_chunks,
)
from server_ext.publish.strategy_choice import Strategy
from server_ext.publish.strategy_run import StrategyRun
from server_ext.sql import sql_string
from server_ext.staging.manifest import PartitionManifest
from server_ext.staging.staging_tables import copied_columns, table_settings
from server_ext.types.target_table import TargetTable, describe_table

log = logging.getLogger(__name__)

WINDOW_SETTING = "replicated_deduplication_window_seconds"
WINDOW_MARGIN_SECONDS = 300.0  # clock skew and the server's cleanup period, at most
ONE_BLOCK_BYTES = 1 << 40  # squash a copied partition into one block, whatever its size
OPTIMIZE_ON_INSERT = "optimize_on_insert"


class AttachReplicatedRun(StrategyRun):
    strategy = Strategy.ATTACH_REPLICATED

    def require_within_window(self, record: PublishRecord, intended: list[str]) -> None:
        """Refuse a repeat that the server's deduplication may no longer cover.

        A repeat re-sends the ATTACH and relies on the target dropping the blocks the
        first try attached; the server forgets block ids older than
        ``replicated_deduplication_window_seconds`` (18.16: 7 days; 26.x: 1 hour). An
        intent older than that, less a margin for the clock and the cleanup's period,
        is ``InDoubtPublish``: an operator looks (``txsink resolve``) instead of a repeat
        that could double the rows. Intents written before they carried their time are
        repeated as before.
        """
        started = record.at
        if started is None:
            return
        window = self.dedup_window_seconds()
        age = time.time() - float(started)
        if age > window - min(WINDOW_MARGIN_SECONDS, window / 10):
            raise InDoubtPublish(
                target=self.target, staging=self.staging, partition_ids=intended,
                found=f"the publish began {age:.0f} s ago, beyond what the target's "
                      f"replicated_deduplication_window_seconds ({window:.0f} s) lets a "
                      "repeat rely on")

    def dedup_window_seconds(self) -> float:
        """The target's ``replicated_deduplication_window_seconds``: its own setting, else
        the server's default for MergeTree tables."""
        engine_full = catalog_value(self.client,
            "SELECT engine_full FROM system.tables WHERE database = "
            f"{sql_string(self.manifest.target_database)} AND name = "
            f"{sql_string(self.manifest.target_table)}", purpose="read target's settings")
        own = table_settings(engine_full).get(WINDOW_SETTING)
        if own is not None:
            return float(own.strip("'"))
        return float(self.client.query_value(
            "SELECT value FROM system.merge_tree_settings WHERE name = "
            f"{sql_string(WINDOW_SETTING)}", purpose="read the server's dedup window"))

    def publish_pending(self, pending: list[PartitionManifest], record: PublishRecord,
                        sealed: dict[str, bool]) -> None:
        intended = record.intended
        self.require_staged(pending, sealed, intended)
        unsealed = [p.partition_id for p in pending if not sealed[p.partition_id]]
        if unsealed:
            raise InDoubtPublish(target=self.target, staging=self.staging,
                                 partition_ids=unsealed,
                                 found="the staging partitions are gone before the mark")
        if record.deduplicated:  # an earlier run's ATTACH was dropped: copy them
            dropped = set(record.deduplicated)
            self.insert_dropped([p for p in pending if p.partition_id in dropped], record)
            return
        if intended:
            self.require_within_window(record, sorted(intended))
        blocks_path = self.blocks_path()
        current = self.block_ids(blocks_path)
        # the first run's ids and watermarks stay: a repeat counts what every run attached
        first = record.blocks_before if intended else None
        before = {p.partition_id: tuple(sorted(
            (first or {}).get(p.partition_id, current.get(p.partition_id, ()))))
            for p in pending}
        marks = record.attach_watermarks if first is not None else None
        if marks is None:
            marks = partition_watermarks(self.client, self.manifest.target_database,
                                         self.manifest.target_table,
                                         [p.partition_id for p in pending])
        # the first intent's time stays: the window runs from the first ATTACH
        self.put_intent(pending, record.published, at=record.at or round(time.time(), 3),
                        blocks_before=before, attach_watermarks=marks)
        try:
            alter_in_chunks(self.client, self.target, self.from_staging("ATTACH", pending),
                            purpose="attach partitions into target", retry=True)
        except ClickHouseError as exc:
            if exc.code == KEEPER_EXCEPTION and "Node exists" in str(exc):
                raise self.deduplicated([p.partition_id for p in pending],
                                        "within one staged partition") from exc
            raise
        self.on_step(STEP_AFTER_ATTACH)
        after = self.block_ids(blocks_path)
        legacy = intended if first is None else set()  # an intent without its block ids
        attached = {p.partition_id: self.attached_parts(p, before, after, legacy)
                    for p in pending}
        short = [p for p in pending if attached[p.partition_id] < len(p.parts)]
        if short:
            record = PublishRecord.intent(
                (), [*record.published, *(p.partition_id for p in pending if p not in short)],
                deduplicated=tuple(p.partition_id for p in short),
                dropped_parts=self.dropped_parts(short, attached, marks))
            record.store(self.ledger, self.key)
            self.insert_dropped(short, record)
            return
        self.mark_published()

    def dropped_parts(self, short: list[PartitionManifest], attached: dict[str, int],
                      marks: dict[str, int]) -> dict[str, tuple[str, ...]]:
        """Per partition the server took fewer parts of than staged, the parts it dropped:
        all, where it took none; else those without a counterpart above the partition's
        watermark from before the first ATTACH (``InDoubtPublish`` where that cannot be
        told)."""
        decider = AttachDecider(self.client, self.manifest, 0)
        dropped: dict[str, tuple[str, ...]] = {}
        undecided = []
        for partition in short:
            pid = partition.partition_id
            names = list(partition.part_names) if attached[pid] == 0 else (
                decider.dropped(partition, marks[pid], attached[pid]) if pid in marks
                else None)
            if names is None:
                undecided.append(pid)
            else:
                dropped[pid] = tuple(names)
        if undecided:
            raise InDoubtPublish(
                target=self.target, staging=self.staging, partition_ids=undecided,
                found="the server dropped some, not all, staged parts of each as duplicates "
                      "of byte-identical earlier parts, and the target's parts above the "
                      "watermark no longer show which")
        return dropped

    @staticmethod
    def attached_parts(partition: PartitionManifest, before: dict[str, tuple[str, ...]],
                       after: dict[str, set[str]], legacy: set[str]) -> int:
        """How many staged parts of ``partition`` the ATTACHes so far took: one new block
        id each, counted from before the first run's ATTACH."""
        pid = partition.partition_id
        new_ids = len(after.get(pid, set()) - set(before.get(pid, ())))
        if pid in legacy and new_ids == 0:  # a release before blocks_before: trusted as is
            return len(partition.parts)
        return min(new_ids, len(partition.parts))

    def insert_dropped(self, partitions: list[PartitionManifest], record: PublishRecord
                       ) -> None:
        """Copy the partitions whose parts the server dropped as duplicates with one
        ``INSERT ... SELECT`` each (``insert_deduplicate=0``), then mark published.

        A plain INSERT keeps such rows (the server deduplicates a retried INSERT, not what
        a view writes or a later epoch repeats), so the sink does too. The INSERT is not
        idempotent: as ``attach_marked`` does for its ATTACH, the intent carries each
        partition's block-number watermark, merges of the target are stopped around it,
        and a repeat decides from the parts above the watermark (``AttachDecider.inserted``).
        A table that materialized views read is not copied into: the INSERT would fire
        them a second time (their share of the epoch is published on its own). There the
        server's deduplication stands, as it does for a plain INSERT of such a block; a
        warning names the partitions.
        """
        pids = [p.partition_id for p in partitions]
        if self.feeds_views():
            log.warning("%s dropped staged parts of partitions %s from %s as duplicates of "
                        "byte-identical earlier parts, as it drops such an INSERT block; not "
                        "copied, since it feeds materialized views, which an INSERT would "
                        "fire again (they got the epoch's rows)", self.target, pids, self.staging)
            self.mark_published()
            return
        self.set_target_merges("STOP")
        try:
            copied: set[str] = set()
            if record.watermarks is not None:
                self.wait_for_interrupted_statement()
                decider = AttachDecider(self.client, self.manifest, 0)
                copied = {p.partition_id for p in partitions if p.partition_id in
                          record.watermarks and decider.inserted(
                              p, record.watermarks[p.partition_id], self.parts_of(p, record))}
                self.refuse_doubts(decider)
            to_copy = [p for p in partitions if p.partition_id not in copied]
            if to_copy:
                marks = partition_watermarks(self.client, self.manifest.target_database,
                                             self.manifest.target_table,
                                             [p.partition_id for p in to_copy])
                done = set(record.published) | copied
                PublishRecord.intent((), done, deduplicated=tuple(pids),
                                     dropped_parts=record.dropped_parts,
                                     watermarks=marks).store(self.ledger, self.key)
                self.on_step(STEP_AFTER_INSERT_INTENT)
                self.ledger.confirm()
                target = describe_table(self.client, f"{self.manifest.target_database}."
                                                     f"{self.manifest.target_table}")
                for partition in to_copy:
                    self.insert_partition(target, partition, self.parts_of(partition, record))
                self.on_step(STEP_AFTER_INSERT)
        except InDoubtPublish:
            self.set_target_merges("START")  # the evidence is in the error
            raise
        log.warning("%s dropped staged parts of partitions %s from %s as duplicates of "
                    "byte-identical earlier parts; their rows were copied by INSERT",
                    self.target, pids, self.staging)
        self.mark_published()
        self.set_target_merges("START")

    @staticmethod
    def parts_of(partition: PartitionManifest, record: PublishRecord) -> tuple[str, ...]:
        """The staged parts of ``partition`` to copy: those the server dropped."""
        return (record.dropped_parts or {}).get(partition.partition_id, partition.part_names)

    def insert_partition(self, target: TargetTable, partition: PartitionManifest,
                         part_names: tuple[str, ...]) -> None:
        """Staged parts of one partition into the target (described as ``target``) as one
        block: one part, never deduplicated."""
        names, copy_settings = copied_columns(target)
        settings: dict[str, object] = {
            "insert_deduplicate": 0, "min_insert_block_size_rows": 0,
            "min_insert_block_size_bytes": ONE_BLOCK_BYTES, **copy_settings}
        if OPTIMIZE_ON_INSERT in known_settings(self.client, (OPTIMIZE_ON_INSERT,)):
            settings[OPTIMIZE_ON_INSERT] = 0  # the copy keeps the staged rows as they are
        self.client.execute(
            f"INSERT INTO {self.target} ({names}) SELECT {names} FROM {self.staging} "
            f"WHERE _partition_id = {sql_string(partition.partition_id)} AND _part IN "
            f"({', '.join(sql_string(name) for name in part_names)})",
            purpose="copy deduplicated partition into target", settings=settings,
            retry=False)

    def feeds_views(self) -> bool:
        """Whether a materialized view reads the target."""
        return bool(int(catalog_value(self.client,
            "SELECT count() FROM system.tables WHERE database = "
            f"{sql_string(self.manifest.target_database)} AND name = "
            f"{sql_string(self.manifest.target_table)} AND notEmpty(dependencies_table)",
            purpose="look for materialized views reading target")))

    def blocks_path(self) -> str:
        rows = self.client.query_rows(
            "SELECT zookeeper_path FROM system.replicas WHERE database = "
            f"{sql_string(self.manifest.target_database)} AND table = "
            f"{sql_string(self.manifest.target_table)}",
            purpose="read replication path of target",
        )
        if not rows:
            raise ValueError(f"{self.target} is not a Replicated table")
        return rows[0]["zookeeper_path"].rstrip("/") + "/blocks"

    def block_ids(self, blocks_path: str) -> dict[str, set[str]]:
        """Deduplication ids the server keeps for attached parts, per partition id."""
        rows = self.client.query_rows(
            f"SELECT name FROM system.zookeeper WHERE path = {sql_string(blocks_path)}",
            purpose="read deduplication block ids of target",
        )
        ids: dict[str, set[str]] = {}
        for row in rows:
            pid, marker, _ = row["name"].partition("_replace_from_")
            if marker:
                ids.setdefault(pid, set()).add(row["name"])
        return ids

    def deduplicated(self, partition_ids: list[str], how: str) -> PartsDeduplicated:
        return PartsDeduplicated(
            f"{self.target} dropped staged parts of partitions {partition_ids} from "
            f"{self.staging} as duplicates of byte-identical parts ({how}); their rows are "
            "not in the target. Decide with resolve_partition",
            target=self.target, staging=self.staging, partition_ids=partition_ids,
        )
