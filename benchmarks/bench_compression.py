"""What request compression costs and saves: ``BranchWriter`` with each ``compression``.

Issue 15 asks for compression "on by default if it measurably helps". On one machine the
wire is loopback, so compression can only cost CPU here; what it saves is bytes. This run
measures both, in one run, per server and encoding: rows/s of the writer (1M rows of the
``bench_writer.py`` workload into a MergeTree table, median of ``--repeat`` runs,
interleaved with the uncompressed baseline) and the bytes sent. From them it prints the
**break-even link speed**: on a network slower than that, the encoding's saved bytes
outweigh its CPU (time on a link of B bytes/s = measured time + bytes / B).

Usage: python benchmarks/bench_compression.py [--rows 1000000] [--repeat 3]
Prints a table (ratios to ``none`` measured in the same run) and writes
``benchmarks/results/compression.json``. Needs ``./run services up --modern`` for the
26.x rows (skipped, and said so, when that server does not answer).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import pyarrow as pa
from bench_writer import DATABASE, QUALIFIED, check_count, make_table, reset_table

from server_ext.capabilities import detect_capabilities
from server_ext.client import ENCODINGS, ClickHouseClient, compress, encoding_problem
from server_ext.errors import ServerUnreachable
from server_ext.old_server import encode_native_block
from server_ext.sql import quote_identifier
from server_ext.staging import BranchWriter
from server_ext.types import check_arrow_schema, describe_table

RESULTS = Path(__file__).parent / "results" / "compression.json"
SERVERS = {"ch18": "http://127.0.0.1:8123", "ch26": "http://127.0.0.1:8124"}


def time_writer(client: ClickHouseClient, batches: list[pa.RecordBatch], encoding: str | None,
                block_rows: int) -> float:
    target = describe_table(client, QUALIFIED)
    writer = BranchWriter(client, target, QUALIFIED, detect_capabilities(client),
                          block_rows=block_rows, encoding=encoding)
    started = time.perf_counter()
    for batch in batches:
        writer.write(batch)
    writer.flush()
    return time.perf_counter() - started


def wire_bytes(client: ClickHouseClient, table: pa.Table, encoding: str | None,
               block_rows: int) -> int:
    """Bytes of the bodies the writer sends (Native blocks; compressed as sent)."""
    columns = check_arrow_schema(describe_table(client, QUALIFIED), table.schema)
    total = 0
    for start in range(0, table.num_rows, block_rows):
        block = table.slice(start, block_rows).combine_chunks().to_batches()[0]
        body = b"".join(bytes(p) for p in encode_native_block(block, columns))
        total += len(compress(body, encoding)) if encoding else len(body)
    return total


def bench_server(name: str, url: str, rows: int, repeat: int, block_rows: int) -> list[dict]:
    client = ClickHouseClient(url, timeout=300)
    table = make_table(rows)
    batches = table.to_batches(max_chunksize=10_000)
    reset_table(client)
    encodings = [None, *(e for e in ENCODINGS if encoding_problem(client, e) is None)]
    times: dict[str | None, list[float]] = {e: [] for e in encodings}
    for _ in range(repeat):  # interleaved: every encoding sees the same machine state
        for encoding in encodings:
            reset_table(client)
            times[encoding].append(time_writer(client, batches, encoding, block_rows))
            check_count(client, rows)
    sizes = {e: wire_bytes(client, table, e, block_rows) for e in encodings}
    client.execute(f"DROP DATABASE IF EXISTS {quote_identifier(DATABASE)}", purpose="drop db")
    base_time, base_bytes = statistics.median(times[None]), sizes[None]
    results = []
    for encoding in encodings:
        seconds = statistics.median(times[encoding])
        saved, extra = base_bytes - sizes[encoding], seconds - base_time
        results.append({
            "server": name, "encoding": encoding or "none", "rows": rows,
            "rows_per_s": round(rows / seconds), "seconds": [round(t, 3) for t in times[encoding]],
            "speed_vs_none": round(base_time / seconds, 3),
            "bytes": sizes[encoding], "bytes_vs_none": round(sizes[encoding] / base_bytes, 3),
            # below this link speed (bytes/s) the encoding is faster than none
            "break_even_bytes_per_s": (round(saved / extra) if extra > 0 and saved > 0
                                       else None),
        })
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--block-rows", type=int, default=1_048_576)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    results = []
    for name, url in SERVERS.items():
        try:
            results += bench_server(name, url, args.rows, args.repeat, args.block_rows)
        except ServerUnreachable:
            print(f"{name} at {url} does not answer: skipped")
    print(f"{'server':>6} {'encoding':>8} {'rows/s':>11} {'speed ÷ none':>13} "
          f"{'bytes ÷ none':>13} {'faster than none below':>24}")
    for r in results:
        even = r["break_even_bytes_per_s"]
        link = f"{even * 8 / 1e6:,.0f} Mbit/s" if even else "-"
        print(f"{r['server']:>6} {r['encoding']:>8} {r['rows_per_s']:>11,} "
              f"{r['speed_vs_none']:>13.2f} {r['bytes_vs_none']:>13.2f} {link:>24}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"results": results}, indent=2) + "\n")
    print(f"written {args.output}")


if __name__ == "__main__":
    main()
