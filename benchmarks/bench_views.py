"""What staging the target's materialized views costs ``clickhouse_tx``.

A partition operation does not fire materialized views, so every branch of
``clickhouse_tx`` stages the target's view tree (``server_ext/ddl/views.py``, "The staged view
tree" in ``docs/design.md``): per view, a staging copy of the view's table and a staging
materialized view are created in each task, and each view's share is a branch of its own,
combined per server and table and published under the same decision. ``clickhouse_plain``
INSERTs into the target, and the server fires the real views. This run measures, on one
server, with the rows of ``bench_sink.py`` (``sinkbench/workload.py``):

1. **job**: a 1M-row batch job in 2 Spark partitions into a target that feeds one rollup
   view (a SummingMergeTree ``TO`` table: count and sum per day and key), with
   ``clickhouse_tx`` (``tx_view``) and ``clickhouse_plain`` (``plain_view``), and
   both sinks into the same target without the view (``tx_noview``, ``plain_noview``).
   Rounds are interleaved and the variants' order turns each round
   (``sinkbench/rounds.turned``); round 0 warms the workers up and is not counted.
   Ratios are of rows/s (above 1: faster), paired per round: ``tx ÷ plain`` = plain s /
   tx s (both with the view; goal >= 0.9), ``tx with view ÷ tx without`` = tx_noview s /
   tx_view s, and the same two for the target without views and for ``plain``, so that
   what the view costs can be told from what ``tx`` costs anyway.
2. **epoch**: a small epoch (10,000 rows, 2 partitions) with ``clickhouse_tx`` into targets
   feeding 0, 1, 2 and 4 such views; the sink's own per-epoch metrics (``commit_ms``,
   ``stage_ms``, ``seal_ms``: ``txsink.core.driver.epoch_metrics``, read back from the xid's
   record in ZooKeeper) as medians, and the least-squares slope of each against the
   number of view tables (the extra milliseconds per view table), from the medians and
   paired per round (the median of each round's slope).

Every job's rows are checked in the target and in each view's table (``sum(n)``).
``profile_views.py`` says, statement by statement, where the view's fixed cost goes.

Usage::

    python benchmarks/bench_views.py            # 18.16 (HTTP 8123): writes views.json
    python benchmarks/bench_views.py --modern   # 26.x (HTTP 8124): views-modern.json
    python benchmarks/bench_views.py --rounds 3 --epoch-rounds 5

Needs ClickHouse and ZooKeeper (``./run services up``, ``--modern`` for 26.x); uses its
own database and ZooKeeper root and removes both. Writes ``benchmarks/results/views.json``
(``views-modern.json``) and the PNG beside it.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from kazoo.client import KazooClient
from plots import views as plot
from sinkbench import workload
from sinkbench.environment import Scratch, load, run_record, sql, start_spark, write_result
from sinkbench.report import GOAL_TX_VS_PLAIN, table
from sinkbench.rounds import turned

import txsink
from coordinator import Coordinator
from coordinator.sink_admin import SinkAdmin
from server_ext.sql import qualified_name

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_URL = "http://127.0.0.1:8123"
MODERN_URL = "http://127.0.0.1:8124"
JOB_VARIANTS = ("tx_view", "plain_view", "tx_noview", "plain_noview")
VIEW_COUNTS = (0, 1, 2, 4)
METRICS = ("commit_ms", "stage_ms", "seal_ms")
KEYS = 1000  # rollup keys per day (id % KEYS)


def log(message: str) -> None:
    print(message, flush=True)


def create_tree(url: str, target: str, views: int) -> list[str]:
    """(Re)create ``target`` (``workload.create_target``) feeding ``views`` rollup views;
    returns the views' tables. Each view: a SummingMergeTree ``TO`` table with count and
    sum per day and key, and the materialized view that fills it."""
    database, name = target.split(".", 1)
    existing = sql(url, "SELECT name FROM system.tables WHERE database = "
                        f"'{database}' AND startsWith(name, '{name}_r')").split()
    for other in sorted(existing, key=lambda n: not n.endswith("_mv")):  # views first
        sql(url, f"DROP TABLE IF EXISTS {qualified_name(database, other)}")
    workload.create_target(url, target)
    tables = []
    for index in range(views):
        rollup = qualified_name(database, f"{name}_r{index}")
        sql(url, f"CREATE TABLE {rollup} (day Date, key UInt64, n UInt64, total Float64) "
                 "ENGINE = SummingMergeTree() PARTITION BY toYYYYMM(day) ORDER BY (day, key)")
        sql(url, f"CREATE MATERIALIZED VIEW {qualified_name(database, f'{name}_r{index}_mv')} "
                 f"TO {rollup} AS SELECT toDate(ts) AS day, toUInt64(id % {KEYS}) AS key, "
                 f"count() AS n, sum(score) AS total FROM {qualified_name(database, name)} "
                 "GROUP BY day, key")
        tables.append(rollup)
    return tables


class ViewBench:
    """Jobs of one Spark session into the scratch database, each checked after it ran."""

    def __init__(self, spark, scratch: Scratch) -> None:
        self.spark = spark
        self.scratch = scratch
        self.zk = KazooClient(hosts=scratch.zookeeper)
        self.zk.start(timeout=15)

    def close(self) -> None:
        self.zk.stop()
        self.zk.close()

    def job(self, sink: str, target: str, views: int, rows: int, partitions: int,
            sink_id: str) -> dict:
        """One job (``sink``: ``tx`` or ``plain``) into a fresh ``target`` with ``views``
        views: its seconds, load, and for ``tx`` the metrics recorded on its xid."""
        url = self.scratch.url
        rollups = create_tree(url, target, views)  # untimed
        options = {"url": url, "table": target}
        if sink == "tx":
            options.update(zookeeper=self.scratch.zookeeper, zk_root=self.scratch.zk_root,
                           sink_id=sink_id)
        df = workload.rows_frame(self.spark, rows, partitions)
        sample: dict = {"load_start": load()}
        started = time.perf_counter()
        df.write.format(f"clickhouse_{sink}").options(**options).mode("append").save()
        sample["seconds"] = round(time.perf_counter() - started, 4)
        sample["load_end"] = load()
        landed = workload.count(url, target)
        if landed != rows:
            raise RuntimeError(f"{sink} into {target}: {landed} rows landed, {rows} written")
        for rollup in rollups:
            counted = int(sql(url, f"SELECT sum(n) FROM {rollup}").strip() or 0)
            if counted != rows:
                raise RuntimeError(f"{sink}: view table {rollup} counts {counted} rows, "
                                   f"{rows} written")
        if sink == "tx":
            sample["metrics"] = self.metrics(sink_id)
        return sample

    def metrics(self, sink_id: str) -> dict:
        """What the driver recorded on the sink's last committed xid."""
        coord = Coordinator(self.zk, sink_id, root=self.scratch.zk_root, role="benchmark")
        epoch = SinkAdmin(coord).last_committed()
        record = coord.xid(epoch) if epoch is not None else None
        if record is None:
            raise RuntimeError(f"sink {sink_id} has no committed xid")
        wanted = (*METRICS, "branches", "partitions", "latency_ms")
        return {"epoch": epoch, **{k: record.metrics.get(k) for k in wanted}}


