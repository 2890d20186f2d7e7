"""Consolidation: the winners of one xid on one server, published in one pass.

Publishing every winning branch on its own costs a merges stop/start, a watermark, an
intent, an ALTER, a mark and a staging drop per branch, and adds one part per branch and
partition to the target. ``publish_combined`` instead gathers the winners' staged rows
into one *combined* staging table on the server, seals it and publishes that single
table with the strategy's ordinary ``publish``: one pass per xid and server.

How the rows get there depends on their size (``docs/benchmarks.md`` has the figures):

- if sources *contributed* their parts to the xid's **pre-combined** table while their
  tasks ran (:func:`attach_to_precombined`), those are taken from there: one ``ATTACH
  PARTITION ... FROM`` per partition, after an ``OPTIMIZE ... FINAL`` of each partition in
  which the background merges left more than ``SizeLimits.merge_above_parts`` parts (26.x
  merges attached parts as they come; 18.16 does not wake its merges for an ATTACH), so
  the commit's cost no longer grows with the epoch's branches; the few sources that did
  not (``direct``: the tasks below ``SizeLimits.direct_max_winners``) are attached from
  their own staging tables in the same ``ALTER``;
- otherwise, up to ``SizeLimits.rewrite_max_bytes`` on disk and ``rewrite_max_sources``
  sources, one ``INSERT ... SELECT`` from all sources (``merge()`` over their names) rewrites them:
  one part per target partition, in one statement;
- beyond either, the sources' parts are attached (hard links, nothing rewritten), and
  partitions of more than ``SizeLimits.merge_above_parts`` parts and at most
  ``SizeLimits.merge_max_bytes`` are merged into one part each;
- staged parts larger than ``SizeLimits.small_part_bytes`` on average are neither
  rewritten nor merged: they are large already.

The pre-combined table (one per xid, generation, server and target) is an optimization
that may fail in any way without losing or doubling a row:

- a task attaches (hard links) its sealed parts into it *before* it prepares its branch,
  and records the table's name in its payload only if the ATTACH succeeded; the sources
  are left intact;
- the combine copies from it only the partitions of the sources that recorded it, the
  other sources' (``direct``) from their own staging, and checks that each partition of
  the combined table holds exactly the rows all sources sealed there. Anything else in
  it (a failed attempt's or a speculative copy's rows, a half-done ATTACH) makes a
  partition's rows differ, and the combine falls back to reading the sources
  themselves. A winner cannot be missing from it: its ATTACH finished before its branch
  was prepared.
- its rows are never published from it directly: the copy is a sealed combined table
  like any other, so the contract below holds unchanged.

Contract (the same as ``publish``: may be repeated after a crash anywhere, by this actor
or by whoever holds the xid's publish lease next):

- Until the ledger records the combined table (``{"state": "combined", "manifest": ...}``
  under :func:`combine_key`), nothing of it counts: a repeat drops and rebuilds it from
  the sources, which are still intact (neither path takes anything from them). The
  record is written only after the combined table was sealed with exactly the sources'
  rows, so from then on the combined table is the one source of truth and the sources
  may be dropped.
- Before anything is combined from the sources, every source must hold exactly its
  sealed parts (``StagingChanged`` otherwise): rows that left a source are never
  silently skipped.
- The sources stay until the caller rolls them back (txsink: as non-winners, once the
  xid is ``Committed``); a repeat before that finds them, after that the record.
- Rewriting and merging copy the data once, inside the server; above
  ``merge_max_bytes`` a partition keeps the sources' parts (they are large already and
  the rewrite would cost more than the parts it saves).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from server_ext.capabilities import known_settings
from server_ext.client.client_protocol import SqlClient
from server_ext.errors import ClickHouseError
from server_ext.publish.publish_branch import publish
from server_ext.publish.publish_ledger import COMBINED, PublishLedger, PublishRecord
from server_ext.publish.publish_steps import (
    MAX_COMMANDS_PER_ALTER,
    PublishReport,
    StepHook,
    no_step,
)
from server_ext.sql import qualified_name, split_table_name, sql_string
from server_ext.staging.manifest import Manifest, PartitionManifest
from server_ext.staging.seal import merge_partitions, read_staged_partitions, require_sealed, seal
from server_ext.staging.staging_tables import (
    copied_columns,
    create_staging_table,
    rollback,
    staging_qualified,
)
from server_ext.types.target_table import TargetTable, describe_table

log = logging.getLogger(__name__)

STEP_AFTER_COMBINE = "combine.after_build"  # combined table built, not recorded
STEP_AFTER_RECORD = "combine.after_record"  # recorded, nothing published yet
COMBINE_STEPS = (STEP_AFTER_COMBINE, STEP_AFTER_RECORD)

REWRITE_BLOCK_BYTES = 256 * 1024 * 1024  # uncompressed rows per part written
DEFAULT_MAX_QUERY_SIZE = 262_144  # the servers' default max_query_size
PARTITIONS_LIMIT = "max_partitions_per_insert_block"  # not on 18.16


@dataclass(frozen=True)
class SizeLimits:
    """Where combining stops copying data (figures in ``docs/benchmarks.md``)."""

    rewrite_max_bytes: int = 64 * 1024 * 1024  # all sources together, on disk
    rewrite_max_sources: int = 200  # more: attach (one INSERT reading them all slows down)
    # A staged part above this (on disk, on average) is large already: rewriting or merging
    # it costs more in the commit than the part it saves (2 branches of 2M rows on 26.x:
    # +1.4 s for one part less per partition). Tiny parts are what "too many parts" is.
    small_part_bytes: int = 1024 * 1024
    merge_max_bytes: int = 256 * 1024 * 1024  # per partition, when attaching
    # A partition of at most this many parts is published as it is, for the server's
    # background merges, as a plain INSERT from as many tasks leaves it: merging it in the
    # commit costs the epoch (100,000 rows in 4 partitions of 2 parts: ~140 ms on 26.x) and
    # buys no fewer parts than plain's. An epoch of more branches adds one part instead.
    merge_above_parts: int = 8
    # A task's staged table over more partitions than this is not contributed: an attach
    # per (task, partition), then the combine's copy and publish of every contributed part,
    # cost more than rewriting the sources at the commit (4 tasks × 50 partitions on
    # 26.x: twice the server CPU and commit time; ``docs/benchmarks.md``).
    contribute_max_partitions: int = 4
    # At most this many winners of one server and table are published directly, each from
    # its own staging (a ledger, a watermark and a MOVE or ATTACH each), and the tasks of
    # the partitions below it contribute nothing: for 2 winners the contributions and the
    # combined table cost more statements and requests than a second publish, and buy no
    # fewer parts (``docs/design.md``, "One pass per xid and server").
    direct_max_winners: int = 2

    def merges(self, parts: int, size: int) -> bool:
        """Whether a partition of ``parts`` staged parts, ``size`` bytes on disk in all,
        is merged into one part before it is published."""
        return parts > self.merge_above_parts and size <= self.merge_max_bytes

    def small(self, manifest: Manifest) -> bool:
        """Whether a branch's staged parts are small (worth combining) on average."""
        parts = sum(len(p.parts) for p in manifest.partitions)
        return 0 < sum(p.bytes for p in manifest.partitions) <= parts * self.small_part_bytes

    def contributes(self, manifest: Manifest) -> bool:
        """Whether a task's sealed staging table is worth contributing to its pre-combined
        table: small parts in few partitions."""
        return (len(manifest.partitions) <= self.contribute_max_partitions
                and self.small(manifest))

    def publishes_directly(self, winners: int) -> bool:
        """Whether ``winners`` winners of one server and table are published directly."""
        return winners <= self.direct_max_winners


