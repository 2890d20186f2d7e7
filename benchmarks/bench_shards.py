"""``clickhouse_tx`` into one server against 2 shards: the cost of sharding (issue 8).

What it measures: the same rows (those of ``bench_sink.py``: id, 20-character name,
score, timestamp; here over 5 days, see ``DAYS``) written by ``clickhouse_tx`` in batch
append mode, one job = one xid, into the day-partitioned ``MergeTree`` of ``bench_sink.py``
on

- ``one_server`` — shard 1's server alone (no ``shards`` option);
- ``two_shards_id`` — both shards (1 replica each) through the ``shards`` option with
  ``sharding_key=id``: a bare integer column, routed with numpy, no chdb;
- ``two_shards_hash`` — the same with ``sharding_key=cityHash64(id)``, evaluated by chdb
  in the Python workers (left out when chdb is not installed).

Every (case, variant) runs once per round, in the same order (rounds interleaved, see
``sinkbench/rounds.py``); figures are medians and the ratio to ``one_server`` is paired
(median of per-round ratios). Before each measurement the target is recreated on both
shards (untimed); after it, the benchmark checks that the shards hold exactly the rows
written (count and distinct ids summed over shards), that every row sits on the shard
the key names (checked with the 18.16 server's own functions), and that the sink left no
staging table; then it drops the target.

Read the ratio for what it is: both shards run on the same 2-core machine as Spark,
so a second shard adds no CPU. The ratio shows the protocol's overhead of sharding (a
branch per shard per task, routing each batch, describing and publishing on every
shard), not how a cluster scales.

The shards: by default the benchmark starts its own 2 x 1 layout of ClickHouse servers
(``tests.harness.services.Cluster``, HTTP ports ``--port-base`` + 11 and + 21, files under
``--home``, the shared ZooKeeper; the main server's config is not touched) and stops
the servers it started at the end. ``--shard-urls "http://a:p;http://b:p"`` uses two
running servers instead (e.g. the r1 replicas of the test cluster, 28511 and 28521); it
only creates and drops its own database there.

Usage::

    python benchmarks/bench_shards.py            # 1M rows, 2 and 4 partitions, 5 rounds
    python benchmarks/bench_shards.py --quick    # smoke run (results/quick)
    python benchmarks/bench_shards.py --shard-urls "http://127.0.0.1:28511;http://127.0.0.1:28521"

Prints the table; writes ``shards.json`` into ``--out`` (``benchmarks/results`` by
default, ``benchmarks/results/quick`` with ``--quick``) and draws ``shards.png`` there.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import statistics
import sys
import time
import traceback
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import plots
from kazoo.client import KazooClient
from sinkbench import environment, report, workload
from sinkbench.environment import load, sql
from sinkbench.memory import PeakMemory, jvm_pid
from sinkbench.rounds import Case, Sample, summarize

from coordinator import Coordinator, SinkAdmin
from server_ext.sql import qualified_name, quote_identifier
from server_ext.staging import STAGING_DATABASE
from tests.harness.services import Cluster, ClusterServer, ZooKeeper

RESULTS = Path(__file__).resolve().parent / "results"
BASELINE = "one_server"
DEFAULT_HOME = Path("/tmp/txsink-bench-shards")
DEFAULT_PORT_BASE = 29500
#: Timestamps over 5 days, not bench_sink's 4: with 4, day = id % 4 would give each shard
#: of ``id % 2`` only 2 of the days, and its branches fewer partitions to publish.
DAYS = 5
METRIC_KEYS = ("branches", "partitions", "stage_ms", "seal_ms", "commit_ms")
CAVEAT = ("Both shards share the same 2 CPUs with Spark and each other: the ratio is the "
          "protocol's overhead of sharding, not cluster scaling.")


@dataclass(frozen=True)
class Variant:
    """One way of writing the rows: to shard 1 alone or to both shards by a key."""

    name: str
    label: str
    shards: int
    sharding_key: str | None = None
    needs_chdb: bool = False


VARIANTS = (
    Variant(BASELINE, "1 server", 1),
    Variant("two_shards_id", "2 shards, key id", 2, "id"),
    Variant("two_shards_hash", "2 shards, cityHash64(id) (chdb)", 2, "cityHash64(id)",
            needs_chdb=True),
)


@dataclass(frozen=True)
class Plan:
    rows: int = 1_000_000
    partitions: tuple[int, ...] = (2, 4)
    rounds: int = 5


QUICK = Plan(rows=100_000, partitions=(2,), rounds=1)


def log(message: str) -> None:
    print(message, flush=True)


@dataclass
class Topology:
    """The two shards' URLs, and the servers this run started (stopped at the end)."""

    urls: list[str]
    started: list[ClusterServer] = field(default_factory=list)
    own: bool = False

    @classmethod
    def start_own(cls, home: Path, port_base: int, zookeeper: str) -> Topology:
        port = int(zookeeper.rsplit(":", 1)[1]) if ":" in zookeeper else 2181
        cluster = Cluster(home, ZooKeeper(home, port=port), None, 2, 1,
                          name="txsink_bench", port_base=port_base)
        running = {s.name for s in cluster.servers if s.process.pid() is not None}
        if running:
            log(f"reusing running servers {sorted(running)} under {home} (left running)")
        began = time.time()
        cluster.up()
        started = [s for s in cluster.servers if s.name not in running]
        log(f"shards up in {time.time() - began:.1f} s: "
            + ", ".join(s.url for s in cluster.servers))
        return cls([s.url for s in cluster.servers], started, own=True)

    def stop(self) -> None:
        for server in self.started:
            server.stop()
        if self.started:
            log("stopped " + ", ".join(s.name for s in self.started))