def job_experiment(bench: ViewBench, rows: int, partitions: int, rounds: int) -> dict:
    """Part 1: tx and plain into a target with one view, tx without it."""
    samples: dict[str, list[dict]] = {v: [] for v in JOB_VARIANTS}
    for number in range(rounds + 1):  # round 0 warms the workers up
        for variant in turned(JOB_VARIANTS, number):
            sink, shape = variant.split("_")
            views = 1 if shape == "view" else 0
            sample = bench.job(sink, bench.scratch.table(variant), views, rows, partitions,
                               f"job-{variant}")
            log(f"  job round {number}/{rounds} {variant:<10} {sample['seconds']:6.2f} s  "
                f"load {sample['load_start']:.1f}->{sample['load_end']:.1f}"
                + (f"  commit_ms {sample['metrics']['commit_ms']}" if "metrics" in sample
                   else ""))
            if number:
                samples[variant].append(sample)
    seconds = {v: [s["seconds"] for s in samples[v]] for v in JOB_VARIANTS}
    results = []
    for variant in JOB_VARIANTS:
        row = {"variant": variant, "median_s": round(statistics.median(seconds[variant]), 4),
               "rows_per_s": round(rows / statistics.median(seconds[variant])),
               "runs_s": seconds[variant],
               "load_range": [min(s["load_start"] for s in samples[variant]),
                              max(s["load_end"] for s in samples[variant])]}
        if variant.startswith("tx"):
            row["metrics_median"] = _metric_medians(samples[variant])
            row["metrics_runs"] = [s["metrics"] for s in samples[variant]]
        results.append(row)
    ratios = {
        "tx_vs_plain": _paired(seconds["plain_view"], seconds["tx_view"]),
        "tx_view_vs_tx_noview": _paired(seconds["tx_noview"], seconds["tx_view"]),
        "tx_vs_plain_noview": _paired(seconds["plain_noview"], seconds["tx_noview"]),
        "plain_view_vs_plain_noview": _paired(seconds["plain_noview"], seconds["plain_view"]),
        "tx_vs_plain_of_medians": round(statistics.median(seconds["plain_view"])
                                        / statistics.median(seconds["tx_view"]), 3),
        "tx_view_vs_tx_noview_of_medians": round(statistics.median(seconds["tx_noview"])
                                                 / statistics.median(seconds["tx_view"]), 3),
        "tx_view_minus_noview_s": _paired_difference(seconds["tx_view"], seconds["tx_noview"]),
        "plain_view_minus_noview_s": _paired_difference(seconds["plain_view"],
                                                        seconds["plain_noview"]),
    }
    return {"rows": rows, "partitions": partitions, "rounds": rounds, "results": results,
            "ratios": ratios, "goal_tx_vs_plain": GOAL_TX_VS_PLAIN,
            "goal_met": ratios["tx_vs_plain"]["median"] >= GOAL_TX_VS_PLAIN}