DEFAULT_LIMITS = SizeLimits()


def combine_key(combined_table: str) -> str:
    """PublishLedger key of the record that the combined table is built and sealed."""
    return f"{combined_table}.combined"


def create_precombined(client: SqlClient, target: TargetTable, name: str) -> str:
    """Create (if absent) the pre-combined table ``name`` in the staging database, with
    merges on; returns it quoted. Idempotent."""
    return create_staging_table(client, target, name, merges=True)


def attach_to_precombined(client: SqlClient, manifest: Manifest, precombined: str) -> bool:
    """Attach a sealed branch's parts into the pre-combined table ``precombined``
    (:func:`create_precombined`). True if every partition was attached; False (logged) on
    any failure, after which the table may hold some of them: the combine then finds the
    rows differ and reads the sources instead.

    Task side, before the branch is prepared; any number of tasks at once, of any
    attempt. Not repeatable: a second call attaches the parts again (the combine would
    fall back), so a task calls it once per branch.
    """
    if not manifest.partitions:
        return False
    source = qualified_name(manifest.staging_database, manifest.staging_table)
    commands = ", ".join(f"ATTACH PARTITION ID {sql_string(p.partition_id)} FROM {source}"
                         for p in manifest.partitions)
    try:
        client.execute(f"ALTER TABLE {staging_qualified(precombined)} {commands}",
                       purpose="contribute to pre-combined table", retry=False)
    except ClickHouseError as exc:
        log.warning("%s not contributed to %s (the commit reads it instead): %s",
                    source, precombined, exc)
        return False
    return True


