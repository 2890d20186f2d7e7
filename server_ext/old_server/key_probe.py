"""Does chdb put rows on the shards the target server would? A probe, before any row.

An expression key is evaluated by chdb (``chdb_key``), a newer engine than some servers.
Most functions agree across versions, but not all: 18.16 computes ``toInt32(-8) % 70001``
as 55933 (the modulo of the unsigned value), chdb (26.x) as -8, so negative keys would land
on another shard than an INSERT through the ``Distributed`` table puts them. Each row would
still be written exactly once, only on the wrong shard, silently. So before routing, the
key is evaluated on both over a few probe rows of its columns' types (boundaries, signs,
empty and non-ASCII strings, far dates) and the shard each row gets is compared; any
difference refuses the key by name. Columns of other types take no part (the probe then
covers the others); a key on such columns alone is not probed.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from server_ext.client.client_protocol import SqlClient
from server_ext.errors import ClickHouseError, ShardingError
from server_ext.sharding.key_values import unsigned_key_values
from server_ext.sql import quote_identifier, sql_string
from server_ext.types.chtypes import INTEGER_TYPES, parse_type

_ROW = "__txsink_probe_row"

_STRINGS = ("", "a", "user-42", "ключ", "0123456789abcdef0123456789abcdef")
_FLOATS = ("-1.5", "0", "1", "3.75", "-1e10", "1e10")
_DATES = ("1970-01-01", "2000-02-29", "2026-01-15", "2100-12-31")
_UNIX_TIMES = ("0", "86399", "951782400", "1768480496", "4102444799")
_UUIDS = ("00000000-0000-0000-0000-000000000000", "61f0c404-5cb3-11e7-907b-a6006ad3dba0",
          "ffffffff-ffff-ffff-ffff-ffffffffffff")


def probe_values(ch_type: str) -> list[str] | None:
    """SQL expressions of ``ch_type`` worth probing a key with; None for a type not probed."""
    t = parse_type(ch_type).value_type()
    target = sql_string(str(t))
    if t.base in INTEGER_TYPES:
        bits = int(np.dtype(INTEGER_TYPES[t.base][0]).itemsize) * 8
        if t.base.startswith("U"):
            texts = {0, 1, 7, 255, 2 ** (bits - 1) - 1, 2 ** bits - 1}
        else:
            low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
            texts = {low, low + 1, -129, -8, -1, 0, 1, 7, 1000, high}
            texts = {v for v in texts if low <= v <= high}
        return [f"CAST({sql_string(str(v))}, {target})" for v in sorted(texts)]
    if t.base in ("Float32", "Float64"):
        return [f"CAST({sql_string(v)}, {target})" for v in _FLOATS]
    if t.base == "String":
        return [f"CAST({sql_string(v)}, {target})" for v in _STRINGS]
    if t.base == "FixedString":
        size = int(t.params[0])
        return [f"CAST({sql_string(v)}, {target})" for v in _STRINGS
                if len(v.encode()) <= size]
    if t.base == "Date":
        return [f"CAST({sql_string(v)}, {target})" for v in _DATES]
    if t.base == "DateTime":  # instants, as the data holds them: no time zone parsing
        return [f"CAST(toUInt32({v}), {target})" for v in _UNIX_TIMES]
    if t.base == "UUID":
        return [f"CAST({sql_string(v)}, {target})" for v in _UUIDS]
    return None


def probe_sql(key: str, types: Mapping[str, str]) -> str | None:
    """A query giving ``key``'s type and value over probe rows of ``types`` (column ->
    ClickHouse type), one row per line in probe order; None if no column can be probed.
    The same text runs on both engines."""
    if not types:  # a constant
        return f"SELECT toTypeName({key}) AS type, toString({key}) AS value"
    columns = {name: values for name, ch_type in types.items()
               if (values := probe_values(ch_type)) is not None}
    if len(columns) < len(types):
        return None
    rows = max(len(values) for values in columns.values())
    selects = []
    for row in range(rows):
        cells = ", ".join(f"{values[row % len(values)]} AS {quote_identifier(name)}"
                          for name, values in columns.items())
        selects.append(f"SELECT {row} AS {_ROW}, {cells}")
    return (f"SELECT toTypeName({key}) AS type, toString({key}) AS value "
            f"FROM ({' UNION ALL '.join(selects)}) ORDER BY {_ROW}")


def slots(rows: list[dict], total_weight: int, constant: bool = False) -> list[int]:
    """The slot (unsigned key value modulo the total weight) of each probe row."""
    found = []
    for row in rows:
        type_name = row["type"]
        if type_name not in INTEGER_TYPES:
            raise ShardingError(f"evaluates to {type_name}")
        dtype = np.dtype(INTEGER_TYPES[type_name][0])
        value = np.array([int(row["value"])], dtype=dtype)
        unsigned = unsigned_key_values(value, type_name, constant)[0]
        found.append(int(unsigned % np.uint64(total_weight)))
    return found


def check_agreement(key: str, types: Mapping[str, str], chdb: SqlClient, server: SqlClient,
                    total_weight: int) -> None:
    """Refuse ``key`` if, for some probe row, the server would choose another shard than
    chdb computes (``ShardingError`` naming the key, the values and both results)."""
    sql = probe_sql(key, types)
    if sql is None:
        return
    purpose = "probe sharding key"
    ours = chdb.query_rows(sql, purpose=purpose)
    try:
        theirs = server.query_rows(sql, purpose=purpose)
    except ClickHouseError as exc:
        raise ShardingError(f"the server cannot evaluate sharding key {key}, so it would "
                            f"refuse an INSERT through the Distributed table: {exc}") from None
    constant = not types
    try:
        server_slots = slots(theirs, total_weight, constant)
    except ShardingError as exc:
        raise ShardingError(f"sharding key {key} {exc} on the server, not an integer type: "
                            "the server refuses such a key") from None
    for index, (mine, its) in enumerate(zip(slots(ours, total_weight, constant),
                                            server_slots, strict=True)):
        if mine != its:
            raise ShardingError(
                f"sharding key {key} is computed differently by the server than by chdb, "
                f"which routes the rows: probe row {index} gives {theirs[index]['value']} "
                f"({theirs[index]['type']}) on the server and {ours[index]['value']} "
                f"({ours[index]['type']}) in chdb, another shard. Rows would land on other "
                "shards than an INSERT through the Distributed table puts them; route by a "
                "bare integer column, or by an expression both compute alike (e.g. a hash "
                "function)")