def epoch_experiment(bench: ViewBench, rows: int, partitions: int, rounds: int,
                     counts: Sequence[int] = VIEW_COUNTS) -> dict:
    """Part 2: tx's per-epoch metrics against the number of view tables."""
    samples: dict[int, list[dict]] = {n: [] for n in counts}
    for number in range(rounds + 1):  # round 0 warms up (and creates the sinks' trees)
        for views in turned(counts, number):
            sample = bench.job("tx", bench.scratch.table(f"epoch_v{views}"), views, rows,
                               partitions, f"epoch-v{views}")
            m = sample["metrics"]
            log(f"  epoch round {number}/{rounds} views {views}  {sample['seconds']:5.2f} s  "
                f"commit_ms {m['commit_ms']}  stage_ms {m['stage_ms']}  seal_ms "
                f"{m['seal_ms']}  branches {m['branches']}  load {sample['load_start']:.1f}")
            if number:
                samples[views].append(sample)
    results = [{"views": n, "job_median_s": round(statistics.median(
                    s["seconds"] for s in samples[n]), 4),
                "metrics_median": _metric_medians(samples[n]),
                "branches": samples[n][0]["metrics"]["branches"],
                "runs": samples[n],
                "load_range": [min(s["load_start"] for s in samples[n]),
                               max(s["load_end"] for s in samples[n])]} for n in counts]
    fits = {}
    for key in (*METRICS, "job_ms"):
        def value(sample: dict, key: str = key) -> float:
            return sample["seconds"] * 1000 if key == "job_ms" else sample["metrics"][key]
        medians = [statistics.median(value(s) for s in samples[n]) for n in counts]
        slope, intercept = statistics.linear_regression(counts, medians)
        per_round = [statistics.linear_regression(
            counts, [value(samples[n][r]) for n in counts])[0] for r in range(rounds)]
        fits[key] = {"per_view_ms": round(slope, 1), "at_0_views_ms": round(intercept, 1),
                     "per_view_ms_paired": round(statistics.median(per_round), 1),
                     "per_view_ms_rounds": [round(s, 1) for s in per_round]}
    return {"rows": rows, "partitions": partitions, "rounds": rounds, "results": results,
            "fit": fits}


def _metric_medians(samples: list[dict]) -> dict:
    return {k: round(statistics.median(s["metrics"][k] for s in samples), 1)
            for k in METRICS if all(s["metrics"].get(k) is not None for s in samples)}


def _paired_difference(mine: list[float], base: list[float]) -> float:
    """The median over rounds of mine s − base s."""
    return round(statistics.median(m - b for m, b in zip(mine, base, strict=True)), 3)