@dataclass(frozen=True)
class Scratch:
    """The run's database on both shards and its ZooKeeper root."""

    urls: tuple[str, ...]
    zookeeper: str
    run: str

    @property
    def database(self) -> str:
        return f"bench_shards_{self.run}"

    @property
    def table(self) -> str:
        return f"{self.database}.target"

    @property
    def zk_root(self) -> str:
        return f"/bench/shards-{self.run}"

    def sink_id(self, variant: str, case: Case) -> str:
        return f"shards-{self.run}-{variant}-{case.key}"

    def create(self) -> None:
        for url in self.urls:
            sql(url, f"CREATE DATABASE {quote_identifier(self.database)}")

    def remove(self, sink_ids: set[str]) -> list[str]:
        """Drop the database everywhere, the staging tables the sinks left (returned: the
        sink should have dropped them) and the ZooKeeper root."""
        leftovers = []
        for url in self.urls:
            sql(url, f"DROP DATABASE IF EXISTS {quote_identifier(self.database)}")
            for name in environment.staging_tables(url, sink_ids):
                sql(url, f"DROP TABLE IF EXISTS {qualified_name(STAGING_DATABASE, name)}")
                leftovers.append(f"{url} {name}")
        environment.delete_zk_root(self.zookeeper, self.zk_root)
        return leftovers



