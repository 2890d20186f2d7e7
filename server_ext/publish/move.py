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
``move_apart`` says so.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from server_ext.errors import ClickHouseError
from server_ext.publish.publish_ledger import PublishRecord
from server_ext.publish.publish_steps import STEP_AFTER_ATTACH, alter_in_chunks
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
            self.client, self.manifest.staging_database, self.manifest.staging_table,
            (self.manifest.target_database, self.manifest.target_table),
            purpose="read staged parts and the target's block number before publish",
        )
        return staged

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
        else:  # decided by this repeat alone: recorded, never decided again
            self.mark_published()
        return moved
