"""Every message of an epoch: ZooKeeper requests and ClickHouse statements, per way in.

For a stream of ``--epochs`` micro-batches of ``--rows`` rows (2 Spark tasks each, rows
over 4 partitions of the target) and for as many batch jobs of the same size, counts per
epoch the ZooKeeper requests (with ``--store keepermap``: the coordinator's statements on
the KeeperMap records table) and the ClickHouse statements of each variant:

- ``stream_foreach_tx`` — ``foreachBatch(txsink.foreach_batch(...))``;
  ``stream_foreach_plain`` — ``foreachBatch(plain_foreach_batch(...))`` (at-least-once);
- ``stream_tx`` — ``writeStream.format("clickhouse_tx")``; ``stream_plain`` — the same
  with ``clickhouse_plain``;
- ``batch_write`` — ``txsink.write``; ``batch_plain_write`` — ``plain_foreach_batch``'s
  function on the job's DataFrame (the same ``mapInArrow`` job, inserting directly);
- ``batch_tx`` — ``df.write.format("clickhouse_tx")``; ``batch_plain`` — ``clickhouse_plain``.

Counted exactly and for this run alone: the sink is pointed at two local proxies
(``tests/harness/wire.py``) that relay every connection to the servers and record each
ZooKeeper request (with its operation and path) and each ClickHouse connection's port;
the statements are the rows of ``system.query_log`` from those ports (the proxy adds
``log_queries=1``: 18.16 logs nothing by default). The benchmark's own statements go
to the server directly and are not counted. Epochs are separated by idle gaps (the
stream's next files are added only once the previous micro-batch has finished), so each
message belongs to one epoch even at 18.16's one-second ``query_log`` resolution;
messages outside every epoch (query start and stop) are counted apart. Per process:
the Spark Python workers (tasks, and the data source's driver side) and the driver.
Beside each exactly-once epoch: what its metrics recorded (``store_requests`` /
``statements``, the writer's own count up to its ``Committed`` write).

    PYTHONPATH=. python benchmarks/bench_messages.py --url http://127.0.0.1:8124 \\
        [--store zookeeper|keepermap] [--rows 100000] [--epochs 4] [--variants a,b]

Prints a table per variant and a summary; writes ``messages_<server>_<store>.json`` and
``.png`` into ``benchmarks/results``.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import statistics
import sys
import tempfile
import time
import uuid
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

from kazoo.client import KazooClient
from sinkbench import environment, messages, workload
from sinkbench.environment import load, sql

from tests.harness.wire import ClickHouseProxy, ZooKeeperProxy

RESULTS = Path(__file__).resolve().parent / "results"
DATABASE = "bench_messages"
TASKS = 2
#: Idle seconds between epochs: longer than query_log's resolution on 18.16 (1 s).
GAP_SECONDS = 1.6
POLL_SECONDS = 0.05
#: variant -> (way in, the plain variant it is compared with)
VARIANTS: dict[str, tuple[str, str]] = {
    "stream_foreach_tx": ("foreachBatch(txsink.foreach_batch)", "stream_foreach_plain"),
    "stream_foreach_plain": ("foreachBatch(plain_foreach_batch)", "stream_foreach_plain"),
    "stream_tx": ('writeStream.format("clickhouse_tx")', "stream_plain"),
    "stream_plain": ('writeStream.format("clickhouse_plain")', "stream_plain"),
    "batch_write": ("txsink.write", "batch_plain_write"),
    "batch_plain_write": ("plain_foreach_batch(df, 0)", "batch_plain_write"),
    "batch_tx": ('df.write.format("clickhouse_tx")', "batch_plain"),
    "batch_plain": ('df.write.format("clickhouse_plain")', "batch_plain"),
}


def log(message: str) -> None:
    print(message, flush=True)


@dataclass(frozen=True)
class Run:
    """Where this run writes: the proxies, its ZooKeeper chroot, its records table."""

    url: str  # the server, for the benchmark's own statements
    zookeeper: ZooKeeperProxy
    clickhouse: ClickHouseProxy
    chroot: str
    store: str
    records: str | None
    key: str
    carry: int = 0  # the sink's carry_max_bytes (0: off)

    @property
    def proxied_url(self) -> str:
        return f"http://127.0.0.1:{self.clickhouse.port}"

    def table(self, variant: str) -> str:
        return f"{DATABASE}.t_{variant}_{self.key}"

    def sink_id(self, variant: str) -> str:
        return f"bench-messages-{variant}-{self.key}"

    def options(self, variant: str) -> dict[str, str]:
        """The sink's options (for the plain variants only ``url``)."""
        if variant.endswith("plain") or variant.endswith("plain_write"):
            return {"url": self.proxied_url}
        store = ({"coordinator": "keepermap", "records_table": self.records}
                 if self.store == "keepermap" else
                 {"zookeeper": f"127.0.0.1:{self.zookeeper.port}{self.chroot}"})
        carry = {"carry_max_bytes": str(self.carry)} if self.carry else {}
        return {"url": self.proxied_url, "sink_id": self.sink_id(variant), **store, **carry}


