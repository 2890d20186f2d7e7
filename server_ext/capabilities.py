"""What the connected ClickHouse server can do, asked from the server itself.

Why not from the version number: forks, backports and ClickHouse Cloud make version
numbers a poor guide, so every capability that changes behaviour is probed directly
(``system.formats``, ``system.settings``, and a throwaway ``ALTER ... MOVE PARTITION`` on
two empty tables in a scratch database). The version is kept as a hint for humans.

Contract: ``detect_capabilities`` is safe to call at any time and from several processes
at once (each probe uses its own uniquely named tables, dropped afterwards); the answer is
cached per client url for the life of the process. Callers may override any detected
value with ``Capabilities.with_overrides`` (e.g. to force a publish strategy in a test).
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from dataclasses import dataclass
from typing import Literal, Protocol

from server_ext.client import qualified_name, quote_identifier
from server_ext.errors import ClickHouseError

SCRATCH_DATABASE = "txsink_scratch"
Strategy = Literal["move", "attach_replicated", "attach_marked"]
STRATEGIES: tuple[Strategy, ...] = ("move", "attach_replicated", "attach_marked")


class SqlClient(Protocol):
    """The part of ``ClickHouseClient`` / ``ChdbClient`` this module uses."""

    url: str

    def execute(self, sql: str, *, purpose: str, settings: dict | None = None,
                retry: bool = True) -> None: ...

    def query_rows(self, sql: str, *, purpose: str, settings: dict | None = None
                   ) -> list[dict]: ...

    def query_value(self, sql: str, *, purpose: str) -> str: ...


class ReplicatedTarget(Protocol):
    """Anything that says whether a target table is Replicated (``TargetTable`` does)."""

    replicated: bool


@dataclass(frozen=True)
class Capabilities:
    """Server features that change how txsink writes and publishes."""

    version: tuple[int, ...]
    version_text: str
    move_partition: bool  # ALTER TABLE s MOVE PARTITION ... TO TABLE t
    arrow_stream: bool  # ArrowStream input format
    native: bool  # Native input format
    row_binary: bool  # RowBinary input format
    low_cardinality: bool  # LowCardinality(T) columns can be created
    low_cardinality_native_setting: bool  # low_cardinality_allow_in_native_format exists
    insert_deduplication_token: bool  # per-insert dedup token setting
    non_replicated_deduplication_window: bool  # dedup for plain MergeTree exists
    keeper: bool  # the server has a ZooKeeper/Keeper configured (Replicated tables work)

    def with_overrides(self, **changes: object) -> Capabilities:
        """A copy with some detected values replaced (unknown names raise TypeError)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


_CACHE: dict[str, Capabilities] = {}
_CACHE_LOCK = threading.Lock()


def detect_capabilities(client: SqlClient, *, refresh: bool = False) -> Capabilities:
    """Capabilities of the server behind ``client`` (cached per ``client.url``)."""
    with _CACHE_LOCK:
        cached = _CACHE.get(client.url)
    if cached is not None and not refresh:
        return cached
    caps = _probe(client)
    with _CACHE_LOCK:
        _CACHE[client.url] = caps
    return caps


def choose_strategy(caps: Capabilities, target: ReplicatedTarget) -> Strategy:
    """The publish strategy for ``target`` on this server.

    A Replicated target always gets ``attach_replicated``: MOVE PARTITION needs source and
    destination of the same engine family and staging is a plain MergeTree, while the
    target's replication log deduplicates a repeated attach. A plain target gets ``move``
    where the server has it (a repeat moves nothing) and ``attach_marked`` otherwise.
    """
    if target.replicated:
        return "attach_replicated"
    return "move" if caps.move_partition else "attach_marked"


def _probe(client: SqlClient) -> Capabilities:
    version_text = client.query_value("SELECT version()", purpose="read server version")
    formats = _input_formats(client)
    settings = _known_settings(client)
    return Capabilities(
        version=_version_tuple(version_text),
        version_text=version_text,
        move_partition=_probe_move_partition(client),
        arrow_stream="ArrowStream" in formats,
        native="Native" in formats,
        row_binary="RowBinary" in formats,
        low_cardinality=_has_type_family(client, "LowCardinality"),
        low_cardinality_native_setting="low_cardinality_allow_in_native_format" in settings,
        insert_deduplication_token="insert_deduplication_token" in settings,
        non_replicated_deduplication_window=_has_merge_tree_setting(
            client, "non_replicated_deduplication_window"
        ),
        keeper=_has_keeper(client),
    )


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("."):
        if not piece.isdigit():
            break
        parts.append(int(piece))
    return tuple(parts)


def _input_formats(client: SqlClient) -> set[str]:
    rows = client.query_rows(
        "SELECT name FROM system.formats WHERE is_input", purpose="list input formats"
    )
    return {row["name"] for row in rows}


def _known_settings(client: SqlClient) -> set[str]:
    wanted = ("low_cardinality_allow_in_native_format", "insert_deduplication_token",
              "allow_experimental_low_cardinality_type")
    names = ", ".join(f"'{name}'" for name in wanted)
    rows = client.query_rows(
        f"SELECT name FROM system.settings WHERE name IN ({names})", purpose="list settings"
    )
    return {row["name"] for row in rows}


def _has_type_family(client: SqlClient, family: str) -> bool:
    rows = client.query_rows(
        f"SELECT name FROM system.data_type_families WHERE name = '{family}'",
        purpose="list data types",
    )
    return bool(rows)


def _has_merge_tree_setting(client: SqlClient, name: str) -> bool:
    rows = client.query_rows(
        f"SELECT name FROM system.merge_tree_settings WHERE name = '{name}'",
        purpose="list MergeTree settings",
    )
    return bool(rows)


def _has_keeper(client: SqlClient) -> bool:
    try:
        client.query_value(
            "SELECT count() FROM system.zookeeper WHERE path = '/'", purpose="probe keeper"
        )
    except ClickHouseError:
        return False
    return True


def _probe_move_partition(client: SqlClient) -> bool:
    """Try MOVE PARTITION between two empty throwaway tables; a syntax error means no."""
    suffix = uuid.uuid4().hex[:12]
    source = qualified_name(SCRATCH_DATABASE, f"probe_move_src_{suffix}")
    dest = qualified_name(SCRATCH_DATABASE, f"probe_move_dst_{suffix}")
    client.execute(f"CREATE DATABASE IF NOT EXISTS {quote_identifier(SCRATCH_DATABASE)}",
                   purpose="create scratch database")
    try:
        for table in (source, dest):
            client.execute(
                f"CREATE TABLE {table} (x UInt8) ENGINE = MergeTree() ORDER BY x",
                purpose="create probe table",
            )
        client.execute(f"ALTER TABLE {source} MOVE PARTITION ID 'all' TO TABLE {dest}",
                       purpose="probe MOVE PARTITION", retry=False)
        return True
    except ClickHouseError as exc:
        if exc.code in (62, 48, 36):  # syntax error / not implemented / bad arguments
            return False
        raise
    finally:
        for table in (source, dest):
            client.execute(f"DROP TABLE IF EXISTS {table}", purpose="drop probe table")

