"""Staging tables: the "temporary parts" of a branch, invisible until publish.

A stock ClickHouse server cannot hold uncommitted parts inside the target table, so each
branch writes into its own staging table in the database ``txsink_staging``. Publish later
hands the staged parts to the target with one partition-level statement (MOVE, ATTACH or
REPLACE PARTITION), which makes a partition visible all at once.

Contract:
- ``staging_table_name(sink_id, epoch, branch_id, root=...)`` is deterministic and unique
  per (root, sink id, epoch, branch id) (up to a 2^-48 hash collision per part);
  ``parse_staging_table_name`` gives back the sink key, the epoch, the branch key and the
  root tag, so the sweeper can attribute any staging table to its xid *and* to the
  coordinator root that owns that xid. Every root's sinks share ``txsink_staging``, and
  only the owning root can tell whether a table is still live, so the root is part of the
  name rather than guessed. ``root`` is an opaque identity string (the sink passes the
  absolute znode path of its coordinator root, chroot included); the name carries
  ``root_tag(root)``, a hash of it. Sink ids and branch ids may hold any characters: the
  name keeps a readable lowercase slug of each plus a hash of the full text. The sink id
  and the root are not recoverable from the name: a caller compares ``sink_key(sink_id)``
  and ``root_tag(root)`` for the ones it knows.
- Layout: ``txs_<sink slug>_<sink hash>_e<epoch>_<branch slug>_<branch hash>_r<root tag>``,
  at most 103 characters of ``[a-z0-9_]`` for epochs below 10^20 (ClickHouse uses the
  name as a directory name: file-name limit 255). The root tag is last so that
  ``txs_<sink key>_`` stays a prefix of every table of a sink. Names written before the
  root tag existed (no ``_r<tag>``) still parse, with ``root_tag=None``: no root can
  claim them.
- ``create_staging_table`` is idempotent (IF NOT EXISTS). The table has the target's
  columns (types, defaults, materialized and alias columns included), partition key, sorting key,
  primary key and MergeTree settings (index_granularity first of all), so that ATTACH /
  MOVE / REPLACE PARTITION accept its parts, and its TTL (see ``staging_ddl``). A task's
  staging has the target's MergeTree variant with its parameters (``mirror_engine``), so
  that its rows are merged at insert as a plain INSERT's would be; tables filled from
  other staging tables are plain ``MergeTree``. Never Replicated (a staging table must not
  register a replica in ZooKeeper). SAMPLE BY is not copied: ATTACH / MOVE do not
  compare it. Targets in the deprecated ``MergeTree(date, key, granularity)`` syntax are
  refused (``UnsupportedTarget``): their parts have another format version.
- Merges in a staging table never run: publish relies on the part names recorded at seal
  time, and a merge would also break the Replicated target's deduplication of a repeated
  ATTACH. The table is created with ``max_bytes_to_merge_at_{max,min}_space_in_pool = 1``:
  no part is that small, so the merge selector never picks one, and the setting is stored
  in the table's metadata (measured: 6 parts stayed unmerged across a restart, where a
  ``SYSTEM STOP MERGES`` is forgotten: a stopped table merged its 6 parts within 1 s of a
  restart on 18.16). So no ``SYSTEM STOP MERGES`` is sent; a target's settings that force
  merges by age (``min_age_to_force_merge_*``) are not copied.
  Without merges every insert adds a part, so the part-count limits are raised as well.
- ``rollback`` drops the staging table and is idempotent. It is for branches that will
  never be published (losers, aborted xids) and for winners once publish has finished;
  rolling back a winner before its publish finished would lose its rows.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass

from tenacity import Retrying, retry_if_result, stop_after_delay, wait_fixed

from server_ext.capabilities import detect_capabilities
from server_ext.client.client_protocol import SqlClient
from server_ext.errors import ClickHouseError
from server_ext.old_server.low_cardinality import ddl_settings
from server_ext.sharding.engine_args import engine_arguments
from server_ext.sql import (
    SCRATCH_DATABASE,
    clause,
    qualified_name,
    quote_identifier,
    setting_assignments,
    split_table_name,
    sql_string,
    tokenize,
)
from server_ext.types.target_table import TargetTable

log = logging.getLogger(__name__)

STAGING_DATABASE = "txsink_staging"
#: Seconds a plan waits for a Replicated target's read-only replica (``publish_problem``)
READ_ONLY_WAIT = 90.0

# Table settings that make a staging table hold its parts exactly as written.
DEDUP_WINDOW = 100  # blocks a staging table remembers; a repeat is of the latest one
STAGING_SETTINGS: dict[str, str] = {
    "max_bytes_to_merge_at_max_space_in_pool": "1",
    "max_bytes_to_merge_at_min_space_in_pool": "1",
    "parts_to_delay_insert": "100000",
    "parts_to_throw_insert": "100000",
}

#: Target settings that merge parts by their age whatever their size: not copied to staging.
FORCED_MERGES = "min_age_to_force_merge"

#: The root identity of a sink with default options (``zk_root=/txsink``, no chroot).
DEFAULT_ROOT = "/txsink"

_PREFIX = "txs"
_SINK_SLUG_LEN, _SINK_HASH_LEN = 24, 12
_BRANCH_SLUG_LEN, _BRANCH_HASH_LEN = 16, 8
_ROOT_HASH_LEN = 12
_NAME_RE = re.compile(
    rf"^{_PREFIX}_(?P<sink>[a-z0-9]{{0,{_SINK_SLUG_LEN}}}_[0-9a-f]{{{_SINK_HASH_LEN}}})"
    r"_e(?P<epoch>\d+)"
    rf"_(?P<branch>[a-z0-9]{{0,{_BRANCH_SLUG_LEN}}}_[0-9a-f]{{{_BRANCH_HASH_LEN}}})"
    rf"(?:_r(?P<root>[0-9a-f]{{{_ROOT_HASH_LEN}}}))?$"
)


class UnsupportedTarget(ValueError):
    """The target table cannot get a staging table whose parts it would accept."""


def _digest(text: str, length: int) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]


def root_tag(root: str) -> str:
    """The root's part of a staging table name: a hash of the root identity."""
    return _digest(root, _ROOT_HASH_LEN)


