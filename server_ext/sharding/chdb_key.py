"""Expression sharding keys, evaluated by the ClickHouse engine embedded in chdb.

``cityHash64(user_id)``, ``intHash64(id)``, ``id % 3``: any key that is not one bare
integer column is computed by chdb over the batch's key columns, cast to the target's
column types. chdb is imported lazily (a process that forks after importing it hangs).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pyarrow as pa

from server_ext.client.client_protocol import SqlClient
from server_ext.errors import ShardingError
from server_ext.old_server.key_probe import check_agreement
from server_ext.sharding.engine_args import tokens, unquote
from server_ext.sharding.key_values import KeyValues, reject_nulls, unsigned_key_values
from server_ext.sql import quote_identifier, sql_string
from server_ext.types.chtypes import INTEGER_TYPES, parse_type

# "Unknown identifier: x" (18.x), "Unknown expression or function identifier `x`" (26.x)
_UNKNOWN_IDENTIFIER_RE = re.compile(
    r"Unknown (?:expression (?:or function )?)?identifier:? `?([^`\s,.]+)")
_CHDB_MISSING = ("install the chdb package (pip install chdb) to route rows by it, or make "
                 "the sharding key a bare integer column")


def expression_key(key: str, schema: pa.Schema, types: dict[str, str],
                   server: SqlClient | None = None, total_weight: int = 1) -> KeyValues:
    """Any other expression: evaluated by chdb over the batch's key columns. With
    ``server`` (the one an INSERT through the Distributed table would route on), the key is
    first checked to route probe rows as that server does (``old_server.key_probe``), once per
    process, server and key."""
    session = _chdb_session(key)
    used = _referenced_columns(key, schema)
    plan = _ChdbKey(key, used, schema, types, session)
    if server is not None and all(name in types for name in used):
        used_types = {name: types[name] for name in used}
        agreed = (server.url, key, tuple(sorted(used_types.items())), total_weight)
        if agreed not in _AGREED:
            check_agreement(key, used_types, session, server, total_weight)
            _AGREED.add(agreed)
    return plan.values


_AGREED: set[tuple[object, ...]] = set()  # keys that passed the probe in this process


def _chdb_session(key: str) -> Any:
    try:
        import chdb  # noqa: F401 - lazy: a process that forks after importing chdb hangs
    except ImportError:
        raise ShardingError(f"sharding key {key} is an expression; {_CHDB_MISSING}") from None
    from server_ext.client.chdb_client import ChdbClient

    return ChdbClient.for_process()


def null_refusing_columns(key: str, schema: pa.Schema, types: dict[str, str]) -> list[str]:
    """The columns of expression ``key`` in which a null gives a row no shard: those the
    key reads that are not Nullable in the table (a Nullable one reaches the key)."""
    return [name for name in _referenced_columns(key, schema)
            if not _is_nullable(types.get(name))]


def _referenced_columns(key: str, schema: pa.Schema) -> list[str]:
    """Columns of ``schema`` that ``key`` names (names not followed by '(')."""
    names: set[str] = set()
    found = list(tokens(key))
    for position, (token, _) in enumerate(found):
        follower = found[position + 1][0] if position + 1 < len(found) else ""
        if token[0] in "`\"":
            names.add(unquote(token))
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
                reject_nulls(array, name, self.key)
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
        from server_ext.client import chdb_client

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
    value = f"CAST({source}, {sql_string(ch_type)})" if ch_type else source
    return f"{value} AS {quote_identifier(name)}"
