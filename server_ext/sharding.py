"""Shard layout discovery and row routing for writes that span the shards of a cluster.

Why: a transaction over a sharded table stages each shard's rows on a server of that shard
and publishes them there, instead of inserting through the ``Distributed`` table (whose
inserts are neither atomic nor idempotent). For reads through the ``Distributed`` table to
stay correct (``optimize_skip_unused_shards``, per-shard joins and aggregations), every row
must land on the shard the server itself would have chosen. ``ShardRouter`` reproduces the
server's choice; ``layout_from_distributed`` reads the layout from the server so that it
cannot drift from the cluster config.

The routing rule (``createBlockSelector`` in ClickHouse; checked by inserting through a
``Distributed`` table on a ClickHouse 18.16 server with shard weights [1, 2, 4]):

- the sharding key must evaluate to UInt8..UInt64 or Int8..Int64 (not Nullable, Date,
  Float, ...): anything else makes the server refuse the insert;
- a key value becomes unsigned as C++ casts it: Int8/Int16/Int32 values are sign-extended
  to 32 bits (``-1`` is ``4294967295``), Int64 values to 64 bits; a *constant* key uses the
  unsigned type of its own width (``toInt16(-1)`` is ``65535``);
- that value modulo the total weight is a slot; slots are handed out in cluster order,
  ``weight`` consecutive slots per shard (weights [1, 2]: slot 0 -> shard 0, 1-2 -> 1).

Keys: a bare integer column is computed here with numpy (vectorised); ``rand()`` (or no
key) lets rows go anywhere, so they are cut into contiguous weighted slices; any other
expression (``cityHash64(user_id)``, ``intHash64(id)``, ``id % 3``) is evaluated by the
ClickHouse engine embedded in ``chdb``. chdb is trusted to agree with an older server
because ClickHouse keeps its hash functions stable (a changed hash would re-shard every
existing cluster): cityHash64, intHash32/64, sipHash64, halfMD5, metroHash64 and
murmurHash2_32 were compared between the 18.16 server and chdb (engine 26.9), see
tests/test_sharding.py. Exceptions found: ``farmHash64`` changed after 18.16, and
``xxHash64``/``javaHash`` do not exist on 18.16. Result *types* may differ too (18.16 types
``Int64 % 3`` as Int8, 26.9 as Int16); the router uses chdb's type, which gives the same
shard whenever both types are at most 32 bits wide or both are 64 bits wide.

Pass the target's column types (``describe_table(...).columns``) to ``ShardRouter`` when
the Arrow types may differ from the table's: the server hashes its own column type
(``cityHash64`` of an Int32 differs from that of the same Int64).

Limits: chdb runs in the process's one chdb session (``ChdbClient.for_process()``), so a
process that routes by an expression cannot later open chdb at another path; functions
that depend on a time zone (``toYYYYMM`` of a DateTime without one) use chdb's, not the
server's; ``weight`` 0 (a shard excluded from inserts) is not supported.
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from server_ext.chtypes import INTEGER_TYPES, parse_type
from server_ext.client import quote_identifier, split_table_name
from server_ext.errors import ClickHouseError

# Keys whose value is random: the server may put any row on any shard.
_RANDOM_KEY_RE = re.compile(r"^\s*(rand|rand32|rand64|randConstant)\s*\([^()]*\)\s*$", re.I)
_BARE_IDENTIFIER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MACRO_RE = re.compile(r"\{([A-Za-z0-9_]+)\}")
# "Unknown identifier: x" (18.x), "Unknown expression or function identifier `x`" (26.x)
_UNKNOWN_IDENTIFIER_RE = re.compile(
    r"Unknown (?:expression (?:or function )?)?identifier:? `?([^`\s,.]+)")
_STRING_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "b": "\b", "f": "\f",
                   "a": "\a", "v": "\v", "e": "\x1b"}
_ARROW_INTEGERS = {(bits, signed): f"{'' if signed else 'U'}Int{bits}"
                   for bits in (8, 16, 32, 64) for signed in (True, False)}
_CHDB_MISSING = ("install the chdb package (pip install chdb) to route rows by it, or make "
                 "the sharding key a bare integer column")


class ShardingError(ValueError):
    """A shard layout, a shard URL option or a sharding key cannot be used.

    A ``ValueError`` like the sink's option errors: it is raised before anything is staged.
    Messages name the bad part but never a URL's credentials.
    """


class SqlClient(Protocol):
    url: str

    def query_rows(self, sql: str, *, purpose: str, settings: dict | None = None
                   ) -> list[dict]: ...


# -- layout ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Shard:
    """One shard: ``index`` 0-based in cluster order, its ``weight`` and replicas' URLs."""

    index: int
    weight: int
    replicas: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.index < 0:
            raise ShardingError(f"shard index {self.index} is negative")
        if self.weight < 1:
            raise ShardingError(
                f"shard {self.index + 1} has weight {self.weight}; txsink needs every "
                "shard's weight to be at least 1"
            )
        if not self.replicas:
            raise ShardingError(f"shard {self.index + 1} has no replica")