_DEFAULT_ROOT_TAG = root_tag(DEFAULT_ROOT)


@dataclass(frozen=True)
class StagingName:
    """What a staging table's name says about its owner."""

    sink_key: str  # sink_key(sink_id) of the owning sink
    epoch: int
    branch_key: str  # branch_key(branch_id) of the owning branch
    # root_tag(root) of the owning coordinator root; None: a name without a root tag
    root_tag: str | None = _DEFAULT_ROOT_TAG

    @property
    def table(self) -> str:
        name = f"{_PREFIX}_{self.sink_key}_e{self.epoch}_{self.branch_key}"
        return name if self.root_tag is None else f"{name}_r{self.root_tag}"


def _key(text: str, slug_len: int, hash_len: int) -> str:
    slug = re.sub(r"[^a-z0-9]", "", text.lower())[:slug_len]
    return f"{slug}_{_digest(text, hash_len)}"


def sink_key(sink_id: str) -> str:
    """The sink's part of a staging table name: readable slug + hash of the sink id."""
    return _key(sink_id, _SINK_SLUG_LEN, _SINK_HASH_LEN)


def branch_key(branch_id: str) -> str:
    """The branch's part of a staging table name: readable slug + hash of the branch id."""
    return _key(branch_id, _BRANCH_SLUG_LEN, _BRANCH_HASH_LEN)


def staging_table_name(sink_id: str, epoch: int, branch_id: str, *,
                       root: str = DEFAULT_ROOT) -> str:
    """Unquoted name (in ``STAGING_DATABASE``) of the staging table of one branch.

    ``root`` identifies the coordinator root the branch's xid lives under; writers always
    pass theirs (the default is the root of a sink with default options).
    """
    if epoch < 0:
        raise ValueError(f"epoch must be >= 0, got {epoch}")
    return StagingName(sink_key(sink_id), epoch, branch_key(branch_id), root_tag(root)).table


def parse_staging_table_name(name: str) -> StagingName | None:
    """The owner encoded in a staging table name; None for any other table name.

    A name without a root tag (written before the tag existed) gives ``root_tag=None``.
    """
    match = _NAME_RE.match(name)
    if match is None:
        return None
    return StagingName(match["sink"], int(match["epoch"]), match["branch"], match["root"])


