"""The sink's ways in on one PySpark (the running one), against each other and the idiom.

On the PySpark of the interpreter that runs it (the main environment's, or a version's
virtualenv from ``python -m tests.harness spark-venv``), in one Spark session, on the same
rows (100k and 1M, 2 partitions), against the 18.16 server and the modern 26.x server:

- ``write`` — ``txsink.write`` (exactly-once through ``mapInArrow``, every PySpark);
- ``tx`` — ``format("clickhouse_tx")``, the Python data source (only where the PySpark has
  ``pyspark.sql.datasource``: 4.0 and later);
- ``foreach_tx`` — one micro-batch of an exactly-once ``foreachBatch``: ``txsink.write``
  with the batch id as ``txn_version`` (what ``txsink.foreach_batch`` does in a stream);
- ``connect_executor`` — what Spark 3.5 users write today: ``foreachBatch`` with
  clickhouse-connect's ``insert_arrow`` from every task (``mapInArrow``), at-least-once;
  only on the server clickhouse-connect supports (26.x, not 18.16).

Paired rounds with the order turned by one each round (``sinkbench.rounds``); the ratios
are medians of per-round ratios, measured in this run only (above 1: the first is faster).

Usage (services of ``python -m tests.harness services up --modern``; ports from the same
``TXSINK_*`` variables)::

    python benchmarks/bench_spark_versions.py              # the main environment's PySpark
    VENV=$(python -m tests.harness spark-venv 3.5 --bench)  # PySpark 3.5 + the clients
    $VENV benchmarks/bench_spark_versions.py --rounds 3

Writes ``spark_versions-<pyspark>.json`` into ``--out`` (``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from urllib.parse import urlsplit

from sinkbench import environment, report
from sinkbench.client_baseline import connect_unsupported
from sinkbench.environment import Scratch, load
from sinkbench.memory import jvm_pid
from sinkbench.rounds import Bench, Case
from sinkbench.variants import server_native_port

RESULTS = Path(__file__).resolve().parent / "results"
SIZES = (100_000, 1_000_000)
PARTITIONS = 2
#: (variant, baseline) pairs whose paired ratio is reported, where both were measured.
PAIRS = (("write", "tx"), ("write", "connect_executor"), ("foreach_tx", "connect_executor"),
         ("write", "foreach_tx"))


def log(message: str) -> None:
    print(message, flush=True)


def has_data_source() -> bool:
    return importlib.util.find_spec("pyspark.sql.datasource") is not None


def servers() -> dict[str, str]:
    """The two servers' HTTP URLs, from the harness's port variables."""
    return {"ch18": f"http://127.0.0.1:{os.environ.get('TXSINK_CH_HTTP_PORT', '8123')}",
            "ch26": f"http://127.0.0.1:{os.environ.get('TXSINK_MODERN_HTTP_PORT', '8124')}"}


def variants_for(url: str) -> tuple[tuple[str, ...], dict[str, str]]:
    """The variants measured against ``url``, and those left out with the reason."""
    import txsink

    chosen: list[str] = []
    skipped: dict[str, str] = {}
    for variant, function in (("write", "write"), ("foreach_tx", "write")):
        if hasattr(txsink, function):
            chosen.append(variant)
        else:
            skipped[variant] = f"this txsink has no txsink.{function}"
    if has_data_source():
        chosen.append("tx")
    else:
        skipped["tx"] = "this PySpark has no Python data source API (pyspark.sql.datasource)"
    parts = urlsplit(url)
    why = connect_unsupported(parts.hostname or "127.0.0.1", parts.port or 8123)
    if why is None:
        chosen.append("connect_executor")
    else:
        skipped["connect_executor"] = why
    return tuple(chosen), skipped


def paired_ratio(rows: list[dict], variant: str, baseline: str, size: int) -> float | None:
    """Median over rounds of baseline seconds / variant seconds (above 1: faster)."""
    by_name = {r["variant"]: r for r in rows if r["rows"] == size}
    if variant not in by_name or baseline not in by_name:
        return None
    ratios = [b["seconds"] / v["seconds"] for v, b in
              zip(by_name[variant]["runs"], by_name[baseline]["runs"], strict=True)
              if v["seconds"] and b["seconds"]]
    return round(statistics.median(ratios), 3) if ratios else None


def run_server(spark, name: str, url: str, zookeeper: str, rounds: int,
               sizes: tuple[int, ...]) -> dict:
    variants, skipped = variants_for(url)
    for variant, why in skipped.items():
        log(f"{name}: skipping {variant}: {why}")
    scratch = Scratch.create(url, zookeeper)
    bench = Bench(spark, scratch, jvm_pid(spark), log, server_native_port(url))
    try:
        bench.warm_up(variants)
        rows = bench.rounds(f"versions-{name}", [Case(n, PARTITIONS) for n in sizes],
                            variants, rounds)
    finally:
        scratch.remove()
    ratios = [{"rows": size, "variant": v, "baseline": b,
               "paired_ratio": paired_ratio(rows, v, b, size)}
              for size in sizes for v, b in PAIRS]
    return {"url": url, "clickhouse": environment.sql(url, "SELECT version()").strip(),
            "variants": list(variants), "skipped": skipped, "rows": rows,
            "ratios": [r for r in ratios if r["paired_ratio"] is not None]}


def render(result: dict) -> str:
    parts = [f"PySpark {result['pyspark']}"]
    for name, server in result["servers"].items():
        parts.append(f"\n{name} (ClickHouse {server['clickhouse']})")
        parts.append(report.table(
            ["variant", "rows", "median s", "M rows/s", "failures"],
            [[r["variant"], r["rows"], r["median_s"],
              r["rows_per_s"] / 1e6 if r["rows_per_s"] else None, r["failures"]]
             for r in server["rows"]]))
        if server["ratios"]:
            parts.append(report.table(
                ["rows", "variant", "vs", "paired ratio"],
                [[r["rows"], r["variant"], r["baseline"], r["paired_ratio"]]
                 for r in server["ratios"]]))
        for variant, why in server["skipped"].items():
            parts.append(f"not measured: {variant}: {why.splitlines()[0][:160]}")
    return "\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)),
                        help="comma-separated rows per write")
    parser.add_argument("--servers", default="ch18,ch26",
                        help="comma-separated subset of ch18,ch26")
    parser.add_argument("--zookeeper",
                        default=f"127.0.0.1:{os.environ.get('TXSINK_ZK_PORT', '2181')}")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    logging.getLogger("txsink").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning)
    import pyspark

    started, load_start = time.time(), load()
    spark = environment.start_spark(cores=2)
    settings = environment.spark_settings(spark)
    if has_data_source():
        import txsink

        txsink.register(spark)
    chosen = [s.strip() for s in args.servers.split(",") if s.strip()]
    sizes = tuple(int(n) for n in args.sizes.split(",") if n.strip())
    results: dict = {}
    try:
        for name in chosen:
            log(f"== {name} (load {load():.1f})")
            results[name] = run_server(spark, name, servers()[name], args.zookeeper,
                                       args.rounds, sizes)
    finally:
        spark.stop()
    data = environment.run_record(
        "txsink's ways in on one PySpark", "bench_spark_versions.py", started, load_start,
        pyspark=pyspark.__version__, python_executable=sys.executable, spark=settings,
        rounds=args.rounds, sizes=list(sizes), partitions=PARTITIONS, servers=results)
    print("\n" + render(data))
    output = args.out / f"spark_versions-{pyspark.__version__}.json"
    print(environment.write_result(output, data, lambda _data, _folder: None))


if __name__ == "__main__":
    main()
