"""The ``clickhouse_tx`` Spark sink against its baselines, in one run on the same rows.

What it measures (every figure also as a ratio to baselines measured in the same run,
medians of interleaved rounds; see ``benchmarks/sinkbench/`` for each experiment):

- baselines: Spark ``noop``, a no-op Python Arrow writer, ``clickhouse_plain``
  (at-least-once), ``foreachBatch`` + clickhouse-driver (driver and task shapes),
  ``clickhouse_tx``;
- throughput vs concurrent writers, vs rows per transaction, vs ``insert_block_rows``;
- the whole-job overhead of a tiny epoch, time vs rows (linear fit) and peak memory;
- a fixed streaming workload vs trigger interval: total time and visibility latency;
- the cost of each protocol step of one epoch (driver-side harness).

Usage::

    python benchmarks/bench_sink.py            # full run (~14 minutes at load 8 on 2 cores)
    python benchmarks/bench_sink.py --quick    # smoke run (~1.5 minutes on a quiet machine)
    python benchmarks/bench_sink.py --only baselines,breakdown --huge

Prints every table and the goals; writes ``sink.json`` into ``--out``
(``benchmarks/results`` by default, ``benchmarks/results/quick`` with ``--quick``).
Needs ClickHouse (HTTP 8123, native 9000) and ZooKeeper; uses its own database and
ZooKeeper root and removes both.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from sinkbench import batch, breakdown, environment, report, streaming
from sinkbench.environment import Scratch, load
from sinkbench.memory import jvm_pid
from sinkbench.noop_source import NoopArrowDataSource
from sinkbench.rounds import Bench

RESULTS = Path(__file__).resolve().parent / "results"
EXPERIMENTS = ("baselines", "writers", "epoch_size", "block_rows", "overhead", "scaling",
               "streaming", "breakdown")


@dataclass(frozen=True)
class Plan:
    """How big and how often: the full run, or the smoke run (``--quick``)."""

    rows: int = 1_000_000
    partitions: int = 2
    rounds: int = 5
    sweep_rounds: int = 3
    writer_partitions: tuple[int, ...] = (1, 2, 4)
    epoch_sizes: tuple[int, ...] = (10_000, 100_000, 1_000_000)
    block_sizes: tuple[int, ...] = (65_536, 262_144, 1_048_576)
    overhead_rows: int = 10_000
    overhead_partitions: tuple[int, ...] = (1, 10)
    scaling_sizes: tuple[int, ...] = (1_000_000, 10_000_000)
    triggers: tuple[float, ...] = (1, 2, 5, 10)
    stream_sinks: tuple[str, ...] = streaming.SINKS
    stream_rate: int = 20_000
    stream_seconds: int = 10
    breakdown_branches: tuple[int, ...] = (1, 2, 4, 10)
    breakdown_partitions: tuple[int, ...] = (1, 10)
    breakdown_rows: int = 100_000
    breakdown_epochs: int = 5
    skip: frozenset[str] = field(default_factory=frozenset)


QUICK = Plan(
    rows=100_000, rounds=1, sweep_rounds=1, overhead_partitions=(1, 2),
    scaling_sizes=(100_000, 200_000), triggers=(2,), stream_sinks=("tx",),
    stream_rate=5_000, stream_seconds=3, breakdown_branches=(1, 2),
    breakdown_partitions=(1,), breakdown_epochs=2, breakdown_rows=20_000,
    skip=frozenset({"writers", "epoch_size", "block_rows"}),
)


def log(message: str) -> None:
    print(message, flush=True)


def run(plan: Plan, only: set[str], url: str, zookeeper: str, arrow_batch_rows: int) -> dict:
    started, load_start = time.time(), load()
    spark = environment.start_spark(cores=2, arrow_batch_rows=arrow_batch_rows)
    settings = environment.spark_settings(spark)
    import txsink

    txsink.register(spark)
    spark.dataSource.register(NoopArrowDataSource)
    scratch = Scratch.create(url, zookeeper)
    bench = Bench(spark, scratch, jvm_pid(spark), log)
    results: dict = {}
    timings: dict[str, float] = {}
    wanted = [e for e in EXPERIMENTS if e in only and e not in plan.skip]
    try:
        if set(wanted) - {"streaming", "breakdown"}:
            bench.warm_up(batch.ALL_VARIANTS)
        for name in wanted:
            log(f"== {name} (load {load():.1f})")
            began = time.time()
            results.update(_experiment(name, plan, bench, spark, scratch))
            timings[name] = round(time.time() - began, 1)
    finally:
        scratch.remove()
        spark.stop()
    return {
        "benchmark": "clickhouse_tx Spark sink against its baselines",
        "command": " ".join(["python", *sys.argv]),
        "started_at": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(started)),
        "duration_s": round(time.time() - started, 1),
        "machine": environment.machine(),
        "clickhouse": environment.sql(url, "SELECT version()").strip(),
        "spark": settings,
        "load": {"start": load_start, "end": load()},
        "plan": {k: (sorted(v) if isinstance(v, frozenset) else v)
                 for k, v in plan.__dict__.items()},
        "experiment_seconds": timings,
        "experiments": results,
    }


def _experiment(name: str, plan: Plan, bench: Bench, spark, scratch: Scratch) -> dict:
    if name == "baselines":
        return {name: batch.baselines(bench, plan.rows, plan.partitions, plan.rounds)}
    if name == "writers":
        return {name: batch.writers(bench, plan.rows, plan.writer_partitions,
                                    plan.sweep_rounds)}
    if name == "epoch_size":
        return {name: batch.epoch_size(bench, plan.epoch_sizes, plan.partitions,
                                       plan.sweep_rounds)}
    if name == "block_rows":
        return {name: batch.block_rows(bench, plan.rows, plan.partitions, plan.block_sizes,
                                       plan.sweep_rounds)}
    if name == "overhead":
        return {name: batch.overhead(bench, plan.overhead_rows, plan.overhead_partitions,
                                     plan.rounds)}
    if name == "scaling":
        rows = batch.scaling(bench, plan.scaling_sizes, plan.partitions, plan.sweep_rounds)
        fits = [batch.linear_fit(rows, v) for v in ("plain", "tx")]
        return {name: rows, "scaling_fit": [f for f in fits if f]}
    if name == "streaming":
        return {name: streaming.trigger_sweep(spark, scratch, plan.triggers, plan.stream_sinks,
                                              plan.stream_rate, plan.stream_seconds, log)}
    return {name: breakdown.run(scratch, plan.breakdown_branches, plan.breakdown_partitions,
                                plan.breakdown_rows, plan.breakdown_epochs, log)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: every code path, figures too small to read")
    parser.add_argument("--huge", action="store_true", help="add 50M rows to the scaling run")
    parser.add_argument("--only", default=",".join(EXPERIMENTS),
                        help=f"comma-separated subset of: {', '.join(EXPERIMENTS)}")
    parser.add_argument("--url", default="http://127.0.0.1:8123")
    parser.add_argument("--zookeeper", default="127.0.0.1:2181")
    parser.add_argument("--arrow-batch-rows", type=int, default=environment.ARROW_BATCH_ROWS,
                        help="spark.sql.execution.arrow.maxRecordsPerBatch")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    only = {name.strip() for name in args.only.split(",") if name.strip()}
    unknown = only - set(EXPERIMENTS)
    if unknown:
        parser.error(f"unknown experiment(s): {', '.join(sorted(unknown))}")
    plan = QUICK if args.quick else Plan()
    if args.huge:
        plan = Plan(**{**plan.__dict__, "scaling_sizes": (*plan.scaling_sizes, 50_000_000)})
    logging.getLogger("txsink").setLevel(logging.ERROR)  # per-epoch lines of the harness
    warnings.filterwarnings("ignore", category=FutureWarning)  # pyspark on pandas 3
    results = run(plan, only, args.url, args.zookeeper, args.arrow_batch_rows)
    results["quick"] = args.quick
    results["goals"] = report.goals(results["experiments"])
    print("\n" + report.render(results))
    out = args.out or (RESULTS / "quick" if args.quick else RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sink.json").write_text(json.dumps(results, indent=1) + "\n")
    print("\nseconds per experiment: " + ", ".join(
        f"{k} {v:.0f}" for k, v in results["experiment_seconds"].items()))
    print(f"written {out / 'sink.json'} in {results['duration_s']:.0f} s "
          f"(load {results['load']['start']:.1f} -> {results['load']['end']:.1f})")


if __name__ == "__main__":
    main()
