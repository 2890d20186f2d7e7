"""``foreachBatch`` + a Python ClickHouse client: what PySpark users do today.

Spark has no ClickHouse sink for Python, so users write each micro-batch themselves with
a client library inside ``foreachBatch``. Two clients, each used the efficient way, in
blocks of ~1M rows like the sink's ``insert_block_rows``:

- clickhouse-driver 0.2.x (native TCP protocol, port 9000): columnar NumPy inserts
  (``use_numpy``). Works against every server here, 18.16 included.
- clickhouse-connect, the official HTTP client: ``insert_arrow`` (the Arrow table sent
  as is, in ``FORMAT Arrow``, lz4-compressed by the client's default). It cannot be used
  against ClickHouse 18.16: every new client runs, right after
  ``SELECT version(), timezone()``, ``SELECT name, value, readonly FROM system.settings``,
  which fails there (18.16's ``system.settings`` has no ``readonly`` column:
  ``Code: 47 Unknown identifier: readonly``); :func:`connect_unsupported` says so for a
  given server.

Two shapes of the user function for each client, both common:

- driver — ``batch_df.toPandas()`` (clickhouse-driver) or ``batch_df.toArrow()``
  (clickhouse-connect), then one insert from the driver. Simple, but every row passes
  through the driver and one connection.
- executor — ``mapInArrow`` so each Spark task inserts its own partition in parallel;
  what a user who cares about throughput writes.

Neither is exactly-once: a replayed micro-batch or a retried task inserts its rows again,
and a failed batch leaves what its finished inserts wrote.

Spark workers import this module by name (``benchmarks/`` is on their ``PYTHONPATH``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from urllib.parse import urlsplit

import pandas as pd
import pyarrow as pa

NATIVE_PORT = 9000
BLOCK_ROWS = 1_048_576

_clients: dict[tuple[str, int], object] = {}
_connect_clients: dict[tuple[str, int], object] = {}


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
    sent = sum(_insert(target, block) for block in _blocks(batches))
    yield pa.RecordBatch.from_pydict({"rows": [sent]})


def _blocks(batches: Iterator[pa.RecordBatch]) -> Iterator[list[pa.RecordBatch]]:
    """The record batches of a task, grouped into blocks of ~``BLOCK_ROWS`` rows."""
    pending: list[pa.RecordBatch] = []
    pending_rows = 0
    for batch in batches:
        pending.append(batch)
        pending_rows += batch.num_rows
        if pending_rows >= BLOCK_ROWS:
            yield pending
            pending, pending_rows = [], 0
    if pending_rows:
        yield pending


def _insert(target: ClientTarget, batches: list[pa.RecordBatch]) -> int:
    frame = _naive_utc(pa.Table.from_batches(batches).to_pandas())
    _client(target).insert_dataframe(target.insert_sql, frame)
    return len(frame)


# clickhouse-connect ------------------------------------------------------------------


@dataclass(frozen=True)
class ConnectTarget:
    """Where clickhouse-connect inserts: a server's HTTP port and a ``db.table``."""

    host: str
    port: int
    table: str

    @classmethod
    def at(cls, url: str, table: str) -> ConnectTarget:
        """``table`` on the server of an HTTP ``url``."""
        parts = urlsplit(url)
        return cls(parts.hostname or "127.0.0.1", parts.port or 8123, table)

    @property
    def database(self) -> str:
        return self.table.split(".", 1)[0]

    @property
    def name(self) -> str:
        return self.table.split(".", 1)[1]


def _connect_client(target: ConnectTarget):
    """One clickhouse-connect client per process and server (default settings)."""
    import clickhouse_connect

    key = (target.host, target.port)
    if key not in _connect_clients:
        _connect_clients[key] = clickhouse_connect.get_client(host=target.host,
                                                              port=target.port)
    return _connect_clients[key]


def connect_driver_insert(target: ConnectTarget, batch_df, batch_id: int) -> None:
    """The ``foreachBatch`` function: ``toArrow()`` on the driver, one ``insert_arrow``."""
    table = batch_df.toArrow()
    if table.num_rows:
        _connect_client(target).insert_arrow(target.name, table, database=target.database)


def connect_executor_insert(target: ConnectTarget, batch_df, batch_id: int) -> None:
    """The ``foreachBatch`` function: every task inserts its partition (``mapInArrow``)."""
    batch_df.mapInArrow(partial(connect_insert_partition, target), "rows long").collect()


def connect_insert_partition(target: ConnectTarget, batches: Iterator[pa.RecordBatch]
                             ) -> Iterator[pa.RecordBatch]:
    """Runs in a Spark task: ``insert_arrow`` the partition in blocks of ~1M rows."""
    client = _connect_client(target)
    sent = 0
    for block in _blocks(batches):
        table = pa.Table.from_batches(block)
        client.insert_arrow(target.name, table, database=target.database)
        sent += table.num_rows
    yield pa.RecordBatch.from_pydict({"rows": [sent]})


def connect_unsupported(host: str, port: int) -> str | None:
    """Why clickhouse-connect cannot be used against this server, or None if it can.

    Opens a client exactly as the baselines do, so the reason is the real failure (on
    18.16: ``SELECT name, value, readonly FROM system.settings`` answered with
    ``Unknown identifier: readonly``).
    """
    try:
        import clickhouse_connect
    except ImportError as exc:
        return f"clickhouse-connect is not installed ({exc}); pip install clickhouse-connect"
    version = getattr(clickhouse_connect, "__version__", "?")
    try:
        client = clickhouse_connect.get_client(host=host, port=port)
    except Exception as exc:  # noqa: BLE001 - the reason is the point
        first = " ".join(str(exc).split())[:300]
        query = (" (its set-up query SELECT name, value, readonly FROM system.settings: "
                 "this server's system.settings has no readonly column)"
                 if "identifier: readonly" in first else "")
        return (f"clickhouse-connect {version} cannot open a client on {host}:{port}"
                f"{query}: {type(exc).__name__}: {first}")
    client.close()
    return None


def foreach_batch_function(shape: str, target):
    """The function to hand ``writeStream.foreachBatch``.

    ``shape``: ``driver`` or ``executor`` (clickhouse-driver, a :class:`ClientTarget`),
    ``connect_driver`` or ``connect_executor`` (clickhouse-connect, a
    :class:`ConnectTarget`).
    """
    insert = {"driver": driver_insert, "executor": executor_insert,
              "connect_driver": connect_driver_insert,
              "connect_executor": connect_executor_insert}[shape]
    return partial(insert, target)