@dataclass(frozen=True)
class ShardLayout:
    """The shards of a target, the table on each, and the key that picks the shard.

    ``sharding_key`` None means: rows may go to any shard (as with ``rand()``); with one
    shard it is the only choice.
    """

    shards: tuple[Shard, ...]
    local_table: str
    sharding_key: str | None

    def __post_init__(self) -> None:
        if not 1 <= len(self.shards) <= 65535:
            raise ShardingError(f"a shard layout needs 1 to 65535 shards, not {len(self.shards)}")
        for position, shard in enumerate(self.shards):
            if shard.index != position:
                raise ShardingError(f"shard at position {position} has index {shard.index}")
        if self.sharding_key is not None and not self.sharding_key.strip():
            raise ShardingError("the sharding key is empty; give an expression or None")
        _table_text(self.local_table)  # raises ShardingError on a malformed name

    @property
    def total_weight(self) -> int:
        return sum(shard.weight for shard in self.shards)

    @property
    def slots(self) -> tuple[int, ...]:
        """Shard index of each slot (``key % total_weight``), as the server assigns them."""
        return tuple(shard.index for shard in self.shards for _ in range(shard.weight))


def layout_from_urls(shard_urls: list[list[str]], local_table: str,
                     sharding_key: str | None, weights: list[int] | None = None) -> ShardLayout:
    """A layout given by hand: replica URLs per shard (cluster order), weights default 1."""
    if not shard_urls:
        raise ShardingError("no shard given")
    if weights is not None and len(weights) != len(shard_urls):
        raise ShardingError(f"{len(weights)} weight(s) given for {len(shard_urls)} shard(s)")
    for urls in shard_urls:
        for url in urls:
            _check_url(url)
    _reject_duplicates(shard_urls)
    shards = tuple(
        Shard(index, weights[index] if weights else 1, tuple(urls))
        for index, urls in enumerate(shard_urls)
    )
    return ShardLayout(shards, _table_text(local_table), _clean_key(sharding_key))


def parse_shard_urls(text: str) -> list[list[str]]:
    """Parse ``"http://a:8123,http://b:8123;http://c:8123"``: shards by ';', replicas by ','.

    Whitespace around parts is ignored; an empty shard or replica, a URL that is not
    http(s)://host[:port], one with credentials, or one given twice is an error.
    """
    if not text or not text.strip():
        raise ShardingError("the shard URL list is empty")
    shards: list[list[str]] = []
    for number, part in enumerate(text.split(";"), start=1):
        if not part.strip():
            raise ShardingError(f"shard {number} of the shard URL list is empty")
        replicas = []
        for replica_number, url in enumerate(part.split(","), start=1):
            if not url.strip():
                raise ShardingError(f"replica {replica_number} of shard {number} is empty")
            replicas.append(_check_url(url.strip(), f"shard {number}, replica {replica_number}"))
        shards.append(replicas)
    _reject_duplicates(shards)
    return shards


