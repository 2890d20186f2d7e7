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
- ``on_step(name)`` is called at each crash point, once per call: ``STEPS[strategy]``
  lists them in order. Tests raise from it to simulate a crash.

Strategies (chosen by ``capabilities.choose_strategy``):

``move`` (servers with ``MOVE PARTITION ... TO TABLE``): the move takes the parts out of
staging, so a repeat finds nothing to move. An empty staging partition that the intent
names therefore means "already moved"; one that it does not name means lost data.

``attach_replicated`` (Replicated target): ``ATTACH PARTITION ... FROM`` records one block
id per attached part under the table's ``/blocks`` in ZooKeeper, so a repeat of the same
attach is dropped by the server. Measured on 18.16, and handled here: the block id is a
hash of the part's content only, so a staged part byte-identical to a part attached within
the last ``replicated_deduplication_window`` blocks (default 100) is dropped too, even with
``insert_deduplicate=0``; and two identical parts in one staged partition make the ATTACH
fail (``Node exists``, code 999). Publish therefore compares the partition's block ids in
ZooKeeper before and after its ATTACH: fewer new ids than staged parts, when no earlier
attempt can have attached them, raises ``PartsDeduplicated`` (never a silent loss); seal
merges look-alike parts of a partition so the second case does not arise. A repeat after
a crash relies on the server's deduplication, so it must come within the deduplication
window (100 further attaches or inserts into the target, 7 days).

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

Dynamic partition overwrite (``publish_overwrite``): each partition present in the data
is replaced as a whole with ``REPLACE PARTITION ... FROM``, which is idempotent; the
partitions that several winning branches staged are first combined in one staging table
per xid. Partitions absent from the data are left untouched.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from server_ext.capabilities import STRATEGIES, SqlClient
from server_ext.client import qualified_name, quote_identifier
from server_ext.errors import ClickHouseError
from server_ext.manifest import Manifest, PartitionManifest, StagedPart
from server_ext.schema import describe_table
from server_ext.seal import read_staged_partitions, sql_string
from server_ext.staging import create_staging, staging_qualified

log = logging.getLogger(__name__)

STEP_BEFORE_PARTITION = "publish.before_partition"  # checks done, nothing written yet
STEP_AFTER_INTENT = "publish.after_intent"
STEP_AFTER_ATTACH = "publish.after_attach"  # after the statement that makes rows visible
STEP_AFTER_MARK = "publish.after_mark"
STEP_AFTER_DROP = "publish.after_drop_staging_partition"

# The crash points each way of publishing passes, in order.
STEPS: dict[str, tuple[str, ...]] = {
    "move": (STEP_BEFORE_PARTITION, STEP_AFTER_INTENT, STEP_AFTER_ATTACH, STEP_AFTER_MARK),
    "attach_replicated": (STEP_BEFORE_PARTITION, STEP_AFTER_INTENT, STEP_AFTER_ATTACH,
                          STEP_AFTER_MARK, STEP_AFTER_DROP),
    "attach_marked": (STEP_BEFORE_PARTITION, STEP_AFTER_INTENT, STEP_AFTER_ATTACH,
                      STEP_AFTER_MARK, STEP_AFTER_DROP),
    "replace": (STEP_BEFORE_PARTITION, STEP_AFTER_ATTACH, STEP_AFTER_MARK, STEP_AFTER_DROP),
}

STATEMENT_WAIT_SECONDS = 60.0  # how long a repeat waits for an interrupted ALTER to end
MAX_COMMANDS_PER_ALTER = 200  # keeps a statement far below the server's max_query_size
UNKNOWN_TABLE, UNKNOWN_DATABASE = 60, 81
PUBLISHED = "published"
ATTACHING = "attaching"

StepHook = Callable[[str], None]


class Ledger(Protocol):
    """Durable publish records, backed by the caller (e.g. ZooKeeper).

    ``put`` must be durable when it returns; values are small JSON-safe dicts.
    """

    def get(self, key: str) -> dict | None: ...

    def put(self, key: str, value: dict) -> None: ...


class MemoryLedger:
    """A ``Ledger`` in a dict, for tests and benchmarks (values stored as JSON text)."""

    def __init__(self) -> None:
        self._records: dict[str, str] = {}

    def get(self, key: str) -> dict | None:
        text = self._records.get(key)
        return None if text is None else json.loads(text)

    def put(self, key: str, value: dict) -> None:
        self._records[key] = json.dumps(value, sort_keys=True)

    def keys(self) -> list[str]:
        return sorted(self._records)