def _plain_function(table: str, options: dict[str, str]):
    from txsink.spark.plain_batches import plain_foreach_batch

    return plain_foreach_batch(table=table, **options)


def _stream_writer(spark, variant: str, run: Run, source: Path, checkpoint: str):
    import txsink

    table, options = run.table(variant), run.options(variant)
    frame = (spark.readStream.schema(workload_schema()).parquet(str(source) + "/epoch-*"))
    writer = frame.writeStream.option("checkpointLocation", checkpoint)
    if variant == "stream_foreach_tx":
        writer = writer.foreachBatch(txsink.foreach_batch(table=table, **options))
    elif variant == "stream_foreach_plain":
        writer = writer.foreachBatch(_plain_function(table, options))
    else:
        name = "clickhouse_tx" if variant == "stream_tx" else "clickhouse_plain"
        writer = writer.format(name).options(table=table, **options)
    return writer.trigger(processingTime="100 milliseconds").start()


def workload_schema() -> str:
    return "id long, name string, score double, ts timestamp"


def _epoch_rows(spark, epoch: int, rows: int):
    frame = spark.range(epoch * rows, (epoch + 1) * rows, 1, TASKS)
    return frame.selectExpr(*workload.row_expressions("id"))


def _batch_write(variant: str, run: Run) -> Callable[[object], None]:
    import txsink

    table, options = run.table(variant), run.options(variant)
    if variant == "batch_write":
        return lambda df: txsink.write(df, table=table, mode="append", **options)
    if variant == "batch_plain_write":
        return lambda df: _plain_function(table, options)(df, 0)
    name = "clickhouse_tx" if variant == "batch_tx" else "clickhouse_plain"
    return lambda df: df.write.format(name).options(table=table, **options).mode(
        "append").save()


def run_variant(spark, variant: str, run: Run, rows: int, epochs: int) -> dict:
    """One variant's epochs; the windows of each (start, end) and the run's bounds."""
    table = run.table(variant)
    workload.create_target(run.url, table)
    windows: list[tuple[float, float]] = []
    begun = time.time()
    time.sleep(GAP_SECONDS)  # apart from the previous variant's last statements
    if variant.startswith("stream"):
        source = Path(tempfile.mkdtemp(prefix="bench-messages-in-"))
        staging = Path(tempfile.mkdtemp(prefix="bench-messages-new-"))
        checkpoint = tempfile.mkdtemp(prefix="bench-messages-ckpt-")
        query = _stream_writer(spark, variant, run, source, checkpoint)
        try:
            time.sleep(GAP_SECONDS)
            for epoch in range(epochs):
                directory = staging / f"epoch-{epoch:04d}"
                _epoch_rows(spark, epoch, rows).write.parquet(str(directory))
                start = time.time()
                directory.rename(source / directory.name)  # both files at once
                while sum(1 for p in query.recentProgress if p.numInputRows) <= epoch:
                    if query.exception() is not None:
                        raise RuntimeError(str(query.exception()))
                    time.sleep(POLL_SECONDS)
                windows.append((start, time.time()))
                time.sleep(GAP_SECONDS)
        finally:
            query.stop()
            for path in (source, staging, Path(checkpoint)):
                shutil.rmtree(path, ignore_errors=True)
        tasks = [p.numInputRows for p in query.recentProgress if p.numInputRows]
    else:
        write = _batch_write(variant, run)
        for epoch in range(epochs):
            df = _epoch_rows(spark, epoch, rows)
            start = time.time()
            write(df)
            windows.append((start, time.time()))
            time.sleep(GAP_SECONDS)
        tasks = []
    time.sleep(GAP_SECONDS)
    visible = workload.count(run.url, table)
    if visible != rows * epochs:
        raise RuntimeError(f"{variant}: {visible} rows in the target, not {rows * epochs}")
    return {"variant": variant, "begun": begun, "ended": time.time(), "windows": windows,
            "input_rows": tasks, "visible_rows": visible}


