"""Every way of writing a DataFrame that the benchmarks compare, behind one signature.

A variant is ``write(df, sink)``: it writes all rows of ``df`` and returns when they are
where that variant puts them (for ``clickhouse_tx``: committed and visible). The names
are used in tables, JSON and plots:

- ``noop`` — Spark's ``format("noop")``: the JVM computes the rows and drops them;
- ``arrow_noop`` — the rows reach a Python Arrow writer that only counts them (the
  ceiling for any Python sink);
- ``plain`` — ``clickhouse_plain``: the same writer as ``clickhouse_tx`` inserting straight
  into the target (at-least-once; no staging, no ZooKeeper);
- ``client_driver`` / ``client_executor`` — ``foreachBatch`` + clickhouse-driver, the user
  function applied to the DataFrame (see :mod:`sinkbench.client_baseline`);
- ``connect_driver`` / ``connect_executor`` — the same with clickhouse-connect's
  ``insert_arrow`` (``toArrow()`` on the driver, or ``mapInArrow`` in the tasks); only
  against servers clickhouse-connect supports (not 18.16, see :data:`CONNECT`);
- ``tx`` — ``clickhouse_tx`` (the Python data source, PySpark 4.0 and later);
- ``write`` — ``txsink.write``: the same exactly-once write through ``mapInArrow``, on
  every PySpark from 3.5;
- ``foreach_tx`` — the body of an exactly-once ``foreachBatch`` function: ``txsink.write``
  with the micro-batch's id as ``txn_version`` (each call the next id of its sink), what
  ``txsink.foreach_batch`` does inside a stream (it refuses to run outside one);
- ``tx_carried`` / ``write_carried`` / ``foreach_tx_carried`` — the same three with
  ``carry_max_bytes`` = :data:`CARRY_MAX_BYTES`: a task whose rows take at most that many
  Arrow bytes hands them to the driver in its commit message, and the driver stages them
  (``txsink/core/carried_rows.py``). The benchmark rows take ~48 Arrow bytes each, so a
  task of up to ~350,000 rows carries; a larger one stages as without the option.

Nothing here imports ``pyspark.sql.datasource`` at import time: PySpark 3.5 has none.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from sinkbench.client_baseline import (
    NATIVE_PORT,
    ClientTarget,
    ConnectTarget,
    foreach_batch_function,
)
from sinkbench.environment import sql

#: The batch ids ``foreach_tx`` hands its sinks: each call a new micro-batch.
_batch_ids = itertools.count()

#: ``carry_max_bytes`` of the ``*_carried`` variants (16 MiB).
CARRY_MAX_BYTES = 16_777_216


@dataclass(frozen=True)
class Sink:
    """Where the ClickHouse variants write, and as which sink id."""

    url: str
    zookeeper: str
    table: str
    zk_root: str
    sink_id: str
    insert_block_rows: int = 1_048_576
    native_port: int = NATIVE_PORT

    def options(self) -> dict[str, str]:
        """Options shared by ``clickhouse_plain`` and ``clickhouse_tx``."""
        return {"url": self.url, "table": self.table,
                "insert_block_rows": str(self.insert_block_rows)}

    def tx_options(self) -> dict[str, str]:
        return {**self.options(), "zookeeper": self.zookeeper, "zk_root": self.zk_root,
                "sink_id": self.sink_id}

    def carried_options(self) -> dict[str, str]:
        """``tx_options`` with the ``*_carried`` variants' ``carry_max_bytes``."""
        return {**self.tx_options(), "carry_max_bytes": str(CARRY_MAX_BYTES)}

    def client_target(self) -> ClientTarget:
        return ClientTarget(urlsplit(self.url).hostname or "127.0.0.1", self.table,
                            self.native_port)

    def connect_target(self) -> ConnectTarget:
        return ConnectTarget.at(self.url, self.table)


def server_native_port(url: str) -> int:
    """The native (TCP) port of the server behind ``url``, for clickhouse-driver.

    Asked from the server (``getServerPort``, 21.x on); 18.16 lacks the function and
    listens on the default 9000.
    """
    try:
        return int(sql(url, "SELECT getServerPort('tcp_port')").strip())
    except (RuntimeError, ValueError):
        return NATIVE_PORT


Write = Callable[[object, Sink], None]


def write_noop(df, sink: Sink) -> None:
    df.write.format("noop").mode("overwrite").save()


def write_arrow_noop(df, sink: Sink) -> None:
    from sinkbench.noop_source import NAME

    df.write.format(NAME).mode("append").save()


def write_plain(df, sink: Sink) -> None:
    df.write.format("clickhouse_plain").options(**sink.options()).mode("append").save()


def write_tx(df, sink: Sink, carry: bool = False) -> None:
    options = sink.carried_options() if carry else sink.tx_options()
    df.write.format("clickhouse_tx").options(**options).mode("append").save()


def write_txsink(df, sink: Sink, carry: bool = False) -> None:
    import txsink

    txsink.write(df, mode="append", **(sink.carried_options() if carry else sink.tx_options()))


def write_foreach_tx(df, sink: Sink, carry: bool = False) -> None:
    import txsink

    txsink.write(df, mode="append", txn_version=str(next(_batch_ids)),
                 **(sink.carried_options() if carry else sink.tx_options()))


def write_tx_carried(df, sink: Sink) -> None:
    write_tx(df, sink, carry=True)


def write_txsink_carried(df, sink: Sink) -> None:
    write_txsink(df, sink, carry=True)


def write_foreach_tx_carried(df, sink: Sink) -> None:
    write_foreach_tx(df, sink, carry=True)


def write_client_driver(df, sink: Sink) -> None:
    foreach_batch_function("driver", sink.client_target())(df, 0)


def write_client_executor(df, sink: Sink) -> None:
    foreach_batch_function("executor", sink.client_target())(df, 0)


def write_connect_driver(df, sink: Sink) -> None:
    foreach_batch_function("connect_driver", sink.connect_target())(df, 0)


def write_connect_executor(df, sink: Sink) -> None:
    foreach_batch_function("connect_executor", sink.connect_target())(df, 0)


VARIANTS: dict[str, Write] = {
    "noop": write_noop,
    "arrow_noop": write_arrow_noop,
    "plain": write_plain,
    "client_driver": write_client_driver,
    "client_executor": write_client_executor,
    "connect_driver": write_connect_driver,
    "connect_executor": write_connect_executor,
    "tx": write_tx,
    "write": write_txsink,
    "foreach_tx": write_foreach_tx,
    "tx_carried": write_tx_carried,
    "write_carried": write_txsink_carried,
    "foreach_tx_carried": write_foreach_tx_carried,
}

#: Variants whose rows land in ClickHouse (the target is recreated and counted).
WRITES_TABLE = frozenset({"plain", "client_driver", "client_executor", "connect_driver",
                          "connect_executor", "tx", "write", "foreach_tx", "tx_carried",
                          "write_carried", "foreach_tx_carried"})

#: Variants that need clickhouse-connect, hence a server it supports (not 18.16).
CONNECT = ("connect_driver", "connect_executor")
