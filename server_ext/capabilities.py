"""What the connected ClickHouse server can do, asked from the server itself.

Why not from the version number: forks, backports and ClickHouse Cloud make version
numbers a poor guide, so every capability that changes behaviour is probed directly
(``system.formats``, ``system.settings``, and a throwaway ``ALTER ... MOVE PARTITION`` on
two empty tables in a scratch database). The version is kept as a hint for humans.

The one place the old-server wing (``server_ext.old_server``, ClickHouse 18.16 only) is
chosen from: its probes are asked here, and what the modern path calls is picked here from
the answers, so that path never names the old server: ``Capabilities.insert_format``
(ArrowStream, or the wing's Native encoder), ``Capabilities.hash_argument`` and
``row_hash_argument`` (the digest's row hash), ``fires_view_chains``; ``move_partition``
is what ``publish.strategy_choice`` picks ``attach_marked`` by.
The Date/DateTime values the server reads back unchanged (``value_ranges``) are measured
the same way, by text round trips of boundary values (~9 small queries).

Contract: ``detect_capabilities`` is safe to call at any time and from several processes
at once (each probe uses its own uniquely named tables, dropped afterwards); the answer is
cached per client url for the life of the process. Callers may override any detected
value with ``Capabilities.with_overrides`` (e.g. to force a publish strategy in a test).
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass

from server_ext.client.client_protocol import SqlClient
from server_ext.errors import KEEPER_EXCEPTION, ClickHouseError
from server_ext.old_server.hash_arguments import hashes_any_type, old_hash_argument
from server_ext.old_server.native_encoder import NATIVE
from server_ext.old_server.probes import moves_partitions, view_chains_fire
from server_ext.sql import sql_string
from server_ext.types.arrow_stream import ARROW_STREAM, InsertFormat
from server_ext.types.chtypes import (
    DATE32_CALENDAR,
    DATE_MAX_DAYS,
    DATETIME64_CALENDAR,
    DATETIME_MAX_SECONDS,
    ValueRanges,
)
from server_ext.types.digest import HashArgument, any_type_argument


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
    async_insert: bool  # the async_insert setting exists (staging inserts then set it to 0)
    non_replicated_deduplication_window: bool  # dedup for plain MergeTree exists
    keeper: bool  # the server has a ZooKeeper/Keeper configured (Replicated tables work)
    hash_any_type: bool  # cityHash64 takes Decimal, UUID and Nullable elements (digest)
    value_ranges: ValueRanges  # Date/DateTime values it stores and reads back unchanged

    @property
    def insert_format(self) -> InsertFormat:
        """The body format of staging INSERTs: ArrowStream where the server reads it, else
        the old-server wing's Native encoder (18.16 reads no ArrowStream)."""
        if self.arrow_stream:
            return ARROW_STREAM
        if self.native:
            return NATIVE
        raise ClickHouseError("the server reads neither ArrowStream nor Native input",
                              name="UNSUPPORTED_SERVER", purpose="create branch writer")

    @property
    def hash_argument(self) -> HashArgument:
        """How the row hash of a content digest takes each column: as it is where
        ``cityHash64`` takes any type, else as the old-server wing makes it one 18.16's
        takes."""
        return _hash_argument(self.hash_any_type)

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


def row_hash_argument(client: SqlClient) -> HashArgument:
    """``Capabilities.hash_argument`` of the server behind ``client``, asked in one
    read-only query rather than the whole probe (``txsink verify``)."""
    return _hash_argument(hashes_any_type(client))


def _hash_argument(any_type: bool) -> HashArgument:
    return any_type_argument if any_type else old_hash_argument


def known_settings(client: SqlClient, wanted: tuple[str, ...]) -> frozenset[str]:
    """Which of the query settings ``wanted`` the server knows (cached per url and names).

    For a statement that sends a setting only where it exists: one small query per
    process, where ``detect_capabilities`` would probe everything.
    """
    key = (client.url, wanted)
    with _CACHE_LOCK:
        cached = _SETTINGS_CACHE.get(key)
    if cached is None:
        cached = frozenset(_known_settings(client, wanted))
        with _CACHE_LOCK:
            _SETTINGS_CACHE[key] = cached
    return cached


_SETTINGS_CACHE: dict[tuple[str, tuple[str, ...]], frozenset[str]] = {}


