"""Carried rows (``carry_max_bytes``) in time: batch jobs and a stream, against ``plain``.

One run on one server, every figure a paired ratio of interleaved rounds
(``sinkbench/rounds.py``):

- batch jobs of ``--rows`` rows (2 partitions): ``plain``, ``tx``, ``tx_carried``,
  ``write``, ``write_carried`` and, on servers clickhouse-connect supports,
  ``connect_driver`` (``sinkbench/variants.py``; the ``*_carried`` variants set
  ``carry_max_bytes=16777216``: a task of up to ~350,000 benchmark rows carries, a
  larger one stages as without the option);
- a stream of ``--files`` parquet files of 100,000 rows, one per micro-batch
  (``bench_pipelined.py``): ``clickhouse_tx`` inline with and without carry, and with
  ``--pipelined`` the same with ``publish=pipelined``, against ``clickhouse_plain``;
  the time until every row is visible.

Each round's ratio is ``plain`` s ÷ variant s (rows/s over rows/s: above 1 = faster than
``plain``); printed and written are the median and the min–max over rounds, and the
same for ``tx_carried`` against ``tx`` (``write_carried`` against ``write``, …).

Usage::

    python benchmarks/bench_carried.py --modern --rounds 5     # 26.x (HTTP 8124)
    python benchmarks/bench_carried.py --rounds 5              # 18.16 (HTTP 8123)
    python benchmarks/bench_carried.py --rows 100000 --no-stream --rounds 3

Writes ``carried_ch26.json`` (``carried_ch18.json`` without ``--modern``) into
``benchmarks/results``. Needs ``./run services up``; uses its own database, tables and
ZooKeeper roots and removes them.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import statistics
import tempfile
import time
import uuid
import warnings
from pathlib import Path

import bench_pipelined
from sinkbench import environment
from sinkbench.client_baseline import connect_unsupported
from sinkbench.environment import Scratch, load, run_record, sql, write_result
from sinkbench.memory import jvm_pid
from sinkbench.rounds import Bench, Case
from sinkbench.variants import CARRY_MAX_BYTES, server_native_port

import txsink

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_URL, MODERN_URL = "http://127.0.0.1:8123", "http://127.0.0.1:8124"
BATCH_VARIANTS = ("plain", "tx", "tx_carried", "write", "write_carried", "connect_driver")
STREAM_VARIANTS = ("tx_inline", "tx_inline_carried", "plain")
PIPELINED_VARIANTS = ("tx_pipelined", "tx_pipelined_carried")
#: variant -> the variant it is the carried form of
CARRIED_OF = {"tx_carried": "tx", "write_carried": "write",
              "tx_inline_carried": "tx_inline", "tx_pipelined_carried": "tx_pipelined"}


def log(message: str) -> None:
    print(message, flush=True)


def spread(values: list[float]) -> dict | None:
    """Median and min–max of per-round ratios."""
    if not values:
        return None
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "rounds": len(values)}


def paired(numerators: list[float | None], denominators: list[float | None]) -> list[float]:
    """Per round ``numerator s ÷ denominator s`` where both were measured."""
    return [n / d for n, d in zip(numerators, denominators, strict=True) if n and d]


def batch_ratios(summary: list[dict]) -> list[dict]:
    """Per size and variant: the paired throughput ratio to ``plain`` and, for a carried
    variant, to its uncarried form."""
    seconds = {(r["rows"], r["variant"]): [s["seconds"] for s in r["runs"]] for r in summary}
    out = []
    for rows, variant in seconds:
        row = {"rows": rows, "variant": variant,
               "median_s": next(r["median_s"] for r in summary
                                if r["rows"] == rows and r["variant"] == variant),
               "vs_plain": spread(paired(seconds[(rows, "plain")], seconds[(rows, variant)]))}
        base = CARRIED_OF.get(variant)
        if base and (rows, base) in seconds:
            row[f"vs_{base}"] = spread(paired(seconds[(rows, base)], seconds[(rows, variant)]))
        out.append(row)
    return out


def stream_ratios(rounds: list[dict]) -> list[dict]:
    """Per variant: the paired ratio ``plain`` time ÷ its time until every row is visible."""
    variants = list(rounds[0]["results"]) if rounds else []
    visible = {v: [r["results"][v]["visible_s"] for r in rounds] for v in variants}
    out = []
    for variant in variants:
        measured = [s for s in visible[variant] if s]
        row = {"variant": variant, "failures": len(visible[variant]) - len(measured),
               "median_visible_s": round(statistics.median(measured), 3) if measured else None,
               "vs_plain": spread(paired(visible["plain"], visible[variant]))}
        base = CARRIED_OF.get(variant)
        if base in visible:
            row[f"vs_{base}"] = spread(paired(visible[base], visible[variant]))
        out.append(row)
    return out


def _figure(ratio: dict | None) -> str:
    if not ratio:
        return "–"
    return f"{ratio['median']:.2f} ({ratio['min']:.2f}–{ratio['max']:.2f})"


def print_tables(batch: list[dict], stream: list[dict], load_range: tuple[float, float]
                 ) -> None:
    log(f"\nthroughput ratios, paired rounds: median (min–max); load {load_range[0]:.1f}–"
        f"{load_range[1]:.1f}")
    for row in batch:
        carried = next((f"  vs {k[3:]} {_figure(v)}" for k, v in row.items()
                        if k.startswith("vs_") and k != "vs_plain"), "")
        log(f"  batch {row['rows']:>9,} rows  {row['variant']:<16} {row['median_s'] or 0:6.2f} s"
            f"  vs plain {_figure(row['vs_plain'])}{carried}")
    for row in stream:
        carried = next((f"  vs {k[3:]} {_figure(v)}" for k, v in row.items()
                        if k.startswith("vs_") and k != "vs_plain"), "")
        log(f"  stream {row['variant']:<22} {row['median_visible_s'] or 0:6.2f} s"
            f"  vs plain {_figure(row['vs_plain'])}{carried}"
            + (f"  ({row['failures']} failed)" if row["failures"] else ""))


def run_stream(spark, url: str, zookeeper: str, variants: tuple[str, ...], files: int,
               rows: int, rounds: int) -> list[dict]:
    source = Path(tempfile.mkdtemp(prefix="bench-carried-in-"))
    zk_root = f"/bench-carried-{uuid.uuid4().hex[:6]}"
    try:
        bench_pipelined.make_input(spark, source, files, rows)
        return bench_pipelined.paired_rounds(spark, variants, source, url, zookeeper,
                                             zk_root, files * rows, rounds, CARRY_MAX_BYTES)
    finally:
        shutil.rmtree(source, ignore_errors=True)
        environment.delete_zk_root(zookeeper, zk_root)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modern", action="store_true",
                        help=f"the 26.x server ({MODERN_URL}) and carried_ch26.json")
    parser.add_argument("--url", default=None, help=f"default {DEFAULT_URL}")
    parser.add_argument("--zookeeper", default="127.0.0.1:2181")
    parser.add_argument("--rows", default="100000,1000000", help="rows per batch job")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--files", type=int, default=6, help="micro-batches of the stream")
    parser.add_argument("--stream-rows", type=int, default=100_000,
                        help="rows per micro-batch")
    parser.add_argument("--no-batch", action="store_true")
    parser.add_argument("--no-stream", action="store_true")
    parser.add_argument("--pipelined", action="store_true",
                        help="the stream also with publish=pipelined, with and without carry")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    url = args.url or (MODERN_URL if args.modern else DEFAULT_URL)
    version = sql(url, "SELECT version()").strip()
    output = args.output or RESULTS / f"carried_ch{version.split('.')[0]}.json"
    sizes = [int(n) for n in args.rows.split(",") if n.strip()]
    host, port = url.split("//", 1)[1].split(":")
    why = connect_unsupported(host, int(port))
    batch_variants = tuple(v for v in BATCH_VARIANTS if not (why and v == "connect_driver"))
    stream_variants = (*STREAM_VARIANTS[:2], *(PIPELINED_VARIANTS if args.pipelined else ()),
                       "plain")
    logging.getLogger("txsink").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning)
    started, load_start = time.time(), load()
    log(f"server {url} ({version}), load {load_start:.1f}"
        + (f"; connect_driver skipped: {why}" if why else ""))
    spark = environment.start_spark(cores=2)
    txsink.register(spark)
    scratch = Scratch.create(url, args.zookeeper)
    bench = Bench(spark, scratch, jvm_pid(spark), log, server_native_port(url))
    summary: list[dict] = []
    stream: list[dict] = []
    seconds: dict[str, float] = {}
    try:
        if not args.no_batch:
            began = time.time()
            bench.warm_up(batch_variants)
            summary = bench.rounds("carried", [Case(rows, 2) for rows in sizes],
                                   batch_variants, args.rounds)
            seconds["batch"] = round(time.time() - began, 1)
        if not args.no_stream:
            began = time.time()
            log(f"stream: {args.files} micro-batches of {args.stream_rows:,} rows")
            try:
                stream = run_stream(spark, url, args.zookeeper, stream_variants, args.files,
                                    args.stream_rows, args.rounds)
            except Exception as exc:  # noqa: BLE001 - the batch figures are still written
                log(f"stream FAILED: {exc!r}"[:600])
            seconds["stream"] = round(time.time() - began, 1)
    finally:
        scratch.remove()
        spark.stop()
    batch, streamed = batch_ratios(summary), stream_ratios(stream)
    loads = [load_start, load(), *(x for r in summary for x in r["load_range"])]
    print_tables(batch, streamed, (min(loads), max(loads)))
    data = run_record("carried", "bench_carried.py", started, load_start, url=url,
                      server_version=version, carry_max_bytes=CARRY_MAX_BYTES,
                      rounds=args.rounds, experiment_seconds=seconds,
                      skipped={"connect_driver": why} if why else {},
                      batch_ratios=batch, stream_ratios=streamed, batch=summary,
                      stream={"files": args.files, "rows": args.stream_rows,
                              "rounds": stream})
    log(write_result(output, data, lambda _data, _dir: None))


if __name__ == "__main__":
    main()
