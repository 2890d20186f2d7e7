"""The coordinator alone through many epochs with a short retention: is its state flat?

What it measures: one sink driven through epochs as a streaming driver drives it (begin,
``--branches`` branches registered and prepared with a sealed manifest of one partition
and its content digest, the decision with no-op publish callbacks, the metrics, then the
writers' retention step ``txsink.core.retention_step.retain_after_commit``), with no
Spark and no ClickHouse data, on each store: ZooKeeper, and a KeeperMap table of the
modern server (its log retention set to ``--log-retain``). Every ``--sample-every``
seconds it samples the sink's nodes and bytes (a tree walk through the store), ZooKeeper's
``mntr`` (``zk_znode_count``, ``zk_approximate_data_size``), the KeeperMap table's rows
and bytes under the sink's namespace, the time of ``txsink status`` for the sink and this
process's RSS, and the time of ``txsink recover`` for the sink (nothing open: what it
reads). A store runs until ``--epochs`` or ``--seconds``, whichever comes first.

    python benchmarks/bench_retention.py [--stores zookeeper,keepermap] [--epochs 100000]
        [--seconds 600] [--retention 30] [--log-retain 60] [--branches 2]
        [--zookeeper 127.0.0.1:2181] [--url http://127.0.0.1:8124]
    python benchmarks/bench_retention.py --stream 300 [--retention 30]
        [--stream-url http://127.0.0.1:8123]   # a 1 s-trigger stream instead (Spark)

Prints the samples; writes ``benchmarks/results/retention_<store>.json`` and plots them
(``benchmarks/results/retention.png``).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
import uuid
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
RECORDS = "txsink_bench.records"
PARTITIONS = 4  # target partitions the epochs write, in turn
MILESTONES = {100, 1_000, 10_000, 100_000}  # epochs sampled whatever the time


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def mntr(hosts: str) -> dict[str, str]:
    host, _, port = hosts.split(",")[0].split("/")[0].partition(":")
    try:
        with socket.create_connection((host, int(port or 2181)), timeout=5) as conn:
            conn.sendall(b"mntr")
            data = b""
            while chunk := conn.recv(65536):
                data += chunk
    except OSError:
        return {}
    return dict(line.split("\t", 1) for line in data.decode().splitlines() if "\t" in line)


def walk(client: Any, path: str) -> tuple[int, int]:
    """(nodes, bytes of names and data) of the tree under ``path``; a node that retention
    deletes during the walk counts as gone."""
    from kazoo.exceptions import NoNodeError

    try:
        data, _ = client.get(path)
        children = client.get_children(path)
    except NoNodeError:
        return 0, 0
    nodes, size = 1, len(path.rsplit("/", 1)[1]) + len(data)
    for child in children:
        n, b = walk(client, f"{path}/{child}")
        nodes, size = nodes + n, size + b
    return nodes, size


def manifest(epoch: int, branch: int) -> dict[str, Any]:
    """A sealed branch's record as a task writes it: one partition, its digest."""
    from server_ext.staging import Manifest, PartitionManifest, StagedPart
    from server_ext.types import ContentDigest
    from txsink.core.payload import StagedBranch, to_record

    month = 202601 + (epoch % PARTITIONS)
    rows = 2500
    staging = f"txs_bench_e{epoch}_b{branch}"
    found = Manifest("bench", "events", "txsink_staging", staging, (PartitionManifest(
        str(month), str(month), (StagedPart(f"{month}_1_1_0", rows, 90_000),),
        ContentDigest(rows, (epoch * 7919 + branch) % 2**64, "cityHash64:v1")),))
    return to_record(StagedBranch(found, "move", staging, "http://bench:8123", rows))


def store_options(store_kind: str, args: argparse.Namespace, url: str,
                  root: str) -> dict[str, str]:
    """The sink's options for ``store_kind``; for KeeperMap, its records table made."""
    raw = {"url": url, "zk_root": root, "retention": str(args.retention)}
    if store_kind == "zookeeper":
        return raw | {"zookeeper": args.zookeeper}
    from server_ext.client import ClickHouseClient
    from server_ext.ddl import KeeperMapTable

    database, table = RECORDS.split(".")
    KeeperMapTable(ClickHouseClient(url), database, table).create(f"/{database}/{table}")
    return raw | {"coordinator": "keepermap", "records_table": RECORDS}


def open_store(store_kind: str, args: argparse.Namespace, options: Any,
               root: str) -> tuple[Any, Any]:
    """(the node store, the operators' commands) of the sink's records; the KeeperMap
    log's own retention shortened to ``--log-retain``."""
    from txsink.core import connections
    from txsink.ops.commands import Operations

    client = connections.node_store(options)
    if store_kind == "zookeeper":
        return client, Operations(args.zookeeper, zk_root=root, url=options.connection.url)
    ops = Operations("", zk_root=root, url=options.connection.url, coordinator="keepermap",
                     records_url=options.connection.url, records_table=RECORDS)
    for store in (client, ops.zk):
        store.snapshots.retain = args.log_retain
    return client, ops


