"""A stream of 100k-row micro-batches: `tx` pipelined vs `tx` inline vs `plain`.

As a user would run it: parquet files of ``--rows`` rows each, one file per micro-batch
(``maxFilesPerTrigger=1``, ``availableNow``), a target of 4 partitions. Measured per
variant: the time from the query's start until every row is visible in the target
(polled every 50 ms), and for `tx` the per-epoch visibility lag (decision → rows
visible) the sink records. Paired rounds, the order of the variants turning each round;
each round's ratio ``plain time / variant time`` (above 1: faster than `plain`), the
medians printed and written as JSON.

``--variants`` picks among :data:`ALL_VARIANTS`: the ``*_carried`` ones set
``carry_max_bytes`` (``--carry-max-bytes``, 16 MiB by default), under which a 100k-row
micro-batch's task hands its rows to the driver in its commit message.

Usage (one server per run)::

    PYTHONPATH=. python3 benchmarks/bench_pipelined.py --url http://127.0.0.1:8123 \\
        --zookeeper 127.0.0.1:2181 --files 6 --rows 100000 --rounds 3
    PYTHONPATH=. python3 benchmarks/bench_pipelined.py \\
        --variants tx_inline,tx_inline_carried,tx_pipelined,tx_pipelined_carried,plain
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import requests
from kazoo.client import KazooClient

from coordinator import Coordinator

VARIANTS = ("tx_pipelined", "tx_inline", "plain")
#: ``tx_<publish>`` is ``clickhouse_tx`` with that ``publish``; ``_carried``: with
#: ``carry_max_bytes``.
ALL_VARIANTS = (*VARIANTS, "tx_inline_carried", "tx_pipelined_carried")
CARRY_MAX_BYTES = 16_777_216
POLL_SECONDS = 0.05


def sql(url: str, query: str) -> str:
    response = requests.post(url, data=query.encode(), timeout=120)
    if response.status_code != 200:
        raise RuntimeError(f"{query[:80]}: {response.text[:300]}")
    return response.text


def make_input(spark, directory: Path, files: int, rows: int) -> None:
    from pyspark.sql import functions as f
    for n in range(files):
        (spark.range(n * rows, (n + 1) * rows, numPartitions=1)  # one file: one micro-batch
         .select(f.col("id"), (f.col("id") % 4).alias("part"),
                 f.concat(f.lit("name-"), f.col("id").cast("string")).alias("name"),
                 (f.col("id") * 0.5).alias("value"))
         .write.mode("overwrite").parquet(str(directory / f"file={n:04d}")))


def create_target(url: str, table: str) -> None:
    sql(url, f"DROP TABLE IF EXISTS {table}")
    sql(url, f"CREATE TABLE {table} (id Int64, part Int64, name String, value Float64) "
             "ENGINE = MergeTree PARTITION BY part ORDER BY id")


def run_variant(spark, variant: str, source: Path, url: str, zookeeper: str, zk_root: str,
                total: int, carry_max_bytes: int = CARRY_MAX_BYTES) -> dict:
    table = f"default.bench_pipelined_{uuid.uuid4().hex[:8]}"
    create_target(url, table)
    checkpoint = tempfile.mkdtemp(prefix="bench-pipelined-")
    sink_id = f"bench-{uuid.uuid4().hex[:8]}"
    options = {"url": url, "table": table}
    if variant != "plain":
        publish = variant.removeprefix("tx_").removesuffix("_carried")
        options |= {"zookeeper": zookeeper, "zk_root": zk_root, "sink_id": sink_id,
                    "publish": publish}
        if variant.endswith("_carried"):
            options["carry_max_bytes"] = str(carry_max_bytes)
    try:
        frame = (spark.readStream.schema("id long, part long, name string, value double")
                 .option("maxFilesPerTrigger", 1).parquet(str(source) + "/file=*"))
        started = time.monotonic()
        query = (frame.writeStream.format("clickhouse_plain" if variant == "plain"
                                          else "clickhouse_tx")
                 .options(**options).option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        query.awaitTermination(600)
        if query.exception():
            raise RuntimeError(str(query.exception()))
        returned = time.monotonic() - started
        while int(sql(url, f"SELECT count() FROM {table}").strip()) < total:
            if time.monotonic() - started > 600:
                raise RuntimeError(f"{variant}: rows never all visible")
            time.sleep(POLL_SECONDS)
        visible = time.monotonic() - started
        count = int(sql(url, f"SELECT count() FROM {table}").strip())
    except Exception:
        sql(url, f"DROP TABLE IF EXISTS {table}")
        shutil.rmtree(checkpoint, ignore_errors=True)
        raise
    lags = []
    if variant != "plain":
        zk = KazooClient(hosts=zookeeper)
        zk.start(timeout=15)
        coord = Coordinator(zk, sink_id, root=zk_root)
        for epoch in range(64):
            record = coord.xid(epoch)
            if record is None:
                break
            lag = record.metrics.get("visibility_lag_ms")
            if lag is not None:
                lags.append(float(lag))
        zk.stop()
        zk.close()
    sql(url, f"DROP TABLE IF EXISTS {table}")
    shutil.rmtree(checkpoint, ignore_errors=True)
    return {"variant": variant, "returned_s": round(returned, 3),
            "visible_s": round(visible, 3), "rows": count, "lags_ms": lags}


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, int(round(q * len(ordered) + 0.5)) - 1))]


def paired_rounds(spark, variants: tuple[str, ...], source: Path, url: str, zookeeper: str,
                  zk_root: str, total: int, rounds: int,
                  carry_max_bytes: int = CARRY_MAX_BYTES) -> list[dict]:
    """``rounds`` rounds of every variant, the order turning by one each round; each
    round's ratio ``plain`` time / variant time (``plain`` must be among the variants)."""
    # Warm-up: the first query of a session boots its workers, the first carried one
    # imports the driver's staging path.
    for warm in ("tx_inline", *[v for v in variants if v.endswith("_carried")][:1]):
        run_variant(spark, warm, source, url, zookeeper, zk_root, total, carry_max_bytes)
    out = []
    for number in range(rounds):
        turn = number % len(variants)
        order = variants[turn:] + variants[:turn]
        results = {v: _measured(spark, v, source, url, zookeeper, zk_root, total,
                                carry_max_bytes) for v in order}
        plain = results["plain"]["visible_s"]
        ratios = {v: round(plain / r["visible_s"], 3) if plain and r["visible_s"] else None
                  for v, r in results.items()}
        print(f"round {number + 1} order {','.join(order)}: " + ", ".join(
            f"{v} {r['visible_s']:.2f} s (returned {r['returned_s']:.2f} s, "
            f"{ratios[v] or 0:.2f}x plain)" if r["visible_s"] else f"{v} FAILED"
            for v, r in results.items()), flush=True)
        out.append({"order": list(order), "results": results, "ratios": ratios})
    return out