def publish_combined(
    client: SqlClient,
    sources: list[Manifest],
    combined_table: str,
    strategy: str,
    ledger: PublishLedger,
    *,
    precombined: str = "",
    direct: frozenset[str] = frozenset(),
    target: TargetTable | None = None,
    on_step: StepHook | None = None,
    limits: SizeLimits = DEFAULT_LIMITS,
) -> PublishReport:
    """Publish the sealed staging tables ``sources`` (one target, one server) in one pass
    through ``combined_table`` (in the staging database). ``precombined``: the table the
    sources contributed to ("": read the sources), but for those named (staging table) in
    ``direct``, which did not. ``target``: the description the sources' staging tables
    were created from, if the caller has it (else the target is described). Re-runnable;
    the caller drops the combined table afterwards, as it drops a branch's staging after
    ``publish``."""
    step = on_step or no_step
    manifest = combine(client, sources, combined_table, ledger, precombined=precombined,
                       direct=direct, target=target, on_step=step, limits=limits)
    return publish(client, manifest, strategy, ledger, on_step=step)


def combine(
    client: SqlClient,
    sources: list[Manifest],
    combined_table: str,
    ledger: PublishLedger,
    *,
    precombined: str = "",
    direct: frozenset[str] = frozenset(),
    target: TargetTable | None = None,
    on_step: StepHook = no_step,
    limits: SizeLimits = DEFAULT_LIMITS,
) -> Manifest:
    """The sealed manifest of the combined table, built now or recorded earlier."""
    key = combine_key(combined_table)
    record = PublishRecord.load(ledger, key)
    if record is not None and record.state == COMBINED and record.manifest is not None:
        manifest = record.manifest
    else:
        manifest = _build(client, sources, combined_table, precombined, direct, target,
                          limits)
        on_step(STEP_AFTER_COMBINE)
        PublishRecord(COMBINED, manifest=manifest).store(ledger, key)
        on_step(STEP_AFTER_RECORD)
    return manifest


def _build(client: SqlClient, sources: list[Manifest], combined_table: str,
           precombined: str, direct: frozenset[str], target: TargetTable | None,
           limits: SizeLimits) -> Manifest:
    targets = {(m.target_database, m.target_table) for m in sources}
    if len(targets) != 1:
        raise ValueError(f"sources of one combined table must share a target, got {targets}")
    database, table = next(iter(targets))
    sources = [m for m in sources if m.partitions]  # a task without rows staged no table
    if target is None or (target.database, target.name) != (database, table):
        target = describe_table(client, f"{database}.{table}")
    staging = staging_qualified(combined_table)
    adopted = None
    if sources and precombined:
        _recreate(client, target, combined_table)
        adopted = _adopt(client, sources, precombined, direct, staging, limits)
    if adopted is None:
        require_sealed(client, sources, purpose="read winners' staged parts before combining")
        _recreate(client, target, combined_table)
        if sources and _rewrites(sources, limits):
            _rewrite(client, target, sources, staging)
        elif sources:
            _attach(client, sources, staging, limits)
    # no source with rows: the combined table stays empty and is sealed with 0 rows
    manifest = seal(client, target, combined_table, sum(m.rows for m in sources),
                    partitions=adopted)
    log.info("combined %d branches into %s%s: %d partitions, %d parts", len(sources), staging,
             f" from {precombined}" if adopted is not None else "", len(manifest.partitions),
             sum(len(p.parts) for p in manifest.partitions))
    return manifest


