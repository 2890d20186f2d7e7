"""Writes through a Spark Connect client: ``df.write``, ``writeStream`` and a transaction.

``python -m tests.jobs.connect_writes ARGS_JSON`` starts a Spark Connect server in this
process (a local Spark with the Connect plugin, on a free port), connects to it as a
Connect client (``SparkSession.builder.remote("sc://…")``) and runs each write of
``ARGS_JSON`` through that client. It prints one JSON line: ``"ok"`` or the error of each
write, and the class of the session the writes used.

A Connect session cannot share a process with a classic one (PySpark 4.3 refuses
``remote()`` while a SparkContext runs: ``SESSION_ALREADY_EXIST``), hence a process of
its own. PySpark's ``remote("local[2]")`` starts the same in-process server but always on
port 15002, which another run on the machine may hold.
"""

from __future__ import annotations

import json
import socket
import sys
import time

from pyspark import SparkConf, SparkContext
from pyspark.sql import SparkSession
from pyspark.sql.connect.session import SparkSession as ConnectSession

import txsink

CONNECT_PLUGIN = "org.apache.spark.sql.connect.SparkConnectPlugin"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def connect_server(port: int) -> SparkSession:
    """The server side: a local Spark whose Connect plugin listens on ``port``."""
    conf = (SparkConf().setMaster("local[2]").setAppName("txsink-connect")
            .set("spark.ui.enabled", "false").set("spark.driver.memory", "1g")
            .set("spark.sql.shuffle.partitions", "2")
            .set("spark.plugins", CONNECT_PLUGIN)
            .set("spark.connect.grpc.binding.address", "127.0.0.1")
            .set("spark.connect.grpc.binding.port", str(port)))
    server = SparkSession(SparkContext.getOrCreate(conf))
    server.sparkContext.setLogLevel("ERROR")
    return server


def main(args: dict) -> dict[str, str]:
    started = time.monotonic()
    port = free_port()
    server = connect_server(port)
    spark = ConnectSession.builder.remote(f"sc://127.0.0.1:{port}").getOrCreate()
    result = {"session": f"{type(spark).__module__}.{type(spark).__name__}",
              "start_seconds": f"{time.monotonic() - started:.1f}"}
    options, tables = args["options"], args["tables"]

    def attempt(key: str, write) -> None:
        started = time.monotonic()
        try:
            write()
            result[key] = "ok"
        except Exception as exc:  # noqa: BLE001 - reported to the test
            result[key] = f"{type(exc).__name__}: {exc}"[:2000]
        result[f"{key}_seconds"] = f"{time.monotonic() - started:.1f}"

    attempt("register", lambda: txsink.register(spark))
    attempt("batch", lambda: (
        spark.range(args["rows"], numPartitions=2).write.format("clickhouse_tx")
        .options(**options).option("table", tables["batch"]).mode("append").save()))
    attempt("batch_modern", lambda: (
        spark.range(args["rows"], numPartitions=2).write.format("clickhouse_tx")
        .options(**{**options, "url": args["modern_url"]})
        .option("table", tables["batch_modern"]).mode("append").save()))

    def stream() -> None:
        query = (spark.readStream.schema("id LONG").option("maxFilesPerTrigger", 1)
                 .json(args["stream_source"])
                 .writeStream.format("clickhouse_tx").options(**options)
                 .option("table", tables["stream"])
                 .option("checkpointLocation", args["checkpoint"])
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)
        if query.exception() is not None:
            raise query.exception()
        result["stream_batches"] = json.dumps(sorted(p["batchId"]
                                                     for p in query.recentProgress))
    attempt("stream", stream)

    def transaction() -> None:
        with txsink.transaction(spark, sink_id="connect-tx", **options) as tx:
            tx.write(spark.range(args["rows"]), tables["tx_first"])
            tx.write(spark.range(args["rows"], 2 * args["rows"]), tables["tx_second"])
    attempt("transaction", transaction)

    spark.stop()
    server.stop()
    return result


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