def _paired(base: list[float], mine: list[float]) -> dict:
    """base s / mine s per round (rows/s ratio of ``mine`` to ``base``): median, range."""
    ratios = [b / m for b, m in zip(base, mine, strict=True)]
    return {"median": round(statistics.median(ratios), 3),
            "rounds": [round(r, 3) for r in ratios]}


def print_report(data: dict) -> None:
    job = data["job"]
    print(f"\nbatch job ({job['rows']:,} rows, {job['partitions']} partitions, "
          f"{job['rounds']} rounds), {data['url']} (ClickHouse {data['server_version']})")
    print(table(["variant", "median s", "M rows/s", "commit_ms", "stage_ms", "seal_ms",
                 "load"],
                [[r["variant"], r["median_s"], r["rows_per_s"] / 1e6,
                  *(r.get("metrics_median", {}).get(k) for k in METRICS[:3]),
                  f"{r['load_range'][0]:.1f}–{r['load_range'][1]:.1f}"]
                 for r in job["results"]]))
    ratios = job["ratios"]
    print(f"tx ÷ plain (with the view, rows/s, paired): {ratios['tx_vs_plain']['median']} "
          f"(rounds {ratios['tx_vs_plain']['rounds']}; of medians "
          f"{ratios['tx_vs_plain_of_medians']})")
    print(f"tx with view ÷ tx without (rows/s, paired): "
          f"{ratios['tx_view_vs_tx_noview']['median']} (rounds "
          f"{ratios['tx_view_vs_tx_noview']['rounds']}; tx with − without: "
          f"{ratios['tx_view_minus_noview_s']} s)")
    print(f"without views: tx ÷ plain (rows/s, paired): "
          f"{ratios['tx_vs_plain_noview']['median']} (rounds "
          f"{ratios['tx_vs_plain_noview']['rounds']})")
    print(f"plain with view ÷ plain without (rows/s, paired): "
          f"{ratios['plain_view_vs_plain_noview']['median']} (plain with − without: "
          f"{ratios['plain_view_minus_noview_s']} s)")
    print(f"goal tx ÷ plain >= {GOAL_TX_VS_PLAIN}: "
          f"{'MET' if job['goal_met'] else 'MISSED'}")
    epoch = data["epoch"]
    print(f"\nsmall epoch ({epoch['rows']:,} rows, {epoch['partitions']} partitions, "
          f"{epoch['rounds']} rounds), tx, medians")
    print(table(["views", "branches", "job s", *METRICS, "load"],
                [[r["views"], r["branches"], r["job_median_s"],
                  *(r["metrics_median"].get(k) for k in METRICS),
                  f"{r['load_range'][0]:.1f}–{r['load_range'][1]:.1f}"]
                 for r in epoch["results"]]))
    print(table(["per view table", "ms (fit of medians)", "ms (paired per round)",
                 "at 0 views ms"],
                [[k, f["per_view_ms"], f["per_view_ms_paired"], f["at_0_views_ms"]]
                 for k, f in epoch["fit"].items()]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modern", action="store_true",
                        help=f"the 26.x server ({MODERN_URL}) and views-modern.json")
    parser.add_argument("--url", default=None, help=f"default {DEFAULT_URL}")
    parser.add_argument("--zookeeper", default="127.0.0.1:2181")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epoch-rows", type=int, default=10_000)
    parser.add_argument("--epoch-rounds", type=int, default=9)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    url = args.url or (MODERN_URL if args.modern else DEFAULT_URL)
    output = args.output or RESULTS / ("views-modern.json" if args.modern else "views.json")
    started = time.time()
    log(f"txsink from {Path(txsink.__file__).parent}; server {url}; load {load():.1f}")
    spark = start_spark()
    txsink.register(spark)
    scratch = Scratch.create(url, args.zookeeper)
    bench = ViewBench(spark, scratch)
    load_start = load()
    try:
        version = sql(url, "SELECT version()").strip()
        job = job_experiment(bench, args.rows, args.partitions, args.rounds)
        epoch = epoch_experiment(bench, args.epoch_rows, args.partitions, args.epoch_rounds)
    finally:
        bench.close()
        scratch.remove()
        spark.stop()
    data = run_record("views", "bench_views.py", started, load_start, url=url,
                      server_version=version, modern=args.modern, job=job, epoch=epoch)
    print_report(data)
    print(write_result(output, data, plot))


if __name__ == "__main__":
    main()
