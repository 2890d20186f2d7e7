"""The target made to fit the data: ``CREATE TABLE`` from an Arrow schema, and the
``ALTER TABLE … ADD COLUMN`` of the columns it lacks.

Why here, as text built from the schema: the sink's options ``create_table=if_missing``
and ``schema_evolution=add_columns`` change the target before anything is staged, and the
types they choose must be ones the rest of the writer takes back from the server
(``schema.type_problem``) with every Spark value kept exactly. The mapping is the reverse
of docs/usage.md, "Column types", per server: a type the server lacks (18.16 has no
``Bool``, ``Date32``, ``DateTime64`` or ``Map``, read from ``system.data_type_families``)
falls back to the one it has, or the column is refused by name before anything is
created.

Nullability follows the Arrow field (Spark's ``nullable``), except where ClickHouse takes
no ``Nullable``: ``Array``, ``Map`` and ``Tuple`` columns and ``Map`` keys are created
non-Nullable (a null in them is refused per row by ``schema.check_batch``), and so are the
columns the sorting or partition key names (ClickHouse refuses Nullable key columns,
measured on 18.16 and 26.9).

The statements are built as pure text (fast tests check it); :func:`create_table`,
:func:`add_column` and :func:`type_families` run them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from server_ext.client.client_protocol import SqlClient
from server_ext.errors import ClickHouseError
from server_ext.sql import identifier_text, quote_identifier, sql_string, tokenize
from server_ext.types.json_values import is_spark_variant

#: MergeTree engines a created target may have: each takes a staging table's partitions
#: as a plain INSERT's (docs/usage.md, "Table shapes"), Replicated or not.
CREATABLE_ENGINES = tuple(
    f"{replicated}{kind}MergeTree"
    for replicated in ("", "Replicated")
    for kind in ("", "Replacing", "Summing", "Aggregating", "Collapsing"))

#: MergeTree engines the sink cannot publish into, and why (refused before creation).
UNPUBLISHABLE_ENGINES = {
    "VersionedCollapsingMergeTree": "its engine appends the version column to the sorting "
                                    "key, so no staging table's partitions match it",
    "GraphiteMergeTree": "its rollup rules come from the server's configuration, which a "
                         "staging table cannot copy",
}

DEFAULT_ENGINE = "MergeTree"
SYNTAX_ERROR = 62  # the server's code for a statement it cannot parse
#: The type families the mapping uses where a server has them, else a fallback.
_OPTIONAL_FAMILIES = ("Bool", "Date32", "DateTime64", "Map")


class TypeNotMapped(ValueError):
    """A field whose Arrow type no ClickHouse column of this server holds exactly."""


def engine_name(engine: str) -> str:
    """The engine's name: ``ReplacingMergeTree(version)`` → ``ReplacingMergeTree``."""
    return engine.strip().split("(", 1)[0].strip()


def creatable_engine_problem(engine: str) -> str | None:
    """Why a target cannot be created with ``engine`` (None: it can).

    ``engine`` is the engine clause as written after ``ENGINE =``: a name with optional
    arguments. Only the MergeTree engines of :data:`CREATABLE_ENGINES` are created; a
    ``Distributed`` table above them is ``distributed_table``'s (``create_distributed``).
    """
    name = engine_name(engine)
    if name in UNPUBLISHABLE_ENGINES:
        return f"engine {name} cannot be published into: {UNPUBLISHABLE_ENGINES[name]}"
    if name == "Distributed":
        return ("a Distributed table is not created by engine, which names the local "
                "tables' engine: give shards to create the local table on each, and "
                "distributed_table and cluster to create a Distributed table above them")
    if name not in CREATABLE_ENGINES:
        return (f"engine {name or engine!r} is not one the sink creates "
                f"({', '.join(CREATABLE_ENGINES)})")
    problem = expression_problem(engine)
    return f"engine {engine!r}: {problem}" if problem else None


def expression_problem(text: str) -> str | None:
    """Why ``text`` is not one clause of SQL (None: it is): unbalanced brackets or a
    statement separator would let an option's text end the statement it is put into."""
    depth = 0
    for token in tokenize(text):
        if token.kind == "punct" and token.text == ";":
            return "a ';' ends the statement"
        if token.kind == "punct" and token.text in "([":
            depth += 1
        elif token.kind == "punct" and token.text in ")]":
            depth -= 1
        if depth < 0:
            return "a closing bracket without its opening one"
    return "an opening bracket without its closing one" if depth else None


