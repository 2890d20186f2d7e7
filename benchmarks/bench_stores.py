"""One batch job through ``clickhouse_tx`` with each coordinator store, in one run.

What it measures: the wall time of a batch job of ``--rows`` rows (default 1M) into a
plain MergeTree of the modern server (strategy ``move``), with the coordinator's records
in ZooKeeper (``coordinator=zookeeper``) and in a KeeperMap table of that server
(``coordinator=keepermap``), rounds interleaved so that the load of a shared machine hits
both alike; medians, and the ratio ``tx(keepermap) ÷ tx(zookeeper)`` as a throughput
ratio (≥ 0.9 is the goal). The server needs a ``<zookeeper>`` section (``./run services
up --modern`` writes one).

    python benchmarks/bench_stores.py [--url http://127.0.0.1:8124] [--rows 1000000]
        [--rounds 3] [--zookeeper 127.0.0.1:2181]

Prints one table; writes ``benchmarks/results/stores.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import uuid
from pathlib import Path

import requests

RESULTS = Path(__file__).parent / "results" / "stores.json"
RECORDS = "txsink_bench.records"


def sql(url: str, statement: str) -> str:
    answer = requests.post(url, data=statement.encode(), timeout=120)
    if answer.status_code != 200:
        raise RuntimeError(f"{statement[:60]}: {answer.text.strip()}")
    return answer.text


def run(url: str, zookeeper: str, rows: int, rounds: int) -> dict:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import txsink
    from server_ext.client import ClickHouseClient
    from server_ext.ddl import KeeperMapTable

    database, table = RECORDS.split(".")
    KeeperMapTable(ClickHouseClient(url), database, table).create(f"/{database}/{table}")
    spark = (SparkSession.builder.master("local[2]").appName("bench-stores")
             .config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    txsink.register(spark)
    db = f"bench_{uuid.uuid4().hex[:8]}"
    sql(url, f"CREATE DATABASE `{db}`")
    df = (spark.range(rows, numPartitions=4)
          .select(F.col("id"), F.expr("date_add(date'2026-01-01', cast(id % 90 as int))")
                  .alias("day"), F.concat(F.lit("e"), F.col("id").cast("string")).alias("name"),
                  (F.col("id") / 2).alias("value"))).cache()
    df.count()
    root = f"/bench-stores-{uuid.uuid4().hex[:8]}"
    stores = {"zookeeper": {"zookeeper": zookeeper, "zk_root": root},
              "keepermap": {"coordinator": "keepermap", "records_table": RECORDS,
                            "zk_root": root}}
    times: dict[str, list[float]] = {s: [] for s in stores}
    try:
        for i in range(rounds + 1):  # the first round warms up
            for store, options in stores.items():
                target = f"{db}.t_{store}_{i}"
                sql(url, f"CREATE TABLE {target} (id UInt64, day Date, name String, "
                         "value Float64) ENGINE = MergeTree PARTITION BY toYYYYMM(day) "
                         "ORDER BY id")
                started = time.perf_counter()
                (df.write.format("clickhouse_tx").option("url", url).options(**options)
                   .option("table", target).mode("append").save())
                elapsed = time.perf_counter() - started
                assert int(sql(url, f"SELECT count() FROM {target}")) == rows
                if i:
                    times[store].append(elapsed)
    finally:
        sql(url, f"DROP DATABASE IF EXISTS `{db}`")
        spark.stop()
    medians = {s: round(statistics.median(t), 3) for s, t in times.items()}
    ratio = round(medians["zookeeper"] / medians["keepermap"], 3)
    for store, seconds in medians.items():
        print(f"tx({store}): {rows:,} rows in {seconds:.2f} s (median of {rounds}) = "
              f"{rows / seconds / 1e6:.2f} M rows/s")
    print(f"tx(keepermap) / tx(zookeeper) throughput = {ratio} (goal >= 0.9)")
    return {"benchmark": "one batch job per coordinator store", "rows": rows,
            "rounds": rounds, "machine": platform.platform(), "cpus": os.cpu_count(),
            "load_average": os.getloadavg(), "seconds": times, "median_s": medians,
            "throughput_ratio_keepermap_to_zookeeper": ratio}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8124")
    parser.add_argument("--zookeeper", default="127.0.0.1:2181")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    report = run(args.url, args.zookeeper, args.rows, args.rounds)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