def drive(store_kind: str, args: argparse.Namespace) -> dict[str, Any]:
    from coordinator import Coordinator
    from txsink.core.retention_step import retain_after_commit
    from txsink.options import parse_options

    root = f"/bench-retention-{uuid.uuid4().hex[:6]}"
    sink = f"bench-{store_kind}"
    raw = store_options(store_kind, args, args.url, root)
    options = parse_options(raw | {"table": "bench.events"}, env={})
    client, ops = open_store(store_kind, args, options, root)
    coord = Coordinator(client, sink, root=root)
    generation = coord.claim(uuid.uuid4().hex)
    samples: list[dict[str, Any]] = []
    started = time.monotonic()
    next_sample = 0.0
    epoch = 0

    def noop(_record: object) -> None:
        return None

    while epoch < args.epochs and time.monotonic() - started < args.seconds:
        # one coordinator per epoch, as the driver makes one per commit (its record
        # caches live as long as it does)
        coord = Coordinator(client, sink, root=root)
        coord.begin(epoch, generation)
        winners = []
        for b in range(args.branches):
            branch = f"p{b}-a0-s0-{epoch:08x}"
            coord.register_branch(epoch, branch, generation,
                                  owner={"staging": f"txs_bench_e{epoch}_b{b}",
                                         "server": "http://bench:8123"})
            coord.prepare_branch(epoch, branch, manifest(epoch, b))
            winners.append(branch)
        coord.commit(epoch, generation, winners, publish=noop, rollback=noop)
        coord.record_metrics(epoch, {"rows": 2500 * args.branches, "by": "writer"})
        retain_after_commit(options, coord)
        epoch += 1
        elapsed = time.monotonic() - started
        if elapsed >= next_sample or epoch in MILESTONES:
            samples.append(sample(store_kind, args, client, coord.layout, ops, sink,
                                  epoch, elapsed, args.url))
            print(json.dumps(samples[-1]), flush=True)
            next_sample = elapsed + args.sample_every
    samples.append(sample(store_kind, args, client, coord.layout, ops, sink, epoch,
                          time.monotonic() - started, args.url))
    print(json.dumps(samples[-1]), flush=True)
    ops.close()
    return {"store": store_kind, "retention": args.retention, "branches": args.branches,
            "log_retain": args.log_retain if store_kind == "keepermap" else None,
            "epochs": epoch, "seconds": round(time.monotonic() - started, 1),
            "load": os.getloadavg(), "samples": samples}


def sample(store_kind: str, args: argparse.Namespace, client: Any, layout: Any, ops: Any,
           sink: str, epoch: int, elapsed: float, url: str) -> dict[str, Any]:
    nodes, size = walk(client, layout.sink)
    t0 = time.perf_counter()
    ops.status(sink)
    status_ms = (time.perf_counter() - t0) * 1000
    t0 = time.perf_counter()
    ops.recover(sink)
    recover_ms = (time.perf_counter() - t0) * 1000
    found: dict[str, Any] = {"t": round(elapsed, 1), "epochs": epoch, "nodes": nodes,
                             "bytes": size, "status_ms": round(status_ms, 1),
                             "recover_ms": round(recover_ms, 1),
                             "rss_mb": round(rss_mb(), 1),
                             "retained": len(client.get_children(layout.xids))}
    if store_kind == "zookeeper":
        stats = mntr(args.zookeeper)
        found["zk_znodes"] = int(stats.get("zk_znode_count", -1))
        found["zk_data_bytes"] = int(stats.get("zk_approximate_data_size", -1))
    else:
        import requests

        query = (f"SELECT count(), sum(length(k) + length(v)) FROM {RECORDS} "
                 f"WHERE position(k, '{layout.root}/') > 0 FORMAT TSV")
        rows, size_km = requests.post(url, data=query.encode(),
                                      timeout=60).text.split()
        found["km_rows"], found["km_bytes"] = int(rows), int(size_km)
    return found


