"""The ``clickhouse_tx`` Spark sink against its baselines, in one run on the same rows.

What it measures (every figure also as a ratio to baselines measured in the same run,
medians of interleaved rounds; see ``benchmarks/sinkbench/`` for each experiment):

- baselines: Spark ``noop``, a no-op Python Arrow writer, ``clickhouse_plain``
  (at-least-once), ``foreachBatch`` + clickhouse-driver (driver and task shapes),
  ``foreachBatch`` + clickhouse-connect ``insert_arrow`` (driver and task shapes; only on
  servers clickhouse-connect supports, skipped with the reason on 18.16),
  ``clickhouse_tx``;
- throughput vs concurrent writers, vs rows per transaction, vs ``insert_block_rows``;
- the whole-job overhead of a tiny epoch, time vs rows (linear fit) and peak memory;
- a fixed streaming workload vs trigger interval: total time and visibility latency;
- the cost of each protocol step of one epoch (driver-side harness).

Usage::

    python benchmarks/bench_sink.py            # full run (~14 minutes at load 8 on 2 cores)
    python benchmarks/bench_sink.py --quick    # smoke run (~1.5 minutes on a quiet machine)
    python benchmarks/bench_sink.py --only baselines,breakdown --huge
    python benchmarks/bench_sink.py --modern   # the modern server (26.x on HTTP 8124):
                                               # every variant at 1M and 2M rows
    python benchmarks/bench_sink.py --modern --modern-rows 1000000,4000000 --rounds 3

Prints every table and the goals; writes ``sink.json`` into ``--out``
(``benchmarks/results`` by default, ``benchmarks/results/quick`` with ``--quick``;
``--modern`` writes ``sink.json`` and ``modern.png`` into ``benchmarks/results/modern``,
or ``benchmarks/results/quick/modern`` with ``--quick``).
Needs ClickHouse (HTTP 8123, native 9000; ``--modern``: HTTP 8124, its native port is
asked from the server) and ZooKeeper; uses its own database and ZooKeeper root and
removes both.
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
from urllib.parse import urlsplit

from sinkbench import batch, breakdown, environment, report, streaming
from sinkbench.client_baseline import connect_unsupported
from sinkbench.environment import Scratch, load
from sinkbench.memory import jvm_pid
from sinkbench.noop_source import NoopArrowDataSource
from sinkbench.rounds import Bench
from sinkbench.variants import CONNECT, server_native_port

RESULTS = Path(__file__).resolve().parent / "results"
EXPERIMENTS = ("baselines", "writers", "epoch_size", "block_rows", "overhead", "scaling",
               "streaming", "breakdown")
#: Experiments run only when asked for (``--only`` or ``--modern``), never by default.
EXTRA_EXPERIMENTS = ("modern",)
MODERN_URL = "http://127.0.0.1:8124"
DEFAULT_URL = "http://127.0.0.1:8123"


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
    modern_sizes: tuple[int, ...] = (1_000_000, 2_000_000)
    modern_rounds: int = 5
    skip: frozenset[str] = field(default_factory=frozenset)


QUICK = Plan(
    rows=100_000, rounds=1, sweep_rounds=1, overhead_partitions=(1, 2),
    scaling_sizes=(100_000, 200_000), triggers=(2,), stream_sinks=("tx",),
    stream_rate=5_000, stream_seconds=3, breakdown_branches=(1, 2),
    breakdown_partitions=(1,), breakdown_epochs=2, breakdown_rows=20_000,
    modern_sizes=(100_000,), modern_rounds=1,
    skip=frozenset({"writers", "epoch_size", "block_rows"}),
)


def log(message: str) -> None:
    print(message, flush=True)


def run(plan: Plan, only: set[str], url: str, zookeeper: str, arrow_batch_rows: int) -> dict:
    started, load_start = time.time(), load()
    wanted = [e for e in (*EXPERIMENTS, *EXTRA_EXPERIMENTS) if e in only and e not in plan.skip]
    skipped = _skipped_variants(url) if {"baselines", "modern"} & set(wanted) else {}
    for name, why in skipped.items():
        log(f"skipping {name}: {why}")
    variants = tuple(v for v in batch.ALL_VARIANTS if v not in skipped)
    spark = environment.start_spark(cores=2, arrow_batch_rows=arrow_batch_rows)
    settings = environment.spark_settings(spark)
    import txsink

    txsink.register(spark)
    spark.dataSource.register(NoopArrowDataSource)
    scratch = Scratch.create(url, zookeeper)
    bench = Bench(spark, scratch, jvm_pid(spark), log, server_native_port(url))
    results: dict = {}
    timings: dict[str, float] = {}
    try:
        if set(wanted) - {"streaming", "breakdown"}:
            bench.warm_up(variants)
        for name in wanted:
            log(f"== {name} (load {load():.1f})")
            began = time.time()
            results.update(_experiment(name, plan, bench, spark, scratch, variants))
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
        "native_port": bench.native_port,
        "skipped": skipped,
        "experiments": results,
    }


def _skipped_variants(url: str) -> dict[str, str]:
    """The clickhouse-connect variants, with the reason, if that client cannot be used."""
    parts = urlsplit(url)
    why = connect_unsupported(parts.hostname or "127.0.0.1", parts.port or 8123)
    return dict.fromkeys(CONNECT, why) if why else {}


def _experiment(name: str, plan: Plan, bench: Bench, spark, scratch: Scratch,
                variants: tuple[str, ...]) -> dict:
    if name == "baselines":
        return {name: batch.baselines(bench, plan.rows, plan.partitions, plan.rounds,
                                      variants)}
    if name == "modern":
        return {name: batch.modern(bench, plan.modern_sizes, plan.partitions,
                                   plan.modern_rounds, variants)}
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
    parser.add_argument("--only", default=None,
                        help="comma-separated subset of: "
                             f"{', '.join((*EXPERIMENTS, *EXTRA_EXPERIMENTS))} "
                             f"(default: {', '.join(EXPERIMENTS)})")
    parser.add_argument("--modern", action="store_true",
                        help=f"the modern server ({MODERN_URL} unless --url): only the "
                             "'modern' experiment, every variant incl. clickhouse-connect, "
                             "results in benchmarks/results/modern")
    parser.add_argument("--modern-rows", default=None,
                        help="comma-separated rows per epoch of the 'modern' experiment "
                             f"(default {','.join(map(str, Plan.modern_sizes))})")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds of the 'baselines' and 'modern' experiments")
    parser.add_argument("--url", default=None, help=f"default {DEFAULT_URL}")
    parser.add_argument("--zookeeper", default="127.0.0.1:2181")
    parser.add_argument("--arrow-batch-rows", type=int, default=environment.ARROW_BATCH_ROWS,
                        help="spark.sql.execution.arrow.maxRecordsPerBatch")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    default_only = "modern" if args.modern else ",".join(EXPERIMENTS)
    only = {name.strip() for name in (args.only or default_only).split(",") if name.strip()}
    unknown = only - set(EXPERIMENTS) - set(EXTRA_EXPERIMENTS)
    if unknown:
        parser.error(f"unknown experiment(s): {', '.join(sorted(unknown))}")
    plan = QUICK if args.quick else Plan()
    if args.huge:
        plan = Plan(**{**plan.__dict__, "scaling_sizes": (*plan.scaling_sizes, 50_000_000)})
    if args.modern_rows:
        sizes = tuple(int(n) for n in args.modern_rows.split(",") if n.strip())
        plan = Plan(**{**plan.__dict__, "modern_sizes": sizes})
    if args.rounds:
        plan = Plan(**{**plan.__dict__, "rounds": args.rounds, "modern_rounds": args.rounds})
    logging.getLogger("txsink").setLevel(logging.ERROR)  # per-epoch lines of the harness
    warnings.filterwarnings("ignore", category=FutureWarning)  # pyspark on pandas 3
    url = args.url or (MODERN_URL if args.modern else DEFAULT_URL)
    results = run(plan, only, url, args.zookeeper, args.arrow_batch_rows)
    results["quick"] = args.quick
    results["goals"] = _goals(results["experiments"])
    print("\n" + report.render(results))
    out = args.out or (RESULTS / "quick" if args.quick else RESULTS)
    if args.modern and not args.out:
        out = out / "modern"
    out.mkdir(parents=True, exist_ok=True)
    (out / "sink.json").write_text(json.dumps(results, indent=1) + "\n")
    if results["experiments"].get("modern"):
        import plots

        print(f"written {plots.modern(results, out)}")
    print("\nseconds per experiment: " + ", ".join(
        f"{k} {v:.0f}" for k, v in results["experiment_seconds"].items()))
    print(f"written {out / 'sink.json'} in {results['duration_s']:.0f} s "
          f"(load {results['load']['start']:.1f} -> {results['load']['end']:.1f})")


def _goals(experiments: dict) -> list[dict]:
    """Issue 7's goals; the modern-server goals where clickhouse-connect was measured
    (only those when the run was the ``modern`` experiment alone)."""
    if set(experiments) == {"modern"}:
        return report.modern_goals(experiments)
    measured = {r["variant"] for name in ("baselines", "modern")
                for r in experiments.get(name, [])}
    issue7 = report.goals(experiments)
    seen = {g["goal"] for g in issue7}
    return issue7 + [g for g in (report.modern_goals(experiments)
                                 if measured & set(CONNECT) else []) if g["goal"] not in seen]


if __name__ == "__main__":
    main()
