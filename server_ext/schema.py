"""The target table as the server describes it, and whether Arrow data fits into it.

Why checks on our side: ClickHouse accepts silently much that is wrong for an exactly-once
pipeline (300 into UInt8 wraps to 44, an omitted column becomes 0), and what it does
reject it rejects one problem at a time, after staging already exists. So:

- ``check_arrow_schema`` compares the whole Arrow schema with the target before anything
  is created, and raises one ``SchemaMismatch`` that names every bad column: a missing
  column without a default, an unknown column, a column that cannot be written
  (MATERIALIZED/ALIAS), a type that cannot be converted (string into UInt64), a type the
  writer does not support.
- ``check_batch`` checks the values of one batch before any of it is sent, and raises
  ``InvalidValue`` naming the column, the first offending row and its value: a null into
  a non-Nullable column, an integer out of the column's range, a string longer than
  FixedString(N), a Date/DateTime/Date32/DateTime64 outside what the server can store, a
  timestamp finer than DateTime64(p), a decimal that does not fit Decimal(P, S) exactly,
  an Enum label or code not in the type, a UUID or IP address not in canonical text, a
  JSON text that is no object the server stores as written, Nested sub-columns of unequal
  lengths, a Map or Tuple element that fails these checks (named ``col (value)`` /
  ``col.element``).
  With a collecting row map (``bad_values.Collect``, ``bad_rows=quarantine``) the same
  checks report every bad row instead, each charged to its outer row.
  The server would convert some of these silently (a struct field of another name into a
  Tuple becomes the element's default, a null Map value 0, -1 into UInt256 wraps) and the
  others it refuses for the whole INSERT, without the row.
- Date and DateTime are checked against the ranges of the server being written to
  (``ValueRanges``, measured by ``capabilities``), not against the storage width alone: a
  value the server stores but cannot read back unchanged (a Date after 2105-12-31 on
  ClickHouse 18.16 reads back as 1970-01-01 or not at all) is refused like an overflow.

Conventions (stated once, relied on by the encoder): a missing Nullable column is filled
with NULL by the server, so it needs no default; timestamps are instants (a timestamp
without a time zone is taken as UTC) and lose their sub-second part in DateTime, while a
timestamp with digits DateTime64(p) cannot hold is rejected; a value that would need
rounding to fit Decimal(P, S) is rejected, never rounded. The checks run on a prepared
batch (``prepare``): Nested sub-columns split out, wall-clock timestamps made instants.
All checks are vectorised (pyarrow compute), never a Python loop over rows, except JSON
text, which no vectorised parser checks (``json_values``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from server_ext.bad_values import Collect, Rows, shown_value
from server_ext.chtypes import (
    FLOAT_TYPES,
    INTEGER_TYPES,
    STORAGE_RANGES,
    WIDE_INTEGER_TYPES,
    ChType,
    ValueRanges,
    parse_type,
)
from server_ext.client_protocol import SqlClient
from server_ext.conversions import (
    UNIT_DIGITS,
    day_text,
    instant_text,
    to_days,
    to_seconds,
    to_ticks,
)
from server_ext.errors import ClickHouseError, SchemaMismatch
from server_ext.json_values import is_spark_variant, json_source_problem, json_text_problem
from server_ext.nested import check_sibling_lengths, flatten_schema
from server_ext.sql import (
    qualified_name,
    quote_identifier,
    shown_name,
    split_table_name,
    sql_string,
    table_filter,
)

UNWRITABLE_DEFAULT_KINDS = ("MATERIALIZED", "ALIAS", "EPHEMERAL")
RowOf = Rows  # index in the checked array -> row of the batch, and where bad values go


@dataclass(frozen=True)
class Column:
    """One target column: ``default_kind`` is '', DEFAULT, MATERIALIZED, ALIAS, EPHEMERAL."""

    name: str
    type: str
    default_kind: str = ""
    default_expression: str = ""
    chtype: ChType = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "chtype", parse_type(self.type))

    @property
    def writable(self) -> bool:
        """Whether an INSERT may supply this column."""
        return self.default_kind not in UNWRITABLE_DEFAULT_KINDS

    @property
    def may_be_omitted(self) -> bool:
        """Whether the server fills it when the data lacks it (a DEFAULT, or NULL)."""
        return bool(self.default_kind) or self.chtype.unwrap_low_cardinality().is_nullable


@dataclass(frozen=True)
class TargetTable:
    """What txsink needs to know about a target table to stage and publish into it."""

    database: str
    name: str
    columns: list[Column]
    partition_key: str
    sorting_key: str
    primary_key: str
    engine: str
    engine_full: str
    replicated: bool
    index_granularity: int
    create_table_query: str

    @property
    def qualified(self) -> str:
        """``\\`db\\`.\\`table\\``` for SQL."""
        return qualified_name(self.database, self.name)

    def column(self, name: str) -> Column:
        for column in self.columns:
            if column.name == name:
                return column
        raise KeyError(name)


def describe_table(client: SqlClient, table: str) -> TargetTable:
    """Describe ``db.table`` (or ``table`` in ``default``) from the server.

    Raises ``ClickHouseError`` named UNKNOWN_DATABASE or UNKNOWN_TABLE naming the table.
    """
    database, name = split_table_name(table)
    purpose = f"describe table {shown_name(database, name)}"
    found = client.query_rows(
        "SELECT engine, engine_full, partition_key, sorting_key, primary_key, "
        "create_table_query FROM system.tables "
        f"WHERE {table_filter(database, name, name_column='name')}",
        purpose=purpose,
    )
    if not found:  # the database or the table: named by the first that is missing
        _require_exists(client, database, name, purpose)
        raise _unknown_table(database, name, purpose)  # created since: still not described
    meta = found[0]
    rows = client.query_rows(f"DESCRIBE TABLE {qualified_name(database, name)}", purpose=purpose)
    columns = [
        Column(row["name"], row["type"], row.get("default_type", ""),
               row.get("default_expression", ""))
        for row in rows
    ]
    return TargetTable(
        database=database, name=name, columns=columns,
        partition_key=meta["partition_key"], sorting_key=meta["sorting_key"],
        primary_key=meta["primary_key"], engine=meta["engine"],
        engine_full=meta["engine_full"], replicated=meta["engine"].startswith("Replicated"),
        index_granularity=_index_granularity(meta["engine_full"]),
        create_table_query=meta["create_table_query"],
    )


def _require_exists(client: SqlClient, database: str, name: str, purpose: str) -> None:
    """Raise a clear UNKNOWN_DATABASE / UNKNOWN_TABLE error instead of a DESCRIBE failure."""
    rows = client.query_rows(
        f"SELECT (SELECT count() FROM system.databases WHERE name = {sql_string(database)}) AS db, "
        "(SELECT count() FROM system.tables "
        f"WHERE {table_filter(database, name, name_column='name')}) AS tbl",
        purpose=purpose,
    )[0]
    if int(rows["db"]) == 0:
        raise ClickHouseError(f"database `{database}` does not exist", code=81, purpose=purpose)
    if int(rows["tbl"]) == 0:
        raise _unknown_table(database, name, purpose)


def _unknown_table(database: str, name: str, purpose: str) -> ClickHouseError:
    return ClickHouseError(f"table `{database}`.`{name}` does not exist", code=60,
                           purpose=purpose)


def _index_granularity(engine_full: str) -> int:
    match = re.search(r"index_granularity\s*=\s*(\d+)", engine_full)
    return int(match.group(1)) if match else 8192


# -- schema check --------------------------------------------------------------------------


def check_arrow_schema(target: TargetTable, schema: pa.Schema) -> list[Column]:
    """The target columns to send, in the target's order; raises ``SchemaMismatch``.

    Every problem is collected before raising, so the message names every bad column.
    Nullability of the Arrow fields is not judged here (Spark marks most fields nullable):
    nulls are checked per batch by ``check_batch``.
    """
    schema, problems = flatten_schema([(c.name, c.chtype) for c in target.columns], schema)
    incoming = {f.name: f for f in schema}
    known = {c.name for c in target.columns}
    for arrow_field in schema:
        if arrow_field.name not in known:
            problems.append(_unknown_column(arrow_field.name, known))
    send: list[Column] = []
    for column in target.columns:
        arrow_field = incoming.get(column.name)
        if arrow_field is None:
            if column.writable and not column.may_be_omitted:
                problems.append(f"missing column `{column.name}` ({column.type}) has no default")
            continue
        if not column.writable:
            problems.append(f"column `{column.name}` is {column.default_kind} and cannot be "
                            "written")
            continue
        reason = type_problem(arrow_field.type, column.chtype)
        if reason:
            problems.append(f"column `{column.name}`: {reason}")
            continue
        send.append(column)
    if problems:
        raise SchemaMismatch(shown_name(target.database, target.name), problems)
    return send


def _unknown_column(name: str, known: set[str]) -> str:
    near = [k for k in known if k.lower() == name.lower()]
    hint = f" (did you mean {quote_identifier(near[0])}?)" if near else ""
    return f"unknown column {quote_identifier(name)}: the target has no such column{hint}"


def type_problem(arrow_type: pa.DataType, target: ChType) -> str | None:
    """Why values of ``arrow_type`` cannot be written to ``target``, or None if they can."""
    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    if is_spark_variant(arrow_type):
        return ("Spark's VariantType is not written (no ClickHouse type takes its binary "
                "encoding): turn it into JSON text with to_json() in Spark")
    ch = target.unwrap_low_cardinality()
    if ch.is_nullable and ch.inner is not None:
        ch = ch.inner.unwrap_low_cardinality()
    if pa.types.is_null(arrow_type):
        if target.unwrap_low_cardinality().is_nullable:
            return None
        return f"a field of Arrow type null (always null) cannot go into non-Nullable {target}"
    if ch.base == "Array":
        if not _is_list(arrow_type):
            return f"cannot convert {arrow_type} to {target}"
        inner = type_problem(arrow_type.value_type, ch.inner) if ch.inner else "bad Array"
        return f"element: {inner}" if inner else None
    if ch.base == "Map":
        if not pa.types.is_map(arrow_type):
            return f"cannot convert {arrow_type} to {target}"
        key = type_problem(arrow_type.key_type, ch.elements[0])
        value = type_problem(arrow_type.item_type, ch.elements[1])
        return f"key: {key}" if key else f"value: {value}" if value else None
    if ch.base == "Tuple":
        return _tuple_problem(arrow_type, ch)
    if ch.base == "JSON" and (pa.types.is_struct(arrow_type) or pa.types.is_map(arrow_type)):
        problem = json_source_problem(arrow_type)
        return f"{problem} (into {target})" if problem else None
    if ch.base in ("Variant", "Dynamic"):
        return _variant_problem(arrow_type, ch)
    accepts = _ACCEPTS.get(_family(ch))
    if accepts is None:
        return f"type {target} is not supported by the writer"
    if not any(test(arrow_type) for test in accepts):
        return f"cannot convert {arrow_type} to {target}"
    return None


# The type the server gives an Arrow column of each type (ArrowStream input), for Variant
# and Dynamic, which store values under that type (measured on 26.9: int32 -> Int32).
_SERVER_TYPE_OF = {
    **{f"int{b}": f"Int{b}" for b in (8, 16, 32, 64)},
    **{f"uint{b}": f"UInt{b}" for b in (8, 16, 32, 64)},
    "float": "Float32", "double": "Float64", "bool": "Bool",
    "string": "String", "large_string": "String",
}


def _variant_problem(arrow_type: pa.DataType, ch: ChType) -> str | None:
    """Dynamic takes the scalars the server types by themselves; Variant those of them
    whose type is one of its own (the server refuses any other: CANNOT_CONVERT_TYPE).
    Nulls are refused per batch like any null into a non-Nullable column: the server's
    Arrow reader stores the type's default for them ('' or false, measured on 26.9)."""
    stored = _SERVER_TYPE_OF.get(str(arrow_type))
    if stored is None:
        return (f"cannot convert {arrow_type} to {ch}: it takes integers, floats, booleans "
                "and strings")
    if ch.base == "Variant" and stored not in [str(e) for e in ch.elements]:
        return (f"{arrow_type} is stored as {stored}, which is none of the types of {ch}; "
                "cast it to one of them in Spark")
    return None


