"""All costs counted: a stream over many target partitions, Spark and servers alike.

Plain inserts leave one part per task and target partition for the server to merge; the
exactly-once sink leaves one per partition and epoch. This benchmark runs the same
stream through each variant and counts what it costs until the server has merged what it
was given:

- the stream: Spark's ``rate`` source at ``--rate`` rows/s, every row in one of
  ``--partitions`` target partitions (``part = id % partitions``), repartitioned into
  ``--tasks`` tasks, at a ``--trigger`` s processing-time trigger for ``--seconds`` s;
- the variants: ``tx_pipelined`` and ``tx_inline`` (``clickhouse_tx`` with
  ``publish=pipelined`` / ``inline``), and ``plain`` (``clickhouse_plain``, the same
  writer inserting straight into the target, at-least-once);
- measured per variant: rows/s (rows visible ÷ the time from the query's start until
  the last row was visible), the median micro-batch (kept up: no longer than the
  trigger), the target's active parts every ``--sample-every`` s, the server's merges
  (``system.events`` ``MergedRows`` and ``MergesTimeMilliseconds``; neither server here
  keeps ``system.part_log``) until merges settle (no merge of the target running and
  its active parts unchanged for ``--settled-for`` s, at most ``--settle`` s after the
  stream stopped), and CPU seconds of Spark (this process and its descendants: the JVM
  and its Python workers; until the stream stopped), of the ClickHouse server and of
  ZooKeeper (their processes, found by the port they listen on; until merges settled).

Prints one line per variant and the ratios ``tx ÷ plain`` of the total CPU (Spark +
server + ZooKeeper, per million rows) and of rows/s; writes ``all_costs_<server>.json``
and a plot of active parts over time and CPU per million rows by whom
(``all_costs_<server>.png``) in ``benchmarks/results/``.

    python benchmarks/bench_all_costs.py [--url http://127.0.0.1:8123]
        [--zookeeper 127.0.0.1:2181] [--rate 20000] [--partitions 50] [--tasks 4]
        [--trigger 1] [--seconds 120] [--variants tx_pipelined,tx_inline,plain]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sinkbench.environment import load, run_record, sql, start_spark
from sinkbench.process_cpu import listening_pid, process_cpu, tree_cpu

RESULTS = Path(__file__).resolve().parent / "results"
VARIANTS = ("tx_pipelined", "tx_inline", "plain")


MERGE_EVENTS = ("MergedRows", "MergesTimeMilliseconds")  # 18.16 has no ``Merge`` event


def merges(url: str) -> dict[str, int]:
    text = sql(url, "SELECT event, value FROM system.events WHERE event IN "
                    f"({', '.join(repr(e) for e in MERGE_EVENTS)}) FORMAT TSV")
    found = dict(line.split("\t") for line in text.strip().splitlines())
    return {k: int(found.get(k, 0)) for k in MERGE_EVENTS}


def active_parts(url: str, database: str, table: str) -> int:
    return int(sql(url, f"SELECT count() FROM system.parts WHERE database = '{database}' "
                        f"AND table = '{table}' AND active").strip())


def running_merges(url: str, database: str, table: str) -> int:
    return int(sql(url, f"SELECT count() FROM system.merges WHERE database = '{database}' "
                        f"AND table = '{table}'").strip())


def run_variant(spark: Any, variant: str, args: argparse.Namespace, pids: dict[str, int | None],
                database: str) -> dict[str, Any]:
    from pyspark.sql import functions as F

    import txsink

    table = f"events_{variant}"
    target = f"`{database}`.`{table}`"
    sql(args.url, f"CREATE TABLE {target} (id Int64, part UInt16, name String, value Float64)"
                  " ENGINE = MergeTree PARTITION BY part ORDER BY id")
    options = {"url": args.url, "table": f"{database}.{table}"}
    if variant != "plain":
        options |= {"zookeeper": args.zookeeper, "zk_root": f"/bench-costs-{database}",
                    "sink_id": f"costs-{variant}", "publish": variant.removeprefix("tx_")}
    rows = (spark.readStream.format("rate").option("rowsPerSecond", args.rate)
            .option("numPartitions", 2).load()
            .select(F.col("value").alias("id"),
                    (F.col("value") % args.partitions).cast("int").alias("part"),
                    F.concat(F.lit("name-"), F.col("value").cast("string")).alias("name"),
                    (F.col("value") * 0.5).alias("value"))
            .repartition(args.tasks))
    checkpoint = tempfile.mkdtemp(prefix="bench-costs-")
    before = {"spark": tree_cpu(os.getpid()), "server": process_cpu(pids["server"]),
              "zookeeper": process_cpu(pids["zookeeper"]), **merges(args.url)}
    started = time.monotonic()
    query = (rows.writeStream.format("clickhouse_plain" if variant == "plain"
                                     else "clickhouse_tx")
             .options(**options).option("checkpointLocation", checkpoint)
             .trigger(processingTime=f"{args.trigger} seconds").start())
    samples: list[dict[str, float]] = []
    next_sample = 0.0
    while (elapsed := time.monotonic() - started) < args.seconds:
        if elapsed >= next_sample:
            samples.append({"t": round(elapsed, 1),
                            "active_parts": active_parts(args.url, database, table)})
            next_sample += args.sample_every
        time.sleep(0.2)
    query.stop()
    spark_cpu = tree_cpu(os.getpid()) - before["spark"]
    if variant == "tx_pipelined":
        txsink.wait_published(options)
    visible = time.monotonic() - started
    stable_since, last = time.monotonic(), -1
    while time.monotonic() - started < args.seconds + args.settle:
        parts = active_parts(args.url, database, table)
        samples.append({"t": round(time.monotonic() - started, 1), "active_parts": parts})
        if parts != last or running_merges(args.url, database, table):
            stable_since, last = time.monotonic(), parts
        elif time.monotonic() - stable_since >= args.settled_for:
            break
        time.sleep(1.0)
    settled = time.monotonic() - started
    count, distinct = map(int, sql(args.url, f"SELECT count(), uniqExact(id) FROM {target}")
                          .split())
    after = {"server": process_cpu(pids["server"]),
             "zookeeper": process_cpu(pids["zookeeper"]), **merges(args.url)}
    progress = query.recentProgress
    first = next((p for p in progress if p.get("numInputRows")), None)
    batches = [p["durationMs"]["triggerExecution"] for p in progress
               if p.get("numInputRows")]
    cpu = {"spark": spark_cpu, "server": after["server"] - before["server"],
           "zookeeper": after["zookeeper"] - before["zookeeper"]}
    million = max(count, 1) / 1e6
    return {
        "variant": variant, "rows": count, "distinct": distinct,
        "visible_s": round(visible, 2), "settled_s": round(settled, 2),
        "rows_per_s": round(count / visible, 1),
        "micro_batches": len(batches),
        "median_batch_ms": statistics.median(batches) if batches else None,
        "first_batch_at": first.get("timestamp") if first else None,
        "cpu_s": {k: round(v, 2) for k, v in cpu.items()},
        "cpu_s_per_million_rows": {k: round(v / million, 2) for k, v in cpu.items()}
        | {"total": round(sum(cpu.values()) / million, 2)},
        "merged_rows": after["MergedRows"] - before["MergedRows"],
        "merges_ms": after["MergesTimeMilliseconds"] - before["MergesTimeMilliseconds"],
        "final_active_parts": samples[-1]["active_parts"], "samples": samples}


def plot(data: dict[str, Any], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (parts, cpu) = plt.subplots(1, 2, figsize=(11, 4))
    runs = data["runs"]
    for run in runs:
        parts.plot([s["t"] for s in run["samples"]],
                   [s["active_parts"] for s in run["samples"]], label=run["variant"])
    parts.axvline(data["seconds"], color="#999", linestyle=":", label="stream stopped")
    parts.set_title("target's active parts", fontsize=10)
    parts.set_xlabel("seconds since the query started")
    parts.legend(fontsize=8)
    bottoms = [0.0] * len(runs)
    for who, color in (("spark", "#1f77b4"), ("server", "#d62728"),
                       ("zookeeper", "#bcbd22")):
        values = [r["cpu_s_per_million_rows"][who] for r in runs]
        cpu.bar([r["variant"] for r in runs], values, bottom=bottoms, color=color,
                label=who)
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    cpu.set_title("CPU seconds per million rows, until merges settle", fontsize=10)
    cpu.legend(fontsize=8)
    fig.suptitle(f"{data['server']}: {data['rate']:,} rows/s over {data['partitions']} "
                 f"partitions, {data['tasks']} tasks, {data['trigger']} s trigger",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8123")
    parser.add_argument("--zookeeper", default="127.0.0.1:2181")
    parser.add_argument("--rate", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=50)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--trigger", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--settle", type=float, default=300,
                        help="seconds after the stream stopped to wait for merges, at most")
    parser.add_argument("--settled-for", type=float, default=20,
                        help="seconds of unchanged active parts with no merge running")
    parser.add_argument("--sample-every", type=float, default=5)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    started, load_start = time.time(), load()
    version = sql(args.url, "SELECT version()").strip()
    pids = {"server": listening_pid(urlsplit(args.url).port or 8123),
            "zookeeper": listening_pid(int(args.zookeeper.split(",")[0].rsplit(":", 1)[1]))}
    spark = start_spark()
    import txsink

    txsink.register(spark)
    database = f"bench_costs_{uuid.uuid4().hex[:8]}"
    sql(args.url, f"CREATE DATABASE `{database}`")
    runs: list[dict[str, Any]] = []
    try:
        for variant in args.variants.split(","):
            run = run_variant(spark, variant, args, pids, database)
            runs.append(run)
            print(f"{variant}: {run['rows']:,} rows ({run['distinct']:,} distinct) in "
                  f"{run['micro_batches']} micro-batches (median {run['median_batch_ms']} ms), "
                  f"{run['rows_per_s']:,.0f} rows/s; "
                  f"CPU s per million rows {run['cpu_s_per_million_rows']}; "
                  f"{run['merged_rows']:,} rows merged in {run['merges_ms']:,} ms, "
                  f"{run['final_active_parts']} parts at the end, "
                  f"settled {run['settled_s'] - run['visible_s']:.0f} s after the last row",
                  flush=True)
    finally:
        spark.stop()
    plain = next((r for r in runs if r["variant"] == "plain"), None)
    ratios = {}
    if plain:
        for run in runs:
            if run is not plain:
                ratios[run["variant"]] = {
                    "cpu_total": round(run["cpu_s_per_million_rows"]["total"]
                                       / plain["cpu_s_per_million_rows"]["total"], 3),
                    "rows_per_s": round(run["rows_per_s"] / plain["rows_per_s"], 3)}
        print("ratios to plain (CPU per row: below 1 is cheaper; rows/s: above 1 is "
              "faster): " + json.dumps(ratios))
    server = "ch26" if not version.startswith("18.") else "ch18"
    data = run_record("all_costs", "bench_all_costs.py", started, load_start,
                      server=server, version=version, rate=args.rate,
                      partitions=args.partitions, tasks=args.tasks, trigger=args.trigger,
                      seconds=args.seconds, pids=pids, runs=runs, ratios=ratios)
    RESULTS.mkdir(exist_ok=True)
    output = RESULTS / f"all_costs_{server}.json"
    output.write_text(json.dumps(data, indent=1) + "\n")
    print(f"written {output} and {plot(data, RESULTS / f'all_costs_{server}.png')}")
    # last: 18.16 takes minutes to drop tables of hundreds of parts
    sql(args.url, f"DROP DATABASE IF EXISTS `{database}`", timeout=900)


if __name__ == "__main__":
    sys.exit(main())