def _recreate(client: SqlClient, target: TargetTable, combined_table: str) -> None:
    """An empty combined table: whatever an unrecorded build left in it is dropped."""
    rollback(client, combined_table)
    create_staging_table(client, target, combined_table)


def _adopt(client: SqlClient, sources: list[Manifest], precombined: str,
           direct: frozenset[str], staging: str, limits: SizeLimits
           ) -> dict[str, PartitionManifest] | None:
    """Merge the contributed sources' partitions in the pre-combined table and copy them
    from there, the ``direct`` sources' from their own staging tables; the combined table's
    partitions as read last if each partition holds exactly the rows the sources sealed
    there (see the module's contract), else None. Where the background merges left more
    than ``merge_above_parts`` parts, the partition is merged before the copy, so the copy
    takes one part of it."""
    expected: dict[str, int] = {}
    contributed: dict[str, int] = {}  # parts per partition; background merges only lessen
    own: list[str] = []  # the direct sources' ATTACH commands
    for source in sources:
        table = qualified_name(source.staging_database, source.staging_table)
        for partition in source.partitions:
            pid = partition.partition_id
            expected[pid] = expected.get(pid, 0) + partition.rows
            if source.staging_table in direct:
                own.append(f"ATTACH PARTITION ID {sql_string(pid)} FROM {table}")
            else:
                contributed[pid] = contributed.get(pid, 0) + len(partition.parts)
    pool = staging_qualified(precombined)
    try:  # the pool's merges are on (create_precombined)
        if any(limits.merges(n, 0) for n in contributed.values()):  # else nothing to read
            merge_partitions(client, pool, _to_merge(client, pool, set(contributed), limits),
                             merges_on=True)
        commands = [f"ATTACH PARTITION ID {sql_string(pid)} FROM {pool}"
                    for pid in sorted(contributed)] + own
        for start in range(0, len(commands), MAX_COMMANDS_PER_ALTER):
            chunk = commands[start:start + MAX_COMMANDS_PER_ALTER]
            client.execute(f"ALTER TABLE {staging} {', '.join(chunk)}",
                           purpose="copy pre-combined partitions", retry=False)
    except ClickHouseError as exc:
        log.warning("pre-combined %s not used (the sources are read instead): %s",
                    precombined, exc)
        return None
    found = read_staged_partitions(client, *split_table_name(staging),
                                   purpose="check pre-combined rows")
    rows = {pid: p.rows for pid, p in found.items()}
    if rows != expected:
        differ = sorted(pid for pid in set(rows) | set(expected)
                        if rows.get(pid) != expected.get(pid))
        log.warning("pre-combined %s not used: partitions %s hold other rows than the winners "
                    "sealed (a failed or speculative attempt contributed too)", precombined,
                    differ)
        return None
    raced = _to_merge(client, staging, set(expected), limits, found)
    if raced:  # a merge that the copy raced with leaves a partition in several parts
        merge_partitions(client, staging, raced)
        found = read_staged_partitions(client, *split_table_name(staging),
                                       purpose="check pre-combined rows")
    return found