def _check_url(url: str, where: str = "") -> str:
    prefix = f"{where}: " if where else ""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ShardingError(f"{prefix}{_shown_url(url)} is not a URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ShardingError(f"{prefix}{_shown_url(url)} is not an http:// or https:// URL "
                            "with a host")
    if parts.username is not None or parts.password is not None:
        raise ShardingError(f"{prefix}{_shown_url(url)} carries credentials; give them as "
                            "the user and password options")
    if parts.query or parts.fragment:
        raise ShardingError(f"{prefix}{_shown_url(url)} must not have a query or fragment")
    return url


def _shown_url(url: str) -> str:
    """``url`` with any ``user:password@`` replaced, safe for an error message."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return repr(url) if "@" not in url else "'<redacted>'"
    netloc, slash, path = rest.partition("/")
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    return repr(f"{scheme}://{netloc}{slash}{path}")


def _reject_duplicates(shard_urls: list[list[str]]) -> None:
    seen: dict[str, int] = {}
    for number, urls in enumerate(shard_urls, start=1):
        for url in urls:
            key = url.rstrip("/")
            if key in seen:
                raise ShardingError(f"{_shown_url(url)} is given twice (in shard {seen[key]} "
                                    f"and in shard {number})")
            seen[key] = number


def _table_text(name: str) -> str:
    try:
        database, table = split_table_name(name)
    except ValueError as exc:
        raise ShardingError(str(exc)) from None
    return f"{_name_text(database)}.{_name_text(table)}"


def _name_text(name: str) -> str:
    return name if _BARE_IDENTIFIER_RE.match(name) else quote_identifier(name)


def _clean_key(key: str | None) -> str | None:
    return key.strip() if key is not None else None


# -- layout from a Distributed table --------------------------------------------------------


def layout_from_distributed(client: SqlClient, table: str,
                            http_urls: list[list[str]] | None = None,
                            http_port: int | None = None) -> ShardLayout:
    """The layout of the ``Distributed`` table ``table`` on the server of ``client``.

    Reads the engine arguments (cluster, database, table, sharding key) and the cluster's
    shards, weights and replicas from ``system.clusters``. ``system.clusters`` knows only
    the native TCP port, so the replicas' HTTP URLs come from ``http_urls`` (per shard,
    per replica, in ``system.clusters`` order) or are ``http://{host_name}:{http_port}``.

    The remote database must be known for certain: '' is resolved to the replicas'
    ``<default_database>`` (all equal, not empty); ``currentDatabase()`` is refused, since
    18.16 evaluates it when the table is loaded (the creating session's database after
    CREATE, the replicas' default database after a restart) and records neither.
    """
    database, name = split_table_name(table)
    purpose = f"read shard layout of {database}.{name}"
    args = _distributed_args(client, database, name, purpose)
    cluster = _expand_macros(client, _literal_or_name(args[0], "cluster", table), purpose)
    replicas = _cluster_rows(client, cluster, table, purpose)
    remote_db = _remote_database(args[1], replicas, table, cluster)
    remote_table = _literal_or_name(args[2], "table", table)
    key = args[3].strip() if len(args) > 3 else None
    urls = _replica_urls(replicas, http_urls, http_port, cluster)
    shards = tuple(
        Shard(index, _shard_weight(rows), tuple(urls[index]))
        for index, rows in enumerate(replicas)
    )
    return ShardLayout(shards, f"{_name_text(remote_db)}.{_name_text(remote_table)}", key)


def _distributed_args(client: SqlClient, database: str, name: str, purpose: str) -> list[str]:
    rows = client.query_rows(
        "SELECT engine, engine_full FROM system.tables "
        f"WHERE database = {_sql_string(database)} AND name = {_sql_string(name)}",
        purpose=purpose,
    )
    if not rows:
        raise ClickHouseError(f"table `{database}`.`{name}` does not exist", code=60,
                              purpose=purpose)
    if rows[0]["engine"] != "Distributed":
        raise ShardingError(f"{database}.{name} is a {rows[0]['engine']} table, not a "
                            "Distributed table")
    args = engine_arguments(rows[0]["engine_full"])
    if not 3 <= len(args) <= 5:
        raise ShardingError(f"cannot read the Distributed arguments of {database}.{name}: "
                            f"{rows[0]['engine_full']}")
    return args


def engine_arguments(engine_full: str) -> list[str]:
    """The top-level arguments of ``Engine(a, 'b', f(c, d))`` as source text, stripped.

    Commas and parentheses inside quotes, backquotes or nested calls do not split.
    """
    start = engine_full.find("(")
    if start < 0:
        return []
    args: list[str] = []
    depth, begin = 0, start + 1
    for token, position in _tokens(engine_full, start):
        if token in "([":
            depth += 1
        elif token in ")]":
            depth -= 1
            if depth == 0:
                args.append(engine_full[begin:position].strip())
                return args if args != [""] else []
        elif token == "," and depth == 1:
            args.append(engine_full[begin:position].strip())
            begin = position + 1
    raise ShardingError(f"unbalanced parentheses in engine definition: {engine_full}")


def _tokens(text: str, start: int = 0) -> Iterator[tuple[str, int]]:
    """(token, position) of punctuation, quoted strings/names and words in ``text``."""
    i = start
    while i < len(text):
        ch = text[i]
        if ch in "'`\"":
            end = _quoted_end(text, i)
            yield text[i:end], i
            i = end
        elif ch.isalnum() or ch == "_":
            end = i
            while end < len(text) and (text[end].isalnum() or text[end] == "_"):
                end += 1
            yield text[i:end], i
            i = end
        elif ch.isspace():
            i += 1
        else:
            yield ch, i
            i += 1


def _quoted_end(text: str, start: int) -> int:
    """Index just past the quoted token opening at ``start`` (backslash and doubled quote)."""
    quote, i = text[start], start + 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
        elif text[i] == quote:
            if i + 1 < len(text) and text[i + 1] == quote:
                i += 2
            else:
                return i + 1
        else:
            i += 1
    raise ShardingError(f"unterminated {quote} in: {text}")


def _unquote(token: str) -> str:
    body, out, i = token[1:-1], [], 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt == "x" and i + 3 < len(body):
                out.append(chr(int(body[i + 2:i + 4], 16)))
                i += 4
                continue
            out.append(_STRING_ESCAPES.get(nxt, nxt))
            i += 2
        elif ch == token[0] and i + 1 < len(body) and body[i + 1] == ch:
            out.append(ch)
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _literal_or_name(arg: str, what: str, table: str) -> str:
    """An engine argument that is a string literal or an (optionally quoted) identifier."""
    value = _name_value(arg)
    if value is None or (what != "database" and not value):
        raise ShardingError(f"the {what} argument of Distributed table {table} is {arg}; "
                            "txsink reads only a name or a string literal there")
    return value


def _name_value(arg: str) -> str | None:
    arg = arg.strip()
    if len(arg) >= 2 and arg[0] in "'`\"" and _quoted_end(arg, 0) == len(arg):
        return _unquote(arg)
    return arg if _BARE_IDENTIFIER_RE.match(arg) else None


def _expand_macros(client: SqlClient, cluster: str, purpose: str) -> str:
    """``{name}`` macros in a cluster name, as the server expands them."""
    names = _MACRO_RE.findall(cluster)
    if not names:
        return cluster
    rows = client.query_rows("SELECT macro, substitution FROM system.macros", purpose=purpose)
    macros = {row["macro"]: row["substitution"] for row in rows}
    missing = [name for name in names if name not in macros]
    if missing:
        raise ShardingError(f"cluster name {cluster!r} uses macro(s) {', '.join(missing)} "
                            "that the server does not define")
    return _MACRO_RE.sub(lambda match: macros[match.group(1)], cluster)


def _cluster_rows(client: SqlClient, cluster: str, table: str,
                  purpose: str) -> list[list[dict]]:
    """system.clusters rows of ``cluster``, grouped per shard in shard and replica order."""
    rows = client.query_rows(
        "SELECT shard_num, shard_weight, replica_num, host_name, host_address, port, "
        f"default_database FROM system.clusters WHERE cluster = {_sql_string(cluster)} "
        "ORDER BY shard_num, replica_num",
        purpose=purpose,
    )
    if not rows:
        raise ShardingError(f"cluster {cluster!r} of Distributed table {table} is not in "
                            f"system.clusters of {getattr(client, 'url', 'the server')}")
    return [list(group) for _, group in itertools.groupby(rows, key=lambda r: r["shard_num"])]


def _remote_database(arg: str, shards: list[list[dict]], table: str, cluster: str) -> str:
    if arg.strip().lower().replace(" ", "") == "currentdatabase()":
        raise ShardingError(
            f"Distributed table {table} names its database as currentDatabase(): the server "
            "fixed that when it loaded the table (the creating session's database after "
            "CREATE, the replicas' default database after a restart) and does not show "
            "which, so txsink cannot tell where rows belong. Recreate the table with the "
            "database written out"
        )
    database = _literal_or_name(arg, "database", table)
    if database:
        return database
    defaults = {row.get("default_database") or "" for rows in shards for row in rows}
    if len(defaults) == 1 and "" not in defaults:
        return defaults.pop()
    found = ", ".join(repr(name) for name in sorted(defaults))
    raise ShardingError(
        f"Distributed table {table} names no database (''), so each replica's default "
        f"database applies; cluster {cluster!r} gives {found}. txsink needs one database "
        "written in the cluster config as every replica's <default_database>, or the "
        "database written in the table definition"
    )


def _shard_weight(rows: list[dict]) -> int:
    return int(rows[0]["shard_weight"])


def _replica_urls(shards: list[list[dict]], http_urls: list[list[str]] | None,
                  http_port: int | None, cluster: str) -> list[list[str]]:
    if http_urls is not None:
        _check_url_shape(shards, http_urls, cluster)
        for urls in http_urls:
            for url in urls:
                _check_url(url)
        _reject_duplicates(http_urls)
        return [list(urls) for urls in http_urls]
    if http_port is None:
        raise ShardingError(f"system.clusters gives only the native TCP ports of cluster "
                            f"{cluster!r}; give the replicas' http_urls or their http_port")
    urls = [[f"http://{_host(row['host_name'])}:{int(http_port)}" for row in rows]
            for rows in shards]
    try:
        _reject_duplicates(urls)
    except ShardingError as exc:
        raise ShardingError(f"{exc}: replicas of cluster {cluster!r} share a host, so one "
                            "http_port cannot reach them all; give http_urls") from None
    return urls


def _check_url_shape(shards: list[list[dict]], http_urls: list[list[str]],
                     cluster: str) -> None:
    expected = [len(rows) for rows in shards]
    given = [len(urls) for urls in http_urls]
    if expected != given:
        raise ShardingError(
            f"http_urls has {len(given)} shard(s) with {given} replica(s); cluster {cluster!r} "
            f"has {len(expected)} shard(s) with {expected} replica(s)"
        )


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _sql_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


# -- routing ---------------------------------------------------------------------------------


class ShardRouter:
    """Splits Arrow batches by the shard the server would put each row on.

    ``column_types`` (column name -> ClickHouse type of the *local* table, e.g. from
    ``describe_table``) makes the key see the server's types; without it the Arrow types
    stand in (int64 for Int64, string for String, ...). The key is checked here, before
    any batch: missing columns and non-integer results are errors (with one shard the key
    decides nothing and is not checked).
    """

    def __init__(self, layout: ShardLayout, schema: pa.Schema,
                 column_types: Mapping[str, str] | None = None) -> None:
        self.layout = layout
        # uint16 shard numbers: numpy sorts them by radix (linear) in _gather
        self._slots = np.array(layout.slots, dtype=np.uint16)
        self._weights = np.array([shard.weight for shard in layout.shards], dtype=np.int64)
        self._position = random.randrange(layout.total_weight)  # see _any_shard_counts
        self._key_values = _key_evaluator(layout, schema, dict(column_types or {}))

    def split(self, batch: pa.RecordBatch) -> dict[int, pa.RecordBatch]:
        """Shard index -> the rows of ``batch`` that go there (shards without rows omitted).

        Row order is kept within each shard. Rows for any shard are cut into contiguous
        zero-copy slices; keyed rows are gathered with one ``take``.
        """
        if batch.num_rows == 0:
            return {}
        if len(self.layout.shards) == 1:
            return {0: batch}
        if self._key_values is None:
            return self._slices(batch, self._any_shard_counts(batch.num_rows))
        shard_of_row = self._slots[self._key_values(batch) % np.uint64(len(self._slots))]
        return self._gather(batch, shard_of_row)

    def _any_shard_counts(self, rows: int) -> np.ndarray:
        """Rows per shard for rows that may go anywhere: weight-proportional, exactly.

        The rows of successive batches are dealt to the slot cycle (weight slots per shard)
        from a random starting slot, so small batches spread like ``rand()`` would and any
        prefix of the stream is within one cycle of the weights.
        """
        total = len(self._slots)
        counts = (rows // total) * self._weights
        rest = (self._position + np.arange(rows % total)) % total
        counts += np.bincount(self._slots[rest], minlength=len(self._weights))
        self._position = (self._position + rows) % total
        return counts

    @staticmethod
    def _slices(batch: pa.RecordBatch, counts: np.ndarray) -> dict[int, pa.RecordBatch]:
        out, offset = {}, 0
        for index, count in enumerate(counts.tolist()):
            if count:
                out[index] = batch.slice(offset, count)
            offset += count
        return out

    def _gather(self, batch: pa.RecordBatch, shard_of_row: np.ndarray) -> dict[int, pa.RecordBatch]:
        counts = np.bincount(shard_of_row, minlength=len(self.layout.shards))
        if np.count_nonzero(counts) == 1:
            return {int(np.flatnonzero(counts)[0]): batch}
        order = np.argsort(shard_of_row, kind="stable")  # keeps row order within a shard
        return self._slices(batch.take(pa.array(order)), counts)


KeyValues = Callable[[pa.RecordBatch], np.ndarray]  # batch -> unsigned key value per row


def _key_evaluator(layout: ShardLayout, schema: pa.Schema,
                   types: dict[str, str]) -> KeyValues | None:
    """The function giving each row's unsigned key value, or None when any shard will do."""
    key = layout.sharding_key
    if key is None or _RANDOM_KEY_RE.match(key) or len(layout.shards) == 1:
        return None
    column = _column_name(key)
    if column is not None:
        return _column_key(key, column, schema, types)
    return _expression_key(key, schema, types)


def _column_name(key: str) -> str | None:
    """The column a key consists of (bare, `backquoted` or "double-quoted"), else None."""
    if key.startswith("'"):
        return None  # a string literal
    return _name_value(key)


def _column_key(key: str, column: str, schema: pa.Schema, types: dict[str, str]) -> KeyValues:
    """A bare integer column: its values, made unsigned as the server does."""
    if column not in schema.names:
        raise ShardingError(f"sharding key {key} is column `{column}`, which the data does "
                            f"not have (columns: {', '.join(schema.names)})")
    arrow_type = schema.field(column).type
    ch_type = types.get(column) or _integer_name(arrow_type)
    if ch_type not in INTEGER_TYPES:
        shown = ch_type or str(arrow_type)
        raise ShardingError(f"sharding key column `{column}` is {shown}, not an integer type "
                            "(UInt8..UInt64, Int8..Int64): the server refuses such a key")
    target = pa.from_numpy_dtype(np.dtype(INTEGER_TYPES[ch_type][0]))
    _as_integers(pa.array([], arrow_type), target, column)  # fails now if it never can

    def values(batch: pa.RecordBatch) -> np.ndarray:
        array = batch.column(column)
        _reject_nulls(array, column, key)
        array = _as_integers(array, target, column)
        return unsigned_key_values(array.to_numpy(zero_copy_only=False), ch_type)

    return values


def _as_integers(array: pa.Array, target: pa.DataType, column: str) -> pa.Array:
    """``array`` as the key column's integer type, wrapping like the server's conversion."""
    if array.type == target:
        return array
    try:
        return pc.cast(array, target, safe=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ShardingError(f"sharding key column `{column}` holds {array.type}, which "
                            f"cannot become {target}: {exc}") from None


def _integer_name(arrow_type: pa.DataType) -> str | None:
    """The ClickHouse name of an Arrow integer type (int32 -> Int32), else None."""
    if not pa.types.is_integer(arrow_type):
        return None
    return _ARROW_INTEGERS[arrow_type.bit_width, pa.types.is_signed_integer(arrow_type)]


def unsigned_key_values(values: np.ndarray, ch_type: str, constant: bool = False) -> np.ndarray:
    """Key values as the server makes them unsigned before taking them modulo the weight.

    Int8/16/32 are sign-extended to UInt32 and Int64 to UInt64 (a C++ ``static_cast``);
    a constant key is cast to the unsigned type of its own width instead.
    """
    dtype = np.dtype(INTEGER_TYPES[ch_type][0])
    values = values.astype(dtype, copy=False)
    if dtype.kind == "u":
        return values
    if constant or dtype.itemsize == 8:
        return values.view(np.dtype(f"<u{dtype.itemsize}"))
    return values.astype(np.uint32)  # sign-extends, then wraps modulo 2**32


def _reject_nulls(array: pa.Array, column: str, key: str) -> None:
    if array.null_count:
        row = pc.index(pc.is_null(array), True).as_py()
        raise ShardingError(f"column `{column}` of sharding key {key} is null in row {row} "
                            "of the batch; a null key has no shard")


# -- expression keys, evaluated by chdb -------------------------------------------------------


def _expression_key(key: str, schema: pa.Schema, types: dict[str, str]) -> KeyValues:
    """Any other expression: evaluated by chdb over the batch's key columns."""
    session = _chdb_session(key)
    used = _referenced_columns(key, schema)
    plan = _ChdbKey(key, used, schema, types, session)
    return plan.values


def _chdb_session(key: str) -> Any:
    try:
        import chdb  # noqa: F401 - lazy: a process that forks after importing chdb hangs
    except ImportError:
        raise ShardingError(f"sharding key {key} is an expression; {_CHDB_MISSING}") from None
    from server_ext.chdb_client import ChdbClient

    return ChdbClient.for_process()


def _referenced_columns(key: str, schema: pa.Schema) -> list[str]:
    """Columns of ``schema`` that ``key`` names (names not followed by '(')."""
    names: set[str] = set()
    tokens = list(_tokens(key))
    for position, (token, _) in enumerate(tokens):
        follower = tokens[position + 1][0] if position + 1 < len(tokens) else ""
        if token[0] in "`\"":
            names.add(_unquote(token))
        elif (token[0].isalpha() or token[0] == "_") and follower != "(":
            names.add(token)
    return [name for name in schema.names if name in names]


class _ChdbKey:
    """Evaluates an expression key with chdb, over just the columns it names.

    The columns travel to chdb as an Arrow batch read by its ``Python()`` table function
    (no serialisation; faster than pandas or an ArrowStream file, measured) and come back
    as one RowBinary column, read by numpy without parsing. ``max_threads = 1`` keeps the
    output in input order (with more threads chdb returns blocks in any order). Each query
    costs ~3-5 ms however small the batch, so split batches of 100k rows or more where
    the key is an expression (1M rows: ~8 M rows/s; 10k-row batches: ~1.6 M rows/s).
    """

    def __init__(self, key: str, used: list[str], schema: pa.Schema, types: dict[str, str],
                 client: Any) -> None:
        self.key = key
        self.used = used
        self.client = client
        self.nullable = {name: _is_nullable(types.get(name)) for name in used}
        cast = any(name in types for name in used)  # a subquery casts (~0.5 ms per query)
        self.schema = pa.schema([
            pa.field(f"c{i}" if cast else name, schema.field(name).type,
                     nullable=self.nullable[name])
            for i, name in enumerate(used)
        ])
        self.source = "Python(txsink_shard_keys)"
        if cast:
            inner = ", ".join(_inner_column(i, name, types.get(name))
                              for i, name in enumerate(used))
            self.source = f"(SELECT {inner} FROM {self.source})"
        self.result_type = self._result_type()

    def _result_type(self) -> str:
        """The key's type, from an empty batch: checks columns, functions and type now."""
        empty = pa.record_batch([pa.array([], f.type) for f in self.schema], schema=self.schema)
        source = f" FROM {self.source}" if self.used else ""
        text = self._query(f"DESCRIBE (SELECT {self.key}{source})", empty, "TabSeparated")
        type_name = text.decode().split("\t")[1]
        if type_name not in INTEGER_TYPES:
            raise ShardingError(f"sharding key {self.key} evaluates to {type_name}, not an "
                                "integer type (UInt8..UInt64, Int8..Int64): the server "
                                "refuses such a key")
        return type_name

    def values(self, batch: pa.RecordBatch) -> np.ndarray:
        if not self.used:
            return self._constant(batch.num_rows)
        columns = []
        for name in self.used:
            array = batch.column(name)
            if not self.nullable[name]:
                _reject_nulls(array, name, self.key)
            columns.append(array)
        keys = pa.record_batch(columns, schema=self.schema)
        raw = self._query(f"SELECT {self.key} FROM {self.source} SETTINGS max_threads = 1",
                          keys, "RowBinary")
        dtype = np.dtype(INTEGER_TYPES[self.result_type][0])
        values = np.frombuffer(raw, dtype=dtype)
        if len(values) != batch.num_rows:
            raise ShardingError(f"chdb returned {len(values)} key values for "
                                f"{batch.num_rows} rows of sharding key {self.key}")
        return unsigned_key_values(values, self.result_type)

    def _constant(self, rows: int) -> np.ndarray:
        """A key without columns is a constant: the server casts it at its own width."""
        raw = self._query(f"SELECT {self.key}", pa.record_batch([], schema=pa.schema([])),
                          "RowBinary")
        value = np.frombuffer(raw, dtype=np.dtype(INTEGER_TYPES[self.result_type][0]))
        return np.repeat(unsigned_key_values(value, self.result_type, constant=True), rows)

    def _query(self, sql: str, keys: pa.RecordBatch, fmt: str) -> bytes:
        """Run ``sql`` on the process's chdb session, ``keys`` readable as Python(...)."""
        from server_ext import chdb_client

        txsink_shard_keys = keys  # noqa: F841 - found by name by chdb's Python()
        with chdb_client._LOCK:
            try:
                result = self.client._session.query(sql, fmt)
            except Exception as exc:
                raise self._error(exc) from None
        return result.bytes() if result is not None else b""

    def _error(self, exc: Exception) -> ShardingError:
        text = str(exc)
        match = _UNKNOWN_IDENTIFIER_RE.search(text)
        if match:
            return ShardingError(f"sharding key {self.key} uses `{match.group(1)}`, which is "
                                 "not a column of the data")
        message = text[text.find("Code: "):] if "Code: " in text else text
        return ShardingError(f"chdb cannot evaluate sharding key {self.key}: "
                             f"{message.strip()[:500]}")


def _is_nullable(ch_type: str | None) -> bool:
    return ch_type is not None and parse_type(ch_type).unwrap_low_cardinality().is_nullable


def _inner_column(index: int, name: str, ch_type: str | None) -> str:
    source = f"c{index}"
    value = f"CAST({source}, {_sql_string(ch_type)})" if ch_type else source
    return f"{value} AS {quote_identifier(name)}"