def staging_qualified(table: str) -> str:
    """Quoted ``db.table`` for a staging table given bare (in STAGING_DATABASE) or qualified."""
    return qualified_name(*split_table_name(table, default_database=STAGING_DATABASE))


def create_staging_table(client: SqlClient, target: TargetTable, table_name: str,
                         dedup_window: bool = False, merges: bool = False,
                         mirror_engine: bool = False) -> str:
    """Create (if absent) the staging table ``table_name`` for ``target``; returns it quoted.

    ``dedup_window``: give it a ``non_replicated_deduplication_window`` (servers that
    have one), so that an INSERT repeated with the same ``insert_deduplication_token``
    after a lost answer is dropped by the server (``writer.BranchWriter``).
    ``merges``: let the server merge its parts in the background (the pre-combined table
    of ``combined``, whose part names nobody records); every other staging table
    holds its parts exactly as written.
    ``mirror_engine``: the target's MergeTree variant with its parameters (a task's
    staging, which rows are inserted into: a Replacing, Collapsing, Summing or Aggregating
    target merges the rows of each inserted block as a plain INSERT into it would);
    otherwise plain ``MergeTree`` (tables filled from other staging tables, whose rows
    must stay exactly as staged).

    Idempotent: a repeat finds the table. The staging
    database is created once per server and process (every task of an epoch would ask
    again); if it vanished since, the table's creation says so and it is made again.
    """
    staging = staging_qualified(table_name)
    server = getattr(client, "url", None)
    if server is None or server not in _DATABASE_MADE:
        _create_database(client, server)
    try:
        client.execute(staging_ddl(target, staging, dedup_window, merges, mirror_engine),
                       purpose="create staging table", settings=ddl_settings(client, target))
    except ClickHouseError as exc:
        if exc.code != UNKNOWN_DATABASE:
            raise
        _create_database(client, server)
        client.execute(staging_ddl(target, staging, dedup_window, merges, mirror_engine),
                       purpose="create staging table", settings=ddl_settings(client, target))
    return staging


_DATABASE_MADE: set[str] = set()  # servers where this process made the staging database
UNKNOWN_DATABASE = 81


def _create_database(client: SqlClient, server: str | None) -> None:
    client.execute(f"CREATE DATABASE IF NOT EXISTS {quote_identifier(STAGING_DATABASE)}",
                   purpose="create staging database")
    if server is not None:
        _DATABASE_MADE.add(server)


def staging_ddl(target: TargetTable, staging: str, dedup_window: bool = False,
                merges: bool = False, mirror_engine: bool = False) -> str:
    """``CREATE TABLE IF NOT EXISTS`` statement for a staging table of ``target``.

    ``AS <target>`` copies the column definitions exactly as the server stores them (no
    re-rendering of types or default expressions); the explicit ENGINE clause replaces
    the target's engine. Without it, ``AS`` of a Replicated target fails on 18.16 ("Replica
    already exists"), since the copy would register the same replica path.

    The target's table TTL is copied, so that staged parts carry the TTL information a
    plain INSERT gives them (a part attached without it never expires), with TTL merges
    off (``max_number_of_merges_with_ttl_in_pool = 0``, stored in the table's metadata
    like the other merge settings): a TTL merge would rewrite the parts the seal recorded.
    """
    if target.engine == "Null":
        return f"CREATE TABLE IF NOT EXISTS {staging} AS {target.qualified} ENGINE = Null"
    if " ORDER BY " not in f" {target.engine_full} ":
        raise UnsupportedTarget(
            f"{target.qualified} uses the deprecated MergeTree(date, key, granularity) syntax; "
            "its parts have format_version 0 and cannot be staged"
        )
    clauses = []
    if target.partition_key:
        clauses.append(f"PARTITION BY {_key_expression(target.partition_key)}")
    clauses.append(f"ORDER BY {_key_expression(target.sorting_key or 'tuple()')}")
    if target.primary_key and target.primary_key != target.sorting_key:
        clauses.append(f"PRIMARY KEY {_key_expression(target.primary_key)}")
    ttl = clause(target.engine_full, "TTL", ("SETTINGS",))
    if ttl:
        clauses.append(ttl)
    own = STAGING_SETTINGS if not merges else {
        name: value for name, value in STAGING_SETTINGS.items() if "merge" not in name}
    copied = {name: value for name, value in table_settings(target.engine_full).items()
              if merges or not name.startswith(FORCED_MERGES)}
    settings = {"index_granularity": str(target.index_granularity), **copied, **own,
                **({"max_number_of_merges_with_ttl_in_pool": "0"} if ttl else {}),
                **({"non_replicated_deduplication_window": str(DEDUP_WINDOW)}
                   if dedup_window else {})}
    engine = staging_engine(target) if mirror_engine else "MergeTree()"
    return (f"CREATE TABLE IF NOT EXISTS {staging} AS {target.qualified} "
            f"ENGINE = {engine} {' '.join(clauses)} "
            f"SETTINGS {setting_assignments(settings)}")