def fires_view_chains(client: SqlClient) -> bool:
    """Whether the server fires a materialized view on the rows another view writes (a
    chain of views): 26.x does, 18.16 does not. Asked only for a target whose views feed
    views, once per process and url (the old-server wing's probe, ``view_chains_fire``)."""
    return view_chains_fire(client)


def _probe(client: SqlClient) -> Capabilities:
    version_text = client.query_value("SELECT version()", purpose="read server version")
    formats = _input_formats(client)
    settings = _known_settings(client, _PROBED_SETTINGS)
    return Capabilities(
        version=_version_tuple(version_text),
        version_text=version_text,
        move_partition=moves_partitions(client),
        arrow_stream="ArrowStream" in formats,
        native="Native" in formats,
        row_binary="RowBinary" in formats,
        low_cardinality=_has_type_family(client, "LowCardinality"),
        low_cardinality_native_setting="low_cardinality_allow_in_native_format" in settings,
        insert_deduplication_token="insert_deduplication_token" in settings,
        async_insert="async_insert" in settings,
        non_replicated_deduplication_window=_has_merge_tree_setting(
            client, "non_replicated_deduplication_window"
        ),
        keeper=_keeper_configured(client),
        hash_any_type=hashes_any_type(client),
        value_ranges=_probe_value_ranges(client, version_text),
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


_PROBED_SETTINGS = ("low_cardinality_allow_in_native_format", "insert_deduplication_token",
                    "allow_experimental_low_cardinality_type", "async_insert")


def _known_settings(client: SqlClient, wanted: tuple[str, ...]) -> set[str]:
    names = ", ".join(sql_string(name) for name in wanted)
    rows = client.query_rows(
        f"SELECT name FROM system.settings WHERE name IN ({names})", purpose="list settings"
    )
    return {row["name"] for row in rows}


def _has_type_family(client: SqlClient, family: str) -> bool:
    rows = client.query_rows(
        f"SELECT name FROM system.data_type_families WHERE name = {sql_string(family)}",
        purpose="list data types",
    )
    return bool(rows)


def _has_merge_tree_setting(client: SqlClient, name: str) -> bool:
    rows = client.query_rows(
        f"SELECT name FROM system.merge_tree_settings WHERE name = {sql_string(name)}",
        purpose="list MergeTree settings",
    )
    return bool(rows)


def _keeper_configured(client: SqlClient) -> bool:
    """Whether the server has a ZooKeeper/Keeper configured, reachable now or not (a
    ``KEEPER_EXCEPTION`` answer: configured, its session lost)."""
    try:
        client.query_value(
            "SELECT count() FROM system.zookeeper WHERE path = '/'", purpose="probe keeper"
        )
    except ClickHouseError as exc:
        return exc.code == KEEPER_EXCEPTION
    return True


# -- value ranges: which Date / DateTime values the server reads back unchanged -----------
# Measured by round trips on the server, because its calendar, not the storage width,
# bounds them (see ``chtypes.ValueRanges``). Each search is a coarse pass over every
# _GRID-th value and a fine pass over the _GRID values before the first change, so a few
# queries of at most ~65k generated rows each cover the 2^32 DateTime values.

_GRID = 65_536
# Fixed-offset zones at the extreme offsets (no DST, so a text round trip is exact): the
# earliest wall-clock time is probed west, the latest east, where storage reaches furthest.
_WEST, _WEST_OFFSET = "Etc/GMT+12", -12 * 3600
_EAST, _EAST_OFFSET = "Etc/GMT-14", 14 * 3600
_DATE_READS_BACK = "toUInt16(toDate(toString(CAST(toUInt16(n) AS Date)))) = n"


def _datetime_reads_back(zone: str) -> str:
    zone_text = sql_string(zone)
    return (f"toUInt32(toDateTime(toString(toDateTime(toUInt32(n), {zone_text})), "
            f"{zone_text})) = n")


def _probe_value_ranges(client: SqlClient, version_text: str) -> ValueRanges:
    """The server's Date and DateTime ranges, from text round trips of every candidate.

    A value counts only if the server shows it as text and parses that text back to the
    same stored number; 0 is the zero value (18.16 shows it as 0000-00-00 and parses it
    back), which is why the DateTime searches start at 1.
    """
    first_day = _run_start(client, _DATE_READS_BACK, 0, DATE_MAX_DAYS)
    last_day = _run_end(client, _DATE_READS_BACK, first_day, DATE_MAX_DAYS)
    west = _run_start(client, _datetime_reads_back(_WEST), 1, DATETIME_MAX_SECONDS)
    east_ok = _datetime_reads_back(_EAST)
    east = _run_end(client, east_ok, _run_start(client, east_ok, 1, DATETIME_MAX_SECONDS),
                    DATETIME_MAX_SECONDS)
    wall = (None if west == 1 else west + _WEST_OFFSET,
            None if east == DATETIME_MAX_SECONDS else east + _EAST_OFFSET)
    timezone = client.query_value("SELECT timezone()", purpose="read server time zone")
    return ValueRanges(f"ClickHouse {version_text}", (first_day, last_day), wall, timezone,
                       _calendar(client, "Date32", _DATE32_READS_BACK, _DATE32_CANDIDATES),
                       _calendar(client, "DateTime64", _DATETIME64_READS_BACK,
                                 _DATETIME64_CANDIDATES))


# Date32 and DateTime64 calendars a server may have: 26.x reads back years 1 .. 9999;
# releases from 21.9 on had 1900-01-01 .. 2299-12-31 (and 1925 .. 2283 before that).
_DATE32_CANDIDATES = (DATE32_CALENDAR, (-25_567, 120_529), (-16_436, 114_635))
_DATETIME64_CANDIDATES = (DATETIME64_CALENDAR, (-2_208_988_800, 10_413_791_999),
                          (-1_420_070_400, 9_904_550_399))
_DATE32_READS_BACK = "toInt32(toDate32(toString(toDate32(toInt32(n))))) = n"
_DATETIME64_READS_BACK = ("toInt64(toDateTime64(toString(toDateTime64(n, 0, 'UTC')), 0, "
                          "'UTC')) = n")


def _calendar(client: SqlClient, family: str, reads_back: str,
              candidates: tuple[tuple[int, int], ...]) -> tuple[int, int]:
    """The widest candidate range whose two ends the server reads back unchanged.

    A server without ``family`` gets the first candidate: no column of it can exist there.
    """
    if not _has_type_family(client, family):
        return candidates[0]
    for low, high in candidates:
        rows = client.query_rows(
            f"SELECT min({reads_back}) AS ok FROM (SELECT arrayJoin([{low}, {high}]) AS n)",
            purpose="probe value ranges")
        if rows and int(rows[0]["ok"]):
            return low, high
    raise ClickHouseError(f"the server reads back none of the known {family} ranges",
                          name="UNSUPPORTED_SERVER", purpose="probe value ranges")


def _run_start(client: SqlClient, reads_back: str, start: int, top: int) -> int:
    """The smallest n in start..top for which ``reads_back`` holds."""
    hit = _first(client, reads_back, True, start, _GRID, top)
    if hit is None:
        raise ClickHouseError(f"the server reads back no value of `{reads_back}`",
                              name="UNSUPPORTED_SERVER", purpose="probe value ranges")
    if hit == start:
        return start
    found = _first(client, reads_back, True, max(start, hit - _GRID + 1), 1, top)
    return hit if found is None else found


def _run_end(client: SqlClient, reads_back: str, start: int, top: int) -> int:
    """The largest n such that ``reads_back`` holds for every value of start..n."""
    miss = _first(client, reads_back, False, start, _GRID, top)
    if miss is None:
        return top
    found = _first(client, reads_back, False, max(start, miss - _GRID + 1), 1, top)
    return (miss if found is None else found) - 1


def _first(client: SqlClient, reads_back: str, wanted: bool, start: int, step: int,
           top: int) -> int | None:
    """The first n = start + i * step (i < _GRID + 1, capped at ``top``) where
    ``reads_back`` is ``wanted``, or None."""
    rows = client.query_rows(
        f"SELECT count() AS hits, min(n) AS first FROM (SELECT least(toUInt64({start}) + "
        f"number * {step}, toUInt64({top})) AS n FROM system.numbers LIMIT {_GRID + 1}) "
        f"WHERE {'' if wanted else 'NOT '}({reads_back})",
        purpose="probe value ranges",
    )
    return int(rows[0]["first"]) if rows and int(rows[0]["hits"]) else None
