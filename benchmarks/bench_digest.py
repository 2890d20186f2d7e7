"""What the content digest costs a seal: ``seal`` with and without ``digest`` on 1M rows.

A branch's seal scans its staging table once to record each partition's content digest
(``server_ext.types.digest``). This run fills one staging-like table per server with the
``bench_writer.py`` workload (id UInt64, name String, score Float64, ts DateTime) and a
wider one with the wrapped types that 18.16 cannot hash as they are (Nullable, Array of
Nullable, Decimal, UUID, LowCardinality), in 4 partitions, and times ``seal`` with and
without the digest (median of ``--repeat`` runs, interleaved).

Usage: python benchmarks/bench_digest.py [--rows 1000000] [--repeat 5]
Prints a table and writes ``benchmarks/results/digest.json``. Needs ``./run services up
--modern`` for the 26.x rows (skipped, and said so, when that server does not answer).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from server_ext.client import ClickHouseClient
from server_ext.errors import ServerUnreachable
from server_ext.sql import qualified_name, quote_identifier
from server_ext.staging import seal
from server_ext.types import describe_table

RESULTS = Path(__file__).parent / "results" / "digest.json"
SERVERS = {"ch18": "http://127.0.0.1:8123", "ch26": "http://127.0.0.1:8124"}
DATABASE = "txsink_bench_digest"
TABLES = {
    "narrow": ("id UInt64, name String, score Float64, ts DateTime",
               "number, concat('name-', toString(number)), number / 7, "
               "toDateTime(1700000000 + number)"),
    "wrapped": ("id UInt64, n Nullable(String), a Array(Nullable(UInt32)), d Decimal(18, 4), "
                "u UUID, lc LowCardinality(String)",
                "number, if(number % 3 = 0, NULL, toString(number)), "
                "[toNullable(toUInt32(number)), NULL], toDecimal64(number / 7, 4), "
                "generateUUIDv4(), toString(number % 100)"),
}
LOW_CARDINALITY = {"allow_experimental_low_cardinality_type": 1}


def fill(client: ClickHouseClient, name: str, rows: int, on_18: bool) -> str:
    columns, values = TABLES[name]
    table = qualified_name(DATABASE, name)
    settings = LOW_CARDINALITY if on_18 else None
    client.execute(f"CREATE DATABASE IF NOT EXISTS {quote_identifier(DATABASE)}",
                   purpose="bench setup")
    client.execute(f"DROP TABLE IF EXISTS {table}", purpose="bench setup")
    client.execute(f"CREATE TABLE {table} ({columns}) ENGINE = MergeTree "
                   "PARTITION BY id % 4 ORDER BY id", purpose="bench setup", settings=settings)
    client.execute(f"INSERT INTO {table} SELECT {values} FROM numbers({rows})",
                   purpose="bench setup")
    client.execute(f"SYSTEM STOP MERGES {table}", purpose="bench setup")
    return f"{DATABASE}.{name}"


def time_seal(client: ClickHouseClient, table: str, rows: int, digest: bool) -> float:
    target = describe_table(client, table)
    started = time.perf_counter()
    manifest = seal(client, target, table, expected_rows=rows, digest=digest)
    elapsed = time.perf_counter() - started
    assert not digest or all(p.digest for p in manifest.partitions), "no digest recorded"
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    results = []
    for server, url in SERVERS.items():
        client = ClickHouseClient(url)
        try:
            version = client.query_value("SELECT version()", purpose="bench")
        except ServerUnreachable:
            print(f"{server}: not answering at {url}; skipped")
            continue
        for name in TABLES:
            table = fill(client, name, args.rows, on_18=server == "ch18")
            times: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(args.repeat):
                for digest in (False, True):
                    times[digest].append(time_seal(client, table, args.rows, digest))
            plain, digested = (statistics.median(times[d]) * 1000 for d in (False, True))
            results.append({"server": server, "version": version, "table": name,
                            "rows": args.rows, "seal_ms": round(plain, 1),
                            "seal_with_digest_ms": round(digested, 1),
                            "digest_ms": round(digested - plain, 1)})
            print(f"{server} {name:8} {args.rows} rows: seal {plain:7.1f} ms, with digest "
                  f"{digested:7.1f} ms (+{digested - plain:.1f} ms)")
        client.execute(f"DROP DATABASE IF EXISTS {quote_identifier(DATABASE)}", purpose="bench")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