class ShardBench:
    """Measures the variants on the same rows, in one Spark session."""

    def __init__(self, spark, scratch: Scratch, block_rows: int) -> None:
        self.spark = spark
        self.scratch = scratch
        self.block_rows = block_rows
        self.jvm = jvm_pid(spark)
        self.sink_ids: set[str] = set()

    def options(self, variant: Variant, case: Case) -> dict[str, str]:
        s = self.scratch
        self.sink_ids.add(s.sink_id(variant.name, case))
        options = {"url": s.urls[0], "table": s.table, "zookeeper": s.zookeeper,
                   "zk_root": s.zk_root, "sink_id": s.sink_id(variant.name, case),
                   "insert_block_rows": str(self.block_rows)}
        if variant.shards > 1:
            options["shards"] = ";".join(s.urls[:variant.shards])
            options["sharding_key"] = variant.sharding_key or ""
        return options

    def measure(self, variant: Variant, case: Case, label: str = "") -> Sample:
        for url in self.scratch.urls:
            workload.create_target(url, self.scratch.table)  # untimed
        df = workload.rows_frame(self.spark, case.rows, case.partitions, DAYS)
        load_start = load()
        try:
            with PeakMemory(self.jvm) as memory:
                started = time.perf_counter()
                (df.write.format("clickhouse_tx").options(**self.options(variant, case))
                 .mode("append").save())
                seconds = time.perf_counter() - started
            self.verify(variant, case)
        except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
            log(f"  {variant.name} {case.key} FAILED: {exc!r}"[:600])
            log(traceback.format_exc(limit=4))
            return Sample(None, load_start, load(), error=repr(exc)[:500])
        finally:
            for url in self.scratch.urls:
                sql(url, f"DROP TABLE IF EXISTS {self.scratch.table}")
        sample = Sample(round(seconds, 4), load_start, load(), memory.peaks)
        log(f"  {label:<9} p{case.partitions} {variant.name:<16} {seconds:7.2f} s  "
            f"{case.rows / seconds / 1e6:6.3f} M rows/s  "
            f"load {load_start:.1f}->{sample.load_end:.1f}")
        return sample

    def verify(self, variant: Variant, case: Case) -> None:
        """Exactly the rows written, each on the shard its key names, no staging left."""
        n = variant.shards
        key = variant.sharding_key or "0"
        counts, distinct, misplaced, outside = 0, 0, 0, 0
        per_shard = []
        for index, url in enumerate(self.scratch.urls):
            got = sql(url, f"SELECT count(), uniqExact(id), countIf(({key}) % {n} != {index}),"
                           f" countIf(id < 0 OR id >= {case.rows}) FROM {self.scratch.table}")
            c, d, m, o = (int(v) for v in got.split())
            per_shard.append(c)
            counts, distinct, outside = counts + c, distinct + d, outside + o
            misplaced += m if index < n else c  # a shard the variant does not write: empty
        problems = []
        if counts != case.rows or distinct != case.rows or outside:
            problems.append(f"{counts} rows ({distinct} distinct ids, {outside} out of range) "
                            f"landed, {case.rows} written; per shard {per_shard}")
        if misplaced:
            problems.append(f"{misplaced} rows on a shard the key {key!r} does not name "
                            f"(per shard {per_shard})")
        sink = self.scratch.sink_id(variant.name, case)
        left = {url: t for url in self.scratch.urls
                if (t := environment.staging_tables(url, {sink}))}
        if left:
            problems.append(f"staging tables left after the commit: {left}")
        if problems:
            raise RuntimeError(f"{variant.name}: " + "; ".join(problems))

    def rounds(self, variants: list[Variant], cases: list[Case], rounds: int) -> list[dict]:
        samples: dict[tuple[Case, str], list[Sample]] = {
            (c, v.name): [] for c in cases for v in variants}
        for number in range(rounds):
            log(f"round {number + 1}/{rounds} (load {load():.1f})")
            # Rotated each round, so no variant is always the first after a pause.
            order = variants[number % len(variants):] + variants[:number % len(variants)]
            for case in cases:
                for variant in order:
                    samples[(case, variant.name)].append(
                        self.measure(variant, case, f"r{number + 1}"))
        rows = []
        for case in cases:
            base = {BASELINE: samples[(case, BASELINE)]}
            for variant in variants:
                row = summarize(case, variant.name, samples[(case, variant.name)], base)
                row.update(label=variant.label, shards=variant.shards,
                           sharding_key=variant.sharding_key,
                           sink_metrics=self.sink_metrics(variant, case))
                rows.append(row)
        return rows

    def sink_metrics(self, variant: Variant, case: Case) -> dict:
        """Medians of what the sink recorded in ZooKeeper for this (variant, case)'s xids:
        branches, partitions, stage/seal (slowest task) and commit (driver) ms."""
        client = KazooClient(hosts=self.scratch.zookeeper)
        client.start(timeout=15)
        try:
            records = SinkAdmin(Coordinator(client, self.scratch.sink_id(variant.name, case),
                                            root=self.scratch.zk_root)).xids()
        except Exception as exc:  # noqa: BLE001 - the figures stand without it
            return {"error": repr(exc)[:200]}
        finally:
            client.stop()
            client.close()
        metrics = [r.metrics for r in records if r.metrics.get("rows")]
        summary: dict = {"epochs": len(metrics)}
        for key in METRIC_KEYS:
            values = [m[key] for m in metrics if key in m]
            summary[key] = round(statistics.median(values), 1) if values else None
        return summary

    def warm_up(self, variants: list[Variant]) -> None:
        """Worker start-up, imports and chdb's first query: not measured."""
        for variant in variants:
            self.measure(variant, Case(10_000, 2), "warm-up")


def render(rows: list[dict]) -> str:
    return report.table(
        ("variant", "partitions", "median s", "M rows/s", "× 1 server (paired)",
         "× 1 server (medians)", "branches", "commit ms", "failures", "load",
         "largest worker MB"),
        [(r["label"], r["partitions"], r["median_s"],
          r["rows_per_s"] / 1e6 if r["rows_per_s"] else None,
          r["paired_ratio"].get(BASELINE), r["ratio"].get(BASELINE),
          r["sink_metrics"].get("branches"), r["sink_metrics"].get("commit_ms"),
          r["failures"], f"{r['load_range'][0]:.1f}–{r['load_range'][1]:.1f}",
          r["memory_peak"]["worker_max_mb"]) for r in rows])


def ratios(rows: list[dict]) -> list[dict]:
    """Each 2-shard variant ÷ 1 server, per partition count and pooled over them."""
    out = []
    for name in dict.fromkeys(r["variant"] for r in rows if r["variant"] != BASELINE):
        mine = [r for r in rows if r["variant"] == name and BASELINE in r["paired_ratio"]]
        if not mine:
            continue
        out.append({"variant": name, "label": mine[0]["label"],
                    "paired_ratio_by_partitions": {r["partitions"]: r["paired_ratio"][BASELINE]
                                                   for r in mine},
                    "median_over_partitions": round(statistics.median(
                        r["paired_ratio"][BASELINE] for r in mine), 3)})
    return out