def recorded(run: Run, variant: str, zookeeper: str) -> list[dict]:
    """What each epoch's metrics record of its messages (``store_requests``,
    ``statements``: the writer's own count up to the ``Committed`` write), read past the
    proxies."""
    if variant.endswith("plain") or variant.endswith("plain_write"):
        return []
    from txsink.core import connections
    from txsink.options import parse_options

    options = {**run.options(variant), "url": run.url, "table": run.table(variant)}
    if run.store == "zookeeper":
        options["zookeeper"] = zookeeper + run.chroot
    coord = connections.coordinator(parse_options(options), run.sink_id(variant))
    return [{key: record.metrics.get(key) for key in ("store_requests", "statements")}
            for record in coord.store.run(coord.store.read_xids, coord.store.epochs())]


def count(run: Run, measured: dict, statements: list[messages.Statement]) -> dict:
    """The variant's messages per epoch, by kind and by process."""
    variant = measured["variant"]
    target, records = run.table(variant), run.records
    begun, ended = measured["begun"], measured["ended"]
    zk = run.zookeeper.log.between(begun, ended)
    resolution = 1.0 if all(s.at == int(s.at) for s in statements) else 0.0
    own = [s for s in statements if begun - resolution <= s.at <= ended]

    def in_window(at: float, window: tuple[float, float], slack: float) -> bool:
        return window[0] - slack <= at <= window[1]  # slack: a start time rounded down

    http = run.clickhouse.log.between(begun, ended)
    epochs, inside_zk, inside_ch = [], set(), set()
    for window in measured["windows"]:
        zk_epoch = [r for r in zk if in_window(r.at, window, 0.0)]
        ch_epoch = [s for s in own if in_window(s.at, window, resolution)]
        inside_zk |= {id(r) for r in zk_epoch}
        inside_ch |= {id(s) for s in ch_epoch}
        epochs.append({**_epoch(zk_epoch, ch_epoch, run, variant, target, records),
                       "http_requests": sum(in_window(r.at, window, 0.0) for r in http)})
    outside = _epoch([r for r in zk if id(r) not in inside_zk],
                     [s for s in own if id(s) not in inside_ch], run, variant, target, records)
    outside["http_requests"] = len(http) - sum(e["http_requests"] for e in epochs)
    outside["queries"] = [s.query[:200] for s in own if id(s) not in inside_ch]
    return {**measured, "way_in": VARIANTS[variant][0], "epochs": epochs, "outside": outside,
            "steady": _steady(epochs)}


def _epoch(zk: list, ch: list[messages.Statement], run: Run, variant: str, target: str,
           records: str | None) -> dict:
    requests = [r for r in zk if r.kind not in ("ping", "connect")]
    coordinator = [s for s in ch if records and messages.statement_kind(
        s.query, target, records).endswith(" records")]
    data = [s for s in ch if not any(s is c for c in coordinator)]
    return {
        "zk_requests": len(requests),
        "zk_pings": sum(r.kind == "ping" for r in zk),
        "zk_sessions_opened": sum(r.kind == "connect" for r in zk),
        "zk_by_process": messages.by_pid(requests),
        "zk_by_kind": _sorted(Counter(messages.zk_kind(r.kind, run.chroot, run.sink_id(variant))
                                      for r in requests)),
        "coordinator_statements": len(coordinator),
        "coordinator_by_kind": _sorted(Counter(messages.statement_kind(s.query, target, records)
                                               for s in coordinator)),
        "statements": len(data),
        "statements_by_process": messages.by_pid(data),
        "statements_by_kind": _sorted(Counter(messages.statement_kind(s.query, target, records)
                                              for s in data)),
        "exceptions": sum(s.type != "QueryFinish" for s in ch),
        "failed": [f"{s.type}: {s.query[:160]}" for s in ch if s.type != "QueryFinish"],
        "process_unknown": [s.query[:160] for s in ch if s.pid is None],
    }