# -- the type mapping ------------------------------------------------------------------------


def column_type(field: pa.Field, families: frozenset[str], *, key: bool = False) -> str:
    """The ClickHouse type a target column is created with for ``field`` on a server with
    the type ``families``; raises :class:`TypeNotMapped` naming why none fits.

    ``key``: the column is named by the sorting or partition key, so never Nullable.
    """
    inner = _value_type(field.type, families)
    return f"Nullable({inner})" if field.nullable and not key and _may_be_null(inner) else inner


def _may_be_null(ch_type: str) -> bool:
    return not ch_type.startswith(("Array(", "Map(", "Tuple("))


def _element(field: pa.Field, families: frozenset[str]) -> str:
    """An element of an Array, Map value or Tuple: Nullable as its field says."""
    inner = _value_type(field.type, families)
    return f"Nullable({inner})" if field.nullable and _may_be_null(inner) else inner


def _value_type(t: pa.DataType, families: frozenset[str]) -> str:
    if is_spark_variant(t):
        raise TypeNotMapped("Spark's VariantType has no column type: turn it into JSON text "
                            "with to_json() in Spark")
    if pa.types.is_boolean(t):
        return "Bool" if "Bool" in families else "UInt8"
    if pa.types.is_integer(t):
        return f"{'U' if pa.types.is_unsigned_integer(t) else ''}Int{t.bit_width}"
    if pa.types.is_float32(t):
        return "Float32"
    if pa.types.is_float64(t):
        return "Float64"
    if pa.types.is_decimal(t):
        return f"Decimal({t.precision}, {t.scale})"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "String"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "String"
    if pa.types.is_fixed_size_binary(t):
        return f"FixedString({t.byte_width})"
    if pa.types.is_date32(t) or pa.types.is_date64(t):
        return "Date32" if "Date32" in families else "Date"
    if pa.types.is_timestamp(t):  # an instant, or a wall-clock time shown in UTC
        return "DateTime64(6, 'UTC')" if "DateTime64" in families else "DateTime('UTC')"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return f"Array({_element(t.value_field, families)})"
    if pa.types.is_map(t):
        if "Map" not in families:
            raise TypeNotMapped(f"{t}: the server has no Map type")
        key = _value_type(t.key_type, families)
        return f"Map({key}, {_element(t.item_field, families)})"
    if pa.types.is_struct(t):
        if t.num_fields == 0:
            raise TypeNotMapped("a struct without fields has no Tuple type")
        elements = ", ".join(f"{identifier_text(f.name)} {_element(f, families)}" for f in t)
        return f"Tuple({elements})"
    if pa.types.is_null(t):
        raise TypeNotMapped("a column of Spark's NullType (always null) has no type: cast it "
                            "in Spark, e.g. CAST(NULL AS STRING)")
    raise TypeNotMapped(f"{t} has no ClickHouse type that holds its values exactly")


def column_types(schema: pa.Schema, families: frozenset[str],
                 keys: frozenset[str] = frozenset()) -> tuple[list[tuple[str, str]], list[str]]:
    """Each field's (name, created type), and one problem line per field that has none."""
    columns: list[tuple[str, str]] = []
    problems: list[str] = []
    for field in schema:
        try:
            columns.append((field.name, column_type(field, families, key=field.name in keys)))
        except TypeNotMapped as exc:
            problems.append(f"column `{field.name}`: {exc}")
    return columns, problems


def mentioned_columns(expressions: tuple[str, ...], names: list[str]) -> frozenset[str]:
    """The column ``names`` that the key ``expressions`` mention (as words or quoted)."""
    known = set(names)
    return frozenset(t.text for text in expressions for t in tokenize(text)
                     if t.kind in ("word", "quoted") and t.text in known)


def key_clause(expression: str, names: list[str]) -> str:
    """A key option as SQL: its comma-separated parts that name a column exactly are
    quoted identifiers, the others expressions as written; several parts in a tuple."""
    parts = [p.strip() for p in _top_level_parts(expression) if p.strip()]
    known = set(names)
    written = [quote_identifier(p) if p in known else p for p in parts]
    if not written:
        return "tuple()"
    return written[0] if len(written) == 1 else f"({', '.join(written)})"


