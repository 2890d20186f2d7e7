"""Where the server's CPU goes in an epoch over many partitions: `tx` vs `plain`, per statement.

A driver-side profile, without Spark, of the shape ``bench_all_costs.py`` streams (many
target partitions, few rows per task and partition): per epoch ``--tasks`` branches of
``--rows`` rows each, every row in one of ``--partitions`` target partitions. `tx` runs
the sink's own functions in this process (``plan_write``, ``write_branch`` per branch,
``driver.commit_epoch``); `plain` its task body (``plain.insert_directly``) per branch.
`tx_contributing` is `tx` with every task's staging table contributed to the pre-combined
table, however many partitions it spans (``SizeLimits.contribute_max_partitions`` lifted).
It prints, per variant and epoch, the server process's CPU (``/proc``, background merges
included, until the server's merges are done) and `tx`'s commit time; then, where the
server logs queries (26.x), the statements each variant sent, per kind of statement
(literals and names elided): the calls and the server's CPU (``UserTimeMicroseconds`` +
``SystemTimeMicroseconds``) per epoch. Ratios are to `plain`'s. ``bench_all_costs.py``
counts the merges of a whole stream.

Usage: python benchmarks/profile_server_cpu.py [--url http://127.0.0.1:8124]
       [--partitions 50] [--tasks 4] [--rows 5000] [--epochs 5] [--strategy S]
       [--variants tx,tx_contributing,plain]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from urllib.parse import urlsplit

import numpy as np
import pyarrow as pa
from pyspark.sql.types import DateType, LongType, StringType, StructField, StructType
from sinkbench.environment import Scratch, load, sql
from sinkbench.process_cpu import listening_pid, process_cpu

from txsink.core import driver
from txsink.core.attempt import write_branch
from txsink.core.plan import plan_write
from txsink.core.tuning import DEFAULT_TUNING
from txsink.options import parse_options
from txsink.spark.plain import insert_directly

SCHEMA = StructType([StructField("id", LongType()), StructField("day", DateType()),
                     StructField("name", StringType())])
COLUMNS = ("id", "day", "name")
VARIANTS = ("tx", "tx_contributing", "plain")
#: tx_contributing's plans: every task contributes, however many partitions it spans
CONTRIBUTING = replace(DEFAULT_TUNING, limits=replace(
    DEFAULT_TUNING.limits, contribute_max_partitions=1 << 30))
# statements with names, strings and numbers elided, cut to this many characters
KIND = ("substring(replaceRegexpAll(replaceRegexpAll(query, '`[^`]*`|\\'[^\\']*\\'|[0-9]+', "
        "'?'), '\\\\s+', ' '), 1, 80)")


def branch_batch(first_id: int, rows: int, partitions: int) -> pa.RecordBatch:
    ids = np.arange(first_id, first_id + rows)
    days = pa.array((ids % partitions).astype("int32")).cast(pa.date32())
    names = pa.array([f"name-{i}" for i in ids])
    return pa.RecordBatch.from_arrays([pa.array(ids), days, names], names=list(COLUMNS))


def run_variant(scratch: Scratch, variant: str, args: argparse.Namespace
                ) -> tuple[str, list[float]]:
    """Run ``args.epochs`` epochs: the time the first statement may have started, and
    `tx`'s commit seconds per epoch."""
    table = scratch.table(variant)
    sql(scratch.url, f"CREATE TABLE {table} (id Int64, day Date, name String) "
                "ENGINE = MergeTree() PARTITION BY day ORDER BY id")
    raw = {"url": scratch.url, "table": table, "zookeeper": scratch.zookeeper,
           "zk_root": scratch.zk_root, "sink_id": f"cpu-{variant}"}
    if variant != "plain" and args.strategy:
        raw["strategy"] = args.strategy
    sql(scratch.url, "SYSTEM FLUSH LOGS")
    time.sleep(1.1)  # query_log's event_time has whole seconds
    started = sql(scratch.url, "SELECT now()").strip()
    commits = []
    tuning = CONTRIBUTING if variant == "tx_contributing" else DEFAULT_TUNING
    for epoch in range(args.epochs):
        batches = [branch_batch((epoch * args.tasks + task) * args.rows, args.rows,
                                args.partitions) for task in range(args.tasks)]
        if variant == "plain":
            options = parse_options(raw)
            for b in batches:
                insert_directly(options, COLUMNS, iter([b]))
        else:
            plan = replace(plan_write(raw, SCHEMA, False, streaming=False), tuning=tuning)
            messages = [write_branch(plan, plan.epoch, iter([b])) for b in batches]
            begun = time.perf_counter()
            driver.commit_epoch(plan, plan.epoch, messages)
            commits.append(time.perf_counter() - begun)
    return started, commits


