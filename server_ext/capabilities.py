"""What the connected ClickHouse server can do, asked from the server itself.

Why not from the version number: forks, backports and ClickHouse Cloud make version
numbers a poor guide, so every capability that changes behaviour is probed directly
(``system.formats``, ``system.settings``, and a throwaway ``ALTER ... MOVE PARTITION`` on
two empty tables in a scratch database). The version is kept as a hint for humans.
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
import uuid
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from server_ext.chtypes import (
    DATE32_CALENDAR,
    DATE_MAX_DAYS,
    DATETIME64_CALENDAR,
    DATETIME_MAX_SECONDS,
    ValueRanges,
)
from server_ext.client_protocol import SqlClient
from server_ext.digest import hashes_any_type
from server_ext.errors import ClickHouseError
from server_ext.sql import qualified_name, quote_identifier, sql_string

SCRATCH_DATABASE = "txsink_scratch"
class Strategy(StrEnum):
    """How a branch's partitions are made visible (``server_ext/publish.py`` has each).

    A member is its name as a string: options, payloads and ledgers store the text."""

    MOVE = "move"
    ATTACH_REPLICATED = "attach_replicated"
    ATTACH_MARKED = "attach_marked"

    def __repr__(self) -> str:
        return repr(self.value)  # messages quote the name as the user spells it


STRATEGIES: tuple[Strategy, ...] = tuple(Strategy)


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
    async_insert: bool  # the async_insert setting exists (staging inserts then set it to 0)
    non_replicated_deduplication_window: bool  # dedup for plain MergeTree exists
    keeper: bool  # the server has a ZooKeeper/Keeper configured (Replicated tables work)
    hash_any_type: bool  # cityHash64 takes Decimal, UUID and Nullable elements (digest)
    value_ranges: ValueRanges  # Date/DateTime values it stores and reads back unchanged

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
_CHAINS_CACHE: dict[str, bool] = {}


def fires_view_chains(client: SqlClient) -> bool:
    """Whether the server fires a materialized view on the rows another view writes (a
    chain of views). Measured: 18.16 does not (neither through a ``TO`` table nor an inner
    table), 26.x does. Asked of the server itself, once per process and url, with scratch
    tables and two views, and only for a target whose views feed views."""
    with _CACHE_LOCK:
        cached = _CHAINS_CACHE.get(client.url)
    if cached is not None:
        return cached
    suffix = uuid.uuid4().hex[:12]
    source, middle, end, first, second = (
        qualified_name(SCRATCH_DATABASE, f"chain_{suffix}_{name}")
        for name in ("source", "middle", "end", "first_mv", "second_mv"))
    client.execute(f"CREATE DATABASE IF NOT EXISTS {quote_identifier(SCRATCH_DATABASE)}",
                   purpose="create scratch database")
    try:
        for ddl in (f"CREATE TABLE {source} (k UInt8) ENGINE = Null",
                    f"CREATE TABLE {middle} (k UInt8) ENGINE = Memory",
                    f"CREATE TABLE {end} (k UInt8) ENGINE = Memory",
                    f"CREATE MATERIALIZED VIEW {first} TO {middle} AS SELECT k FROM {source}",
                    f"CREATE MATERIALIZED VIEW {second} TO {end} AS SELECT k FROM {middle}",
                    f"INSERT INTO {source} VALUES (1)"):
            client.execute(ddl, purpose="check whether views fire on a view's output")
        fires = int(client.query_value(f"SELECT count() FROM {end}",
                                       purpose="check whether views fire on a view's output")) > 0
    finally:
        for name in (second, first, end, middle, source):
            client.execute(f"DROP TABLE IF EXISTS {name}", purpose="drop scratch table")
    with _CACHE_LOCK:
        _CHAINS_CACHE[client.url] = fires
    return fires


def choose_strategy(caps: Capabilities, target: ReplicatedTarget) -> Strategy:
    """The publish strategy for ``target`` on this server.

    A Replicated target always gets ``attach_replicated``: MOVE PARTITION needs source and
    destination of the same engine family and staging is a plain MergeTree, while the
    target's replication log deduplicates a repeated attach. A plain target gets ``move``
    where the server has it (a repeat moves nothing) and ``attach_marked`` otherwise.
    """
    if target.replicated:
        return Strategy.ATTACH_REPLICATED
    return Strategy.MOVE if caps.move_partition else Strategy.ATTACH_MARKED


# -- checking a strategy against a server and a target (before anything is staged) --------

MOVE_STATEMENT = "ALTER TABLE ... MOVE PARTITION ... TO TABLE"


class DescribedTarget(ReplicatedTarget, Protocol):
    """A target as ``describe_table`` reports it (``TargetTable`` is one)."""

    engine: str
    engine_full: str


@dataclass(frozen=True)
class StrategyProblem:
    """Why ``strategy`` cannot publish into a target on a server, and what to use instead.

    ``statement_runs`` says whether the server would still execute the strategy's
    publishing statement. False means it refuses that statement outright (or publish
    refuses before sending it), so a publish with this strategy can never have made a
    row visible: that is what lets ``txsink recover --strategy`` switch a stuck xid to
    ``instead`` without reading the failed strategy's ledger intent as evidence of an
    attach. True (``attach_marked`` on a Replicated target) means rows may be attached,
    only the strategy's reasoning about a repeat is unsound there.
    """

    strategy: str
    lacks: str  # a sentence: what the server or the target lacks
    instead: Strategy  # the strategy to use instead
    statement_runs: bool


def strategy_problem(caps: Capabilities, target: DescribedTarget | None,
                     strategy: str) -> StrategyProblem | None:
    """None if ``strategy`` can publish into ``target`` on the server of ``caps``.

    ``target=None`` asks about the server alone (any target): what a multi-table
    transaction can check before it knows its tables. The rules, each measured or read
    from the server's behaviour:

    - ``move`` needs MOVE PARTITION (probed, absent on 18.16) and a non-Replicated target:
      MOVE PARTITION needs source and destination of the same engine family and staging
      is a plain MergeTree (the server refuses the statement, NOT_IMPLEMENTED).
    - ``attach_replicated`` needs a Replicated target (its repeat relies on the
      replication log's block ids; publish refuses a plain target before any statement)
      and hence a server with ZooKeeper/Keeper.
    - ``attach_marked`` needs a non-Replicated target: a Replicated table numbers blocks
      per partition in ZooKeeper and may drop attached parts as duplicates, so the
      watermark cannot decide a repeat (the ATTACH itself would run).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown publish strategy {strategy!r}; expected one of "
                         f"{', '.join(STRATEGIES)}")
    replicated = target is not None and target.replicated
    engine = f" ({target.engine})" if target is not None else ""
    if strategy == "move":
        fallback = Strategy.ATTACH_REPLICATED if replicated else Strategy.ATTACH_MARKED
        if not caps.move_partition:
            return StrategyProblem(strategy, f"the server (ClickHouse {caps.version_text}) has "
                                   f"no {MOVE_STATEMENT}", fallback, statement_runs=False)
        if replicated:
            return StrategyProblem(strategy, f"the target is Replicated{engine} and "
                                   f"{MOVE_STATEMENT} needs source and target of one engine "
                                   "family (staging is a plain MergeTree)", fallback,
                                   statement_runs=False)
        return None
    if strategy == "attach_replicated":
        fallback = Strategy.MOVE if caps.move_partition else Strategy.ATTACH_MARKED
        if target is None and not caps.keeper:
            return StrategyProblem(strategy, "the server has no ZooKeeper/Keeper configured, "
                                   "so none of its tables is Replicated", fallback,
                                   statement_runs=False)
        if target is not None and not replicated:
            return StrategyProblem(strategy, f"the target is not Replicated{engine}; "
                                   "attach_replicated relies on the replication log to "
                                   "deduplicate a repeated attach", fallback,
                                   statement_runs=False)
        return None
    if replicated:
        return StrategyProblem(strategy, f"the target is Replicated{engine}: its block numbers "
                               "are allocated per partition and it may drop attached parts as "
                               "duplicates, so the attach_marked watermark cannot decide a "
                               "repeat", Strategy.ATTACH_REPLICATED, statement_runs=True)
    return None


