"""Seal a branch: prove its rows landed in staging and describe them in a manifest.

Sealing is the ClickHouse half of "prepare". After it, the branch's staging table must
not change any more (nothing writes to it and its merges are off), so the manifest stays
true until publish, which re-checks it before making anything visible.

Contract: ``seal`` may be repeated and returns the same manifest as long as the staging
table is untouched by others. It only reads, with one exception: for a Replicated target it
merges a staged partition into one part when two of its parts could be byte-identical
(same rows and bytes). Measured on 18.16: attaching a partition that holds two identical
parts into a Replicated table fails ("Node exists" on the part's deduplication id), and
the rows would never be publishable. It raises ``StagedRowsMismatch`` when the staging table
does not hold exactly ``expected_rows`` rows: an insert whose outcome was unknown landed
twice or not at all, and the branch must not be prepared (its task attempt fails and Spark
retries it as a new branch). A branch that wrote nothing gives an empty manifest.
"""

from __future__ import annotations

import dataclasses
import logging
from concurrent.futures import ThreadPoolExecutor
from contextvars import copy_context

from server_ext.capabilities import detect_capabilities, known_settings
from server_ext.client.client_protocol import SqlClient
from server_ext.errors import ClickHouseError, ServerUnreachable, StagingChanged
from server_ext.sql import clause, qualified_name, split_table_name, sql_string
from server_ext.staging.manifest import Manifest, PartitionManifest, StagedPart
from server_ext.staging.staging_tables import STAGING_DATABASE
from server_ext.types.digest import ContentDigest, partition_digests, stored_columns
from server_ext.types.target_table import TargetTable

log = logging.getLogger(__name__)

MERGE_WORKERS = 4  # OPTIMIZE statements of one table at once
# Newer servers' OPTIMIZE ... FINAL rewrites a partition that is one merged part already
# (45 ms for 100,000 rows on 26.x); 18.16 has no such setting.
SKIP_MERGED = "optimize_skip_merged_partitions"


class StagedRowsMismatch(Exception):
    """The staging table does not hold the rows the branch sent."""

    def __init__(self, staging: str, expected: int, found: int) -> None:
        self.staging = staging
        self.expected = expected
        self.found = found
        super().__init__(
            f"staging table {staging} holds {found} rows but the branch sent {expected}; "
            "the branch cannot be prepared"
        )


def read_staged_partitions(
    client: SqlClient, database: str, table: str, *, purpose: str
) -> dict[str, PartitionManifest]:
    """Active, non-empty parts of a table grouped by partition id.

    Empty active parts are left out: newer servers leave 0-row covering parts behind in a
    table after MOVE / DROP PARTITION.
    """
    return read_staged_tables(client, database, [table], purpose=purpose).get(table, {})


def read_staged_tables(
    client: SqlClient, database: str, tables: list[str], *, purpose: str
) -> dict[str, dict[str, PartitionManifest]]:
    """``read_staged_partitions`` of many tables of one database in one query."""
    if not tables:
        return {}
    names = ", ".join(sql_string(t) for t in tables)
    rows = client.query_rows(_STAGED_PARTS.format(extra="", database=sql_string(database),
                                                  names=names), purpose=purpose)
    return _grouped(rows)


def read_staged_with_watermark(
    client: SqlClient, database: str, tables: list[str], target: tuple[str, str], *,
    purpose: str
) -> tuple[dict[str, dict[str, PartitionManifest]], int | None, int | None]:
    """``read_staged_tables`` and, in the same query, the highest block number of any
    part of ``target`` (database, table; 0 for none) and the server's clock (Unix
    seconds); both None when the tables hold nothing."""
    watermark = ("(SELECT max(max_block_number) FROM system.parts WHERE database = "
                 f"{sql_string(target[0])} AND table = {sql_string(target[1])}) AS watermark, "
                 "toUnixTimestamp(now()) AS server_clock, ")
    names = ", ".join(sql_string(t) for t in tables)
    rows = client.query_rows(_STAGED_PARTS.format(extra=watermark,
                                                  database=sql_string(database),
                                                  names=names), purpose=purpose)
    if not rows:
        return {}, None, None
    return _grouped(rows), int(rows[0]["watermark"]), int(rows[0]["server_clock"])


_STAGED_PARTS = (
    "SELECT {extra}table, partition_id, partition, name, rows, bytes_on_disk FROM system.parts "
    "WHERE database = {database} AND table IN ({names}) "
    "AND active AND rows > 0 ORDER BY table, partition_id, min_block_number, name"
)