class PublishError(Exception):
    """Publish cannot go on without someone looking; the xid stays Committing."""

    def __init__(self, message: str, *, target: str, staging: str,
                 partition_ids: list[str]) -> None:
        self.target = target
        self.staging = staging
        self.partition_ids = list(partition_ids)
        super().__init__(message)

    @property
    def partition_id(self) -> str:
        return self.partition_ids[0]


class StagingChanged(PublishError):
    """The staging table no longer holds the parts sealed in the manifest."""


class InDoubtPublish(PublishError):
    """Whether partitions were attached cannot be decided; ``found`` says what was seen."""

    def __init__(self, *, target: str, staging: str, partition_ids: list[str],
                 found: str) -> None:
        self.found = found
        super().__init__(
            f"publish of partitions {partition_ids} from {staging} into {target} is in "
            f"doubt: {found}. Nothing was attached; decide with resolve_partition after "
            "looking at the target",
            target=target, staging=staging, partition_ids=partition_ids,
        )


class PartsDeduplicated(PublishError):
    """A Replicated target dropped staged parts as duplicates of identical earlier parts."""


@dataclass
class PublishReport:
    """What one ``publish`` call did."""

    strategy: str
    target: str
    published: list[str] = field(default_factory=list)  # partition ids made visible now
    already_published: list[str] = field(default_factory=list)
    rows: int = 0  # rows made visible by this call
    seconds: float = 0.0


def ledger_key(staging_table: str) -> str:
    """Ledger key of the publish record of one staging (or combined) table."""
    return staging_table


def _no_step(_: str) -> None:
    pass


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
        raise ValueError(f"unknown publish strategy {strategy!r}; expected one of {STRATEGIES}")
    publisher_class = {"move": _MovePublisher, "attach_replicated": _ReplicatedPublisher,
                       "attach_marked": _MarkedPublisher}[strategy]
    return publisher_class(client, manifest, ledger, on_step or _no_step).run()


def alter_in_chunks(client: SqlClient, table: str, commands: list[str], *, purpose: str,
                    retry: bool) -> None:
    """``ALTER TABLE table cmd, cmd, ...``, at most MAX_COMMANDS_PER_ALTER per statement."""
    for start in range(0, len(commands), MAX_COMMANDS_PER_ALTER):
        chunk = commands[start:start + MAX_COMMANDS_PER_ALTER]
        client.execute(f"ALTER TABLE {table} {', '.join(chunk)}", purpose=purpose, retry=retry)


def drop_partitions(client: SqlClient, table: str, partition_ids: Iterable[str]) -> None:
    """Drop partitions from a staging table; nothing to do if the table is gone.

    The caller drops a staging table after publish, and may then repeat publish.
    """
    commands = [f"DROP PARTITION ID {sql_string(pid)}" for pid in partition_ids]
    try:
        alter_in_chunks(client, table, commands, purpose="drop published partitions from "
                        "staging", retry=True)
    except ClickHouseError as exc:
        if exc.code not in (UNKNOWN_TABLE, UNKNOWN_DATABASE):
            raise


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
        record = self.ledger.get(self.key) or {}
        if record.get("state") == PUBLISHED:
            report.already_published = list(self.manifest.partition_ids)
        else:
            done = set(record.get("published", []))
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

    def publish_pending(self, pending: list[PartitionManifest], record: dict,
                        sealed: dict[str, bool]) -> None:
        """Make ``pending`` visible and end with ``mark_published``."""
        raise NotImplementedError

    def sealed(self, pending: list[PartitionManifest]) -> dict[str, bool]:
        """Per partition: True if staging holds exactly the sealed parts, False if none."""
        staged = read_staged_partitions(
            self.client, self.manifest.staging_database, self.manifest.staging_table,
            purpose="read staged parts before publish",
        )
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
        self.ledger.put(self.key, {"state": ATTACHING,
                                   "attaching": [p.partition_id for p in attaching],
                                   "published": sorted(published), **extra})
        self.on_step(STEP_AFTER_INTENT)

    def mark_published(self) -> None:
        self.ledger.put(self.key, {"state": PUBLISHED})
        self.on_step(STEP_AFTER_MARK)

    def from_staging(self, verb: str, partitions: list[PartitionManifest]) -> list[str]:
        """``<verb> PARTITION ID p FROM staging`` commands for ALTER TABLE target."""
        return [f"{verb} PARTITION ID {sql_string(p.partition_id)} FROM {self.staging}"
                for p in partitions]


