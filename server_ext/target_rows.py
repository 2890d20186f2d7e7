"""Rows per partition of a target table, as the server holds them (for ``txsink verify``).

Why a module: the verifier compares what the transaction history says was published
with what a target actually holds, and only the server side knows (a) how many rows each
partition holds, (b) whether two recorded servers hold the *same* data (replicas of one
Replicated table), and (c) whether the table's row count can be compared at all (an
engine that collapses rows in merges, or a TTL that deletes them, makes "fewer rows" a
normal event).

Contract:
- :func:`table_rows` only reads (``system.tables``, ``system.parts``,
  ``system.replicas``); it never counts by scanning the table except for partitions with
  lightweight-deleted rows (servers that have them), whose ``count()`` is exact where the
  parts' row counts are not.
- ``identity`` is equal for two ``TableRows`` exactly when they describe the same stored
  data: the ZooKeeper path of a Replicated table (shared by its replicas), otherwise the
  server's host name and the table's metadata path (so two URLs of one server agree).
- ``exact`` is None when ``partitions`` changes only by inserts, attaches and deletions;
  otherwise it says why counts cannot be compared.
- ``digests``: the content digest (``server_ext.types.digest``) of each partition asked for,
  from one scan of those partitions (a partition without rows has none); its count then
  replaces the parts' count, being exact and of the same read. ``digest_scheme`` is the
  scheme of the table's current columns (None: not computed, ``digest_note`` says why).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from server_ext.capabilities import row_hash_argument
from server_ext.client.catalog import catalog_rows
from server_ext.client.client_protocol import SqlClient
from server_ext.errors import ClickHouseError, ServerUnreachable
from server_ext.sql import qualified_name, sql_string, table_filter
from server_ext.types.digest import (
    ContentDigest,
    partition_digests,
    row_hash,
    scheme_of,
    stored_columns,
)

# Engines whose row count is exactly what was inserted minus what was deleted.
EXACT_ENGINES = frozenset({"MergeTree", "ReplicatedMergeTree"})
_TABLE_TTL_RE = re.compile(r"\bTTL\b")


@dataclass(frozen=True)
class TableRows:
    """One table on one server: its rows per partition id and how far they can be trusted."""

    server: str
    database: str
    table: str
    exists: bool
    identity: str
    engine: str = ""
    exact: str | None = None
    replicated: bool = False
    pending_inserts: int = 0  # replication queue entries that will add parts here
    partitions: dict[str, int] = field(default_factory=dict)
    digests: dict[str, ContentDigest] = field(default_factory=dict)
    digest_scheme: str | None = None
    digest_note: str = ""  # why content is not compared (a column TTL, a failed scan)

    @property
    def name(self) -> str:
        return f"{self.database}.{self.table}"


def table_rows(client: SqlClient, database: str, table: str,
               digest_partitions: Iterable[str] = ()) -> TableRows:
    """Rows per partition id of ``database.table`` on ``client``'s server, with the
    content digest of each of ``digest_partitions``.

    A table that does not exist gives ``exists=False`` and no partitions (every row the
    history put there is gone). Raises ``ClickHouseError`` (``ServerUnreachable``) when the
    server cannot answer.
    """
    purpose = f"count rows of {database}.{table}"
    meta = catalog_rows(client,
        "SELECT hostName() AS host, * FROM system.tables "
        f"WHERE {table_filter(database, table, name_column='name')}",
        purpose=purpose,
    )
    if not meta:
        host = client.query_rows("SELECT hostName() AS host", purpose=purpose)[0]["host"]
        return TableRows(client.url, database, table, exists=False,
                         identity=f"{host}:missing:{database}.{table}")
    info = meta[0]
    engine = str(info["engine"])
    replicated = engine.startswith("Replicated")
    identity = f"{info['host']}:{info.get('metadata_path') or f'{database}.{table}'}"
    pending = 0
    if replicated:
        replica = client.query_rows(
            "SELECT zookeeper_path, inserts_in_queue FROM system.replicas "
            f"WHERE {table_filter(database, table)}",
            purpose=purpose,
        )
        if replica:
            identity = f"replicated:{replica[0]['zookeeper_path']}"
            pending = int(replica[0]["inserts_in_queue"])
    found = TableRows(
        client.url, database, table, exists=True, identity=identity, engine=engine,
        exact=_why_inexact(engine, str(info.get("engine_full", ""))),
        replicated=replicated, pending_inserts=pending,
        partitions=_partition_rows(client, database, table, purpose),
    )
    wanted = sorted(set(digest_partitions))
    if not wanted:
        return found
    if _column_ttl(info):
        return replace(found, digest_note="a column TTL changes stored values")
    return _with_digests(client, found, wanted, purpose)


def _with_digests(client: SqlClient, found: TableRows, wanted: list[str],
                  purpose: str) -> TableRows:
    # as ``schema.describe_table`` lists them for the seal: same order, same hash
    columns = stored_columns(
        (r["name"], r["type"], r.get("default_type", "")) for r in client.query_rows(
            f"DESCRIBE TABLE {qualified_name(found.database, found.table)}", purpose=purpose))
    try:
        argument = row_hash_argument(client)
        digests = partition_digests(client, found.database, found.table, columns, argument,
                                    partition_ids=wanted, purpose=purpose)
    except ServerUnreachable:
        raise
    except ClickHouseError as exc:
        return replace(found, digest_note=f"its rows cannot be hashed here: {exc}")
    counts = {pid: n for pid, n in found.partitions.items() if pid not in wanted}
    counts.update({pid: d.rows for pid, d in digests.items()})
    return replace(found, partitions=counts, digests=digests,
                   digest_scheme=scheme_of(row_hash(columns, argument)))


def _column_ttl(info: dict) -> bool:
    """A TTL in the table's statement that is not the table's own (in its engine)."""
    query = str(info.get("create_table_query", ""))
    return bool(_TABLE_TTL_RE.search(query)) and not _TABLE_TTL_RE.search(
        str(info.get("engine_full", "")))


def _why_inexact(engine: str, engine_full: str) -> str | None:
    if engine not in EXACT_ENGINES:
        return (f"engine {engine} merges or collapses rows, so its row count is not the "
                "number of rows published")
    if _TABLE_TTL_RE.search(engine_full):
        return "the table has a TTL that deletes rows"
    return None


def _partition_rows(client: SqlClient, database: str, table: str, purpose: str
                    ) -> dict[str, int]:
    """Active parts' rows per partition; ``count()`` where a lightweight DELETE masks rows."""
    where = f"{table_filter(database, table)} AND active"
    masked = "0"
    if _has_part_column(client, "has_lightweight_delete", purpose):
        masked = "max(has_lightweight_delete)"
    rows = client.query_rows(
        f"SELECT partition_id, toString(sum(rows)) AS rows, {masked} AS masked "
        f"FROM system.parts WHERE {where} GROUP BY partition_id",
        purpose=purpose,
    )
    counts = {r["partition_id"]: int(r["rows"]) for r in rows}
    for row in rows:
        if int(row["masked"]):
            counts[row["partition_id"]] = int(client.query_rows(
                f"SELECT toString(count()) AS n FROM {qualified_name(database, table)} "
                f"WHERE _partition_id = {sql_string(row['partition_id'])}",
                purpose=purpose,
            )[0]["n"])
    return {pid: n for pid, n in counts.items() if n}


def _has_part_column(client: SqlClient, column: str, purpose: str) -> bool:
    return bool(client.query_rows(
        "SELECT name FROM system.columns WHERE database = 'system' AND table = 'parts' "
        f"AND name = {sql_string(column)}",
        purpose=purpose,
    ))
