"""Row routing: which shard the server would put each row of an Arrow batch on.

``ShardRouter.split`` cuts a batch per shard. The key's unsigned value per row comes from
a bare integer column (``key_values``) or from chdb (``chdb_key``); ``rand()`` or no key
lets rows go anywhere, so they are dealt to the shards in contiguous weighted slices.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from server_ext.client.client_protocol import SqlClient
from server_ext.sharding.chdb_key import expression_key, null_refusing_columns
from server_ext.sharding.engine_args import name_value
from server_ext.sharding.key_values import KeyValues, column_key
from server_ext.sharding.shard_layout import ShardLayout
from server_ext.types.bad_values import BadRows, Collect, Rows

# Keys whose value is random: the server may put any row on any shard.
_RANDOM_KEY_RE = re.compile(r"^\s*(rand|rand32|rand64|randConstant)\s*\([^()]*\)\s*$", re.I)


class ShardRouter:
    """Splits Arrow batches by the shard the server would put each row on.

    ``column_types`` (column name -> ClickHouse type of the *local* table, e.g. from
    ``describe_table``) makes the key see the server's types; without it the Arrow types
    stand in (int64 for Int64, string for String, ...). The key is checked here, before
    any batch: missing columns and non-integer results are errors (with one shard the key
    decides nothing and is not checked). ``server``: the server whose routing an
    expression key must match (``old_server.key_probe``).
    """

    def __init__(self, layout: ShardLayout, schema: pa.Schema,
                 column_types: Mapping[str, str] | None = None,
                 server: SqlClient | None = None) -> None:
        self.layout = layout
        # uint16 shard numbers: numpy sorts them by radix (linear) in _gather
        self._slots = np.array(layout.slots, dtype=np.uint16)
        self._weights = np.array([shard.weight for shard in layout.shards], dtype=np.int64)
        self._position = random.randrange(layout.total_weight)  # see _any_shard_counts
        types = dict(column_types or {})
        self._key_values = _key_evaluator(layout, schema, types, server)
        # columns in which a null gives a row no shard (split raises at the first)
        self._null_columns = (_null_refusing(layout.sharding_key or "", schema, types)
                              if self._key_values is not None else [])

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

    def keyless(self, batch: pa.RecordBatch) -> BadRows | None:
        """The rows of ``batch`` that no shard can take, a null in a column of the key
        (``bad_values.BadRows``, for ``bad_rows=quarantine``), None if every row has one.
        :meth:`split` raises for such a row."""
        if not any(batch.column(name).null_count for name in self._null_columns):
            return None
        collected = Collect(batch.num_rows)
        rows = Rows(collected)
        for name in self._null_columns:
            array = batch.column(name)
            if array.null_count:
                rows.report(name, array, pc.is_null(array),
                            f"null in sharding key {self.layout.sharding_key}: a null key has "
                            "no shard")
        return collected.result()

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


def _key_evaluator(layout: ShardLayout, schema: pa.Schema, types: dict[str, str],
                   server: SqlClient | None) -> KeyValues | None:
    """The function giving each row's unsigned key value, or None when any shard will do."""
    key = layout.sharding_key
    if key is None or _RANDOM_KEY_RE.match(key) or len(layout.shards) == 1:
        return None
    column = _column_name(key)
    if column is not None:
        return column_key(key, column, schema, types)
    return expression_key(key, schema, types, server, layout.total_weight)


def _null_refusing(key: str, schema: pa.Schema, types: dict[str, str]) -> list[str]:
    """The columns in which a null gives a row no shard (``ShardRouter.keyless``)."""
    column = _column_name(key)
    return [column] if column is not None else null_refusing_columns(key, schema, types)


def _column_name(key: str) -> str | None:
    """The column a key consists of (bare, `backquoted` or "double-quoted"), else None."""
    if key.startswith("'"):
        return None  # a string literal
    return name_value(key)