def merges_done(url: str) -> None:
    """Wait (up to a minute) until the server runs no merge."""
    for _ in range(120):
        if sql(url, "SELECT count() FROM system.merges").strip() == "0":
            return
        time.sleep(0.5)


def statements(scratch: Scratch, since: str, until: str) -> list[tuple[str, int, float]]:
    """(kind, calls, CPU ms) of every statement finished between ``since`` and ``until``;
    none where the server's query log has no ``ProfileEvents`` map (18.16)."""
    if sql(scratch.url, "SELECT count() FROM system.columns WHERE database = 'system' AND "
                        "table = 'query_log' AND name = 'ProfileEvents'").strip() != "1":
        return []
    sql(scratch.url, "SYSTEM FLUSH LOGS")
    text = sql(scratch.url,
        f"SELECT {KIND} AS kind, count(), sum(ProfileEvents['UserTimeMicroseconds'] + "
        "ProfileEvents['SystemTimeMicroseconds']) / 1000 FROM system.query_log "
        f"WHERE type = 'QueryFinish' AND event_time >= '{since}' AND event_time < '{until}' "
        "AND query NOT LIKE '%system.query_log%' AND query NOT LIKE 'SYSTEM FLUSH LOGS%' "
        "AND query NOT LIKE 'SELECT now()%' GROUP BY kind ORDER BY 3 DESC FORMAT TSV")
    return [(kind, int(calls), float(ms)) for kind, calls, ms in
            (line.split("\t") for line in text.splitlines())]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8124")
    parser.add_argument("--zookeeper", default="127.0.0.1:2181")
    parser.add_argument("--partitions", type=int, default=50)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--rows", type=int, default=5000, help="rows per task and epoch")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--strategy", default="", help="the tx sink's publish strategy "
                        "(default: the one it chooses)")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    print(f"{args.url}: {args.epochs} epochs of {args.tasks} tasks × {args.rows:,} rows "
          f"over {args.partitions} partitions, strategy {args.strategy or 'chosen'}, "
          f"load {load()}")
    server = listening_pid(urlsplit(args.url).port or 8123)
    cpu: dict[str, float] = {}
    logged: dict[str, float] = {}
    scratch = Scratch.create(args.url, args.zookeeper)
    try:
        for variant in args.variants.split(","):
            merges_done(scratch.url)
            before = process_cpu(server)
            since, commits = run_variant(scratch, variant, args)
            merges_done(scratch.url)
            cpu[variant] = (process_cpu(server) - before) * 1000 / args.epochs
            time.sleep(1.1)
            until = sql(scratch.url, "SELECT now()").strip()
            found = statements(scratch, since, until)
            print(f"\n{variant}: server process CPU per epoch {cpu[variant]:.0f} ms"
                  + (f"; commit ms median {statistics.median(commits) * 1000:.0f}, "
                     f"range {min(commits) * 1000:.0f}–{max(commits) * 1000:.0f}"
                     if commits else ""))
            if found:
                logged[variant] = sum(ms for _, _, ms in found) / args.epochs
                print(f"  statements' CPU per epoch {logged[variant]:.0f} ms "
                      "(ms per epoch, calls per epoch, statement)")
            for kind, calls, ms in found:
                if ms / args.epochs >= 1:
                    print(f"  {ms / args.epochs:8.1f} {calls / args.epochs:6.1f}  {kind}")
    finally:
        scratch.remove()
    for name, figures in (("server process CPU", cpu), ("statements' CPU", logged)):
        if "plain" in figures and figures["plain"] > 0:
            print(f"{name} ÷ plain's: " + ", ".join(
                f"{v} {ms / figures['plain']:.2f}" for v, ms in figures.items() if v != "plain"))


if __name__ == "__main__":
    main()
