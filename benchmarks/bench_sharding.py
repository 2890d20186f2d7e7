"""Rows/s of ShardRouter.split: an Int64 column key (numpy) against cityHash64 of a string
column (evaluated by chdb in-process).

What it measures: splitting N rows of (Int64 id, ~20-character String name, Float64
score) by shard, (a) with the key ``id`` and (b) with ``cityHash64(name)``; each as one
batch of N rows and as batches of ``--batch-rows`` rows (Spark's default Arrow batch is
10,000 rows, where chdb's per-query cost shows). Router construction (key validation,
chdb start-up) is not timed; the split, including gathering each shard's rows into its
own RecordBatch, is. Nothing talks to a server.

Usage: python benchmarks/bench_sharding.py [--rows 1000000] [--weights 1 1] [--repeat 5]
Prints one line per case; ``--output x.json`` also writes the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from server_ext.sharding import ShardRouter, layout_from_urls

KEYS = {"int64 column": "id", "cityHash64(string) via chdb": "cityHash64(name)"}


def make_table(rows: int) -> pa.Table:
    """The benchmark rows, built with vectorised Arrow/numpy (not timed)."""
    ids = np.arange(rows, dtype=np.int64) - rows // 2  # negative keys too
    digits = pc.utf8_lpad(pc.cast(pa.array(ids), pa.string()), 15, "0")
    return pa.table({
        "id": ids,
        "name": pc.binary_join_element_wise("user-", digits, ""),
        "score": np.random.default_rng(7).random(rows),
    })


def time_split(router: ShardRouter, batches: list[pa.RecordBatch]) -> float:
    started = time.perf_counter()
    routed = 0
    for batch in batches:
        routed += sum(part.num_rows for part in router.split(batch).values())
    elapsed = time.perf_counter() - started
    assert routed == sum(b.num_rows for b in batches)
    return elapsed


def bench_case(key: str, weights: list[int], table: pa.Table, batch_rows: int,
               repeat: int) -> dict:
    urls = [[f"http://shard{i}:8123"] for i in range(len(weights))]
    router = ShardRouter(layout_from_urls(urls, "db.events", key, weights), table.schema)
    batches = table.combine_chunks().to_batches(max_chunksize=batch_rows)
    time_split(router, batches[:1])  # warm-up: chdb's first query, page faults
    times = [time_split(router, batches) for _ in range(repeat)]
    return {
        "key": key,
        "batch_rows": batch_rows,
        "rows_per_s": round(table.num_rows / statistics.median(times)),
        "seconds": [round(t, 4) for t in times],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch-rows", type=int, default=10_000)
    parser.add_argument("--weights", type=int, nargs="+", default=[1, 1])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()

    table = make_table(args.rows)
    results = []
    for label, key in KEYS.items():
        for batch_rows in (args.rows, args.batch_rows):
            result = bench_case(key, args.weights, table, batch_rows, args.repeat)
            results.append(result)
            print(f"{label:<28} batches of {batch_rows:>9,} rows: "
                  f"{result['rows_per_s'] / 1e6:6.2f} M rows/s  "
                  f"(median of {args.repeat}, {len(args.weights)} shards)")
    if args.output is not None:
        args.output.write_text(json.dumps({"rows": args.rows, "weights": args.weights,
                                           "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
