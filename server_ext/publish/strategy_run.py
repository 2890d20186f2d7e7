"""The run every publish strategy shares: skip what the ledger says is published, check
staging against the manifest, publish the rest (the strategy's part), mark, drop staging.

The ledger record is one per staging table: an intent before the statement that makes
rows visible, ``published`` after it where the run goes on (``move`` ends with that
statement: its intent and the emptied staging say it); a published staging table is
never attached again.
All partitions go into one ``ALTER`` (chunks of ``MAX_COMMANDS_PER_ALTER``); the commands
of one ALTER are not atomic together, so a repeat decides each partition on its own
(``attach_decision``). One run per call, in one thread; repeats may come from any process.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from server_ext.client.client_protocol import SqlClient
from server_ext.errors import InDoubtPublish, StagingChanged
from server_ext.publish.attach_decision import AttachDecider
from server_ext.publish.publish_ledger import PUBLISHED, PublishLedger, PublishRecord, ledger_key
from server_ext.publish.publish_steps import (
    STEP_AFTER_DROP,
    STEP_AFTER_INTENT,
    STEP_AFTER_MARK,
    STEP_BEFORE_PARTITION,
    PublishReport,
    StepHook,
    drop_partitions,
)
from server_ext.sql import qualified_name, sql_string
from server_ext.staging.manifest import Manifest, PartitionManifest
from server_ext.staging.seal import read_staged_partitions

log = logging.getLogger(__name__)

STATEMENT_WAIT_SECONDS = 60.0  # how long a repeat waits for an interrupted ALTER to end


class StrategyRun:
    """The run shared by all strategies: skip what is published, check, publish, drop."""

    strategy = ""
    drops_staging = True  # MOVE leaves nothing to drop

    def __init__(self, client: SqlClient, manifest: Manifest, ledger: PublishLedger,
                 on_step: StepHook) -> None:
        self.client = client
        self.manifest = manifest
        self.ledger = ledger
        self.on_step = on_step
        self.key = ledger_key(manifest.staging_table)
        self.target = qualified_name(manifest.target_database, manifest.target_table)
        self.staging = qualified_name(manifest.staging_database, manifest.staging_table)

    def run(self) -> PublishReport:
        started = time.perf_counter()
        report = PublishReport(self.strategy, self.target)
        if self.manifest.is_empty:
            return report
        record = PublishRecord.load(self.ledger, self.key) or PublishRecord.intent((), ())
        if record.is_published:
            report.already_published = list(self.manifest.partition_ids)
        else:
            done = set(record.published)
            pending = [p for p in self.manifest.partitions if p.partition_id not in done]
            report.already_published = [pid for pid in self.manifest.partition_ids
                                        if pid in done]
            if pending:
                sealed = self.sealed(pending)
                self.on_step(STEP_BEFORE_PARTITION)
                earlier = self.publish_pending(pending, record, sealed) or set()
                report.already_published += [p.partition_id for p in pending
                                             if p.partition_id in earlier]
                pending = [p for p in pending if p.partition_id not in earlier]
            else:  # every partition was resolved by an operator
                self.mark_published()
            report.published = [p.partition_id for p in pending]
            report.rows = sum(p.rows for p in pending)
        if self.drops_staging:
            drop_partitions(self.client, self.staging, self.manifest.partition_ids)
            self.on_step(STEP_AFTER_DROP)
        report.seconds = time.perf_counter() - started
        log.info("published %d partitions (%d rows) of %s into %s with %s in %.3f s",
                 len(report.published), report.rows, self.staging, self.target,
                 self.strategy, report.seconds)
        return report

    def publish_pending(self, pending: list[PartitionManifest], record: PublishRecord,
                        sealed: dict[str, bool]) -> set[str] | None:
        """Make ``pending`` visible and record it (``mark_published``, where the
        strategy's own records do not say it already); returns the partitions an earlier
        run made visible, as this one found (None: none)."""
        raise NotImplementedError

    def read_staged(self) -> dict[str, PartitionManifest]:
        return read_staged_partitions(
            self.client, self.manifest.staging_database, self.manifest.staging_table,
            purpose="read staged parts before publish",
        )

    def sealed(self, pending: list[PartitionManifest],
               staged: dict[str, PartitionManifest] | None = None) -> dict[str, bool]:
        """Per partition: True if staging holds exactly the sealed parts, False if none
        (``staged``: staging's parts as the caller read them, else read now)."""
        staged = self.read_staged() if staged is None else staged
        result = {}
        for partition in pending:
            found = staged.get(partition.partition_id)
            if found is not None and found.part_names != partition.part_names:
                raise StagingChanged(
                    f"staging {self.staging} partition {partition.partition_id!r} holds parts "
                    f"{list(found.part_names)} but {list(partition.part_names)} were sealed",
                    target=self.target, staging=self.staging,
                    partition_ids=[partition.partition_id],
                )
            result[partition.partition_id] = found is not None
        return result

    def require_staged(self, partitions: list[PartitionManifest], sealed: dict[str, bool],
                       intended: set[str]) -> None:
        """Refuse partitions that left staging although no intent names them."""
        lost = [p.partition_id for p in partitions
                if not sealed[p.partition_id] and p.partition_id not in intended]
        if lost:
            raise StagingChanged(
                f"staging {self.staging} no longer holds partitions {lost} and the ledger "
                "has no record of publishing them",
                target=self.target, staging=self.staging, partition_ids=lost,
            )

    def put_intent(self, attaching: list[PartitionManifest], published: Iterable[str],
                   **extra: object) -> None:
        PublishRecord.intent([p.partition_id for p in attaching], published,
                             **extra).store(self.ledger, self.key)
        self.on_step(STEP_AFTER_INTENT)
        self.ledger.confirm()  # every caller sends the statement that makes rows visible next

    def mark_published(self) -> None:
        PublishRecord(PUBLISHED).store(self.ledger, self.key)
        self.on_step(STEP_AFTER_MARK)

    def wait_for_interrupted_statement(self) -> int:
        """Wait until no ALTER of an interrupted run still reads this staging table;
        returns when the server started (Unix seconds, as of the last look).

        The server finishes a statement whose client died; deciding "not attached" while
        such an ATTACH or MOVE still runs would publish the partition twice.
        """
        deadline = time.monotonic() + STATEMENT_WAIT_SECONDS
        running = f"position(query, {sql_string(self.staging)}) > 0"
        own = "position(query, 'system.processes') = 0"  # this query names the table too
        while True:
            found = self.client.query_rows(
                "SELECT count() AS running, toUnixTimestamp(now()) - uptime() AS started "
                f"FROM system.processes WHERE {running} AND {own}",
                purpose="look for a running statement of an interrupted publish")[0]
            if not int(found["running"]):
                return int(found["started"])
            if time.monotonic() > deadline:
                raise InDoubtPublish(
                    target=self.target, staging=self.staging,
                    partition_ids=list(self.manifest.partition_ids),
                    found=f"a statement reading {self.staging} is still running after "
                          f"{STATEMENT_WAIT_SECONDS:.0f} s")
            time.sleep(0.1)

    def decide(self, partitions: list[PartitionManifest], watermark: int,
               sealed: dict[str, bool]) -> set[str]:
        """The ids of ``partitions`` an interrupted ATTACH or MOVE made visible (by the
        target's parts above ``watermark``); ``InDoubtPublish`` where that cannot be told."""
        decider = AttachDecider(self.client, self.manifest, watermark)
        published = {p.partition_id for p in partitions if decider.attached(p, sealed)}
        self.refuse_doubts(decider)
        return published

    def refuse_doubts(self, decider: AttachDecider) -> None:
        """``InDoubtPublish`` naming every partition ``decider`` could not decide."""
        if decider.in_doubt:
            raise InDoubtPublish(target=self.target, staging=self.staging,
                                 partition_ids=[pid for pid, _ in decider.in_doubt],
                                 found="; ".join(reason for _, reason in decider.in_doubt))

    def set_target_merges(self, verb: str) -> None:
        self.client.execute(f"SYSTEM {verb} MERGES {self.target}",
                            purpose=f"{verb.lower()} merges of target around publish")

    def from_staging(self, verb: str, partitions: list[PartitionManifest]) -> list[str]:
        """``<verb> PARTITION ID p FROM staging`` commands for ALTER TABLE target."""
        return [f"{verb} PARTITION ID {sql_string(p.partition_id)} FROM {self.staging}"
                for p in partitions]