def _grouped(rows: list[dict]) -> dict[str, dict[str, PartitionManifest]]:
    grouped: dict[str, dict[str, list[dict]]] = {}
    for row in rows:
        grouped.setdefault(row["table"], {}).setdefault(row["partition_id"], []).append(row)
    return {
        table: {
            pid: PartitionManifest(
                partition_id=pid,
                value=parts[0]["partition"],
                parts=tuple(StagedPart(p["name"], int(p["rows"]), int(p["bytes_on_disk"]))
                            for p in parts),
            )
            for pid, parts in partitions.items()
        }
        for table, partitions in grouped.items()
    }


def require_sealed(client: SqlClient, manifests: list[Manifest], *, purpose: str) -> None:
    """Raise ``StagingChanged`` unless every manifest's staging table still holds exactly
    its sealed parts (one query per staging database): rows that left staging are never
    published or replaced silently."""
    by_database: dict[str, list[Manifest]] = {}
    for manifest in manifests:
        by_database.setdefault(manifest.staging_database, []).append(manifest)
    for database, group in by_database.items():
        staged = read_staged_tables(client, database, [m.staging_table for m in group],
                                    purpose=purpose)
        for manifest in group:
            found = staged.get(manifest.staging_table, {})
            changed = [p.partition_id for p in manifest.partitions
                       if p.partition_id not in found
                       or found[p.partition_id].part_names != p.part_names]
            if changed:
                raise StagingChanged(
                    f"staging {database}.{manifest.staging_table} no longer holds the sealed "
                    f"parts of partitions {changed}",
                    target=qualified_name(manifest.target_database, manifest.target_table),
                    staging=manifest.staging_table, partition_ids=changed)


def seal(client: SqlClient, target: TargetTable, staging: str, expected_rows: int | None,
         partitions: dict[str, PartitionManifest] | None = None) -> Manifest:
    """Check that ``staging`` holds ``expected_rows`` rows and return its manifest.

    ``expected_rows`` None: the rows came from staging views (``server_ext.ddl.views``), whose
    output only the server knows; the manifest records what the table holds.

    ``partitions``: the table's partitions as the caller has just read them
    (``read_staged_partitions``), when nothing can have changed them since.
    """
    database, table = split_table_name(staging, default_database=STAGING_DATABASE)
    if partitions is None:
        partitions = read_staged_partitions(client, database, table, purpose="seal branch")
    if target.replicated:
        partitions = _merge_lookalike_parts(client, database, table, partitions)
    found = sum(p.rows for p in partitions.values())
    if expected_rows is not None and found != expected_rows:
        raise StagedRowsMismatch(f"{database}.{table}", expected_rows, found)
    return Manifest(
        target_database=target.database,
        target_table=target.name,
        staging_database=database,
        staging_table=table,
        partitions=tuple(partitions[pid] for pid in sorted(partitions)),
    )


def expire_rows(client: SqlClient, target: TargetTable, staging: str,
                partitions: dict[str, PartitionManifest], expected_rows: int | None
                ) -> dict[str, PartitionManifest]:
    """``partitions`` (as just read) of a branch's staging table with the target's table
    TTL applied to them, as a plain INSERT's part has it applied right after it lands.

    A staged part whose rows the TTL already expired (its ``delete_ttl_info_min``, or a
    ``WHERE`` or ``GROUP BY`` rule's minimum, at or before the server's now) would
    otherwise be published with them and keep them visible until the target's next TTL
    merge, where a plain INSERT's rows are gone at once (measured on 26.9: its TTL merge
    runs before the INSERT's response is read). The staging table's TTL merges are off
    (``staging_ddl``), so the TTL is applied by ``MATERIALIZE TTL`` (a synchronous
    mutation, about 40 ms for 1,000 rows) between ``SYSTEM START MERGES`` and ``STOP``,
    and the parts read again. The rows sent are
    counted first (``StagedRowsMismatch``); the manifest then holds what the TTL left.
    Targets without a TTL, and staged rows none of which expired (one read), are
    returned as they are. Servers without TTL (18.16) never get here.
    """
    if not partitions or not clause(target.engine_full, "TTL", ("SETTINGS",)):
        return partitions
    database, table = split_table_name(staging, default_database=STAGING_DATABASE)
    now = "toUnixTimestamp(now())"
    expired = client.query_rows(
        f"SELECT count() AS n FROM system.parts WHERE database = {sql_string(database)} "
        f"AND table = {sql_string(table)} AND active AND rows > 0 "
        f"AND (toUnixTimestamp(delete_ttl_info_min) BETWEEN 1 AND {now} "
        f"OR arrayExists(m -> toUnixTimestamp(m) BETWEEN 1 AND {now}, "
        "arrayConcat(rows_where_ttl_info.min, group_by_ttl_info.min)))",
        purpose="staged rows TTL expired")
    if not int(expired[0]["n"]):
        return partitions
    found = sum(p.rows for p in partitions.values())
    if expected_rows is not None and found != expected_rows:
        raise StagedRowsMismatch(f"{database}.{table}", expected_rows, found)
    name = qualified_name(database, table)
    # a mutation runs in the merge pool, which SYSTEM STOP MERGES holds (the table's
    # settings still keep every other merge off)
    client.execute(f"SYSTEM START MERGES {name}", purpose="let staging apply its TTL")
    client.execute(f"ALTER TABLE {name} MATERIALIZE TTL", settings={"mutations_sync": "2"},
                   purpose="apply the target's TTL to staging")
    client.execute(f"SYSTEM STOP MERGES {name}", purpose="hold staging's merges again")
    return read_staged_partitions(client, database, table, purpose="seal branch after TTL")