def plot(results: list[dict[str, Any]], out: Path, x: str = "epochs",
         title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for result in results:
        xs = [s[x] for s in result["samples"]]
        label = result["store"]
        axes[0][0].plot(xs, [s["nodes"] for s in result["samples"]], label=label)
        axes[0][1].plot(xs, [s.get("km_bytes", s["bytes"]) / 1024
                             for s in result["samples"]], label=label)
        axes[1][0].plot(xs, [s["status_ms"] for s in result["samples"]], label=label)
        axes[1][1].plot(xs, [s["rss_mb"] for s in result["samples"]], label=label)
    titles = ("sink's nodes (tree walk)", "store bytes, kB (ZooKeeper: tree; KeeperMap: "
              "table rows)", "txsink status, ms", "driver RSS, MB")
    for ax, name in zip(sum(axes.tolist(), []), titles, strict=True):
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("epochs committed" if x == "epochs" else "seconds")
        ax.legend()
        ax.set_ylim(bottom=0)
    fig.suptitle(title or f"coordinator state with retention {results[0]['retention']} s")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return out


def stream(store_kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """A rate-source stream at a 1 s trigger for ``--stream`` seconds into a plain table,
    its records in ``store_kind`` with ``retention`` = ``--retention`` (ZooKeeper: the
    target on ``--stream-url``; KeeperMap: target and records on ``--url``): the sink's
    state sampled as the coordinator run samples it, then every row counted once and
    ``txsink verify`` run."""
    import requests
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import txsink
    from coordinator.formats.records import decode
    from coordinator.plumbing.paths import SinkLayout
    from txsink.options import parse_options

    url = args.stream_url if store_kind == "zookeeper" else args.url

    def sql(statement: str) -> str:
        answer = requests.post(url, data=statement.encode(), timeout=120)
        answer.raise_for_status()
        return answer.text.strip()

    db, root, sink = (f"bench_{uuid.uuid4().hex[:8]}", f"/bench-stream-{uuid.uuid4().hex[:6]}",
                      "bench-stream")
    raw = store_options(store_kind, args, url, root) | {"table": f"{db}.events",
                                                         "sink_id": sink}
    client, ops = open_store(store_kind, args, parse_options(raw, env={}), root)
    layout = SinkLayout(root, sink)
    sql(f"CREATE DATABASE `{db}`")
    sql(f"CREATE TABLE `{db}`.`events` (id UInt64, day Date, name String) ENGINE = "
        "MergeTree() PARTITION BY toYYYYMM(day) ORDER BY id")
    spark = (SparkSession.builder.master("local[2]").appName("bench-retention-stream")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    txsink.register(spark)
    rows = (spark.readStream.format("rate").option("rowsPerSecond", args.stream_rate)
            .option("numPartitions", 2).load()
            .select(F.col("value").alias("id"),
                    F.expr("date_add(date'2026-01-01', cast(value % 60 as int))").alias("day"),
                    F.concat(F.lit("e"), F.col("value").cast("string")).alias("name")))
    writer = rows.writeStream.format("clickhouse_tx")
    for key, value in raw.items():
        writer = writer.option(key, value)
    query = (writer.option("checkpointLocation", f"/tmp/{db}-checkpoint")
             .trigger(processingTime="1 second").start())
    samples = []
    started = time.monotonic()
    while time.monotonic() - started < args.stream:
        time.sleep(args.sample_every)
        if client.exists(layout.last_committed):
            epochs = decode(client.get(layout.last_committed)[0]).get("epoch")
            samples.append(sample(store_kind, args, client, layout, ops, sink, epochs,
                                  time.monotonic() - started, url))
            print(json.dumps(samples[-1]), flush=True)
    query.stop()
    spark.stop()
    count, distinct = sql(f"SELECT count(), uniqExact(id) FROM `{db}`.`events`").split()
    (report,) = ops.verify(sink)["sinks"]
    ops.close()
    result = {"store": store_kind, "retention": args.retention, "seconds": args.stream,
              "rows": int(count), "distinct": int(distinct), "samples": samples,
              "verify_anomalies": report["anomalies"],
              "verify_not_judged": report["target"]["not_judged"],
              "partitions_ok": report["target"]["partitions_ok"],
              "partitions_ok_by_count": report["target"]["partitions_ok_by_count"]}
    sql(f"DROP DATABASE `{db}`")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", default="zookeeper,keepermap")
    parser.add_argument("--epochs", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--retention", type=float, default=30)
    parser.add_argument("--log-retain", type=float, default=60)
    parser.add_argument("--branches", type=int, default=2)
    parser.add_argument("--sample-every", type=float, default=20)
    parser.add_argument("--zookeeper", default="127.0.0.1:2181")
    parser.add_argument("--url", default="http://127.0.0.1:8124")
    parser.add_argument("--plot-only", action="store_true")
    parser.add_argument("--stream", type=float, default=0,
                        help="seconds of a 1 s-trigger stream instead (needs Spark)")
    parser.add_argument("--stream-rate", type=int, default=1000)
    parser.add_argument("--stream-url", default="http://127.0.0.1:8123")
    args = parser.parse_args()
    RESULTS.mkdir(exist_ok=True)
    if args.stream:
        streams = []
        for store_kind in args.stores.split(","):
            path = RESULTS / f"retention_stream_{store_kind}.json"
            if not args.plot_only:
                result = stream(store_kind, args)
                path.write_text(json.dumps(result, indent=1))
                print(json.dumps({k: v for k, v in result.items() if k != "samples"}))
            if path.exists():
                streams.append(json.loads(path.read_text()))
        if streams:
            title = (f"a 1 s-trigger stream with retention {streams[0]['retention']} s "
                     "(store bytes: ZooKeeper tree walk, KeeperMap table rows)")
            print(f"plot: {plot(streams, RESULTS / 'retention_stream.png', 't', title)}")
        return
    results = []
    for store_kind in args.stores.split(","):
        path = RESULTS / f"retention_{store_kind}.json"
        if not args.plot_only:
            path.write_text(json.dumps(drive(store_kind, args), indent=1))
        if path.exists():
            results.append(json.loads(path.read_text()))
    if results:
        print(f"plot: {plot(results, RESULTS / 'retention.png')}")


if __name__ == "__main__":
    main()
