"""``foreachBatch`` + a Python ClickHouse client: what PySpark users do today.

Spark has no ClickHouse sink for Python, so users write each micro-batch themselves with
a client library inside ``foreachBatch``. The client here is clickhouse-driver 0.2.x
(native TCP protocol, port 9000), used the efficient way: columnar NumPy inserts
(``use_numpy``), blocks of ~1M rows like the sink's ``insert_block_rows``.
clickhouse-connect, the official HTTP client, cannot be used: it reads system-table
columns that ClickHouse 18.16 does not have.

Two shapes of the user function, both common:

- :func:`driver_insert` — ``batch_df.toPandas()`` then one insert from the driver. Simple,
  but every row passes through the driver and one connection.
- :func:`executor_insert` — ``mapInArrow`` so each Spark task inserts its own partition in
  parallel; what a user who cares about throughput writes.

Neither is exactly-once: a replayed micro-batch or a retried task inserts its rows again,
and a failed batch leaves what its finished inserts wrote.

Spark workers import this module by name (``benchmarks/`` is on their ``PYTHONPATH``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial

import pandas as pd
import pyarrow as pa

NATIVE_PORT = 9000
BLOCK_ROWS = 1_048_576

_clients: dict[tuple[str, int], object] = {}


@dataclass(frozen=True)
class ClientTarget:
    """Where the client inserts: a server's native port and a ``db.table``."""

    host: str
    table: str
    port: int = NATIVE_PORT

    @property
    def insert_sql(self) -> str:
        database, name = self.table.split(".", 1)
        return f"INSERT INTO `{database}`.`{name}` (id, name, score, ts) VALUES"


def _client(target: ClientTarget):
    """One connection per process and server, as a user would keep it."""
    from clickhouse_driver import Client

    key = (target.host, target.port)
    if key not in _clients:
        _clients[key] = Client(target.host, port=target.port, settings={"use_numpy": True})
    return _clients[key]


def _naive_utc(frame: pd.DataFrame) -> pd.DataFrame:
    """clickhouse-driver wants naive datetimes; Spark's are UTC instants."""
    ts = frame["ts"]
    if getattr(ts.dt, "tz", None) is not None:
        frame["ts"] = ts.dt.tz_convert("UTC").dt.tz_localize(None)
    return frame


def driver_insert(target: ClientTarget, batch_df, batch_id: int) -> None:
    """The ``foreachBatch`` function: collect the micro-batch, insert it from the driver."""
    frame = _naive_utc(batch_df.toPandas())
    if len(frame):
        _client(target).insert_dataframe(target.insert_sql, frame)


def executor_insert(target: ClientTarget, batch_df, batch_id: int) -> None:
    """The ``foreachBatch`` function: every task inserts its partition (``mapInArrow``)."""
    batch_df.mapInArrow(partial(insert_partition, target), "rows long").collect()


def insert_partition(target: ClientTarget, batches: Iterator[pa.RecordBatch]
                     ) -> Iterator[pa.RecordBatch]:
    """Runs in a Spark task: insert the partition in blocks of ~``BLOCK_ROWS`` rows."""
    pending: list[pa.RecordBatch] = []
    pending_rows = sent = 0
    for batch in batches:
        pending.append(batch)
        pending_rows += batch.num_rows
        if pending_rows >= BLOCK_ROWS:
            sent += _insert(target, pending)
            pending, pending_rows = [], 0
    if pending_rows:
        sent += _insert(target, pending)
    yield pa.RecordBatch.from_pydict({"rows": [sent]})


def _insert(target: ClientTarget, batches: list[pa.RecordBatch]) -> int:
    frame = _naive_utc(pa.Table.from_batches(batches).to_pandas())
    _client(target).insert_dataframe(target.insert_sql, frame)
    return len(frame)


def foreach_batch_function(shape: str, target: ClientTarget):
    """The function to hand ``writeStream.foreachBatch`` (``shape``: driver or executor)."""
    insert = {"driver": driver_insert, "executor": executor_insert}[shape]
    return partial(insert, target)