def _intended(record: dict) -> set[str]:
    """Partitions an earlier, interrupted run may already have made visible."""
    return set(record.get("attaching", [])) if record.get("state") == ATTACHING else set()


class _MovePublisher(_Publisher):
    strategy = "move"
    drops_staging = False

    def publish_pending(self, pending: list[PartitionManifest], record: dict,
                        sealed: dict[str, bool]) -> None:
        self.require_staged(pending, sealed, _intended(record))
        self.put_intent(pending, record.get("published", []))
        movable = [p for p in pending if sealed[p.partition_id]]  # the others moved earlier
        alter_in_chunks(
            self.client, self.staging,
            [f"MOVE PARTITION ID {sql_string(p.partition_id)} TO TABLE {self.target}"
             for p in movable],
            purpose="move partitions into target", retry=True,
        )
        self.on_step(STEP_AFTER_ATTACH)
        self.mark_published()


class _ReplicatedPublisher(_Publisher):
    strategy = "attach_replicated"

    def publish_pending(self, pending: list[PartitionManifest], record: dict,
                        sealed: dict[str, bool]) -> None:
        if record.get("deduplicated"):
            raise self.deduplicated(record["deduplicated"], "earlier")
        intended = _intended(record)
        self.require_staged(pending, sealed, intended)
        unsealed = [p.partition_id for p in pending if not sealed[p.partition_id]]
        if unsealed:
            raise InDoubtPublish(target=self.target, staging=self.staging,
                                 partition_ids=unsealed,
                                 found="the staging partitions are gone before the mark")
        blocks_path = self.blocks_path()
        before = self.block_ids(blocks_path)
        self.put_intent(pending, record.get("published", []))
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
        dropped = [p.partition_id for p in pending
                   if self.dropped_by_server(p, before, after, intended)]
        if dropped:
            kept = [p.partition_id for p in pending if p.partition_id not in dropped]
            self.ledger.put(self.key, {"state": ATTACHING, "attaching": [],
                                       "published": sorted([*record.get("published", []),
                                                            *kept]),
                                       "deduplicated": dropped})
            raise self.deduplicated(dropped, "attached earlier")
        self.mark_published()

    @staticmethod
    def dropped_by_server(partition: PartitionManifest, before: dict[str, set[str]],
                          after: dict[str, set[str]], intended: set[str]) -> bool:
        pid = partition.partition_id
        new_ids = len(after.get(pid, set()) - before.get(pid, set()))
        # No new id on a repeat: the interrupted run attached them (the intended dedup).
        repeat = pid in intended and new_ids == 0
        return new_ids < len(partition.parts) and not repeat

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

    def publish_pending(self, pending: list[PartitionManifest], record: dict,
                        sealed: dict[str, bool]) -> None:
        intended = _intended(record)
        self.require_staged(pending, sealed, intended)
        if intended:
            self.wait_for_interrupted_statement()
        self.set_target_merges("STOP")
        decider = _AttachDecider(self.client, self.manifest, record.get("watermark", 0))
        attached = {p.partition_id for p in pending
                    if p.partition_id in intended and decider.attached(p, sealed)}
        if decider.in_doubt:
            self.set_target_merges("START")  # the evidence is in the error
            raise InDoubtPublish(target=self.target, staging=self.staging,
                                 partition_ids=[pid for pid, _ in decider.in_doubt],
                                 found="; ".join(reason for _, reason in decider.in_doubt))
        to_attach = [p for p in pending if p.partition_id not in attached]
        if to_attach:
            watermark = max_block_number(self.client, self.manifest.target_database,
                                         self.manifest.target_table)
            self.put_intent(to_attach, {*record.get("published", []), *attached},
                            watermark=watermark)
            alter_in_chunks(self.client, self.target, self.from_staging("ATTACH", to_attach),
                            purpose="attach partitions into target", retry=False)
            self.on_step(STEP_AFTER_ATTACH)
        self.mark_published()
        self.set_target_merges("START")

    def wait_for_interrupted_statement(self) -> None:
        """Wait until no ALTER of an interrupted run still reads this staging table.

        The server finishes a statement whose client died; deciding "not attached" while
        such an ATTACH still runs would attach the partition twice.
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

    def set_target_merges(self, verb: str) -> None:
        self.client.execute(f"SYSTEM {verb} MERGES {self.target}",
                            purpose=f"{verb.lower()} merges of target around publish")


@dataclass(frozen=True)
class _TargetPart:
    name: str
    rows: int
    bytes: int
    level: int
    min_block: int
    max_block: int
    data_version: int

    @property
    def single_block(self) -> bool:
        """One block number, never mutated: how ATTACH and INSERT create a part."""
        return self.min_block == self.max_block == self.data_version

    @property
    def fresh_insert(self) -> bool:
        """A part as an INSERT creates it (a rewrite of a lone part raises its level)."""
        return self.single_block and self.level == 0


Signature = tuple[int, int, int, str]  # rows, bytes, level, content fingerprint


class _AttachDecider:
    """Decides, per partition, whether an interrupted ``attach_marked`` run attached it.

    Attached: every staged part has exactly one counterpart above the watermark with the
    same rows, bytes, level and content. Not attached: every part above the watermark is a
    fresh insert unlike any staged part. Anything else is recorded in ``in_doubt``.
    """

    def __init__(self, client: SqlClient, manifest: Manifest, watermark: int) -> None:
        self.client = client
        self.manifest = manifest
        self.watermark = watermark
        self.in_doubt: list[tuple[str, str]] = []
        self.target = qualified_name(manifest.target_database, manifest.target_table)
        self.staging = qualified_name(manifest.staging_database, manifest.staging_table)
        self._columns: list[str] | None = None

    def attached(self, partition: PartitionManifest, sealed: dict[str, bool]) -> bool:
        above = self.parts_above(partition.partition_id)
        if not sealed[partition.partition_id]:
            return self.doubt(partition, "the staging partition is gone before the mark", above)
        wanted = {(p.rows, p.bytes, p.level) for p in partition.parts}
        candidates = [p for p in above
                      if p.single_block and (p.rows, p.bytes, p.level) in wanted]
        found: Counter[Signature] = Counter()
        staged: Counter[Signature] = Counter()
        if candidates:
            found = Counter(self.signatures(self.target, partition, candidates))
            staged = Counter(self.signatures(self.staging, partition, partition.parts))
            if found == staged:
                return True
        if all(p.fresh_insert for p in above) and not found & staged:
            return False
        reason = ("parts above the watermark match the staged parts only partly or more than "
                  "once" if found & staged else "merged or mutated parts above the watermark")
        return self.doubt(partition, reason, above)

    def doubt(self, partition: PartitionManifest, reason: str,
              above: list[_TargetPart]) -> bool:
        listing = ", ".join(f"{p.name} ({p.rows} rows)" for p in above) or "none"
        sealed = ", ".join(f"{p.name} ({p.rows} rows)" for p in partition.parts)
        self.in_doubt.append((partition.partition_id,
                              f"partition {partition.partition_id!r}: {reason}; target parts "
                              f"above block {self.watermark}: {listing}; sealed: {sealed}"))
        return False

    def parts_above(self, partition_id: str) -> list[_TargetPart]:
        rows = self.client.query_rows(
            "SELECT name, rows, bytes_on_disk, level, min_block_number, max_block_number, "
            "data_version FROM system.parts WHERE database = "
            f"{sql_string(self.manifest.target_database)} AND table = "
            f"{sql_string(self.manifest.target_table)} AND active AND partition_id = "
            f"{sql_string(partition_id)} AND max_block_number > {int(self.watermark)} "
            "ORDER BY name",
            purpose="read target parts above the watermark",
        )
        return [_TargetPart(r["name"], int(r["rows"]), int(r["bytes_on_disk"]),
                            int(r["level"]), int(r["min_block_number"]),
                            int(r["max_block_number"]), int(r["data_version"])) for r in rows]

    def signatures(self, table: str, partition: PartitionManifest,
                   parts: Iterable[StagedPart | _TargetPart]) -> list[Signature]:
        by_name = {p.name: p for p in parts}
        prints = self.fingerprints(table, partition.partition_id, list(by_name))
        return [(p.rows, p.bytes, p.level, prints.get(name, "")) for name, p in by_name.items()]

    def fingerprints(self, table: str, partition_id: str,
                     part_names: list[str]) -> dict[str, str]:
        """Order-independent hash of every stored column of each named part of ``table``.

        Text forms are hashed, because cityHash64 on 18.16 refuses Decimal and Nullable
        inside Array, and returns NULL for NULL.
        """
        hashed = ", ".join(f"ifNull(toString({quote_identifier(c)}), '\\\\N')"
                           for c in self.stored_columns())
        names = ", ".join(sql_string(n) for n in part_names)
        rows = self.client.query_rows(
            f"SELECT _part AS part, toString(sum(cityHash64({hashed}))) AS fingerprint "
            f"FROM {table} WHERE _partition_id = {sql_string(partition_id)} "
            f"AND _part IN ({names}) GROUP BY _part",
            purpose="fingerprint parts to decide an interrupted publish",
        )
        return {row["part"]: row["fingerprint"] for row in rows}

    def stored_columns(self) -> list[str]:
        if self._columns is None:
            target = describe_table(
                self.client, f"{self.manifest.target_database}.{self.manifest.target_table}")
            self._columns = [c.name for c in target.columns if c.default_kind != "ALIAS"]
        return self._columns


def max_block_number(client: SqlClient, database: str, table: str) -> int:
    """Highest block number of any part (active or not) of a table; 0 for none."""
    return int(client.query_value(
        "SELECT max(max_block_number) FROM system.parts WHERE database = "
        f"{sql_string(database)} AND table = {sql_string(table)}",
        purpose="read block number watermark of target",
    ))


def resolve_partition(manifest: Manifest, partition_id: str, ledger: Ledger, *,
                      attached: bool) -> None:
    """Record an operator's decision on an in-doubt or deduplicated partition.

    ``attached=True``: the rows are in the target (or their loss is accepted); publish
    will not attach the partition again. ``attached=False``: they are not; the next
    ``publish`` attaches it afresh (for a deduplicated partition the server will drop it
    again: its rows must be copied some other way).
    """
    manifest.partition(partition_id)  # KeyError for a partition the manifest lacks
    key = ledger_key(manifest.staging_table)
    record = ledger.get(key) or {"state": ATTACHING}
    if record.get("state") == PUBLISHED:
        return
    published = set(record.get("published", []))
    if attached:
        published.add(partition_id)
    record.update(
        published=sorted(published),
        attaching=[pid for pid in record.get("attaching", []) if pid != partition_id],
        deduplicated=[pid for pid in record.get("deduplicated", []) if pid != partition_id],
    )
    ledger.put(key, record)


def publish_overwrite(
    client: SqlClient,
    manifests: list[Manifest],
    combined_staging_table: str | None,
    ledger: Ledger,
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
                               on_step or _no_step).run()


Sources = dict[str, list[tuple[Manifest, PartitionManifest]]]


class _OverwritePublisher:
    def __init__(self, client: SqlClient, manifests: list[Manifest], combined: str | None,
                 ledger: Ledger, on_step: StepHook) -> None:
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
        record = self.ledger.get(self.key) or {}
        if record.get("state") == PUBLISHED:
            report.already_published = list(sources)
        else:
            self.check_sealed(sources)
            self.on_step(STEP_BEFORE_PARTITION)
            commands = [f"REPLACE PARTITION ID {sql_string(pid)} FROM {origin}"
                        for pid, origin in self.assemble(sources).items()]
            alter_in_chunks(self.client, self.target, commands,
                            purpose="replace partitions of target", retry=True)
            self.on_step(STEP_AFTER_ATTACH)
            self.ledger.put(self.key, {"state": PUBLISHED})
            self.on_step(STEP_AFTER_MARK)
            report.published = list(sources)
            report.rows = sum(p.rows for parts in sources.values() for _, p in parts)
        self.drop_sources()
        self.on_step(STEP_AFTER_DROP)
        report.seconds = time.perf_counter() - started
        return report

    def check_sealed(self, sources: Sources) -> None:
        """Never REPLACE from a source that lost its rows: that would empty the target."""
        for manifest in self.manifests:
            staged = read_staged_partitions(self.client, manifest.staging_database,
                                            manifest.staging_table,
                                            purpose="read staged parts before overwrite")
            changed = [p.partition_id for p in manifest.partitions
                       if p.partition_id not in staged
                       or staged[p.partition_id].part_names != p.part_names]
            if changed:
                raise StagingChanged(
                    f"staging {manifest.staging_database}.{manifest.staging_table} no longer "
                    f"holds the sealed parts of partitions {changed}",
                    target=self.target, staging=manifest.staging_table, partition_ids=changed,
                )

    def assemble(self, sources: Sources) -> dict[str, str]:
        """Per partition, the quoted table holding exactly its staged rows of all branches."""
        origin = {pid: qualified_name(parts[0][0].staging_database, parts[0][0].staging_table)
                  for pid, parts in sources.items()}
        shared = {pid: parts for pid, parts in sources.items() if len(parts) > 1}
        if not shared:
            return origin
        assert self.combined is not None
        combined = create_staging(self.client, describe_table(
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
            self.client.execute(f"DROP TABLE IF EXISTS {staging_qualified(self.combined)}",
                                purpose="drop combined staging table")
