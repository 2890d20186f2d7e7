"""The ``move`` strategy: ``MOVE PARTITION ... TO TABLE`` (plain target, modern servers).

The intent carries the target's block-number watermark and the server's clock, both
read with the staged parts. A repeat that finds an intended partition still staged
first waits for a MOVE still running; then, on a server that started before that clock
(no restart since the intent), the partition was not moved, since a MOVE is atomic on a
live server: the MOVE is sent again and moves what is still staged. After a restart it
decides the partition from the target's parts above the watermark (a server killed
inside a MOVE can bring a moved partition back into staging), never re-sending the MOVE
blindly. An empty staging partition the intent names was moved; one it does not name is
lost data. So a MOVE that returned needs no ``published`` mark: its intent and the
emptied staging say it (the xid's final write marks the branch); only what a repeat
decides without moving is marked. Runs into one target are independent where
``move_apart`` says so, and then ``move_together`` publishes them with one intent write.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from server_ext.client.client_protocol import SqlClient
from server_ext.errors import ClickHouseError
from server_ext.publish.publish_ledger import PublishLedger, PublishRecord
from server_ext.publish.publish_steps import (
    STEP_AFTER_ATTACH,
    STEP_AFTER_INTENT,
    STEP_BEFORE_PARTITION,
    PublishReport,
    StepHook,
    alter_in_chunks,
    no_step,
)
from server_ext.publish.strategy_choice import Strategy
from server_ext.publish.strategy_run import StrategyRun
from server_ext.sql import sql_string
from server_ext.staging.manifest import Manifest, PartitionManifest
from server_ext.staging.seal import read_staged_with_watermark

log = logging.getLogger(__name__)


def move_apart(manifests: Sequence[Manifest]) -> bool:
    """Whether ``move`` runs of these staging tables into one target may run at once:
    every staged part is as an INSERT made it (level 0), and no two of them hold a part
    of the same partition, rows and bytes.

    Why that suffices: without a server restart a repeat needs no decision (module
    contract); after one it decides from the target's parts above its own watermark
    (``AttachDecider.attached``). Parts another run moved meanwhile lie above it too; they
    have one block number and level 0 like any fresh insert, and no rows and bytes of
    this run's parts, so they are never taken for this run's parts. A merge that mixed
    them with older parts makes that decision doubtful (``InDoubtPublish``, a refusal),
    as any writer's part merged above the watermark does.
    """
    seen: set[tuple[str, int, int]] = set()
    for manifest in manifests:
        parts = [(p.partition_id, part) for p in manifest.partitions for part in p.parts]
        own = {(pid, part.rows, part.bytes) for pid, part in parts}
        if any(part.level for _, part in parts) or own & seen:
            return False
        seen |= own
    return True


class MoveRun(StrategyRun):
    strategy = Strategy.MOVE
    drops_staging = False
    watermark: int | None = None  # the target's, read with the staged parts
    server_clock: int | None = None  # the server's, read with them

    def read_staged(self) -> dict[str, PartitionManifest]:
        staged, self.watermark, self.server_clock = read_staged_with_watermark(
            self.client, self.manifest.staging_database, [self.manifest.staging_table],
            (self.manifest.target_database, self.manifest.target_table),
            purpose="read staged parts and the target's block number before publish",
        )
        return staged.get(self.manifest.staging_table, {})

    def publish_pending(self, pending: list[PartitionManifest], record: PublishRecord,
                        sealed: dict[str, bool]) -> set[str]:
        intended = record.intended
        self.require_staged(pending, sealed, intended)
        # staged and intended: an interrupted MOVE that may have happened (module contract)
        maybe_moved = [p for p in pending if sealed[p.partition_id] and p.partition_id in intended]
        moved: set[str] = set()
        if maybe_moved:
            started = self.wait_for_interrupted_statement()
            if record.server_clock is None or started >= record.server_clock:
                moved = self.decide(maybe_moved, record.watermark or 0, sealed)
            # else no restart since the intent: what is still staged was not moved, and
            # the MOVE sent again moves only that (module contract)
        # gone from staging (intended, by require_staged) or decided: moved earlier
        moved |= {p.partition_id for p in pending if not sealed[p.partition_id]}
        movable = [p for p in pending if p.partition_id not in moved]
        if movable:  # staging holds rows, so the staged parts' read gave the watermark
            self.put_intent(movable, {*record.published, *moved}, watermark=self.watermark,
                            server_clock=self.server_clock)
            self.move(movable)
        else:  # decided by this repeat alone: recorded, never decided again
            self.mark_published()
        return moved

    def intent(self, staged: dict[str, PartitionManifest]) -> PublishRecord:
        """The intent of a first run, from staging's parts as read with the watermark:
        every partition must still hold exactly its sealed parts."""
        self.require_staged(list(self.manifest.partitions),
                            self.sealed(list(self.manifest.partitions), staged), set())
        return PublishRecord.intent(self.manifest.partition_ids, (), watermark=self.watermark,
                                    server_clock=self.server_clock)

    def move(self, movable: Sequence[PartitionManifest]) -> None:
        """The MOVE: sent once, its intent stored and the lease confirmed."""
        try:
            alter_in_chunks(
                self.client, self.staging,
                [f"MOVE PARTITION ID {sql_string(p.partition_id)} TO TABLE {self.target}"
                 for p in movable],
                purpose="move partitions into target", retry=False,
            )
        except ClickHouseError as exc:
            # the statement must not be re-sent, but the whole publish may be: it decides
            exc.retryable = exc.retryable or exc.outcome_unknown
            raise
        self.on_step(STEP_AFTER_ATTACH)


IntentWriter = Callable[[Sequence[tuple[PublishLedger, str, dict]]], None]


def move_together(client: SqlClient, items: Sequence[tuple[Manifest, PublishLedger]],
                  write_intents: IntentWriter, *, on_step: StepHook | None = None
                  ) -> list[PublishReport]:
    """Publish staging tables of one target with ``move`` (each with its own ledger), the
    first runs' intents in one write: ``write_intents(entries)`` stores every (ledger,
    key, value) durably and at once, as each ledger's ``put`` would. Re-runnable.

    The tables must ``move_apart``. A first run (no record in its ledger) reads its
    staged parts with every other first run's in one query, so their intents share one
    watermark and clock; after the joint write, one ``confirm`` precedes their MOVEs,
    sent one after another. Each table then stands where its own ``publish`` would have
    left it after its intent, so a repeat, joint or not, finishes each on its own. A
    table with a record (a repeat) is published by its own run. Reports in ``items``'
    order.
    """
    step = on_step or no_step
    runs = [MoveRun(client, manifest, ledger, step) for manifest, ledger in items]
    first = [run for run in runs if not run.manifest.is_empty
             and PublishRecord.load(run.ledger, run.key) is None]
    databases = {run.manifest.staging_database for run in first}
    if len(first) < 2 or len(databases) != 1:
        return [run.run() for run in runs]
    reports = {id(run): run.run() for run in runs if run not in first}
    target = first[0].manifest
    staged, watermark, server_clock = read_staged_with_watermark(
        client, databases.pop(), [run.manifest.staging_table for run in first],
        (target.target_database, target.target_table),
        purpose="read staged parts and the target's block number before publish")
    intents = []
    for run in first:
        run.watermark, run.server_clock = watermark, server_clock
        intents.append((run.ledger, run.key,
                        run.intent(staged.get(run.manifest.staging_table, {})).to_dict()))
    step(STEP_BEFORE_PARTITION)
    write_intents(intents)
    step(STEP_AFTER_INTENT)
    first[0].ledger.confirm()  # the MOVEs below make rows visible
    for run in first:
        started = time.perf_counter()
        run.move(list(run.manifest.partitions))
        report = PublishReport(run.strategy, run.target, list(run.manifest.partition_ids),
                               rows=run.manifest.rows,
                               seconds=time.perf_counter() - started)
        log.info("published %d partitions (%d rows) of %s into %s with move, intent "
                 "shared by %d tables", len(report.published), report.rows, run.staging,
                 run.target, len(first))
        reports[id(run)] = report
    return [reports[id(run)] for run in runs]
