"""Is it the sink's writer, or Spark's path into Python, when a task inserts slower?

``bench_sink.py --modern`` once showed clickhouse-connect inside the tasks (``mapInArrow``)
~0.17 s faster than ``clickhouse_plain`` at 1M rows. This run separates the two things
that differ: the task body (the sink's writer, ``txsink.spark.plain.insert_directly``, or
clickhouse-connect's ``insert_arrow``) and the path Spark feeds it through (``mapInArrow``
or a Python data source writer), with all four combinations on the same rows, their order
turning each round (``sinkbench/task_paths.py``). Each task records when its first and last
batch arrived and how long its INSERT took after the last one.

Usage: python benchmarks/bench_task_paths.py [--rows 1000000] [--rounds 9]
Needs the modern server (``./run services up --modern``: clickhouse-connect cannot talk to
18.16). Prints median job seconds and each variant ÷ ``map-connect`` (paired per round),
the median task phases, and writes ``benchmarks/results/task_paths.{json,png}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from plots import task_paths as plot
from sinkbench import workload
from sinkbench.environment import Scratch, load, machine, start_spark
from sinkbench.report import table
from sinkbench.rounds import turned
from sinkbench.task_paths import BODIES, PATHS, TaskPathSource, map_function

RESULTS = Path(__file__).parent / "results" / "task_paths.json"
BASELINE = "map-connect"
PHASES = ("first_s", "arrive_s", "insert_s", "task_s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8124")
    parser.add_argument("--zookeeper", default="127.0.0.1:2181")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    started = time.time()
    spark = start_spark()
    spark.dataSource.register(TaskPathSource)
    scratch = Scratch.create(args.url, args.zookeeper)
    variants = [(path, body) for path in PATHS for body in BODIES]
    log = Path(tempfile.mkdtemp(prefix="txsink-task-paths-")) / "tasks.jsonl"
    seconds: dict[str, list[float]] = {f"{p}-{b}": [] for p, b in variants}
    try:
        for number in range(args.rounds + 1):  # round 0 warms the workers up
            for path, body in turned(variants, number):
                name = f"{path}-{body}"
                target = scratch.table(name.replace("-", "_"))
                workload.create_target(args.url, target)
                df = workload.rows_frame(spark, args.rows, args.partitions)
                began = time.perf_counter()
                if path == "map":
                    df.mapInArrow(map_function(body, args.url, target, str(log)),
                                  "rows long").collect()
                else:
                    (df.write.format(TaskPathSource.name()).mode("append")
                     .options(body=body, url=args.url, table=target, log=str(log)).save())
                elapsed = time.perf_counter() - began
                if workload.count(args.url, target) != args.rows:
                    raise RuntimeError(f"{name}: rows landed differ from {args.rows}")
                if number:
                    seconds[name].append(elapsed)
            print(f"round {number}/{args.rounds} (load {load():.1f})", flush=True)
    finally:
        scratch.remove()
        spark.stop()
    tasks = [json.loads(line) for line in log.read_text().splitlines()]
    tasks = tasks[len(variants) * args.partitions:]  # the warm-up round's
    results = []
    for name, runs in seconds.items():
        base = seconds[BASELINE]
        mine = [t for t in tasks if t["variant"] == name]
        results.append({
            "variant": name, "median_s": round(statistics.median(runs), 4),
            "vs_map_connect_paired": round(statistics.median(
                b / s for b, s in zip(base, runs, strict=True)), 3),
            "runs_s": [round(s, 4) for s in runs],
            **{phase: round(statistics.median(t[phase] for t in mine), 4) for phase in PHASES},
        })
    print(table(["variant", "median job s", f"÷ {BASELINE} (paired; >1 faster)",
                 "first batch s", "batches arriving s", "INSERT after last s", "task s"],
                [[r["variant"], r["median_s"], r["vs_map_connect_paired"],
                  *(r[p] for p in PHASES)] for r in results]))
    data = {"benchmark": "task_paths", "started_at": time.strftime(
        "%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)), "duration_s": round(time.time() - started),
        "machine": machine(), "rows": args.rows, "partitions": args.partitions,
        "rounds": args.rounds, "url": args.url, "results": results}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(data, indent=2) + "\n")
    picture = plot(data, args.output.parent)
    print(f"written {args.output}" + (f" and {picture}" if picture else ""))


if __name__ == "__main__":
    main()