def struct_fields_for(arrow_type: pa.StructType, ch: ChType) -> list[int] | None:
    """Which struct field (by index) carries each Tuple element, or None if none match.

    A named Tuple takes the struct's fields by name, in any order (the server would fill
    elements it finds no field for with defaults, silently); an unnamed one by position.
    """
    names = [arrow_type.field(i).name for i in range(arrow_type.num_fields)]
    if len(names) != len(ch.elements):
        return None
    if not ch.names:
        return list(range(len(names)))
    if sorted(names) != sorted(ch.names):
        return None
    return [names.index(name) for name in ch.names]


def _tuple_problem(arrow_type: pa.DataType, ch: ChType) -> str | None:
    if not pa.types.is_struct(arrow_type):
        return f"cannot convert {arrow_type} to {ch}"
    order = struct_fields_for(arrow_type, ch)
    if order is None:
        return (f"the struct's fields ({', '.join(f.name for f in arrow_type)}) do not match "
                f"the elements of {ch}" + (" by name" if ch.names else " in number"))
    for position, index in enumerate(order):
        element = type_problem(arrow_type.field(index).type, ch.elements[position])
        if element:
            return f"element {ch.tuple_names[position]}: {element}"
    return None


def _family(ch: ChType) -> str:
    if ch.base in INTEGER_TYPES:
        return "int"
    if ch.base in WIDE_INTEGER_TYPES:
        return "wide int"
    if ch.base in FLOAT_TYPES:
        return "float"
    if ch.base in ("Enum8", "Enum16"):
        return "Enum"
    return ch.base


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _is_text(t: pa.DataType) -> bool:
    return (_is_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t))


