"""What keeping bad rows (``bad_rows=quarantine``) costs ``clickhouse_tx``.

With ``bad_rows=quarantine`` every batch is checked for *all* its bad rows (a mask per
check, ``server_ext/types/bad_values.py``), the good rows are sent and the bad ones staged into
the quarantine share of their branch, published under the same decision
(``txsink/core/quarantine_share.py``). This run measures, on one server, a 1M-row batch job in 2
Spark partitions with the rows of ``bench_sink.py`` (``sinkbench/workload.py``) plus a
``code UInt8`` column:

- ``fail_clean``: ``bad_rows=fail`` (the default), no bad row;
- ``quarantine_clean``: ``bad_rows=quarantine``, no bad row;
- ``quarantine_bad``: ``bad_rows=quarantine``, 1% of the rows (``id % 100 == 0``) with
  ``code = 300``, which UInt8 cannot hold: 990,000 rows reach the target, 10,000 the
  quarantine table.

Rounds are interleaved and the variants' order turns each round
(``sinkbench/rounds.turned``); round 0 warms the workers up and is not counted. Ratios
are of input rows/s (above 1: faster), paired per round: ``bad ÷ clean`` = fail_clean s
÷ quarantine_bad s (goal >= 0.9), ``bad ÷ quarantine clean`` and ``quarantine clean ÷ fail
clean``; and the machine's CPU seconds per job (``sinkbench.environment.cpu_seconds``:
Spark, its workers and the servers), paired the same way, a steadier figure than
seconds on 2 cores. Every job's rows are checked in the target and in the quarantine table, and the
sink's own per-epoch metrics (``stage_ms``, ``seal_ms``: the slowest task's; ``commit_ms``,
``cleanup_ms``) are read back from the xid's record.

Usage::

    python benchmarks/bench_bad_rows.py --modern   # 26.x (HTTP 8124): bad_rows-modern.json
    python benchmarks/bench_bad_rows.py            # 18.16 (HTTP 8123): bad_rows.json
    python benchmarks/bench_bad_rows.py --rounds 3 --rows 200000

Needs ClickHouse and ZooKeeper (``./run services up``, ``--modern`` for 26.x); uses its
own database and ZooKeeper root and removes both. Writes ``benchmarks/results/
bad_rows[-modern].json`` and the PNG beside it.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from kazoo.client import KazooClient
from sinkbench import workload
from sinkbench.environment import (
    Scratch,
    cpu_seconds,
    load,
    run_record,
    sql,
    start_spark,
    write_result,
)
from sinkbench.report import table
from sinkbench.rounds import turned

import txsink
from coordinator import Coordinator
from coordinator.sink_admin import SinkAdmin
from server_ext.sql import qualified_name

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_URL = "http://127.0.0.1:8123"
MODERN_URL = "http://127.0.0.1:8124"
VARIANTS = ("fail_clean", "quarantine_clean", "quarantine_bad")
METRICS = ("stage_ms", "seal_ms", "commit_ms", "cleanup_ms")
GOAL_BAD_VS_CLEAN = 0.9
BAD_EVERY = 100  # one row in BAD_EVERY is bad in quarantine_bad


def log(message: str) -> None:
    print(message, flush=True)


def create_target(url: str, target: str) -> None:
    """(Re)create the target: the workload's columns and ``code UInt8``."""
    qualified = qualified_name(*target.split(".", 1))
    sql(url, f"DROP TABLE IF EXISTS {qualified}")
    sql(url, f"CREATE TABLE {qualified} ({workload.COLUMNS_DDL}, code UInt8) "
             "ENGINE = MergeTree() PARTITION BY toYYYYMMDD(ts) ORDER BY id")


def frame(spark, rows: int, partitions: int, bad: bool):
    code = (f"CAST(CASE WHEN id % {BAD_EVERY} = 0 THEN 300 ELSE id % 200 END AS INT)"
            if bad else "CAST(id % 200 AS INT)")
    return spark.range(0, rows, 1, partitions).selectExpr(
        *workload.row_expressions("id"), f"{code} AS code")


def metrics(scratch: Scratch, sink_id: str) -> dict:
    """What the driver recorded on the sink's last committed xid."""
    zk = KazooClient(hosts=scratch.zookeeper)
    zk.start(timeout=15)
    try:
        coord = Coordinator(zk, sink_id, root=scratch.zk_root, role="benchmark")
        record = coord.xid(SinkAdmin(coord).last_committed())
    finally:
        zk.stop()
        zk.close()
    return {k: record.metrics.get(k) for k in (*METRICS, "branches", "quarantined")}