def _sorted(counts: Counter) -> dict[str, int]:
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _steady(epochs: list[dict]) -> dict:
    """Medians over the epochs after the first (the first also sets the sink up)."""
    later = epochs[1:] or epochs
    result: dict = {}
    for key in ("zk_requests", "coordinator_statements", "statements"):
        result[key] = statistics.median(e[key] for e in later)
    for key in ("zk_by_kind", "coordinator_by_kind", "statements_by_kind"):
        kinds = {k for e in later for k in e[key]}
        result[key] = _sorted(Counter({k: statistics.median(e[key].get(k, 0) for e in later)
                                       for k in kinds}))
    return result


def beyond_plain(results: dict[str, dict]) -> dict[str, dict]:
    """Each exactly-once variant's steady epoch minus its plain counterpart's."""
    diffs = {}
    for variant, (_, plain) in VARIANTS.items():
        if variant == plain or variant not in results or plain not in results:
            continue
        mine, theirs = results[variant]["steady"], results[plain]["steady"]
        kinds = Counter(mine["statements_by_kind"])
        kinds.subtract(theirs["statements_by_kind"])
        diffs[variant] = {
            "plain": plain,
            "zk_requests": mine["zk_requests"] - theirs["zk_requests"],
            "coordinator_statements": (mine["coordinator_statements"]
                                       - theirs["coordinator_statements"]),
            "statements": mine["statements"] - theirs["statements"],
            "statements_by_kind": _sorted(Counter({k: v for k, v in kinds.items() if v})),
        }
    return diffs


def render(result: dict) -> str:
    store = result["store"]
    coordinator_key = "zk_requests" if store == "zookeeper" else "coordinator_statements"
    heading = "ZK requests" if store == "zookeeper" else "KeeperMap stmts"
    lines = []
    for variant, data in result["variants"].items():
        lines.append(f"\n{variant}: {data['way_in']}")
        lines.append(f"  {'epoch':<8}{heading:>16}{'CH statements':>15}  by process "
                     "(coordinator | ClickHouse)")
        for number, epoch in enumerate(data["epochs"]):
            coordinator = epoch["zk_by_process"] if store == "zookeeper" else None
            mine = data["recorded"][number] if number < len(data["recorded"]) else None
            lines.append(f"  {number:<8}{epoch[coordinator_key]:>16}{epoch['statements']:>15}"
                         + ("" if mine is None else
                            f"  recorded {mine['store_requests']} / {mine['statements']}")
                         + f"  {_processes(coordinator)} | "
                         f"{_processes(epoch['statements_by_process'])}"
                         + _unlogged(epoch)
                         + (f"  ({epoch['exceptions']} failed)" if epoch["exceptions"] else ""))
        outside = data["outside"]
        lines.append(f"  {'outside':<8}{outside[coordinator_key]:>16}"
                     f"{outside['statements']:>15}  (query start and stop)"
                     + _unlogged(outside))
        steady = data["steady"]
        lines.append(f"  steady epoch: {steady[coordinator_key]:g} {heading}, "
                     f"{steady['statements']:g} statements")
        lines.append("    statements: " + _kinds(steady["statements_by_kind"]))
        if store == "zookeeper" and steady["zk_by_kind"]:
            lines.append("    ZooKeeper: " + _kinds(steady["zk_by_kind"]))
        if steady["coordinator_by_kind"]:
            lines.append("    KeeperMap: " + _kinds(steady["coordinator_by_kind"]))
    lines.append(f"\nper steady epoch ({result['server']}, store {store}):")
    lines.append(f"  {'variant':<22}{heading:>16}{'CH statements':>15}"
                 f"{'beyond plain':>14}")
    diffs = result["beyond_plain"]
    for variant, data in result["variants"].items():
        steady = data["steady"]
        diff = diffs.get(variant)
        extra = "" if diff is None else f"{diff['statements']:+g}"
        lines.append(f"  {variant:<22}{steady[coordinator_key]:>16g}"
                     f"{steady['statements']:>15g}{extra:>14}")
    for variant, diff in diffs.items():
        lines.append(f"  {variant} beyond {diff['plain']}: "
                     + _kinds(diff["statements_by_kind"]))
    return "\n".join(lines)


def _unlogged(epoch: dict) -> str:
    """A note when the proxy relayed more or fewer HTTP requests than query_log shows."""
    logged = epoch["statements"] + epoch["coordinator_statements"]
    return "" if epoch["http_requests"] == logged else f"  [{epoch['http_requests']} HTTP]"