def staging_engine(target: TargetTable) -> str:
    """The target's MergeTree variant with its parameters, not Replicated:
    ``ReplicatedReplacingMergeTree('/p', '{replica}', ver)`` → ``ReplacingMergeTree(ver)``
    (a staging table must not register a replica)."""
    name = target.engine
    tokens = tokenize(target.engine_full)
    args: list[str] = []
    if len(tokens) > 1 and tokens[1].text == "(":
        args = engine_arguments(target.engine_full)
    if name.startswith("Replicated"):
        name = name[len("Replicated"):]
        if len(args) >= 2 and all(a.startswith("'") for a in args[:2]):
            args = args[2:]
    return f"{name}({', '.join(args)})"


def merges_at_insert(target: TargetTable) -> bool:
    """Whether an INSERT into a staging table of ``target`` made with ``mirror_engine``
    may keep fewer rows than it sent: a merging variant (Replacing, Collapsing, Summing,
    …) merges the rows of each block on servers that do so (26.x; 18.16 does not)."""
    return target.engine.removeprefix("Replicated") != "MergeTree"


def _key_expression(key: str) -> str:
    """A key as system.tables prints it ("k, d") back as one expression ("(k, d)").

    A single expression is kept as it is: newer servers keep redundant parentheses in the
    key's text, and ATTACH / MOVE compare the key texts of both tables.
    """
    return f"({key})" if len(_split_top_level(key)) > 1 else key


def table_settings(engine_full: str) -> dict[str, str]:
    """The ``SETTINGS name = value, ...`` of an ``engine_full`` text, values as SQL text."""
    marker = engine_full.rfind(" SETTINGS ")
    if marker < 0:
        return {}
    settings: dict[str, str] = {}
    for item in _split_top_level(engine_full[marker + len(" SETTINGS "):]):
        name, _, value = item.partition("=")
        if name.strip() and value.strip():
            settings[name.strip()] = value.strip()
    return settings


def _split_top_level(text: str) -> list[str]:
    """Split at commas that are outside quotes and brackets."""
    items, current, depth, quote = [], [], 0, ""
    escaped = False
    for ch in text:
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "'\"`":
            quote = ch
        elif ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append("".join(current))
            current = []
            continue
        current.append(ch)
    items.append("".join(current))
    return items


def copied_columns(target: TargetTable) -> tuple[str, dict[str, object]]:
    """The column list of an ``INSERT ... SELECT`` that copies staged rows of ``target``
    as they are stored (MATERIALIZED columns copied, not recomputed), and the setting the
    INSERT then needs."""
    columns = [c for c in target.columns if c.default_kind in ("", "DEFAULT", "MATERIALIZED")]
    names = ", ".join(quote_identifier(c.name) for c in columns)
    if any(c.default_kind == "MATERIALIZED" for c in columns):
        return names, {"insert_allow_materialized_columns": 1}
    return names, {}


def rollback(client: SqlClient, table_name: str, view: str = "") -> None:
    """Drop a staging table (bare name or qualified), and first the staging view that
    writes into it, if the branch has one (``server_ext.ddl.views``). Idempotent."""
    if view:
        client.execute(f"DROP TABLE IF EXISTS {staging_qualified(view)}",
                       purpose="drop staging view")
    client.execute(f"DROP TABLE IF EXISTS {staging_qualified(table_name)}",
                   purpose="drop staging table")