def _top_level_parts(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for token in tokenize(text):
        if token.kind == "punct" and token.text in "([":
            depth += 1
        elif token.kind == "punct" and token.text in ")]":
            depth -= 1
        elif token.kind == "punct" and token.text == "," and depth == 0:
            parts.append(text[start:token.start])
            start = token.end
    parts.append(text[start:])
    return parts


# -- statements --------------------------------------------------------------------------------


@dataclass(frozen=True)
class TableShape:
    """How a created target is laid out: the engine clause, its keys (as given)."""

    engine: str = DEFAULT_ENGINE
    order_by: str = ""
    partition_by: str = ""

    def keys(self, names: list[str]) -> frozenset[str]:
        return mentioned_columns((self.order_by, self.partition_by), names)


def create_table_sql(qualified: str, columns: list[tuple[str, str]], shape: TableShape) -> str:
    """``CREATE TABLE IF NOT EXISTS``: two writers may race to create one target, and the
    one that loses finds the winner's table (then described and checked as any other)."""
    names = [name for name, _ in columns]
    body = ", ".join(f"{quote_identifier(name)} {ch_type}" for name, ch_type in columns)
    engine = shape.engine.strip()
    if "(" not in engine:
        engine += "()"
    partition = (f" PARTITION BY {key_clause(shape.partition_by, names)}"
                 if shape.partition_by.strip() else "")
    return (f"CREATE TABLE IF NOT EXISTS {qualified} ({body}) ENGINE = {engine}"
            f"{partition} ORDER BY {key_clause(shape.order_by, names)}")


def add_column_sql(qualified: str, name: str, ch_type: str, *, if_not_exists: bool) -> str:
    """``ALTER TABLE … ADD COLUMN``; ``IF NOT EXISTS`` where the server parses it (18.16
    does not: a syntax error, measured), so a repeat after a lost answer is harmless."""
    guard = " IF NOT EXISTS" if if_not_exists else ""
    return f"ALTER TABLE {qualified} ADD COLUMN{guard} {quote_identifier(name)} {ch_type}"


_FAMILIES: dict[str, frozenset[str]] = {}
_FAMILIES_LOCK = threading.Lock()


def type_families(client: SqlClient) -> frozenset[str]:
    """Which of the optional type families the mapping uses the server has (cached per
    server for the life of the process)."""
    url = getattr(client, "url", "")
    with _FAMILIES_LOCK:
        if url in _FAMILIES:
            return _FAMILIES[url]
    wanted = ", ".join(sql_string(name) for name in _OPTIONAL_FAMILIES)
    rows = client.query_rows(f"SELECT name FROM system.data_type_families WHERE name IN "
                             f"({wanted})", purpose="list data types")
    found = frozenset(row["name"] for row in rows)
    with _FAMILIES_LOCK:
        _FAMILIES[url] = found
    return found


def create_table(client: SqlClient, qualified: str, columns: list[tuple[str, str]],
                 shape: TableShape) -> None:
    """Create the target unless it exists (a server's refusal, e.g. of a key expression,
    raises ``ClickHouseError`` with the server's reason)."""
    client.execute(create_table_sql(qualified, columns, shape),
                   purpose=f"create table {qualified}", retry=True)


_NO_IF_NOT_EXISTS: set[str] = set()  # servers whose ADD COLUMN has no IF NOT EXISTS


def add_column(client: SqlClient, qualified: str, name: str, ch_type: str,
               exists: Callable[[], bool]) -> None:
    """Add one column, idempotently: with ``IF NOT EXISTS`` where the server parses it;
    elsewhere a refusal is accepted when ``exists()`` then finds the column (a concurrent
    writer, or a repeat after a lost answer, added it)."""
    url = getattr(client, "url", "")
    purpose = f"add column {name} to {qualified}"
    if url not in _NO_IF_NOT_EXISTS:
        try:
            client.execute(add_column_sql(qualified, name, ch_type, if_not_exists=True),
                           purpose=purpose)
            return
        except ClickHouseError as exc:
            if exc.code != SYNTAX_ERROR:
                raise
            _NO_IF_NOT_EXISTS.add(url)
    try:
        client.execute(add_column_sql(qualified, name, ch_type, if_not_exists=False),
                       purpose=purpose)
    except ClickHouseError:
        if not exists():
            raise