def _processes(counts: dict[str, int] | None) -> str:
    if counts is None:
        return "-"
    return " ".join(f"{k.split(':')[0].removeprefix('pyspark.')} {v}"
                    for k, v in counts.items()) or "0"


def _kinds(kinds: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in kinds.items()) or "none"


def server_name(url: str) -> str:
    major = sql(url, "SELECT version()").strip().split(".")[0]
    return f"ch{major}"


def setup(url: str, zookeeper: str, store: str) -> Run:
    key = uuid.uuid4().hex[:8]
    zk_host, _, zk_port = zookeeper.rpartition(":")
    chroot = f"/bench-messages-{key}"
    client = KazooClient(hosts=zookeeper)
    client.start(timeout=15)
    try:
        client.ensure_path(chroot)
    finally:
        client.stop()
        client.close()
    parts = urlsplit(url)
    sql(url, f"CREATE DATABASE IF NOT EXISTS {DATABASE}")
    records = None
    if store == "keepermap":
        from server_ext.client import ClickHouseClient
        from server_ext.ddl import KeeperMapTable

        records = f"{DATABASE}.records_{key}"
        KeeperMapTable(ClickHouseClient(url), DATABASE, f"records_{key}").create(
            f"/{DATABASE}/records_{key}")
    return Run(url, ZooKeeperProxy((zk_host or "127.0.0.1", int(zk_port))),
               ClickHouseProxy((parts.hostname or "127.0.0.1", parts.port or 8123)), chroot,
               store, records, key)


def teardown(run: Run, zookeeper: str) -> None:
    run.zookeeper.close()
    run.clickhouse.close()
    for variant in VARIANTS:
        sql(run.url, f"DROP TABLE IF EXISTS {run.table(variant)}")
    if run.records:
        sql(run.url, f"DROP TABLE IF EXISTS {run.records}")
    environment.delete_zk_root(zookeeper, run.chroot)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8123")
    parser.add_argument("--zookeeper", default="127.0.0.1:2181")
    parser.add_argument("--store", choices=("zookeeper", "keepermap"), default="zookeeper")
    parser.add_argument("--rows", type=int, default=100_000, help="rows per epoch")
    parser.add_argument("--epochs", type=int, default=4, help="epochs per variant")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated subset of {', '.join(VARIANTS)}")
    parser.add_argument("--carry-max-bytes", type=int, default=0,
                        help="the tx variants' option carry_max_bytes (0: off)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    wanted = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = set(wanted) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variant(s): {', '.join(sorted(unknown))}")
    logging.getLogger("txsink").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning)
    started, load_start = time.time(), load()
    server = server_name(args.url)
    run = replace(setup(args.url, args.zookeeper, args.store), carry=args.carry_max_bytes)
    spark = environment.start_spark(cores=TASKS)
    spark.conf.set("spark.sql.files.openCostInBytes", str(256 << 20))  # a task per file
    import txsink

    txsink.register(spark)
    measured: list[dict] = []
    try:
        workload.create_target(args.url, run.table("batch_plain"))
        _batch_write("batch_plain", run)(_epoch_rows(spark, 0, 1000))  # boots the workers
        for variant in wanted:
            log(f"== {variant} (load {load():.1f})")
            measured.append(run_variant(spark, variant, run, args.rows, args.epochs))
            measured[-1]["recorded"] = recorded(run, variant, args.zookeeper)
        time.sleep(GAP_SECONDS)
        found = messages.statements(args.url, list(run.clickhouse.connections.values()),
                                    run.clickhouse.log.between(started, time.time()), started)
    finally:
        spark.stop()
        teardown(run, args.zookeeper)
    variants = {m["variant"]: count(run, m, found) for m in measured}
    result = environment.run_record(
        "every message of an epoch", "bench_messages.py", started, load_start,
        server=server, clickhouse=sql(args.url, "SELECT version()").strip(), url=args.url,
        store=args.store, rows=args.rows, epochs=args.epochs, tasks=TASKS,
        carry_max_bytes=args.carry_max_bytes,
        target_partitions=workload.DAYS, variants=variants,
        beyond_plain=beyond_plain(variants))
    print(render(result))
    import plots

    carried = "_carried" if args.carry_max_bytes else ""
    log(environment.write_result(args.out / f"messages_{server}_{args.store}{carried}.json", result,
                                 plots.messages))


if __name__ == "__main__":
    sys.exit(main())