def run(plan: Plan, args: argparse.Namespace) -> dict:
    started, load_start = time.time(), load()
    variants = [v for v in VARIANTS if not v.needs_chdb or importlib.util.find_spec("chdb")]
    if len(variants) < len(VARIANTS):
        log("chdb is not installed: two_shards_hash left out (pip install txsink[cluster])")
    if args.shard_urls:
        urls = [u.strip() for u in args.shard_urls.split(";") if u.strip()]
        if len(urls) != 2 or any("," in u for u in urls):
            raise SystemExit("--shard-urls: exactly 2 shards of one URL each")
        topology = Topology(urls)
    else:
        topology = Topology.start_own(args.home, args.port_base, args.zookeeper)
    scratch = Scratch(tuple(topology.urls), args.zookeeper, uuid.uuid4().hex[:8])
    spark, bench = None, None
    leftovers: list[str] = []
    try:
        versions = [sql(u, "SELECT version()").strip() for u in topology.urls]
        scratch.create()
        spark = environment.start_spark(cores=2, arrow_batch_rows=args.arrow_batch_rows)
        settings = environment.spark_settings(spark)
        import txsink

        txsink.register(spark)
        bench = ShardBench(spark, scratch, args.insert_block_rows)
        bench.warm_up(variants)
        cases = [Case(plan.rows, p, args.insert_block_rows) for p in plan.partitions]
        rows = bench.rounds(variants, cases, plan.rounds)
    finally:
        if spark is not None:
            spark.stop()
        try:
            leftovers = scratch.remove(bench.sink_ids if bench else set())
        finally:
            topology.stop()
    return {
        "benchmark": "clickhouse_tx: one server vs 2 shards (1 replica each)",
        "command": " ".join(["python", *sys.argv]),
        "started_at": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(started)),
        "duration_s": round(time.time() - started, 1),
        "machine": environment.machine(),
        "clickhouse": versions,
        "spark": settings,
        "load": {"start": load_start, "end": load()},
        "plan": plan.__dict__,
        "topology": {"shard_urls": topology.urls, "started_by_benchmark": topology.own},
        "caveat": CAVEAT,
        "results": rows,
        "ratios": ratios(rows),
        "staging_left_at_end": leftovers,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 100k rows, 1 round")
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--partitions", type=int, nargs="+", default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--shard-urls", default=None,
                        help='two running servers, "http://a:p;http://b:p" (default: start '
                             "a 2x1 layout of its own)")
    parser.add_argument("--port-base", type=int, default=DEFAULT_PORT_BASE,
                        help="port base of the layout it starts (HTTP base+11, base+21)")
    parser.add_argument("--home", type=Path, default=DEFAULT_HOME,
                        help="files of the layout it starts")
    parser.add_argument("--zookeeper", default="127.0.0.1:2181")
    parser.add_argument("--insert-block-rows", type=int, default=1_048_576)
    parser.add_argument("--arrow-batch-rows", type=int, default=environment.ARROW_BATCH_ROWS)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    plan = QUICK if args.quick else Plan()
    plan = Plan(rows=args.rows or plan.rows,
                partitions=tuple(args.partitions or plan.partitions),
                rounds=args.rounds or plan.rounds)
    logging.getLogger("txsink").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning)  # pyspark on pandas 3
    results = run(plan, args)
    results["quick"] = args.quick
    print(f"\n### clickhouse_tx: one server vs 2 shards ({plan.rows:,} rows, "
          f"{plan.rounds} rounds, local[2])\n\n{render(results['results'])}\n")
    for ratio in results["ratios"]:
        by = ", ".join(f"{p} partitions {v:.2f}"
                       for p, v in ratio["paired_ratio_by_partitions"].items())
        print(f"{ratio['label']} ÷ 1 server (paired): {by}")
    print(CAVEAT)
    if results["staging_left_at_end"]:
        print(f"staging tables the sink left (dropped now): {results['staging_left_at_end']}")
    out = args.out or (RESULTS / "quick" if args.quick else RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    (out / "shards.json").write_text(json.dumps(results, indent=1) + "\n")
    picture = plots.shards(results, out)
    print(f"written {out / 'shards.json'}" + (f" and {picture}" if picture else "")
          + f" in {results['duration_s']:.0f} s (load {results['load']['start']:.1f} -> "
          f"{results['load']['end']:.1f})")
    failures = sum(r["failures"] for r in results["results"])
    if failures:
        print(f"{failures} measurement(s) FAILED (see the log above and shards.json)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
