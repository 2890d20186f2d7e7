"""Per-epoch cost of the ClickHouse side of a commit: seal + publish + drop staging.

What it measures, for one branch whose rows fall into 1, 10 and 100 partitions of the
target (10,000 rows per epoch, target partitioned by day): the median over several epochs
of ``seal`` (row check + manifest from system.parts), ``publish`` (per partition: intent,
ATTACH, mark, DROP PARTITION from staging; target merges stopped around it) and
``rollback`` (DROP TABLE of the emptied staging table). Creating staging and inserting
the rows are not part of the figure (the writer benchmark covers inserts).

The ledger is a ``MemoryLedger``; with the coordinator's ZooKeeper ledger add about 2 ms
per ledger write (``attach_marked`` writes 2 per partition: intent and mark), printed as
the "est. with ZK" column. ``--strategy attach_replicated`` measures a Replicated target
instead (its ledger writes are also 2 per partition).

    python benchmarks/bench_publish.py [--epochs 7] [--url http://127.0.0.1:8123]

Prints a table; writes ``benchmarks/results/publish.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
import uuid
from pathlib import Path

from server_ext.client import ClickHouseClient
from server_ext.publish import MemoryLedger, publish
from server_ext.sql import qualified_name, quote_identifier
from server_ext.staging import create_staging_table, rollback, seal, staging_table_name
from server_ext.types import describe_table

PARTITION_COUNTS = (1, 10, 100)
ROWS_PER_EPOCH = 10_000
ZK_WRITE_MS = 2.0
RESULTS = Path(__file__).parent / "results" / "publish.json"


class CountingLedger(MemoryLedger):
    """A MemoryLedger that counts its writes (each would be one ZooKeeper write)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def put(self, key: str, value: dict) -> None:
        self.writes += 1
        super().put(key, value)


def make_target(client: ClickHouseClient, database: str, strategy: str) -> str:
    engine = (f"ReplicatedMergeTree('/clickhouse/tables/{database}/events', '{{replica}}')"
              if strategy == "attach_replicated" else "MergeTree()")
    client.execute(
        f"CREATE TABLE {qualified_name(database, 'events')} "
        "(d Date, k UInt64, s String, x Float64) "
        f"ENGINE = {engine} PARTITION BY d ORDER BY k", purpose="bench: create target")
    return f"{database}.events"


def one_epoch(client: ClickHouseClient, table: str, strategy: str, partitions: int,
              epoch: int) -> dict[str, float]:
    """Stage one epoch (untimed), then time seal, publish and drop."""
    target = describe_table(client, table)
    name = staging_table_name("bench-publish", epoch, f"p0-a0-{uuid.uuid4().hex[:8]}")
    staging = create_staging_table(client, target, name)
    client.execute(
        f"INSERT INTO {staging} SELECT toDate('2026-01-01') + number % {partitions}, "
        f"{epoch} * {ROWS_PER_EPOCH} + number, toString(number), number / 3 "
        f"FROM system.numbers LIMIT {ROWS_PER_EPOCH}", purpose="bench: stage rows")
    ledger = CountingLedger()
    t0 = time.perf_counter()
    manifest = seal(client, target, staging, expected_rows=ROWS_PER_EPOCH)
    t1 = time.perf_counter()
    publish(client, manifest, strategy, ledger)
    t2 = time.perf_counter()
    rollback(client, name)
    t3 = time.perf_counter()
    return {"seal_ms": (t1 - t0) * 1e3, "publish_ms": (t2 - t1) * 1e3,
            "drop_ms": (t3 - t2) * 1e3, "total_ms": (t3 - t0) * 1e3,
            "ledger_writes": ledger.writes}


def measure(client: ClickHouseClient, strategy: str, partitions: int,
            epochs: int) -> dict[str, float]:
    database = f"bench_publish_{uuid.uuid4().hex[:8]}"
    client.execute(f"CREATE DATABASE {quote_identifier(database)}",
                   purpose="bench: create database")
    try:
        table = make_target(client, database, strategy)
        one_epoch(client, table, strategy, partitions, 0)  # warm-up
        runs = [one_epoch(client, table, strategy, partitions, e) for e in range(1, epochs + 1)]
    finally:
        client.execute(f"DROP DATABASE IF EXISTS {quote_identifier(database)}",
                       purpose="bench: drop database")
    result = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    result["est_with_zk_ms"] = result["total_ms"] + ZK_WRITE_MS * result["ledger_writes"]
    result["per_partition_ms"] = result["publish_ms"] / partitions
    return {"partitions": partitions, "epochs": epochs, **result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8123")
    parser.add_argument("--epochs", type=int, default=7)
    parser.add_argument("--strategy", default="attach_marked",
                        choices=("attach_marked", "attach_replicated"))
    args = parser.parse_args()
    client = ClickHouseClient(args.url)
    version = client.query_value("SELECT version()", purpose="bench: version")
    rows = [measure(client, args.strategy, n, args.epochs) for n in PARTITION_COUNTS]
    print(f"seal + publish + drop per epoch, {args.strategy}, ClickHouse {version}, "
          f"{ROWS_PER_EPOCH} rows, median of {args.epochs} epochs (ms)")
    header = ("partitions", "seal", "publish", "drop", "total", "per partition",
              "ledger writes", "est. with ZK")
    print(" | ".join(f"{h:>13}" for h in header))
    for r in rows:
        cells = (r["partitions"], r["seal_ms"], r["publish_ms"], r["drop_ms"], r["total_ms"],
                 r["per_partition_ms"], r["ledger_writes"], r["est_with_zk_ms"])
        print(" | ".join(f"{c:>13.1f}" if isinstance(c, float) else f"{c:>13}" for c in cells))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    report = {"strategy": args.strategy, "server": version, "rows_per_epoch": ROWS_PER_EPOCH,
              "zk_write_ms_assumed": ZK_WRITE_MS, "machine": platform.platform(),
              "results": rows}
    existing = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    existing[args.strategy] = report
    RESULTS.write_text(json.dumps(existing, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