def job(spark, scratch: Scratch, variant: str, rows: int, partitions: int) -> dict:
    """One job of ``variant`` into a fresh target and quarantine table, checked after."""
    url = scratch.url
    target, quarantine = scratch.table(variant), scratch.table(f"{variant}_quarantine")
    create_target(url, target)  # untimed
    sql(url, f"DROP TABLE IF EXISTS {qualified_name(*quarantine.split('.', 1))}")
    options = {"url": url, "table": target, "zookeeper": scratch.zookeeper,
               "zk_root": scratch.zk_root, "sink_id": f"bad-rows-{variant}"}
    if variant.startswith("quarantine"):
        options.update(bad_rows="quarantine", quarantine_table=quarantine)
    bad = variant.endswith("_bad")
    df = frame(spark, rows, partitions, bad)
    sample: dict = {"load_start": load()}
    started, cpu = time.perf_counter(), cpu_seconds()
    df.write.format("clickhouse_tx").options(**options).mode("append").save()
    sample["seconds"] = round(time.perf_counter() - started, 4)
    sample["cpu_s"] = round(cpu_seconds() - cpu, 2)
    sample["load_end"] = load()
    expected_bad = (rows + BAD_EVERY - 1) // BAD_EVERY if bad else 0
    landed = workload.count(url, target)
    kept = workload.count(url, quarantine) if options.get("bad_rows") else 0
    if (landed, kept) != (rows - expected_bad, expected_bad):
        raise RuntimeError(f"{variant}: {landed} rows in the target and {kept} in quarantine, "
                           f"expected {rows - expected_bad} and {expected_bad}")
    sample["metrics"] = metrics(scratch, options["sink_id"])
    return sample


def experiment(spark, scratch: Scratch, rows: int, partitions: int, rounds: int) -> dict:
    samples: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for number in range(rounds + 1):  # round 0 warms the workers up
        for variant in turned(VARIANTS, number):
            sample = job(spark, scratch, variant, rows, partitions)
            m = sample["metrics"]
            log(f"  round {number}/{rounds} {variant:<17} {sample['seconds']:6.2f} s  "
                f"cpu {sample['cpu_s']:5.2f} s  "
                f"load {sample['load_start']:.1f}->{sample['load_end']:.1f}  "
                + "  ".join(f"{k} {m[k]}" for k in (*METRICS, "branches")))
            if number:
                samples[variant].append(sample)
    seconds = {v: [s["seconds"] for s in samples[v]] for v in VARIANTS}
    cpu = {v: [s["cpu_s"] for s in samples[v]] for v in VARIANTS}
    results = [{"variant": v, "median_s": round(statistics.median(seconds[v]), 4),
                "median_cpu_s": round(statistics.median(cpu[v]), 2), "runs_cpu_s": cpu[v],
                "rows_per_s": round(rows / statistics.median(seconds[v])),
                "runs_s": seconds[v],
                "metrics_median": {k: round(statistics.median(s["metrics"][k]
                                                              for s in samples[v]), 1)
                                   for k in METRICS},
                "metrics_runs": [s["metrics"] for s in samples[v]],
                "load_range": [min(s["load_start"] for s in samples[v]),
                               max(s["load_end"] for s in samples[v])]} for v in VARIANTS]
    ratios = {
        "bad_vs_clean": _paired(seconds["fail_clean"], seconds["quarantine_bad"]),
        "bad_vs_quarantine_clean": _paired(seconds["quarantine_clean"],
                                           seconds["quarantine_bad"]),
        "quarantine_clean_vs_fail_clean": _paired(seconds["fail_clean"],
                                                  seconds["quarantine_clean"]),
        "bad_vs_clean_of_medians": round(statistics.median(seconds["fail_clean"])
                                         / statistics.median(seconds["quarantine_bad"]), 3),
        "cpu_bad_vs_clean": _paired(cpu["fail_clean"], cpu["quarantine_bad"]),
    }
    return {"rows": rows, "partitions": partitions, "rounds": rounds,
            "bad_rows": (rows + BAD_EVERY - 1) // BAD_EVERY, "results": results,
            "ratios": ratios, "goal_bad_vs_clean": GOAL_BAD_VS_CLEAN,
            "goal_met": ratios["bad_vs_clean"]["median"] >= GOAL_BAD_VS_CLEAN}


