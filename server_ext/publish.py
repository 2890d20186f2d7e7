"""Publish: make a prepared branch's staged rows visible in the target, exactly once.

Publish runs after the xid's decision (Committing) and may be interrupted anywhere: the
driver dies, the network drops, the server restarts. Whoever recovers the xid runs it
again with the same manifest and the same ledger. The contract:

- ``publish`` may be repeated any number of times, after a crash at any point. A repeat
  never makes a row visible twice and never loses one. Where the server leaves it
  undecidable whether a partition was already attached, publish raises
  ``InDoubtPublish`` and attaches nothing; it never guesses. Each partition becomes
  visible all at once; the partitions of a manifest become visible one after another.
- Before any statement touches the target, publish checks that the staging table still
  holds exactly the sealed parts (by name); anything else raises ``StagingChanged``.
- ``ledger`` is durable storage of the caller (ZooKeeper through the coordinator). Publish
  keeps one small record per staging table, under the staging table's name, and writes it
  twice per call: an intent before the statement that makes rows visible
  (``{"state": "attaching", "attaching": [partition ids], "published": [...], ...}``),
  then ``{"state": "published"}``. A published staging table is never attached again;
  a repeat only drops what is left in staging.
- All partitions of a manifest go into one ``ALTER TABLE`` statement (chunks of
  ``MAX_COMMANDS_PER_ALTER``). The commands of one ALTER are not atomic together, so a
  crash may leave some partitions done and others not; recovery decides each partition
  on its own. Measured on 18.16: every statement costs ~3 ms of round trip, so one ALTER
  for 90 partitions takes 57 ms where 90 ALTERs take ~350 ms.
- ``on_step(name)`` is called at each crash point, once per call: ``PUBLISH_STEPS[strategy]``
  lists them in order. Tests raise from it to simulate a crash.

Strategies (chosen by ``capabilities.choose_strategy``):

``move`` (servers with ``MOVE PARTITION ... TO TABLE``): the move takes the parts out of
staging, so a repeat usually finds nothing to move. An empty staging partition that the
intent names therefore means "already moved"; one that it does not name means lost data.
A MOVE is not atomic across a server crash, though: measured on 26.9 with a plain
MergeTree, a server killed while a 40-partition MOVE ran came back, in 2 of 15 runs, with
a partition both in the target and, unchanged, in staging (the move's removal from
staging is durable only once it finishes). So the MOVE is never re-sent blindly: the
intent carries the target's block-number watermark as ``attach_marked``'s does, and a
repeat that finds an intended partition still staged decides it from the target's parts
above the watermark (a moved part keeps its rows, bytes, level and content and gets one
fresh block number, measured): moved, then only what is left in staging is dropped with
the staging table; not moved, then moved now; anything else is ``InDoubtPublish``.

``attach_replicated`` (Replicated target): ``ATTACH PARTITION ... FROM`` records one block
id per attached part under the table's ``/blocks`` in ZooKeeper, so a repeat of the same
attach is dropped by the server. Measured on 18.16, and handled here: the block id is a
hash of the part's content only, so a staged part byte-identical to a part attached within
the last ``replicated_deduplication_window`` blocks (default 100) is dropped too, even with
``insert_deduplicate=0``; and two identical parts in one staged partition make the ATTACH
fail (``Node exists``, code 999). The first intent therefore records the partitions' block
ids as they were before the first ATTACH (``blocks_before``), and every run counts the new
ids against them: one per staged part means attached. A partition of which the server took
no part (a rollup that counts the same in two epochs does this) is copied with an ``INSERT
... SELECT`` (``insert_dropped``: its own intent, watermark and decision), as a plain
INSERT keeps such rows; only the parts it dropped are copied (those without a counterpart
above the partition's watermark from before the first ATTACH, where it took some). Where
views read the table, an INSERT would fire them a second time: the server's deduplication
then stands in the table, with a warning, as it does for a plain INSERT of such a block
(whose views, measured on 18.16, then get nothing; the sink's views get the epoch's rows,
published on their own). Seal merges look-alike parts of a partition so the ``Node
exists`` case does not arise. A repeat after a crash relies on the server's deduplication,
so it must come within the deduplication window (100 further attaches or inserts into the
target on 18.16, 10,000 on 26.x; and ``replicated_deduplication_window_seconds``: 7 days on
18.16, 1 hour on 26.x). The time window is enforced: the intent records when the publish
began, and a repeat after the window (less a margin) is ``InDoubtPublish`` for an
operator, never a blind repeat. The block-count window is not checked: it needs that many
other writes into the target between a crash and its repeat.

``attach_marked`` (plain MergeTree without MOVE, e.g. 18.16): ``ATTACH PARTITION ... FROM``
into a plain MergeTree is not idempotent (a repeat duplicates the rows), so the ledger
decides. The intent carries a watermark W, the highest block number of any part of the
target. Measured on 18.16: ATTACH gives each attached part a fresh block number from the
table's counter, hence above W, and keeps the part's level, rows and bytes (its files are
hard links to the staged ones). A repeat that finds the intent decides, per partition it
names, from the target's parts above W in that partition:

- every staged part has exactly one counterpart above W with the same rows, bytes, level
  and content fingerprint, never merged or mutated: the attach happened;
- every part above W is a fresh insert (one block, level 0) unlike any staged part (other
  writers' inserts), or there is none: the attach did not happen, attach now;
- anything else (a merge or mutation touched a part above W, a partial or ambiguous
  match, the staging partition is gone): ``InDoubtPublish``. An operator looks and calls
  ``resolve_partition``.

A merge of the target would mix an attached part with others and make the repeat
undecidable, so publish stops the target's merges (``SYSTEM STOP MERGES``) from before the
intent until after the mark. An interrupted publish leaves them stopped until a repeat
finishes; a server restart starts them again, which can turn a pending repeat into
``InDoubtPublish``. The switch is per table: a publisher of another xid into the same
target may start merges inside this one's window, with the same worst case (in doubt,
never a duplicate). The remaining blind spot: a foreign insert of a part byte-identical to
a staged part, into the same partition, after W, while our attach did not happen, would
be taken for our attach.

A server killed inside an ATTACH on 18.16 can leave the ATTACH's clones in the target's
directory, and a later ATTACH fails on them with code 84 (``publish_steps.leftover_clone``).
Publish repeats past them: before each repeat it decides, as above, which partitions the
failed ALTER attached, and sends only the others. ``REPLACE`` (overwrite) is repeated as is.

Dynamic partition overwrite (``publish_overwrite``): each partition present in the data
is replaced as a whole with ``REPLACE PARTITION ... FROM``, which is idempotent; the
partitions that several winning branches staged are first combined in one staging table
per xid. Partitions absent from the data are left untouched.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from server_ext.attach_decision import AttachDecider, max_block_number, partition_watermarks
from server_ext.capabilities import STRATEGIES, known_settings
from server_ext.client_protocol import SqlClient
from server_ext.errors import ClickHouseError, InDoubtPublish, PartsDeduplicated, StagingChanged
from server_ext.ledger import PUBLISHED, Ledger, PublishRecord, ledger_key
from server_ext.manifest import Manifest, PartitionManifest
from server_ext.overwrite import publish_overwrite
from server_ext.publish_steps import (
    STEP_AFTER_ATTACH,
    STEP_AFTER_DROP,
    STEP_AFTER_INSERT,
    STEP_AFTER_INSERT_INTENT,
    STEP_AFTER_INTENT,
    STEP_AFTER_MARK,
    STEP_BEFORE_PARTITION,
    PublishReport,
    StepHook,
    alter_in_chunks,
    drop_partitions,
    no_step,
    repeat_past_leftover_clones,
)
from server_ext.schema import TargetTable, describe_table
from server_ext.seal import read_staged_partitions, read_staged_with_watermark
from server_ext.sql import qualified_name, sql_string
from server_ext.staging import copied_columns, table_settings

log = logging.getLogger(__name__)

WINDOW_SETTING = "replicated_deduplication_window_seconds"
WINDOW_MARGIN_SECONDS = 300.0  # clock skew and the server's cleanup period, at most
STATEMENT_WAIT_SECONDS = 60.0  # how long a repeat waits for an interrupted ALTER to end
ONE_BLOCK_BYTES = 1 << 40  # squash a copied partition into one block, whatever its size
OPTIMIZE_ON_INSERT = "optimize_on_insert"


def publish(
    client: SqlClient,
    manifest: Manifest,
    strategy: str,
    ledger: Ledger,
    *,
    overwrite: bool = False,
    on_step: StepHook | None = None,
) -> PublishReport:
    """Publish one sealed staging table (see the module contract). Re-runnable.

    ``overwrite=True`` replaces each partition present in the manifest (dynamic partition
    overwrite) whatever the strategy; with several branches use ``publish_overwrite``.
    """
    if overwrite:
        return publish_overwrite(client, [manifest], None, ledger, on_step=on_step)
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown publish strategy {strategy!r}; expected one of "
                         f"{', '.join(STRATEGIES)}")
    publisher_class = {"move": _MovePublisher, "attach_replicated": _ReplicatedPublisher,
                       "attach_marked": _MarkedPublisher}[strategy]
    return publisher_class(client, manifest, ledger, on_step or no_step).run()


class _Publisher:
    """The run shared by all strategies: skip what is published, check, publish, drop."""

    strategy = ""
    drops_staging = True  # MOVE leaves nothing to drop

    def __init__(self, client: SqlClient, manifest: Manifest, ledger: Ledger,
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
                self.publish_pending(pending, record, sealed)
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
                        sealed: dict[str, bool]) -> None:
        """Make ``pending`` visible and end with ``mark_published``."""
        raise NotImplementedError

    def read_staged(self) -> dict[str, PartitionManifest]:
        return read_staged_partitions(
            self.client, self.manifest.staging_database, self.manifest.staging_table,
            purpose="read staged parts before publish",
        )

    def sealed(self, pending: list[PartitionManifest]) -> dict[str, bool]:
        """Per partition: True if staging holds exactly the sealed parts, False if none."""
        staged = self.read_staged()
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

    def wait_for_interrupted_statement(self) -> None:
        """Wait until no ALTER of an interrupted run still reads this staging table.

        The server finishes a statement whose client died; deciding "not attached" while
        such an ATTACH or MOVE still runs would publish the partition twice.
        """
        deadline = time.monotonic() + STATEMENT_WAIT_SECONDS
        running = f"position(query, {sql_string(self.staging)}) > 0"
        own = "position(query, 'system.processes') = 0"  # this query names the table too
        while int(self.client.query_value(
                f"SELECT count() FROM system.processes WHERE {running} AND {own}",
                purpose="look for a running statement of an interrupted publish")):
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


class _MovePublisher(_Publisher):
    strategy = "move"
    drops_staging = False
    watermark: int | None = None  # the target's, read with the staged parts

    def read_staged(self) -> dict[str, PartitionManifest]:
        staged, self.watermark = read_staged_with_watermark(
            self.client, self.manifest.staging_database, self.manifest.staging_table,
            (self.manifest.target_database, self.manifest.target_table),
            purpose="read staged parts and the target's block number before publish",
        )
        return staged

    def publish_pending(self, pending: list[PartitionManifest], record: PublishRecord,
                        sealed: dict[str, bool]) -> None:
        intended = record.intended
        self.require_staged(pending, sealed, intended)
        # staged and intended: an interrupted MOVE that may have happened (module contract)
        maybe_moved = [p for p in pending if sealed[p.partition_id] and p.partition_id in intended]
        moved: set[str] = set()
        if maybe_moved:
            self.wait_for_interrupted_statement()
            moved = self.decide(maybe_moved, record.watermark or 0, sealed)
        # gone from staging (intended, by require_staged) or decided: moved earlier
        moved |= {p.partition_id for p in pending if not sealed[p.partition_id]}
        movable = [p for p in pending if p.partition_id not in moved]
        if movable:  # staging holds rows, so the staged parts' read gave the watermark
            self.put_intent(movable, {*record.published, *moved}, watermark=self.watermark)
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
        self.mark_published()


class _ReplicatedPublisher(_Publisher):
    strategy = "attach_replicated"

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
        engine_full = self.client.query_value(
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
            if exc.code == 999 and "Node exists" in str(exc):
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
        return bool(int(self.client.query_value(
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


class _MarkedPublisher(_Publisher):
    strategy = "attach_marked"

    def publish_pending(self, pending: list[PartitionManifest], record: PublishRecord,
                        sealed: dict[str, bool]) -> None:
        intended = record.intended
        self.require_staged(pending, sealed, intended)
        if intended:
            self.wait_for_interrupted_statement()
        self.set_target_merges("STOP")
        try:
            attached = self.decide([p for p in pending if p.partition_id in intended],
                                   record.watermark or 0, sealed)
            to_attach = [p for p in pending if p.partition_id not in attached]
            if to_attach:
                watermark = max_block_number(self.client, self.manifest.target_database,
                                             self.manifest.target_table)
                self.put_intent(to_attach, {*record.published, *attached},
                                watermark=watermark)
                self.attach(to_attach, watermark, sealed)
                self.on_step(STEP_AFTER_ATTACH)
        except InDoubtPublish:
            self.set_target_merges("START")  # the evidence is in the error
            raise
        self.mark_published()
        self.set_target_merges("START")

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
