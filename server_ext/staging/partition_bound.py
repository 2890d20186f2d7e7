"""A bound on the partitions one write's rows may spread over, counted as they are staged.

Why: every partition a write touches becomes parts of the target and commands of its
publish. 100,000 distinct values of a ``PARTITION BY id`` key, measured on the test
servers: 18.16 takes more than 30 s for one INSERT of 50,000 rows (one part per row)
and more again to drop the staging table; 26.x refuses any INSERT block of more than
``max_partitions_per_insert_block`` (100) partitions. That server setting counts per
INSERT block, while a job is many blocks and tasks; the bound here counts the whole
write, and is refused as early as the rows show it, before anything is visible.

How each part is counted (``PartitionCounter``, one per task attempt, every shard):
- a key of bare columns whose values are the partition values exactly (integers,
  strings, dates, enums: ``PARTITION BY id``, ``(region, day)``): the distinct key values
  of each batch, before it is sent. The batch that crosses the bound never leaves the task.
- any other key (``toYYYYMM(day)``): only the server evaluates it. Where the server knows
  ``max_partitions_per_insert_block`` (26.x) the staging INSERTs carry the bound there, so
  no INSERT block writes more partitions than the bound, and the server's refusal is
  reported as the bound's; everywhere, the partitions of the sealed staging tables are
  counted before the branch is prepared.
The driver counts the union of the task branches' partitions before the decision: the
bound is per write (a batch job, a micro-batch, one write of a transaction), each task's
count being only the earliest sign of a crossing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from server_ext.capabilities import known_settings
from server_ext.client.client_protocol import SqlClient
from server_ext.errors import ClickHouseError, PartitionLimitExceeded, partitions_per_block_refused
from server_ext.sharding.engine_args import engine_arguments, name_value
from server_ext.sql import qualified_name
from server_ext.types.chtypes import INTEGER_TYPES
from server_ext.types.target_table import Column, TargetTable

#: The server's own per-INSERT-block bound (26.x; 18.16 has no such setting).
SERVER_SETTING = "max_partitions_per_insert_block"
DEFAULT_LIMIT = 100  # the server's default for SERVER_SETTING; 0: no bound
EXAMPLES = 3  # partition values an error names

# Column types whose values are their partition values one to one (a Float32 or a
# DateTime would merge values that differ in Spark: counted by the server instead).
_EXACT_TYPES = frozenset({*INTEGER_TYPES, "String", "Date", "Enum8", "Enum16", "Bool"})


def partition_key_columns(target: TargetTable, columns: list[Column]) -> tuple[str, ...] | None:
    """The columns the partition key consists of, when it is bare columns of exact types
    that every batch carries; None when only the server can count its partitions (and
    ``()`` for an unpartitioned table: one partition)."""
    key = target.partition_key.strip()
    if key in ("", "tuple()"):
        return ()
    if key.startswith("(") and key.endswith(")"):
        key = f"tuple{key}"
    parts = engine_arguments(key) if key.startswith("tuple(") else [key]
    names = [name_value(part) for part in parts]
    sent = {c.name: c for c in columns}
    if any(n is None or n not in sent or sent[n].chtype.value_type().base not in _EXACT_TYPES
           for n in names):
        return None
    return tuple(n for n in names if n is not None)


def partition_bound_settings(client: SqlClient, limit: int, given: Mapping[str, str]
                             ) -> dict[str, int]:
    """The bound as the server's per-INSERT-block setting, where the server knows it and
    the user did not set it (``settings.max_partitions_per_insert_block`` wins): without
    it 26.x would refuse a block of more than 100 partitions whatever the bound."""
    if SERVER_SETTING in given or SERVER_SETTING not in known_settings(client, (SERVER_SETTING,)):
        return {}
    return {SERVER_SETTING: limit}


class PartitionCounter:
    """The distinct partitions of one task attempt's rows, against the write's bound.

    ``limit`` 0 counts nothing. ``admit`` sees every batch before it is sent (exact keys);
    ``sealed`` sees the partition ids of the attempt's sealed staging tables (any key);
    ``refused`` turns the server's per-block refusal into the bound's error.
    """

    def __init__(self, target: TargetTable, columns: list[Column], limit: int,
                 option: str) -> None:
        self.table = qualified_name(target.database, target.name)
        self.limit = limit
        self.option = option
        self.columns = partition_key_columns(target, columns) if limit else None
        self._seen: set[tuple[object, ...]] = set()

    def admit(self, batch: pa.RecordBatch) -> None:
        """Count the batch's key values; raise ``PartitionLimitExceeded`` before it is sent
        if the attempt's rows now span more partitions than the bound."""
        if not self.columns or not batch.num_rows:
            return
        keys = batch.select(list(self.columns))
        distinct = (pa.Table.from_batches([keys]).group_by(list(self.columns)).aggregate([])
                    if len(self.columns) > 1 else pa.table([pc.unique(keys.column(0))],
                                                           names=list(self.columns)))
        self._seen.update(zip(*(distinct.column(i).to_pylist()
                                for i in range(distinct.num_columns)), strict=True))
        self._check(len(self._seen), (repr(k[0] if len(k) == 1 else k) for k in self._seen),
                    scope="the rows of one task (so far)")

    def sealed(self, partitions: Iterable[tuple[str, str]]) -> None:
        """Check the attempt's staged partitions ((id, value) of every sealed table of the
        target), whatever the key."""
        found = dict(partitions)
        self._check(len(found), iter(found.values()), scope="the rows of one task")

    def refused(self, exc: ClickHouseError, view_tables: tuple[str, ...] = ()
                ) -> PartitionLimitExceeded | None:
        """The bound's error for the server's refusal of a block that crossed it (the
        staging INSERTs carry the bound as ``SERVER_SETTING``), else None.

        ``view_tables``: the tables the target's views write into (the staging views
        insert under the same setting). Where the target's own partitions stayed within
        the bound, it was one of them that crossed it."""
        cause = exc.__cause__  # a writer that failed earlier chains the server's error
        if not self.limit or not any(isinstance(e, ClickHouseError) and
                                     partitions_per_block_refused(e) for e in (exc, cause)):
            return None
        table = self.table
        if view_tables and self.columns is not None and len(self._seen) <= self.limit:
            table = f"a table the views of {self.table} write into ({', '.join(view_tables)})"
        return PartitionLimitExceeded(table, self.limit, None, [], self.option,
                                      scope="the rows of one INSERT block")

    def _check(self, count: int, values: Iterable[str], scope: str) -> None:
        if self.limit and count > self.limit:
            examples = [v for _, v in zip(range(EXAMPLES), values, strict=False)]
            raise PartitionLimitExceeded(self.table, self.limit, count, examples, self.option,
                                         scope=scope)


def check_partition_bound(table: str, limit: int, partitions: Iterable[tuple[str, str]],
                option: str) -> None:
    """The driver's check: the union of the write's (partition id, value) over every task
    branch of the target, before the decision."""
    found = dict(partitions)
    if limit and len(found) > limit:
        examples = [v for _, v in zip(range(EXAMPLES), found.values(), strict=False)]
        raise PartitionLimitExceeded(table, limit, len(found), examples, option,
                                     scope="the rows of the write")
