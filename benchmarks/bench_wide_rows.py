"""``clickhouse_tx`` on wide event rows of modern column types, against its baselines.

A batch job of wide event rows (``sinkbench/wide_rows.py``: ``DateTime64(3)``, ``UUID``,
``LowCardinality(String)``, ``Enum8``, ``Map(String, String)``,
``Array(Tuple(String, Float64))``, ``Nullable(Decimal(18, 4))``) on the modern server,
written by three variants on the same rows in one Spark session (``sinkbench/rounds.py``:
rounds interleaved, the variants' order turning each round, one warm-up save each first):

- ``tx`` — ``clickhouse_tx``;
- ``plain`` — ``clickhouse_plain``, the same writer inserting into the target directly
  (at-least-once);
- ``connect_executor`` — ``foreachBatch``-style clickhouse-connect ``insert_arrow`` from
  the tasks (``mapInArrow``), what a user writes without a sink;
- ``arrow_noop`` — a Python Arrow writer that only counts the rows: what Spark's
  production of these rows costs before any sink does anything.

Goals: ``tx`` ≥ 0.95× ``plain`` and ≥ 1.0× ``connect_executor`` in rows/s, as the median of
per-round ratios (paired). Each job's rows are counted in the target.

Usage::

    python benchmarks/bench_wide_rows.py                 # 1M rows, 2 partitions, 5 rounds
    python benchmarks/bench_wide_rows.py --rows 200000 --rounds 3

Needs the modern server (HTTP 8124; ``./run services up --modern``) and ZooKeeper; uses
its own database and ZooKeeper root and removes both. Writes
``benchmarks/results/modern/wide_rows.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from sinkbench import wide_rows
from sinkbench.environment import Scratch, machine, spark_settings, start_spark
from sinkbench.memory import jvm_pid
from sinkbench.noop_source import NoopArrowDataSource
from sinkbench.report import table
from sinkbench.rounds import Bench, Case

import txsink

RESULTS = Path(__file__).resolve().parent / "results" / "modern" / "wide_rows.json"
VARIANTS = ("tx", "plain", "connect_executor", "arrow_noop")
GOALS = {"plain": 0.95, "connect_executor": 1.0}  # arrow_noop: shown, no goal


def log(message: str) -> None:
    print(message, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8124")
    parser.add_argument("--zookeeper", default="127.0.0.1:2181")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    started = time.time()
    spark = start_spark()
    txsink.register(spark)
    spark.dataSource.register(NoopArrowDataSource)
    settings = spark_settings(spark)
    scratch = Scratch.create(args.url, args.zookeeper)
    bench = Bench(spark, scratch, jvm_pid(spark), log, rows=wide_rows)
    try:
        bench.warm_up(VARIANTS)
        results = bench.rounds("wide_rows", [Case(args.rows, args.partitions)], VARIANTS,
                               args.rounds)
    finally:
        scratch.remove()
        spark.stop()
    tx = next(r for r in results if r["variant"] == "tx")
    print(table(["variant", "median s", "M rows/s", "load during runs"],
                [[r["variant"], r["median_s"], round((r["rows_per_s"] or 0) / 1e6, 3),
                  f"{r['load_range'][0]:.1f}–{r['load_range'][1]:.1f}"] for r in results]))
    print(table(["tx ÷", "ratio of medians", "paired (median of rounds)", "goal", "met"],
                [[base, tx["ratio"].get(base), tx["paired_ratio"].get(base), goal,
                  "yes" if (tx["paired_ratio"].get(base) or 0) >= goal else "no"]
                 for base, goal in GOALS.items()]
                + [["arrow_noop", tx["ratio"].get("arrow_noop"),
                    tx["paired_ratio"].get("arrow_noop"), "—", "—"]]))
    data = {"benchmark": "wide_rows", "started_at": time.strftime(
        "%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)), "duration_s": round(time.time() - started),
        "machine": machine(), "spark": settings,
        "url": args.url, "rows": args.rows, "partitions": args.partitions,
        "rounds": args.rounds, "columns": wide_rows.COLUMNS_DDL, "goals": GOALS,
        "results": results}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(data, indent=2) + "\n")
    print(f"written {args.output}")


if __name__ == "__main__":
    main()
