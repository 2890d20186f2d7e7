"""A streaming query whose micro-batches have 200 Spark partitions, at a 5 s trigger.

Issue 14's streaming goal: a 200-partition micro-batch at a 5 s trigger keeps up. The rate
source emits ``--rate`` rows per second (default 40,000: 200,000 rows per micro-batch, the
batch benchmark's job size); every micro-batch is repartitioned into ``--partitions``
tasks (default 200) and written by ``clickhouse_tx`` and, for comparison, by
``clickhouse_plain``, one after the other, on the 18.16 server and (if it answers) the
modern one. After the first micro-batch with rows, the workload is the next ``--seconds``
seconds of ids (``sinkbench/streaming.py``: visibility polled every 100 ms).

Printed per (server, sink): Spark's median ``triggerExecution`` and ``addBatch`` of the
micro-batches that carried the workload, the sink's median ``commit_ms`` (recorded per
epoch in ZooKeeper), mean and max visibility latency, and
whether the query kept up: every row visible, and the median micro-batch no longer than
the trigger interval. Writes ``results/streaming_partitions.json`` and ``.png``.

Measured in the same run, the **floor** of any Python sink for one micro-batch: a batch
job of the micro-batch's shape (rows and partitions) written by the no-op Python Arrow
writer (``sinkbench.noop_source``), which receives every row as a Python sink does and
writes nothing. Where it takes longer than the trigger, no Python sink can keep up on
this machine; the sinks are then judged against it (``÷ floor``).

Usage::

    python benchmarks/bench_streaming_partitions.py            # 200 partitions, 5 s, 40 s
    python benchmarks/bench_streaming_partitions.py --seconds 20 --partitions 20
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import plots
from sinkbench import environment, streaming, workload
from sinkbench.environment import Scratch, load
from sinkbench.noop_source import NAME as NOOP_ARROW
from sinkbench.noop_source import NoopArrowDataSource

import txsink
from coordinator.sink_admin import SinkAdmin

RESULTS = Path(__file__).resolve().parent / "results"


def metrics(scratch: Scratch, sink_prefix: str) -> dict:
    """The median branches per epoch (``streaming._epoch_metrics`` summarises the rest)."""
    from kazoo.client import KazooClient

    from coordinator import Coordinator
    from coordinator.plumbing.store import list_sinks

    client = KazooClient(hosts=scratch.zookeeper)
    client.start(timeout=15)
    try:
        sinks = [s for s in list_sinks(client, scratch.zk_root) if s.startswith(sink_prefix)]
        found = [r.metrics for s in sinks
                 for r in SinkAdmin(Coordinator(client, s, root=scratch.zk_root)).xids()
                 if r.metrics.get("rows")]
    finally:
        client.stop()
        client.close()
    return {"branches_median": statistics.median([m.get("branches", 0) for m in found])
            if found else None}


def python_floor(spark, rows: int, partitions: int, rounds: int = 3) -> dict:
    """Seconds the no-op Python Arrow writer takes for one micro-batch's rows and
    partitions (a batch job; the first, warm-up run is not counted)."""
    frame = workload.rows_frame(spark, rows, 2).repartition(partitions)
    seconds = []
    for _ in range(rounds + 1):
        started = time.perf_counter()
        frame.write.format(NOOP_ARROW).mode("append").save()
        seconds.append(time.perf_counter() - started)
    return {"rows": rows, "partitions": partitions, "seconds": [round(s, 3) for s in seconds[1:]],
            "median_ms": round(statistics.median(seconds[1:]) * 1000, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8123", help="the 18.16 server")
    parser.add_argument("--modern-url", default="http://127.0.0.1:8124",
                        help="a modern server, used if it answers")
    parser.add_argument("--zookeeper", default="127.0.0.1:2181")
    parser.add_argument("--partitions", type=int, default=200)
    parser.add_argument("--trigger", type=float, default=5.0, help="seconds")
    parser.add_argument("--rate", type=int, default=40_000, help="rows per second")
    parser.add_argument("--seconds", type=int, default=40, help="the workload's length")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=FutureWarning)
    servers = [("ch18", args.url)]
    try:
        environment.sql(args.modern_url, "SELECT 1", timeout=5)
        servers.append(("ch26", args.modern_url))
    except Exception as exc:  # noqa: BLE001 - the modern server is optional
        print(f"modern server skipped: {exc}"[:200])
    spark = environment.start_spark(2, 10_000)
    txsink.register(spark)
    spark.dataSource.register(NoopArrowDataSource)
    started, results = time.time(), []
    try:
        floor = python_floor(spark, int(args.rate * args.trigger), args.partitions)
        print(f"floor: the no-op Python writer takes {floor['median_ms']:,.0f} ms for one "
              f"micro-batch ({floor['seconds']} s)", flush=True)
        for name, url in servers:
            scratch = Scratch.create(url, args.zookeeper)
            try:
                for sink in ("tx", "plain"):
                    case = streaming.StreamCase(sink, args.trigger, args.rate, args.seconds,
                                                args.partitions)
                    result = streaming.run_case(spark, scratch, case, print)
                    if sink == "tx":
                        result["epoch_metrics"].update(metrics(scratch, "stream-tx"))
                    trigger_ms = result.get("trigger_ms_median")
                    result.update(server=name, keeps_up=bool(
                        not result.get("error") and trigger_ms is not None
                        and trigger_ms <= args.trigger * 1000))
                    results.append(result)
            finally:
                scratch.remove()
    finally:
        spark.stop()
    print(f"\n### {args.partitions}-partition micro-batches at a {args.trigger:g} s trigger "
          f"({args.rate:,} rows/s, {args.rate * args.trigger:,.0f} rows per micro-batch)\n")
    print("| server | sink | micro-batches | triggerExecution ms | ÷ floor | addBatch ms | "
          "commit_ms | latency mean / max s | keeps up |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for r in results:
        epoch = r.get("epoch_metrics") or {}
        trigger_ms = r.get("trigger_ms_median")
        ratio = f"{trigger_ms / floor['median_ms']:.2f}" if trigger_ms else ""
        print(f"| {r['server']} | {r['sink']} | {r.get('micro_batches')} | "
              f"{trigger_ms} | {ratio} | {r.get('add_batch_ms_median')} | "
              f"{epoch.get('commit_ms_median', '')} | "
              f"{r.get('latency_mean_s')} / {r.get('latency_max_s')} | "
              f"{'yes' if r['keeps_up'] else 'NO'} |")
    print(f"| – | no-op Python writer (floor, batch job) | {len(floor['seconds'])} | "
          f"{floor['median_ms']} | 1.00 | | | | | "
          f"{'yes' if floor['median_ms'] <= args.trigger * 1000 else 'NO'} |")
    if floor["median_ms"] > args.trigger * 1000:
        print(f"\nno Python sink can keep up here: the floor alone takes "
              f"{floor['median_ms'] / 1000:.1f} s per micro-batch, over the "
              f"{args.trigger:g} s trigger")
    out = {"benchmark": "streaming, partitions per micro-batch (issue 14)",
           "command": " ".join(["python", *sys.argv]), "machine": environment.machine(),
           "started_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)),
           "load_end": load(), "floor": floor, "results": results}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "streaming_partitions.json").write_text(json.dumps(out, indent=1) + "\n")
    picture = plots.streaming_partitions(out, args.out)
    print(f"\nwritten {args.out / 'streaming_partitions.json'} and {picture}")


if __name__ == "__main__":
    main()
