"""The quarantine table: where ``bad_rows=quarantine`` keeps the rows its checks refuse.

One row per bad row of the input, with the first problem the checks found in it
(``bad_values``): which write and task kept it, the column, the reason, the offending
value and the whole row, both as JSON text so that the row can be repaired and written
again. The schema is fixed (:data:`COLUMNS`): the table is created with it when missing,
and an existing table with any other columns is refused by name before anything is
staged. Its rows are staged and published like the target's, so they are written
exactly once, under the same decision.

Pure text and Arrow, apart from :func:`ensure_quarantine_table` and
:func:`find_quarantine_table`.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from server_ext.client.client_protocol import SqlClient
from server_ext.errors import UNKNOWN_TABLE, ClickHouseError, SchemaMismatch
from server_ext.sql import (
    qualified_name,
    quote_identifier,
    shown_name,
    split_table_name,
    sql_string,
)
from server_ext.types.bad_values import BadRows, python_value
from server_ext.types.target_table import TargetTable, describe_table

#: The quarantine table's columns, in order (name, ClickHouse type, what it holds).
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("sink_id", "String", "the sink that wrote the row"),
    ("epoch", "UInt64", "the write's epoch (xid = sink id, epoch)"),
    ("task", "String", "the task attempt's branch: p<partition>-a<attempt>-s<shard>-<hex>"),
    ("row_number", "UInt64", "the row's position in its task's input, from 0"),
    ("column", "String", "the column of the first bad value (`m (value)`, `t.e` inside)"),
    ("reason", "String", "why the value does not fit its column"),
    ("value", "String", "the offending value as JSON"),
    ("row", "String", "the whole row as JSON (Spark's column names)"),
)

ARROW_SCHEMA = pa.schema([(name, pa.uint64() if kind == "UInt64" else pa.string())
                          for name, kind, _ in COLUMNS])


#: The server macros a replicated quarantine table's ZooKeeper path and replica name use.
REPLICA_MACROS = ("shard", "replica")


def table_ddl(table: str, *, replicated: bool = False) -> str:
    """``CREATE TABLE IF NOT EXISTS`` of a quarantine table ``database.table``.

    ``replicated``: for a shard of several replicas, a ``ReplicatedMergeTree`` shared by
    the shard's replicas (the server's ``{shard}`` and ``{replica}`` macros, as a
    replicated cluster's tables use), so that a bad row published on the replica its
    branch staged on is read from any of them (through a Distributed table or
    ``cluster()``, which read one replica per shard)."""
    database, name = split_table_name(table)
    columns = ", ".join(f"{quote_identifier(col)} {kind}" for col, kind, _ in COLUMNS)
    engine = "MergeTree"
    if replicated:  # the path names the table, so that two quarantine tables never share it
        path = "/clickhouse/tables/{shard}/txsink_quarantine/" + f"{database}/{name}"
        engine = f"ReplicatedMergeTree({sql_string(path)}, '{{replica}}')"
    return (f"CREATE TABLE IF NOT EXISTS {qualified_name(database, name)} "
            f"({columns}) ENGINE = {engine} ORDER BY (sink_id, epoch)")


def quarantine_schema_problem(table: TargetTable) -> str | None:
    """Why ``table`` is no quarantine table (other columns or types), or None."""
    found = [(c.name, c.type) for c in table.columns]
    wanted = [(name, kind) for name, kind, _ in COLUMNS]
    if found == wanted:
        return None
    shown = ", ".join(f"{name} {kind}" for name, kind in wanted)
    return f"a quarantine table has exactly the columns ({shown})"


def ensure_quarantine_table(client: SqlClient, table: str, *, replicated: bool = False
                            ) -> TargetTable:
    """The quarantine table ``database.table``, created when missing (``replicated``:
    as :func:`table_ddl` says); refused with ``SchemaMismatch`` naming it if it exists
    with another schema."""
    found = find_quarantine_table(client, table)
    if found is None:
        client.execute(table_ddl(table, replicated=replicated),
                       purpose=f"create quarantine table {table}")
        found = describe_table(client, table)
    check_table(found)
    return found


def find_quarantine_table(client: SqlClient, table: str) -> TargetTable | None:
    """The quarantine table as the server describes it, or None when it is missing."""
    try:
        return describe_table(client, table)
    except ClickHouseError as exc:
        if exc.code != UNKNOWN_TABLE:
            raise
        return None


def check_table(found: TargetTable) -> None:
    """Refuse (``SchemaMismatch`` naming it) a quarantine table of another schema."""
    problem = quarantine_schema_problem(found)
    if problem:
        raise SchemaMismatch(shown_name(found.database, found.name), [problem],
                             purpose="check quarantine table")


@dataclass(frozen=True)
class KeptRows:
    """The bad rows of one batch, taken out of it: ``rows`` holds them (Spark's columns),
    ``bad`` says why each is bad, ``first_row`` is the batch's first row in its task."""

    rows: pa.RecordBatch
    bad: BadRows
    first_row: int

    @classmethod
    def of(cls, bad: BadRows, original: pa.RecordBatch, first_row: int) -> KeptRows:
        return cls(original.take(pa.array(bad.rows)), bad, first_row)

    def __len__(self) -> int:
        return len(self.bad)


def quarantine_records(kept: Sequence[KeptRows], *, sink_id: str, epoch: int, task: str
            ) -> pa.RecordBatch:
    """The quarantine rows of ``kept`` (bad rows of batches of one schema), in
    :data:`ARROW_SCHEMA`. One call for many batches: the JSON of the rows is built
    column by column, so its cost is per value, not per batch."""
    count = sum(len(k) for k in kept)
    whole = (rows_json(pa.concat_batches([k.rows for k in kept])) if count
             else pa.array([], pa.string()))
    numbers = [k.bad.rows.astype(np.uint64) + np.uint64(k.first_row) for k in kept]
    return pa.RecordBatch.from_arrays([
        pa.array([sink_id] * count, pa.string()),
        pa.array(np.full(count, epoch, np.uint64)),
        pa.array([task] * count, pa.string()),
        pa.array(np.concatenate(numbers) if numbers else np.array([], np.uint64)),
        pa.array([c for k in kept for c in k.bad.columns], pa.string()),
        pa.array([r for k in kept for r in k.bad.reasons], pa.string()),
        pa.array(_values_json([k.bad for k in kept]), pa.string()),
        whole,
    ], schema=ARROW_SCHEMA)


def _values_json(bad: Sequence[BadRows]) -> list[str]:
    """The offending value of each bad row (of several batches, in order) as JSON text:
    the values of one Arrow type are converted together, a few calls for all batches."""
    texts = [""] * sum(len(b) for b in bad)
    by_type: dict[pa.DataType, list[tuple[pa.Array, np.ndarray]]] = {}
    start = 0
    for rows in bad:
        for taken, at in rows.found:
            by_type.setdefault(taken.type, []).append((taken, at + start))
        start += len(rows)
    for found in by_type.values():
        try:
            groups = [(pa.concat_arrays([taken for taken, _ in found]),
                       np.concatenate([at for _, at in found]))]
        except pa.ArrowInvalid:  # e.g. dictionaries that differ: one array at a time
            groups = found
        for taken, at in groups:
            for position, text in zip(at.tolist(), _column_json(taken).to_pylist(),
                                      strict=True):
                texts[position] = text
    return texts


def rows_json(batch: pa.RecordBatch) -> pa.Array:
    """Each row of ``batch`` as a JSON object (:func:`to_json`'s forms), built column by
    column: integers, floats, booleans and strings without a Python object per value."""
    pieces: list[pa.Array | str] = []
    for index, (name, column) in enumerate(zip(batch.schema.names, batch.columns,
                                               strict=True)):
        pieces += ["{" if index == 0 else ",", json.dumps(name, ensure_ascii=False) + ":",
                   _column_json(column)]
    if not pieces:
        return pa.array(["{}"] * batch.num_rows, pa.string())
    pieces.append("}")
    return pc.binary_join_element_wise(*pieces, "")


def _column_json(column: pa.Array) -> pa.Array:
    """The values of ``column`` as JSON texts ("null" for null)."""
    kind = column.type
    if pa.types.is_integer(kind):
        text = pc.cast(column, pa.string())
    elif pa.types.is_boolean(kind):
        text = pc.if_else(column, "true", "false")
    elif pa.types.is_floating(kind):
        text = pc.cast(pc.cast(column, pa.float64()), pa.string())
        text = pc.if_else(pc.is_nan(column), '"NaN"', text)
        text = pc.if_else(pc.equal(column, math.inf), '"Infinity"', text)
        text = pc.if_else(pc.equal(column, -math.inf), '"-Infinity"', text)
    elif pa.types.is_timestamp(kind) and kind.unit == "us":
        text = _quoted_text(_iso_instants(column))
    elif pa.types.is_date32(kind):
        text = _quoted_text(column.cast(pa.string()))
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        text = pa.array([None if v is None else _quoted(v) for v in column.to_pylist()],
                        pa.string())
    else:
        return pa.array([to_json(v) for v in column.to_pylist()], pa.string())
    return pc.fill_null(text, "null")


def _quoted_text(text: pa.Array) -> pa.Array:
    """Texts that need no escaping (dates and times) as JSON strings; null stays null."""
    return pc.binary_join_element_wise('"', text, '"', "")


def _iso_instants(column: pa.Array) -> pa.Array:
    """Spark's timestamps (microseconds) as ``datetime.isoformat`` shows the values
    ``to_pylist`` gives: wall-clock time in the column's zone, the microseconds only when
    not 0, the zone's offset when the column has a zone. Without a Python object per
    value (~13 µs each that way)."""
    local = pc.local_timestamp(column) if column.type.tz else column
    text = pc.replace_substring(local.cast(pa.string()), " ", "T", max_replacements=1)
    text = pc.if_else(pc.ends_with(text, ".000000"), pc.utf8_slice_codeunits(text, 0, -7),
                      text)
    if not column.type.tz:
        return text
    shift = np.asarray(pc.subtract(local.cast(pa.int64()), column.cast(pa.int64()))
                       .fill_null(0)) // 1_000_000
    offsets, index = np.unique(shift, return_inverse=True)
    shown = pa.array([_offset(int(seconds)) for seconds in offsets], pa.string())
    text = pc.binary_join_element_wise(text, shown.take(pa.array(index)), "")
    # Arrow's zone rules stop at the last listed transition (2037), Python's go on: there,
    # and before 1970, each value as Python shows it
    micros = np.asarray(column.cast(pa.int64()).fill_null(0))
    outside = np.flatnonzero((micros < 0) | (micros >= _ARROW_ZONES_END))
    if not outside.size:
        return text
    values = text.to_pylist()
    for row in outside.tolist():
        value = python_value(column, row)  # text where Python cannot hold the wall-clock
        values[row] = value.isoformat() if isinstance(value, dt.datetime) else value
    return pa.array(values, pa.string())


_ARROW_ZONES_END = int(dt.datetime(2037, 1, 1, tzinfo=dt.UTC).timestamp()) * 1_000_000


def _offset(seconds: int) -> str:
    """A UTC offset as ``isoformat`` writes it: ``+HH:MM``, ``:SS`` when not 0."""
    sign = "-" if seconds < 0 else "+"
    hours, rest = divmod(abs(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    return f"{sign}{hours:02d}:{minutes:02d}" + (f":{secs:02d}" if secs else "")


def to_json(value: object) -> str:
    """``value`` (as Arrow's ``to_pylist`` gives it) as JSON text: instants and dates in
    ISO form, decimals and UUIDs as text, bytes as UTF-8 (base64 if they are not), NaN
    and infinities as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``."""
    try:  # the C encoder; NaN, a key JSON lacks or bytes that are no text: the walk
        return _ENCODER.encode(value)
    except (ValueError, TypeError):
        return json.dumps(_plain(value), ensure_ascii=False, separators=(",", ":"))


def _default(value: object) -> object:
    if isinstance(value, bytes):
        return value.decode()  # UnicodeDecodeError is a ValueError: base64 by the walk
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | uuid.UUID | dt.timedelta):
        return str(value)
    raise TypeError(f"{type(value).__name__} has no JSON form")


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False,
                            default=_default)
_quoted = json.encoder.py_encode_basestring  # replaced by the C one where it exists
if json.encoder.c_encode_basestring is not None:
    _quoted = json.encoder.c_encode_basestring


def _plain(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        if all(isinstance(item, tuple) and len(item) == 2 for item in value) and value:
            return [[_plain(k), _plain(v)] for k, v in value]  # a map's (key, value) pairs
        return [_plain(item) for item in value]
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return base64.b64encode(value).decode()
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | uuid.UUID | dt.timedelta):
        return str(value)
    return value
