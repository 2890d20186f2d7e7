"""The smallest trigger interval each sink sustains at a fixed input rate.

The number a Structured Streaming user tunes by: at ``rate`` rows per second (Spark's
``rate`` source, 2 tasks per micro-batch), each sink writes a fixed workload of
``seconds`` seconds with ``processingTime`` triggers of every interval in ``--triggers``
(``sinkbench/streaming.py``: the same query, warm-up excluded, every row checked visible).
An interval is **sustained** when the workload's micro-batches take, at the median, no
longer than the interval (``triggerExecution`` ≤ trigger: no backlog builds up) and every
row of the workload became visible before the deadline. The sinks (``tx``,
``tx_pipelined``: ``clickhouse_tx`` with ``publish=pipelined``, ``plain``) run interleaved
at each interval (order turning), so a burst of load hits all of them.

Prints per rate and sink the smallest sustained interval and, per interval, the median
micro-batch time as a share of it; writes ``trigger_floor.json``
(``trigger_floor-modern.json`` with ``--modern``) and the PNG beside it.

Usage::

    python benchmarks/bench_trigger_floor.py             # 18.16 (HTTP 8123)
    python benchmarks/bench_trigger_floor.py --modern    # 26.x (HTTP 8124)
    python benchmarks/bench_trigger_floor.py --rates 20000,100000 --triggers 0.5,1,2,5

Needs ``./run services up`` (``--modern`` for 26.x); uses its own database and
ZooKeeper root and removes both.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from plots import trigger_floor as plot
from sinkbench.environment import Scratch, load, run_record, sql, start_spark, write_result
from sinkbench.rounds import turned
from sinkbench.streaming import StreamCase, run_case

import txsink

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_URL, MODERN_URL = "http://127.0.0.1:8123", "http://127.0.0.1:8124"
SINKS = ("tx", "tx_pipelined", "plain")


def log(message: str) -> None:
    print(message, flush=True)


def sustained(result: dict) -> bool:
    """The micro-batches kept up with the interval and every row became visible."""
    median = result.get("trigger_ms_median")
    return (not result.get("error") and median is not None
            and median <= result["trigger_s"] * 1000)


def floors(results: list[dict]) -> dict[str, dict[str, float | None]]:
    """Per rate and sink: the smallest sustained interval (None: none was)."""
    found: dict[str, dict[str, float | None]] = {}
    for r in results:
        per_rate = found.setdefault(str(r["rate"]), {})
        best = per_rate.get(r["sink"])
        if sustained(r) and (best is None or r["trigger_s"] < best):
            per_rate[r["sink"]] = r["trigger_s"]
        else:
            per_rate.setdefault(r["sink"], None)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modern", action="store_true",
                        help=f"the 26.x server ({MODERN_URL}) and trigger_floor-modern.json")
    parser.add_argument("--url", default=None, help=f"default {DEFAULT_URL}")
    parser.add_argument("--zookeeper", default="127.0.0.1:2181")
    parser.add_argument("--rates", default="20000,100000", help="rows per second")
    parser.add_argument("--triggers", default="0.5,1,2,5", help="seconds")
    parser.add_argument("--seconds", type=int, default=10, help="workload per case")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    url = args.url or (MODERN_URL if args.modern else DEFAULT_URL)
    output = args.output or RESULTS / ("trigger_floor-modern.json" if args.modern
                                       else "trigger_floor.json")
    rates = [int(r) for r in args.rates.split(",")]
    triggers = [float(t) for t in args.triggers.split(",")]
    started = time.time()
    spark = start_spark()
    txsink.register(spark)
    scratch = Scratch.create(url, args.zookeeper)
    load_start = load()
    results: list[dict] = []
    try:
        version = sql(url, "SELECT version()").strip()
        log(f"server {url} ({version}), load {load_start:.1f}")
        turn = 0
        for rate in rates:
            for trigger in triggers:
                for sink in turned(SINKS, turn):
                    try:
                        results.append(run_case(spark, scratch,
                                                StreamCase(sink, trigger, rate, args.seconds),
                                                log))
                    except Exception as exc:  # noqa: BLE001 - recorded, the sweep goes on
                        log(f"  {sink} at {rate} rows/s, trigger {trigger:g} s FAILED: "
                            f"{exc!r}"[:400])
                        results.append({"sink": sink, "trigger_s": trigger, "rate": rate,
                                        "error": repr(exc)[:300]})
                turn += 1
    finally:
        scratch.remove()
        spark.stop()
    data = run_record("trigger_floor", "bench_trigger_floor.py", started, load_start, url=url,
                      server_version=version, seconds=args.seconds, results=results,
                      floors=floors(results))
    for rate, per_sink in data["floors"].items():
        log(f"{int(rate):,} rows/s: smallest sustained trigger " + ", ".join(
            f"{sink} {floor if floor is not None else 'none'} s"
            for sink, floor in per_sink.items()))
        for r in (r for r in results if str(r["rate"]) == rate):
            share = (f"{r['trigger_ms_median'] / (r['trigger_s'] * 1000):.2f}"
                     if r.get("trigger_ms_median") else "?")
            log(f"  {r['sink']:<6} trigger {r['trigger_s']:>4g} s: micro-batch ÷ interval "
                f"{share}{'' if sustained(r) else '  (not sustained)'}")
    log(write_result(output, data, plot))


if __name__ == "__main__":
    main()
