"""The ``attach_marked`` strategy: ``ATTACH PARTITION ... FROM`` into a plain MergeTree
without MOVE (18.16).

The ATTACH is not idempotent, so the intent carries a watermark W (the target's highest
block number, read with the staged parts once merges are stopped) and the target's merges
are stopped from before that read until after the mark; a repeat decides each intended
partition from the parts above W (``attach_decision``): attached, not attached (attach
now), or ``InDoubtPublish``. Repeats past the clones an interrupted ATTACH left
(``leftover_clones``). Reasons:
``docs/design.md``, "The ``attach_marked`` window and what closes it".
"""

from __future__ import annotations

import logging

from server_ext.errors import InDoubtPublish, StagingChanged
from server_ext.old_server.leftover_clones import repeat_past_leftover_clones
from server_ext.publish.attach_decision import max_block_number
from server_ext.publish.publish_ledger import PublishRecord
from server_ext.publish.publish_steps import STEP_AFTER_ATTACH, alter_in_chunks
from server_ext.publish.strategy_choice import Strategy
from server_ext.publish.strategy_run import StrategyRun
from server_ext.staging.manifest import PartitionManifest
from server_ext.staging.seal import read_staged_with_watermark

log = logging.getLogger(__name__)


class AttachMarkedRun(StrategyRun):
    strategy = Strategy.ATTACH_MARKED
    watermark: int | None = None  # the target's, read with the staged parts

    def sealed(self, pending: list[PartitionManifest]) -> dict[str, bool]:
        """Stop the target's merges, then read the staged parts and the watermark in one
        query (merges restarted if staging changed: nothing was intended)."""
        self.set_target_merges("STOP")
        try:
            return super().sealed(pending)
        except StagingChanged:
            self.set_target_merges("START")
            raise

    def read_staged(self) -> dict[str, PartitionManifest]:
        staged, self.watermark, _ = read_staged_with_watermark(
            self.client, self.manifest.staging_database, [self.manifest.staging_table],
            (self.manifest.target_database, self.manifest.target_table),
            purpose="read staged parts and the target's block number before publish",
        )
        return staged.get(self.manifest.staging_table, {})

    def publish_pending(self, pending: list[PartitionManifest], record: PublishRecord,
                        sealed: dict[str, bool]) -> set[str]:
        intended = record.intended
        try:
            self.require_staged(pending, sealed, intended)
            if intended:
                self.wait_for_interrupted_statement()
            attached = self.decide([p for p in pending if p.partition_id in intended],
                                   record.watermark or 0, sealed)
            to_attach = [p for p in pending if p.partition_id not in attached]
            if to_attach:
                watermark = self.watermark
                if watermark is None or intended:  # a repeat reads it after its decisions
                    watermark = max_block_number(self.client, self.manifest.target_database,
                                                 self.manifest.target_table)
                self.put_intent(to_attach, {*record.published, *attached},
                                watermark=watermark)
                self.attach(to_attach, watermark, sealed)
                self.on_step(STEP_AFTER_ATTACH)
        except (InDoubtPublish, StagingChanged):
            self.set_target_merges("START")  # the evidence is in the error
            raise
        self.mark_published()
        self.set_target_merges("START")
        return attached

    def attach(self, partitions: list[PartitionManifest], watermark: int,
               sealed: dict[str, bool]) -> None:
        """ATTACH ``partitions`` (named by the intent with ``watermark``) into the target,
        past the clones an interrupted ATTACH left (``leftover_clone``): before each repeat,
        the partitions the failed ALTER attached are decided as a repeat after a crash
        decides them, and only the others are sent again."""
        remaining = partitions

        def attempt(repeat: bool) -> None:
            nonlocal remaining
            if repeat:
                attached = self.decide(remaining, watermark, sealed)
                remaining = [p for p in remaining if p.partition_id not in attached]
            alter_in_chunks(self.client, self.target, self.from_staging("ATTACH", remaining),
                            purpose="attach partitions into target", retry=False)

        repeat_past_leftover_clones(attempt, self.target)