def staged_digests(client: SqlClient, target: TargetTable, staging: str
                   ) -> dict[str, ContentDigest] | None:
    """The content digest of each partition of ``staging`` (a staging table of
    ``target``, rows no longer sent), or None where the server cannot compute one.

    Only reads, so it may run beside other reads of the table: a task digests while it
    seals and contributes, and :func:`digested` keeps a digest only where it counted the
    sealed rows. A server that cannot compute a digest gives none (the branch is then
    judged by row counts alone), never a failure.
    """
    database, table = split_table_name(staging, default_database=STAGING_DATABASE)
    columns = stored_columns((c.name, c.type, c.default_kind) for c in target.columns)
    try:
        return partition_digests(client, database, table, columns,
                                 detect_capabilities(client).hash_argument,
                                 purpose="digest staged rows")
    except ServerUnreachable:
        raise
    except ClickHouseError as exc:  # a column type the server cannot hash: count only
        log.warning("staging %s.%s: no content digest (verify counts its rows only): %s",
                    database, table, exc)
        return None


def digested(manifest: Manifest, digests: dict[str, ContentDigest] | None) -> Manifest:
    """``manifest`` with each partition's digest from ``digests`` where it counted exactly
    the partition's sealed rows."""
    if not digests:
        return manifest
    return dataclasses.replace(manifest, partitions=tuple(
        dataclasses.replace(p, digest=digests[p.partition_id])
        if p.partition_id in digests and digests[p.partition_id].rows == p.rows else p
        for p in manifest.partitions))


def _merge_lookalike_parts(
    client: SqlClient, database: str, table: str, partitions: dict[str, PartitionManifest]
) -> dict[str, PartitionManifest]:
    """Merge each partition holding two parts of equal rows and bytes into one part."""
    lookalikes = [
        pid for pid, partition in partitions.items()
        if len({(p.rows, p.bytes) for p in partition.parts}) < len(partition.parts)
    ]
    if not lookalikes:
        return partitions
    merge_partitions(client, qualified_name(database, table), lookalikes)
    merged = read_staged_partitions(client, database, table, purpose="seal branch")
    unmerged = [pid for pid in lookalikes if len(merged[pid].parts) != 1]
    if unmerged:
        raise RuntimeError(f"staging {database}.{table}: OPTIMIZE left partitions {unmerged} "
                           "with several parts")
    return merged


def merge_partitions(client: SqlClient, staging: str, partition_ids: list[str],
                     merges_on: bool = False) -> None:
    """Merge each named partition of a staging table (quoted) into one part.

    Staging merges are off (see ``staging``), unless ``merges_on``; OPTIMIZE still merges
    while they are started, and the background merge selector cannot pick any part
    meanwhile. Partitions merge at once where the client allows it (``concurrent``): a
    merge is one thread on the server, and four partitions of 50k rows merged 1.5x faster
    so on 2 cores (18.16 and 26.x alike).
    """
    if not partition_ids:
        return
    # A background merge (merges on) may have made a partition one part since the caller
    # counted its parts: that part is not rewritten.
    settings = {SKIP_MERGED: 1} if SKIP_MERGED in known_settings(client, (SKIP_MERGED,)) else None

    def merge(pid: str) -> None:
        client.execute(f"OPTIMIZE TABLE {staging} PARTITION ID {sql_string(pid)} FINAL",
                       purpose="merge staged parts", settings=settings)

    if not merges_on:
        client.execute(f"SYSTEM START MERGES {staging}", purpose="start merges in staging")
    try:
        if len(partition_ids) > 1 and getattr(client, "concurrent", False):
            with ThreadPoolExecutor(min(MERGE_WORKERS, len(partition_ids)),
                                    thread_name_prefix="txsink-merge") as pool:
                # each in a copy of the caller's context, taken here (a caller may count
                # the statements its work sends); raises the first failure
                futures = [pool.submit(copy_context().run, merge, pid) for pid in partition_ids]
                for future in futures:
                    future.result()
        else:
            for pid in partition_ids:
                merge(pid)
    finally:
        if not merges_on:
            client.execute(f"SYSTEM STOP MERGES {staging}", purpose="stop merges in staging")
