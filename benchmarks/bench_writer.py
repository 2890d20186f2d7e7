"""Rows/s of BranchWriter against a raw POST of the same Native bytes.

What it measures: writing N rows of (UInt64, String ~20 chars, Float64, DateTime) into a
MergeTree table, (a) through ``BranchWriter`` from Arrow record batches of ``--batch-rows``
rows (Spark's default Arrow batch is 10,000 rows): value checks, encoding and streaming
included; (b) as raw POSTs of Native bodies encoded beforehand, one per block of
``--block-rows`` rows, on a plain ``requests.Session``: the server's own ingest rate, the
ceiling for any client. The goal is writer >= 80% of raw.

Usage: python benchmarks/bench_writer.py [--rows 1000000 10000000] [--url ...]
Prints one line per size and writes benchmarks/results/writer.json.
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
import requests

from server_ext.capabilities import detect_capabilities
from server_ext.client import ClickHouseClient
from server_ext.old_server import encode_native_block
from server_ext.sql import qualified_name, quote_identifier
from server_ext.staging import BranchWriter
from server_ext.types import check_arrow_schema, describe_table

DATABASE = "txsink_bench"
TABLE = "writer_rows"
QUALIFIED = qualified_name(DATABASE, TABLE)
RESULTS = Path(__file__).parent / "results" / "writer.json"


def make_table(rows: int) -> pa.Table:
    """The benchmark rows, built with vectorised Arrow/numpy (not timed)."""
    ids = np.arange(rows, dtype=np.uint64)
    digits = pc.utf8_lpad(pc.cast(pa.array(ids), pa.string()), 15, "0")
    names = pc.binary_join_element_wise("user-", digits, "")  # 20 characters
    seconds = 1_600_000_000 + (ids % 86_400_000).astype(np.int64)
    return pa.table({
        "id": ids,
        "name": names,
        "score": np.random.default_rng(7).random(rows),
        "ts": pa.array(seconds * 1_000_000, pa.timestamp("us", tz="UTC")),
    })


def reset_table(client: ClickHouseClient) -> None:
    client.execute(f"CREATE DATABASE IF NOT EXISTS {quote_identifier(DATABASE)}",
                   purpose="create bench db")
    client.execute(f"DROP TABLE IF EXISTS {QUALIFIED}", purpose="drop bench table")
    client.execute(
        f"CREATE TABLE {QUALIFIED} (id UInt64, name String, score Float64, ts DateTime) "
        "ENGINE = MergeTree() ORDER BY id",
        purpose="create bench table",
    )


def raw_bodies(table: pa.Table, client: ClickHouseClient, block_rows: int) -> list[bytes]:
    target = describe_table(client, f"{DATABASE}.{TABLE}")
    columns = check_arrow_schema(target, table.schema)
    bodies = []
    for start in range(0, table.num_rows, block_rows):
        block = table.slice(start, block_rows).combine_chunks().to_batches()[0]
        bodies.append(b"".join(bytes(p) for p in encode_native_block(block, columns)))
    return bodies


def time_raw(url: str, bodies: list[bytes]) -> float:
    session = requests.Session()
    query = {"query": f"INSERT INTO {QUALIFIED} FORMAT Native"}
    started = time.perf_counter()
    for body in bodies:
        resp = session.post(url, params=query, data=body, timeout=300)
        if resp.status_code != 200:
            raise RuntimeError(resp.content.decode("utf-8")[:500])
    return time.perf_counter() - started


def time_writer(client: ClickHouseClient, batches: list[pa.RecordBatch], block_rows: int) -> float:
    target = describe_table(client, f"{DATABASE}.{TABLE}")
    caps = detect_capabilities(client)
    writer = BranchWriter(client, target, QUALIFIED, caps, block_rows=block_rows)
    started = time.perf_counter()
    for batch in batches:
        writer.write(batch)
    writer.flush()
    elapsed = time.perf_counter() - started
    assert writer.rows_sent == sum(b.num_rows for b in batches)
    return elapsed


def check_count(client: ClickHouseClient, rows: int) -> None:
    landed = int(client.query_value(f"SELECT count() FROM {QUALIFIED}", purpose="count rows"))
    if landed != rows:
        raise RuntimeError(f"expected {rows} rows, found {landed}")


def bench(url: str, rows: int, batch_rows: int, block_rows: int, repeat: int) -> dict:
    client = ClickHouseClient(url, timeout=300)
    table = make_table(rows)
    batches = table.to_batches(max_chunksize=batch_rows)
    reset_table(client)
    bodies = raw_bodies(table, client, block_rows)
    raw_times, writer_times = [], []
    for _ in range(repeat):  # interleaved so both see the same machine state
        reset_table(client)
        raw_times.append(time_raw(url, bodies))
        check_count(client, rows)
        reset_table(client)
        writer_times.append(time_writer(client, batches, block_rows))
        check_count(client, rows)
    raw_rate = rows / statistics.median(raw_times)
    writer_rate = rows / statistics.median(writer_times)
    return {
        "rows": rows,
        "batch_rows": batch_rows,
        "block_rows": block_rows,
        "repeat": repeat,
        "raw_rows_per_s": round(raw_rate),
        "writer_rows_per_s": round(writer_rate),
        "ratio": round(writer_rate / raw_rate, 3),
        "raw_seconds": [round(t, 4) for t in raw_times],
        "writer_seconds": [round(t, 4) for t in writer_times],
        "native_bytes": sum(len(b) for b in bodies),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8123")
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--batch-rows", type=int, default=10_000)
    parser.add_argument("--block-rows", type=int, default=1_048_576)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    results = []
    for rows in args.rows:
        result = bench(args.url, rows, args.batch_rows, args.block_rows, args.repeat)
        results.append(result)
        print(f"{rows:>11,} rows: writer {result['writer_rows_per_s']:>11,} rows/s   "
              f"raw Native POST {result['raw_rows_per_s']:>11,} rows/s   "
              f"ratio {result['ratio']:.0%}")
    ClickHouseClient(args.url).execute(f"DROP DATABASE IF EXISTS {quote_identifier(DATABASE)}",
                                       purpose="drop bench db")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"server": args.url, "results": results}, indent=2) + "\n")
    print(f"written {args.output}")


if __name__ == "__main__":
    main()