def _to_merge(client: SqlClient, table: str, partition_ids: set[str], limits: SizeLimits,
              found: dict[str, PartitionManifest] | None = None) -> list[str]:
    """The partitions among ``partition_ids`` of ``table`` (quoted) worth merging."""
    if found is None:
        found = read_staged_partitions(client, *split_table_name(table),
                                       purpose="read pre-combined parts")
    return sorted(pid for pid, p in found.items() if pid in partition_ids
                  and limits.merges(len(p.parts), p.bytes))


def _rewrites(sources: list[Manifest], limits: SizeLimits) -> bool:
    """Whether the sources are small and few enough to be rewritten rather than attached."""
    total = sum(p.bytes for m in sources for p in m.partitions)
    parts = sum(len(p.parts) for m in sources for p in m.partitions)
    return (total <= limits.rewrite_max_bytes and total <= parts * limits.small_part_bytes
            and len(sources) <= limits.rewrite_max_sources
            and len({m.staging_database for m in sources}) == 1)


def _rewrite(client: SqlClient, target: TargetTable, sources: list[Manifest],
             staging: str) -> None:
    """Copy every source's rows into the combined table with one ``INSERT ... SELECT``.

    The server squashes the rows into blocks of up to ``REWRITE_BLOCK_BYTES``, so each
    partition gets one part per block: one, for the epochs this path takes. Not
    repeatable (a failed INSERT may have written some blocks): a repeat of the combine
    drops the table first. MATERIALIZED columns are copied, not recomputed.
    """
    names, copy_settings = copied_columns(target)
    # A regular expression naming exactly the sources: merge() takes its columns from the
    # first table it matches, so nothing else may match (a transaction's other targets
    # stage under the same xid prefix). 18.16 pays ~20 us per alternative and table of the
    # staging database for it (18.6 s for 1,000 sources): hence rewrite_max_sources.
    tables = "|".join(re.escape(m.staging_table) for m in sources)
    sql = (f"INSERT INTO {staging} ({names}) SELECT {names} FROM "
           f"merge({sql_string(sources[0].staging_database)}, {sql_string(f'^({tables})$')})")
    settings: dict[str, object] = {
        "min_insert_block_size_rows": 0, "min_insert_block_size_bytes": REWRITE_BLOCK_BYTES,
        "max_query_size": max(DEFAULT_MAX_QUERY_SIZE, len(sql) + 1), **copy_settings}
    if PARTITIONS_LIMIT in known_settings(client, (PARTITIONS_LIMIT,)):
        settings[PARTITIONS_LIMIT] = 0  # an epoch may span more than 100 partitions
    client.execute(sql, purpose="combine winners into one table", settings=settings,
                   retry=False)


def _attach(client: SqlClient, sources: list[Manifest], staging: str,
            limits: SizeLimits) -> None:
    """Attach every source partition (hard links), merging partitions that
    ``SizeLimits.merges`` names and whose parts are small into one part."""
    sizes: dict[str, tuple[int, int]] = {}
    for source in sources:
        for partition in source.partitions:
            parts, size = sizes.get(partition.partition_id, (0, 0))
            sizes[partition.partition_id] = (parts + len(partition.parts), size + partition.bytes)
    small = {pid for pid, (parts, size) in sizes.items()
             if limits.merges(parts, size) and size <= parts * limits.small_part_bytes}
    commands = [(p.partition_id, f"ATTACH PARTITION ID {sql_string(p.partition_id)} FROM "
                                 f"{qualified_name(m.staging_database, m.staging_table)}")
                for m in sources for p in m.partitions]
    for start in range(0, len(commands), MAX_COMMANDS_PER_ALTER):
        chunk = commands[start:start + MAX_COMMANDS_PER_ALTER]
        client.execute(f"ALTER TABLE {staging} {', '.join(c for _, c in chunk)}",
                       purpose="combine winners into one table", retry=False)
        if start + MAX_COMMANDS_PER_ALTER < len(commands):
            # An ATTACH costs more the more parts its table holds (measured on 18.16:
            # ~1 ms at 200 sources, ~9 ms at 1,000): merge as we go, so it stays cheap.
            merge_partitions(client, staging, sorted({pid for pid, _ in chunk} & small))
    merge_partitions(client, staging, sorted(small))