def _measured(spark, variant: str, *args) -> dict:
    """``run_variant``, or its failure recorded (a shared server restarted by someone
    else's test, a failed query): the round goes on without that variant."""
    try:
        return run_variant(spark, variant, *args)
    except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
        print(f"  {variant} FAILED: {exc!r}"[:600], flush=True)
        return {"variant": variant, "returned_s": None, "visible_s": None, "rows": None,
                "lags_ms": [], "error": repr(exc)[:2000]}


def lag_percentiles(rounds: list[dict], variant: str) -> dict[str, float | None]:
    lags = [lag for r in rounds for lag in r["results"].get(variant, {}).get("lags_ms", [])]
    return {"lag_p50_ms": percentile(lags, 0.5), "lag_p99_ms": percentile(lags, 0.99),
            "epochs": len(lags)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8123")
    parser.add_argument("--zookeeper", default="127.0.0.1:2181")
    parser.add_argument("--files", type=int, default=6, help="micro-batches per stream")
    parser.add_argument("--rows", type=int, default=100_000, help="rows per micro-batch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated, among {', '.join(ALL_VARIANTS)} "
                             "(plain among them)")
    parser.add_argument("--carry-max-bytes", type=int, default=CARRY_MAX_BYTES,
                        help="carry_max_bytes of the *_carried variants")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    unknown = set(variants) - set(ALL_VARIANTS)
    if unknown or "plain" not in variants:
        parser.error(f"--variants: unknown {sorted(unknown)} or no plain")

    from pyspark.sql import SparkSession

    import txsink

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master("local[2]").appName("bench-pipelined")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "4").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    txsink.register(spark)
    source = Path(tempfile.mkdtemp(prefix="bench-pipelined-in-"))
    zk_root = f"/bench-pipelined-{uuid.uuid4().hex[:6]}"
    total = args.files * args.rows
    try:
        make_input(spark, source, args.files, args.rows)
        rounds = paired_rounds(spark, variants, source, args.url, args.zookeeper, zk_root,
                               total, args.rounds, args.carry_max_bytes)
        measured = {v: [r["ratios"][v] for r in rounds if r["ratios"][v]] for v in variants}
        summary = {v: statistics.median(m) if m else None for v, m in measured.items()}
        print("median ratio to plain (time until every row visible): "
              + ", ".join(f"{v} {summary[v] or 0:.2f}x" for v in variants))
        lags = {v: lag_percentiles(rounds, v) for v in variants if "pipelined" in v}
        for v, lag in lags.items():
            print(f"{v} visibility lag: p50 {lag['lag_p50_ms']} ms, "
                  f"p99 {lag['lag_p99_ms']} ms over {lag['epochs']} epochs")
        if args.output:
            first = lags.get("tx_pipelined", {})
            args.output.write_text(json.dumps(
                {"url": args.url, "files": args.files, "rows": args.rows, "rounds": rounds,
                 "carry_max_bytes": args.carry_max_bytes, "median_ratio": summary,
                 "lag_p50_ms": first.get("lag_p50_ms"), "lag_p99_ms": first.get("lag_p99_ms"),
                 "lags": lags}, indent=1))
    finally:
        shutil.rmtree(source, ignore_errors=True)
        spark.stop()


if __name__ == "__main__":
    main()