# Targets (server, table, DDL) whose staging tables' partitions were accepted, this process
_ACCEPTED: set[tuple[str, str, str]] = set()
_PREFLIGHT_PARTITION = "209901"  # any id: the probe's staging table is empty


def publish_problem(client: SqlClient, target: TargetTable, strategy: str) -> str | None:
    """Why ``target`` would refuse the partitions of its staging tables (None: it takes
    them), asked of the server before anything is staged.

    The server compares the structure of both tables before it looks for parts
    (measured on 18.16 and 26.x: "Tables have different ordering" for an empty partition),
    so the strategy's own statement (``MOVE``, or ``ATTACH … FROM``) is run with a
    partition of two empty scratch tables made as a task's staging and as a combined
    table are; nothing moves. A refusal found only after the decision would leave the xid
    ``Committing`` for good. Not run for a Replicated target: an empty ``ATTACH`` still
    writes a ``REPLACE_RANGE`` entry to its replication log (measured on 18.16); its
    replica is only checked to be writable (a replica without a ZooKeeper/Keeper session
    is read-only: 26.x here, measured). A ``Null`` target takes no partitions. Cached per
    server, table and DDL in the process.
    """
    if target.replicated:
        return _read_only_replica(client, target)
    if target.engine == "Null":
        return None
    key = (getattr(client, "url", ""), target.qualified, target.create_table_query)
    if key in _ACCEPTED:
        return None
    client.execute(f"CREATE DATABASE IF NOT EXISTS {quote_identifier(SCRATCH_DATABASE)}",
                   purpose="create scratch database")
    suffix = hashlib.sha256(repr(key).encode()).hexdigest()[:12]
    for mirror in (True, False):
        scratch = qualified_name(SCRATCH_DATABASE, f"preflight_{suffix}_{int(mirror)}")
        try:
            client.execute(staging_ddl(target, scratch, mirror_engine=mirror),
                           purpose="create preflight staging table",
                           settings=ddl_settings(client, target))
            statement = (
                f"ALTER TABLE {scratch} MOVE PARTITION ID '{_PREFLIGHT_PARTITION}' "
                f"TO TABLE {target.qualified}" if strategy == "move" else
                f"ALTER TABLE {target.qualified} ATTACH PARTITION ID "
                f"'{_PREFLIGHT_PARTITION}' FROM {scratch}")
            client.execute(statement, purpose="check the target takes staged partitions",
                           retry=False)
        except ClickHouseError as exc:
            return f"it refuses the partitions of a staging table: {exc}"
        finally:
            client.execute(f"DROP TABLE IF EXISTS {scratch}", purpose="drop preflight table")
    _ACCEPTED.add(key)
    return None


def _read_only_replica(client: SqlClient, target: TargetTable) -> str | None:
    """Why a Replicated ``target`` cannot take partitions now: its replica is read-only.

    A server with no ZooKeeper/Keeper configured keeps it read-only for good: refused at
    once. A configured one is read-only while its session is re-established (after a
    ZooKeeper restart 18.16 does so within ``zookeeper_session_expiration_check_period``,
    60 s): waited for, as a plain INSERT's retries would wait, up to ``READ_ONLY_WAIT``
    seconds (logged), then refused."""
    def read_only() -> bool:
        rows = client.query_rows(
            "SELECT is_readonly FROM system.replicas WHERE database = "
            f"{sql_string(target.database)} AND table = {sql_string(target.name)}",
            purpose="check the target's replica is writable")
        return bool(rows) and bool(int(rows[0]["is_readonly"]))

    if not read_only():
        return None
    refusal = ("its replica is read-only on this server (system.replicas.is_readonly = 1: no "
               "ZooKeeper/Keeper session for it), so a plain INSERT is refused too")
    if not detect_capabilities(client).keeper:
        return refusal
    log.warning("the replica of %s is read-only (no ZooKeeper/Keeper session); waiting up "
                "to %.0f s for its session", target.qualified, READ_ONLY_WAIT)
    waiting = Retrying(retry=retry_if_result(bool), stop=stop_after_delay(READ_ONLY_WAIT),
                       wait=wait_fixed(1.0), retry_error_callback=lambda state: True)
    if waiting(read_only):
        return f"{refusal} (still read-only after {READ_ONLY_WAIT:.0f} s)"
    log.info("the replica of %s is writable again", target.qualified)
    return None