def supported_strategies(caps: Capabilities, target: DescribedTarget) -> list[Strategy]:
    """Every strategy that can publish into ``target`` on this server, the one
    :func:`choose_strategy` picks first."""
    first = choose_strategy(caps, target)
    ordered = [first, *(s for s in STRATEGIES if s != first)]
    return [s for s in ordered if strategy_problem(caps, target, s) is None]


def engine_problem(target: DescribedTarget, *, through_distributed: bool = True
                   ) -> str | None:
    """None if staged partitions can be published into a table of this engine.

    Publishing hands whole partitions of a staging MergeTree to the target (ATTACH, MOVE
    or REPLACE PARTITION), which only a MergeTree-family table accepts (measured on 18.16
    and the 26.x engine: Replacing/Summing/Collapsing/Aggregating targets accept a plain
    MergeTree's partitions). The deprecated ``MergeTree(date, key, granularity)`` syntax
    has another part format and cannot be staged. A ``Null`` table (an ingest table whose
    rows live only in its materialized views) is staged as ``Null``: its staging views
    fire, and nothing is published into it. ``through_distributed``: the table is a
    target, which may also be a Distributed table over such tables (a view's table may not).
    """
    if target.engine == "Null":
        return None
    if not target.engine.endswith("MergeTree"):
        over = " (or a Distributed table over such tables)" if through_distributed else ""
        return (f"its engine is {target.engine}; clickhouse_tx publishes whole partitions, "
                f"which only a MergeTree-family table{over} accepts")
    if " ORDER BY " not in f" {target.engine_full} ":
        return ("it uses the deprecated MergeTree(date, key, granularity) syntax, whose "
                "parts have another format; recreate it with PARTITION BY / ORDER BY")
    return None


def _probe(client: SqlClient) -> Capabilities:
    version_text = client.query_value("SELECT version()", purpose="read server version")
    formats = _input_formats(client)
    settings = _known_settings(client, _PROBED_SETTINGS)
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
        async_insert="async_insert" in settings,
        non_replicated_deduplication_window=_has_merge_tree_setting(
            client, "non_replicated_deduplication_window"
        ),
        keeper=_has_keeper(client),
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