def _is_whole(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_boolean(t)


def _is_whole_decimal(t: pa.DataType) -> bool:
    return pa.types.is_decimal(t) and t.scale == 0


def _is_date(t: pa.DataType) -> bool:
    return pa.types.is_date32(t) or pa.types.is_date64(t)


_ACCEPTS = {
    "int": (_is_whole,),
    "wide int": (pa.types.is_integer, _is_whole_decimal),
    "float": (_is_whole, pa.types.is_floating, pa.types.is_decimal),
    "Decimal": (_is_whole, pa.types.is_decimal),
    "String": (_is_text,),
    "FixedString": (_is_text,),
    "Date": (_is_date,),
    "Date32": (_is_date,),
    "DateTime": (_is_date, pa.types.is_timestamp),
    "DateTime64": (_is_date, pa.types.is_timestamp),
    "Bool": (pa.types.is_boolean,),
    "UUID": (_is_string,),
    "Enum": (_is_string, pa.types.is_integer),
    "IPv4": (_is_string,),
    "IPv6": (_is_string,),
    "JSON": (_is_string,),
}


# -- value checks --------------------------------------------------------------------------


def check_batch(target_columns: list[Column], batch: pa.RecordBatch,
                ranges: ValueRanges = STORAGE_RANGES, rows: Rows | None = None) -> None:
    """Raise ``InvalidValue`` for the first value of ``batch`` that its column cannot hold.

    ``target_columns`` is what ``check_arrow_schema`` returned; the batch's fields are
    found by name. ``ranges`` are the Date/DateTime ranges of the server the batch goes to
    (``Capabilities.value_ranges``); the default checks the storage limits only, which
    some servers cannot read back. Nothing is sent by this function: call it before
    encoding. ``rows``: the batch's row map with its collector
    (``bad_values.Collect``: every bad row is recorded there instead of raised).
    """
    rows = rows or Rows.fail_fast()
    order = {name: index for index, name in enumerate(batch.schema.names)}
    # the batch's (the DataFrame's) order: a row's first problem is that of its first column
    for column in sorted(target_columns, key=lambda c: order.get(c.name, len(order))):
        array = batch.column(column.name)
        _check_array(column.name, array, column.chtype, rows, ranges)
    check_sibling_lengths([(c.name, c.chtype) for c in target_columns], batch, rows)


def _check_array(name: str, array: pa.Array, target: ChType, row_of: RowOf,
                 ranges: ValueRanges) -> None:
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    nullable = target.unwrap_low_cardinality().is_nullable
    if array.null_count and not nullable:
        _fail(name, array, pc.is_null(array), row_of, f"null value into non-Nullable {target}")
    ch = target.value_type()
    check = _VALUE_CHECKS.get(_family(ch))
    if check is not None:
        check(name, array, ch, row_of, ranges)


def _check_json(name: str, array: pa.Array, ch: ChType, row_of: RowOf,
                ranges: ValueRanges) -> None:
    """Texts: each one JSON object the server stores as written (``json_values``; a
    Python loop, see there). Structs and maps: no NaN or infinity, which JSON lacks."""
    if not (pa.types.is_string(array.type) or pa.types.is_large_string(array.type)):
        _check_finite(name, array, row_of)
        return
    problems = [None if text is None else json_text_problem(text)
                for text in array.to_pylist()]
    row_of.report(name, array, np.array([p is not None for p in problems], bool), problems)


def _check_finite(name: str, array: pa.Array, row_of: RowOf) -> None:
    if pa.types.is_floating(array.type):
        bad = pc.and_(pc.is_valid(array), pc.invert(pc.is_finite(array)))
        if pc.any(bad).as_py():
            _fail(name, array, bad, row_of, "NaN or infinity, which JSON has no number for")
    elif pa.types.is_struct(array.type):
        for field, child in zip(array.type, array.flatten(), strict=True):
            _check_finite(f"{name}.{field.name}", child, row_of)
    elif pa.types.is_map(array.type) and len(array):
        values, element_row = list_values(array, row_of)
        _check_finite(f"{name} (value)", values.field(1), element_row)
    elif (pa.types.is_list(array.type) or pa.types.is_large_list(array.type)) and len(array):
        values, element_row = list_values(array, row_of)
        _check_finite(name, values, element_row)


def _check_integer(name: str, array: pa.Array, ch: ChType, row_of: RowOf,
                   ranges: ValueRanges) -> None:
    _check_integer_range(name, array, ch, row_of)


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _check_float(name: str, array: pa.Array, ch: ChType, row_of: RowOf,
                 ranges: ValueRanges) -> None:
    """A double into ``Float32``: a finite value that rounds beyond Float32's range would
    be stored as infinity (both servers convert it without a word). NaN and infinities
    are stored as they are; a value within the range is rounded to the nearest Float32."""
    if ch.base != "Float32" or not pa.types.is_float64(array.type):
        return
    extremes = pc.min_max(array)  # nulls and NaN ignored
    low, high = extremes["min"].as_py(), extremes["max"].as_py()
    if low is None or (-_FLOAT32_MAX <= low and high <= _FLOAT32_MAX):
        return
    values = pc.fill_null(array, 0.0).to_numpy(zero_copy_only=False)
    with np.errstate(over="ignore"):
        overflows = np.isfinite(values) & np.isinf(values.astype(np.float32))
    if overflows.any():
        _fail(name, array, overflows, row_of,
              f"value out of range for {ch} (beyond ±{_FLOAT32_MAX:.7g}: stored as infinity)")


def _check_date(name: str, array: pa.Array, ch: ChType, row_of: RowOf,
                ranges: ValueRanges) -> None:
    low, high = ranges.date_days if ch.base == "Date" else ranges.date32_days
    if not _extremes_fit(array, to_days, low, high):
        _check_range(name, to_days(array), low, high, array, row_of,
                     f"date outside the range of {ch}{_on(ranges)} "
                     f"({day_text(low)} .. {day_text(high)})")


def _check_datetime(name: str, array: pa.Array, ch: ChType, row_of: RowOf,
                    ranges: ValueRanges) -> None:
    """In this server's range of the DateTime or DateTime64 column ``ch``."""
    low, high = (ranges.datetime64_bounds(ch) if ch.base == "DateTime64"
                 else ranges.datetime_seconds(ch))
    if not _extremes_fit(array, to_seconds, low, high):
        _check_range(name, to_seconds(array), low, high, array, row_of,
                     f"timestamp outside the range of {ch}{_on(ranges)} "
                     f"({instant_text(low)} .. {instant_text(high)} UTC)")


def _check_datetime64(name: str, array: pa.Array, ch: ChType, row_of: RowOf,
                      ranges: ValueRanges) -> None:
    """In this server's range, and no digit below 10^-p: DateTime64 is never rounded."""
    _check_datetime(name, array, ch, row_of, ranges)
    if not pa.types.is_timestamp(array.type):
        return
    lost = UNIT_DIGITS[array.type.unit] - int(ch.params[0])
    if lost <= 0 or array.null_count == len(array):
        return
    inexact = to_ticks(array) % (10**lost) != 0
    if array.null_count:
        inexact &= pc.is_valid(array).to_numpy(zero_copy_only=False)
    row_of.report(name, array, inexact,
                  f"timestamp has digits below the {ch.params[0]} decimals of {ch} "
                  "(DateTime64 is never rounded: truncate it in Spark, e.g. "
                  "date_trunc('millisecond', t))")


def _check_list(name: str, array: pa.Array, ch: ChType, row_of: RowOf,
                ranges: ValueRanges) -> None:
    if ch.inner is None or len(array) == 0:
        return
    values, element_row = list_values(array, row_of)
    _check_array(name, values, ch.inner, element_row, ranges)


def _check_map(name: str, array: pa.Array, ch: ChType, row_of: RowOf,
               ranges: ValueRanges) -> None:
    if len(array) == 0:
        return
    offsets = array.offsets
    start, stop = offsets[0].as_py(), offsets[-1].as_py()
    _, element_row = list_values(array, row_of)
    key_type, value_type = ch.elements
    _check_array(f"{name} (key)", array.keys.slice(start, stop - start), key_type,
                 element_row, ranges)
    _check_array(f"{name} (value)", array.items.slice(start, stop - start), value_type,
                 element_row, ranges)


def _check_tuple(name: str, array: pa.Array, ch: ChType, row_of: RowOf,
                 ranges: ValueRanges) -> None:
    order = struct_fields_for(array.type, ch) or []
    children = array.flatten()  # sliced like the struct; a null struct row nulls them
    for position, index in enumerate(order):
        element_name = f"{name}.{ch.tuple_names[position]}"
        _check_array(element_name, children[index], ch.elements[position], row_of, ranges)


def list_values(array: pa.Array, row_of: Callable[[int], int]
                ) -> tuple[pa.Array, Callable[[int], int]]:
    """The elements of a list (or map) array's rows, and each element's row."""
    offsets = _list_offsets(array)
    base = offsets[0].as_py()
    values = array.values.slice(base, offsets[-1].as_py() - base)
    ends = pc.subtract(offsets, base).to_numpy()
    if isinstance(row_of, Rows):
        return values, row_of.elements(ends)

    def element_row(index: int) -> int:
        return row_of(int(np.searchsorted(ends, index, side="right")) - 1)

    return values, element_row


# Canonical texts the server parses (checked here so a bad one is named with its row,
# before anything is staged: the server would fail the whole INSERT without a row).
_UUID_RE = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_IPV4 = rf"{_OCTET}(\.{_OCTET}){{3}}"
_H = r"[0-9a-fA-F]{1,4}"
_IPV6 = ("(" + "|".join([
    rf"({_H}:){{7}}{_H}",
    rf"({_H}:){{1,7}}:",
    rf"({_H}:){{1,6}}:{_H}",
    rf"({_H}:){{1,5}}(:{_H}){{1,2}}",
    rf"({_H}:){{1,4}}(:{_H}){{1,3}}",
    rf"({_H}:){{1,3}}(:{_H}){{1,4}}",
    rf"({_H}:){{1,2}}(:{_H}){{1,5}}",
    rf"{_H}:(:{_H}){{1,6}}",
    rf":((:{_H}){{1,7}}|:)",
    rf"({_H}:){{6}}{_IPV4}",
    rf"({_H}:){{0,5}}:{_IPV4}",
    rf"::({_H}:){{0,5}}{_IPV4}",
    rf"{_IPV4}",  # the server reads a bare IPv4 address as ::ffff:a.b.c.d
]) + ")")
_TEXT_FORMS = {"UUID": ("a UUID", _UUID_RE), "IPv4": ("an IPv4 address", f"^{_IPV4}$"),
               "IPv6": ("an IPv6 address", f"^{_IPV6}$")}


def _check_text_form(name: str, array: pa.Array, ch: ChType, row_of: RowOf,
                     ranges: ValueRanges) -> None:
    what, pattern = _TEXT_FORMS[ch.base]
    bad = pc.invert(pc.match_substring_regex(array, pattern))
    if pc.any(bad).as_py():
        _fail(name, array, bad, row_of, f"not {what} in canonical text form for {ch}")


def _check_enum(name: str, array: pa.Array, ch: ChType, row_of: RowOf,
                ranges: ValueRanges) -> None:
    if pa.types.is_integer(array.type):
        known = pa.array([code for _, code in ch.labels], pa.int64())
        found = pc.is_in(array.cast(pa.int64(), safe=False), value_set=known)
        what = "code"
    else:
        known = pa.array([label for label, _ in ch.labels], array.type)
        found = pc.is_in(array, value_set=known)
        what = "label"
    bad = pc.and_(pc.is_valid(array), pc.invert(found))  # a null finds nothing: no fault
    if pc.any(bad).as_py():
        shown = ", ".join(label for label, _ in ch.labels)
        _fail(name, array, bad, row_of, f"{what} is not one of {ch.base}'s ({shown[:200]})")


def _check_wide_integer(name: str, array: pa.Array, ch: ChType, row_of: RowOf,
                        ranges: ValueRanges) -> None:
    """Int64 and Decimal(38, 0) fit every signed wide integer; unsigned refuse negatives."""
    if WIDE_INTEGER_TYPES[ch.base][0] < 0 or array.null_count == len(array):
        return
    if pa.types.is_unsigned_integer(array.type):
        return
    negative = pc.less(array, pa.scalar(0, pa.int64()).cast(array.type))
    if pc.any(negative).as_py():
        _fail(name, array, negative, row_of, f"negative value into {ch}")


_VALUE_CHECKS: dict[str, Callable[[str, pa.Array, ChType, RowOf, ValueRanges], None]] = {
    "Array": _check_list,
    "Map": _check_map,
    "Tuple": _check_tuple,
    "int": _check_integer,
    "wide int": _check_wide_integer,
    "float": _check_float,
    "Decimal": lambda name, array, ch, row_of, _: _check_decimal(name, array, ch, row_of),
    "FixedString": lambda name, array, ch, row_of, _: _check_fixed_string(name, array, ch,
                                                                           row_of),
    "Date": _check_date,
    "Date32": _check_date,
    "DateTime": _check_datetime,
    "DateTime64": _check_datetime64,
    "UUID": _check_text_form,
    "IPv4": _check_text_form,
    "IPv6": _check_text_form,
    "Enum": _check_enum,
    "JSON": _check_json,
}


def _on(ranges: ValueRanges) -> str:
    return f" on {ranges.server}" if ranges.server else ""


def _extremes_fit(array: pa.Array, convert: Callable[[pa.Array], np.ndarray], low: int,
                  high: int) -> bool:
    """Fast path: the converted smallest and largest values (nulls ignored) lie in low..high.

    The conversions are monotonic, so checking the two extremes checks every value.
    """
    if array.null_count == len(array):
        return True
    extremes = pc.min_max(array)
    width = np.int32 if array.type.bit_width == 32 else np.int64  # date32 / the others
    raw = np.array([extremes["min"].value, extremes["max"].value], width)
    low_high = convert(pa.Array.from_buffers(array.type, 2, [None, pa.py_buffer(raw)]))
    return bool(low_high[0] >= low and low_high[1] <= high)


def _list_offsets(array: pa.Array) -> pa.Array:
    if pa.types.is_fixed_size_list(array.type):
        size = array.type.list_size
        return pa.array(range(array.offset * size, (array.offset + len(array) + 1) * size, size),
                        pa.int64())
    return array.offsets


def _check_integer_range(name: str, array: pa.Array, ch: ChType, row_of: RowOf) -> None:
    _, low, high = INTEGER_TYPES[ch.base]
    if pa.types.is_boolean(array.type):
        return
    source_low, source_high = _INT_BOUNDS[str(array.type)]
    if source_low >= low and source_high <= high:
        return  # every value of the source type fits
    extremes = pc.min_max(array)  # nulls ignored
    if extremes["min"].as_py() is None or (
            extremes["min"].as_py() >= low and extremes["max"].as_py() <= high):
        return
    values = (pc.fill_null(array, 0) if array.null_count else array).to_numpy(
        zero_copy_only=False)
    # bounds clipped to the source type, so numpy never compares across signedness limits
    _check_range(name, values, max(low, source_low), min(high, source_high), array, row_of,
                 f"value out of range for {ch} ({low} .. {high})")


_INT_BOUNDS = {
    f"{'u' if unsigned else ''}int{bits}": (
        0 if unsigned else -(2 ** (bits - 1)),
        2**bits - 1 if unsigned else 2 ** (bits - 1) - 1,
    )
    for bits in (8, 16, 32, 64)
    for unsigned in (False, True)
}


def _check_range(name: str, values: np.ndarray, low: int, high: int, shown: pa.Array,
                 row_of: RowOf, reason: str) -> None:
    """Fail on the first of ``values`` outside ``low..high`` (nulls arrive as 0)."""
    if len(values) == 0:
        return
    outside = (values < values.dtype.type(low)) | (values > values.dtype.type(high))
    if shown.null_count:
        outside &= pc.is_valid(shown).to_numpy(zero_copy_only=False)
    row_of.report(name, shown, outside, reason)


def _check_fixed_string(name: str, array: pa.Array, ch: ChType, row_of: RowOf) -> None:
    size = int(ch.params[0])
    if pa.types.is_fixed_size_binary(array.type):
        if array.type.byte_width > size and len(array) > array.null_count:
            _fail(name, array, pc.is_valid(array), row_of,
                  f"value longer than {ch} ({array.type.byte_width} bytes)")
        return
    too_long = pc.greater(pc.binary_length(array), size)
    if pc.any(too_long).as_py():
        _fail(name, array, too_long, row_of, f"string longer than {size} bytes for {ch}")


def _check_decimal(name: str, array: pa.Array, ch: ChType, row_of: RowOf) -> None:
    target = decimal_arrow_type(ch)
    if _cast_fits(array, target):
        return
    reason = f"value does not fit {ch} without rounding or overflow"
    if isinstance(row_of.sink, Collect):
        bad = np.zeros(len(array), bool)
        bad[_failing_rows(array, lambda part: _cast_fits(part, target))] = True
    else:
        bad = np.arange(len(array)) == _first_failing_row(
            array, lambda part: _cast_fits(part, target))
    row_of.report(name, array, bad, reason)


def decimal_arrow_type(ch: ChType) -> pa.DataType:
    """The Arrow decimal type that holds exactly the values of ClickHouse ``Decimal(P, S)``."""
    if ch.precision <= 38:
        return pa.decimal128(ch.precision, ch.scale)
    return pa.decimal256(ch.precision, ch.scale)


def _cast_fits(array: pa.Array, target: pa.DataType) -> bool:
    try:
        to_decimal(array, target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False
    return True


def to_decimal(array: pa.Array, target: pa.DataType) -> pa.Array:
    """``array`` as decimal type ``target``, exactly (``ArrowInvalid`` for a value that does
    not fit). Integers go through Decimal(38, 0): Arrow casts an integer type straight to a
    decimal only if the decimal holds every value of the type, whatever the values are."""
    if pa.types.is_integer(array.type):
        array = pc.cast(array, pa.decimal128(38, 0))
    return pc.cast(array, target, safe=True)


def _first_failing_row(array: pa.Array, fits: Callable[[pa.Array], bool]) -> int:
    """Bisect to the first row for which ``fits`` fails: log2(n) vectorised calls."""
    low, high = 0, len(array)  # the failure lies in array[low:high]
    while high - low > 1:
        middle = (low + high) // 2
        if fits(array.slice(low, middle - low)):
            low = middle
        else:
            high = middle
    return low


def _failing_rows(array: pa.Array, fits: Callable[[pa.Array], bool]) -> list[int]:
    """Every row for which ``fits`` fails, by halving only the halves that fail: about
    k·log2(n/k) vectorised calls for k bad rows, never one per row."""
    found: list[int] = []
    pending = [(0, len(array))] if len(array) and not fits(array) else []
    while pending:
        low, high = pending.pop()
        if high - low == 1:
            found.append(low)
            continue
        middle = (low + high) // 2
        for start, stop in ((middle, high), (low, middle)):
            if stop > start and not fits(array.slice(start, stop - start)):
                pending.append((start, stop))
    return sorted(found)


def _fail(name: str, shown: pa.Array, mask: pa.Array, row_of: RowOf, reason: str) -> None:
    """Report the values ``mask`` marks (null: no fault) as bad."""
    row_of.report(name, shown, mask, reason)


_shown = shown_value
