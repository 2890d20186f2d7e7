"""How many columns a staging INSERT can write within the server's memory limit.

Why: an INSERT writes a new part, and the part writer holds a buffer for every file it
writes (one per column, more for Nullable, Array, LowCardinality), whatever the number of
rows. Measured on 18.16: about 2 MiB per file (its 1 MiB compressed-block buffer and its
1 MiB file buffer; no query setting changes it: ``max_compress_block_size``,
``max_insert_block_size``, ``min_insert_block_size_rows`` and ``max_block_size`` left the
peak unchanged), so with its ``max_memory_usage`` of 4 GB (3.73 GiB) one INSERT of a
table with ~1,900 plain columns fails with "Memory limit exceeded", even for one row.
26.x sizes those buffers to the data (~150 KiB per file in a wide part, ~17 KiB per
column in a compact one) and its test server has no per-query limit.

Such a write is refused before staging (``txsink.core.plan_checks``), from what the server
itself says: its per-query limit (``max_memory_usage``, ``max_memory_usage_for_user``;
0 is none) and the memory a one-row INSERT takes per file, measured on the server with a
narrow and a wide scratch table (``system.query_log``'s peak ``memory_usage``; wide parts
forced where the server has compact ones, the most a staging part can take). Where the
server keeps no query log the cost is estimated from its ``max_compress_block_size`` plus
the 1 MiB file buffer (what 18.16 measured). Cached per server url for the process, and
probed only where a limit is set.

The estimate covers the part's buffers only: the rows themselves add their size (the
server squashes an INSERT's rows into one block), which ``insert_block_rows`` bounds.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass
from typing import Protocol

from server_ext.client.client_protocol import SqlClient
from server_ext.errors import ClickHouseError
from server_ext.sql import SCRATCH_DATABASE, qualified_name, quote_identifier, sql_string
from server_ext.types.chtypes import ChType
from server_ext.types.target_table import Column, TargetTable


class ProbeClient(SqlClient, Protocol):
    """``SqlClient`` that can also INSERT a body (``ClickHouseClient``)."""

    def insert(self, table: str, body: bytes, *, fmt: str, purpose: str,
               columns: list[str] | None = None, settings: dict | None = None) -> None: ...


PROBE_FILES = 128  # columns of the wide probe table beyond the narrow one's
FILE_BUFFER = 1 << 20  # the part writer's file buffer (DBMS_DEFAULT_BUFFER_SIZE), no setting
UNSTORED = ("ALIAS", "EPHEMERAL")


@dataclass(frozen=True)
class InsertMemory:
    """A server's per-query memory limit and what a staging INSERT's part costs in it."""

    limit: int  # bytes; 0: no per-query limit
    base: int  # bytes a one-row INSERT holds whatever its columns
    per_file: int  # bytes per file the part writes
    measured: bool  # from the server's query log (else estimated from its settings)

    def needed(self, files: int) -> int:
        """Bytes a one-row INSERT writing ``files`` files needs."""
        return self.base + files * self.per_file

    def max_files(self) -> int:
        """The most files one INSERT can write within the limit (0 limit: unbounded, -1)."""
        return -1 if not self.limit else max(0, (self.limit - self.base) // self.per_file)


def column_files(ch: ChType) -> int:
    """How many files a part writes for a column of type ``ch`` (measured on 18.16:
    Nullable and Array add one to their element's, LowCardinality writes two)."""
    if ch.base in ("Nullable", "Array") and ch.inner is not None:
        return 1 + column_files(ch.inner)
    if ch.base == "LowCardinality":
        return 2
    if ch.base == "Tuple":
        return sum(column_files(e) for e in ch.elements) or 1
    if ch.base == "Map" and len(ch.elements) == 2:
        return 1 + sum(column_files(e) for e in ch.elements)
    return 1


def table_files(columns: list[Column]) -> int:
    """Files a part of a table with ``columns`` writes (ALIAS and EPHEMERAL are not stored)."""
    return sum(column_files(c.chtype) for c in columns if c.default_kind not in UNSTORED)


def memory_problem(client: ProbeClient, table: TargetTable) -> str | None:
    """Why one staging INSERT into a copy of ``table`` cannot fit in the server's
    per-query memory limit (None: it fits, or the server has no limit)."""
    memory = insert_memory(client)
    files = table_files(table.columns)
    if not memory.limit or memory.needed(files) <= memory.limit:
        return None
    how = "measured on this server" if memory.measured else \
        "estimated from its max_compress_block_size"
    return (f"an INSERT into its staging copy writes {files} column files for its "
            f"{len(table.columns)} columns and needs about {_size(memory.needed(files))} of "
            f"server memory ({_size(memory.per_file)} per file, {how}), above the server's "
            f"per-query limit of {_size(memory.limit)} (max_memory_usage), which allows "
            f"{memory.max_files()} files; write fewer columns per table or raise the limit")


_CACHE: dict[str, InsertMemory] = {}
_LOCK = threading.Lock()


def insert_memory(client: ProbeClient) -> InsertMemory:
    """The server's limit and INSERT costs (:class:`InsertMemory`), cached per url."""
    with _LOCK:
        found = _CACHE.get(client.url)
    if found is None:
        found = _probe(client)
        with _LOCK:
            _CACHE[client.url] = found
    return found


def _probe(client: ProbeClient) -> InsertMemory:
    settings = _settings(client, ("max_memory_usage", "max_memory_usage_for_user",
                                  "max_compress_block_size"))
    limits = [int(settings.get(n) or 0) for n in ("max_memory_usage", "max_memory_usage_for_user")]
    limit = min((x for x in limits if x > 0), default=0)
    estimate = InsertMemory(limit, 4 << 20,
                            int(settings.get("max_compress_block_size") or 1 << 20) + FILE_BUFFER,
                            measured=False)
    if not limit:
        return estimate
    try:
        narrow, wide = _measure(client, 1), _measure(client, 1 + PROBE_FILES)
    except ClickHouseError:  # no query log (or no right to flush it): the estimate
        return estimate
    if narrow is None or wide is None or wide <= narrow:
        return estimate
    per_file = (wide - narrow) // PROBE_FILES
    return InsertMemory(limit, max(0, narrow - per_file), per_file, measured=True)


def _settings(client: SqlClient, names: tuple[str, ...]) -> dict[str, str]:
    wanted = ", ".join(sql_string(n) for n in names)
    rows = client.query_rows(f"SELECT name, value FROM system.settings WHERE name IN ({wanted})",
                             purpose="read the server's memory limits")
    return {row["name"]: row["value"] for row in rows}


def _measure(client: ProbeClient, columns: int) -> int | None:
    """Peak memory of a one-row INSERT into a scratch MergeTree of ``columns`` UInt8
    columns, from ``system.query_log``."""
    name = f"probe_insert_memory_{uuid.uuid4().hex[:12]}"
    table = qualified_name(SCRATCH_DATABASE, name)
    purpose = "measure the memory of an insert"
    wide = "min_bytes_for_wide_part" in _merge_tree_settings(client)
    client.execute(f"CREATE DATABASE IF NOT EXISTS {quote_identifier(SCRATCH_DATABASE)}",
                   purpose="create scratch database")
    names = [f"c{i}" for i in range(columns)]
    try:
        client.execute(
            f"CREATE TABLE {table} ({', '.join(f'{quote_identifier(n)} UInt8' for n in names)}) "
            "ENGINE = MergeTree() ORDER BY tuple()"
            + (" SETTINGS min_bytes_for_wide_part = 0" if wide else ""), purpose=purpose)
        client.insert(table, ("\t".join("1" for _ in names) + "\n").encode(),
                      fmt="TabSeparated", purpose=purpose, columns=names,
                      settings={"log_queries": 1})
        client.execute("SYSTEM FLUSH LOGS", purpose=purpose)
        rows = client.query_rows(  # type 2: QueryFinish (18.16's column is no enum)
            "SELECT max(memory_usage) AS peak, count() AS found FROM system.query_log "
            f"WHERE toUInt8(type) = 2 AND position(query, {sql_string(name)}) > 0 "
            "AND query LIKE 'INSERT%'", purpose=purpose)
    finally:
        client.execute(f"DROP TABLE IF EXISTS {table}", purpose="drop probe table")
    return int(rows[0]["peak"]) if rows and int(rows[0]["found"]) else None


def _merge_tree_settings(client: SqlClient) -> set[str]:
    rows = client.query_rows("SELECT name FROM system.merge_tree_settings "
                             "WHERE name = 'min_bytes_for_wide_part'",
                             purpose="list MergeTree settings")
    return {row["name"] for row in rows}



def _size(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"