def _paired(base: list[float], mine: list[float]) -> dict:
    """base s / mine s per round (rows/s ratio of ``mine`` to ``base``): median, range."""
    ratios = [b / m for b, m in zip(base, mine, strict=True)]
    return {"median": round(statistics.median(ratios), 3),
            "rounds": [round(r, 3) for r in ratios]}


def plot(data: dict, out: Path) -> Path | None:
    """Each variant's seconds per round (dots) and median (bar)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    job_data = data["job"]
    rows = job_data["results"]
    fig, axes = plt.subplots(figsize=(6, 3.5))
    labels = [r["variant"] for r in rows]
    axes.bar(labels, [r["median_s"] for r in rows], width=0.5,
             color=["#aec7e8", "#98df8a", "#2ca02c"])
    for label, r in zip(labels, rows, strict=True):
        axes.scatter([label] * len(r["runs_s"]), r["runs_s"], color="black", s=8, zorder=3)
    ratio = job_data["ratios"]["bad_vs_clean"]["median"]
    axes.set_ylabel("job seconds (bar: median, dots: rounds)", fontsize=8)
    axes.set_title(f"{job_data['rows']:,} rows, {job_data['partitions']} tasks, 1% bad: "
                   f"bad ÷ clean {ratio} (goal {job_data['goal_bad_vs_clean']})", fontsize=9)
    axes.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    picture = out / f"{Path(data['output']).stem}.png"
    fig.savefig(picture, dpi=110)
    plt.close(fig)
    return picture


def print_report(data: dict) -> None:
    job_data = data["job"]
    print(f"\nbatch job ({job_data['rows']:,} rows, {job_data['partitions']} partitions, "
          f"{job_data['rounds']} rounds), {data['url']} (ClickHouse {data['server_version']})")
    print(table(["variant", "median s", "M rows/s", "machine CPU s", *METRICS, "load"],
                [[r["variant"], r["median_s"], r["rows_per_s"] / 1e6, r["median_cpu_s"],
                  *(r["metrics_median"][k] for k in METRICS),
                  f"{r['load_range'][0]:.1f}–{r['load_range'][1]:.1f}"]
                 for r in job_data["results"]]))
    ratios = job_data["ratios"]
    for key, label in (("bad_vs_clean", "1% bad in quarantine ÷ none, fail mode"),
                       ("bad_vs_quarantine_clean", "1% bad ÷ none, both quarantine"),
                       ("quarantine_clean_vs_fail_clean", "quarantine ÷ fail, none bad"),
                       ("cpu_bad_vs_clean", "machine CPU per job, none (fail mode) ÷ 1% bad")):
        print(f"{label} (input rows/s, paired): {ratios[key]['median']} "
              f"(rounds {ratios[key]['rounds']})")
    print(f"goal 1% bad ÷ none >= {GOAL_BAD_VS_CLEAN}: "
          f"{'MET' if job_data['goal_met'] else 'MISSED'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modern", action="store_true",
                        help=f"the 26.x server ({MODERN_URL}) and bad_rows-modern.json")
    parser.add_argument("--url", default=None, help=f"default {DEFAULT_URL}")
    parser.add_argument("--zookeeper", default="127.0.0.1:2181")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    url = args.url or (MODERN_URL if args.modern else DEFAULT_URL)
    output = args.output or RESULTS / ("bad_rows-modern.json" if args.modern
                                       else "bad_rows.json")
    started = time.time()
    log(f"txsink from {Path(txsink.__file__).parent}; server {url}; load {load():.1f}")
    spark = start_spark()
    txsink.register(spark)
    scratch = Scratch.create(url, args.zookeeper)
    load_start = load()
    try:
        version = sql(url, "SELECT version()").strip()
        result = experiment(spark, scratch, args.rows, args.partitions, args.rounds)
    finally:
        scratch.remove()
        spark.stop()
    data = run_record("bad_rows", "bench_bad_rows.py", started, load_start, url=url,
                      server_version=version, modern=args.modern, output=str(output),
                      job=result)
    print_report(data)
    print(write_result(output, data, plot))


if __name__ == "__main__":
    main()
