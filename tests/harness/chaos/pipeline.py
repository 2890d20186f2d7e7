"""The job under test, run as its own driver process so that a fault can kill all of it.

Run directly::

    python -m tests.harness.chaos.pipeline --source DIR --checkpoint DIR --table db.events \\
        --sink clickhouse_tx --url http://127.0.0.1:8123 --zookeeper 127.0.0.1:2181 \\
        [--trigger available-now|processing-time] [--interval "1 second"] \\
        [--option timeout=10 ...] [--fail-flag FILE] [--mode stream|batch] \\
        [--way datasource|foreach_batch|write]

``stream`` (default) reads uniquely keyed JSON event files, one file per micro-batch
(``maxFilesPerTrigger=1``), and writes them with ``writeStream`` from the checkpoint;
restarted from the same checkpoint it continues where Spark's commit log says.
``batch`` writes each input file as one batch job with a fixed ``sink_id``; on start it
recovers the sink as an operator would (``txsink recover``), then skips every file whose
ids are all visible, re-runs every file with none visible, and fails loudly on a file
that is partly visible (a job that was not atomic).

``--way`` is how the job reaches the sink: ``datasource`` (default: ``format(--sink)``,
PySpark 4.0+, streams 4.1+), ``foreach_batch`` (streams:
``writeStream.foreachBatch(txsink.foreach_batch(...))``) or ``write`` (batch jobs:
``txsink.write(df, ...)``). With ``--sink clickhouse_plain`` these two are the
at-least-once baseline's ``foreachBatch`` insert (``txsink.spark.plain_batches``). Any way
but ``datasource`` imports nothing of ``pyspark.sql.datasource`` and registers nothing,
so the pipeline runs on every PySpark from 3.5.

:class:`tests.harness.chaos.launcher.DriverProcess` starts this program in a session of its own,
so that its driver, JVM and Python workers can be killed at once, like a lost machine.
The input files and the target table are made here too, so that every harness feeds
the job the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import requests

from tests.harness.chaos import checker
from tests.harness.chaos.faults import fired_markers, kill_session
from txsink.options import KEEPERMAP, STORE_OPTIONS

#: The events every chaos run writes: a unique id per row, three monthly partitions.
SCHEMA = "id LONG, day DATE, name STRING, value DOUBLE"
EVENTS_DDL = (
    "CREATE TABLE {table} (id UInt64, day Date, name String, value Float64) "
    "ENGINE = {engine} PARTITION BY toYYYYMM(day) ORDER BY id"
)
SINKS = ("clickhouse_tx", "clickhouse_plain")
#: The ways in (``--way``): the data source, or the ``mapInArrow`` forms of every PySpark.
DATASOURCE, FOREACH_BATCH, WRITE = "datasource", "foreach_batch", "write"
WAYS = (DATASOURCE, FOREACH_BATCH, WRITE)
#: The ways each mode can take.
MODE_WAYS = {"stream": (DATASOURCE, FOREACH_BATCH), "batch": (DATASOURCE, WRITE)}
EXIT_FAILED = 1          # the query or a job raised
EXIT_NOT_ATOMIC = 3      # batch mode found an input file partly visible
RUNNING_LINE = "query started"    # progress lines the driver prints (see _say)
RECOVERED_LINE = "sink recovered"
RECOVER_PATIENCE_SECONDS = 60.0  # > the ZooKeeper session timeout a dead lease lives for
STANDBY_LINE = "standing by"


def _quoted(table: str) -> str:
    return ".".join("`" + p.replace("\\", "\\\\").replace("`", "\\`") + "`"
                    for p in table.split(".", 1))


def create_events_table(url: str, table: str, engine: str = "MergeTree()") -> None:
    """Create the target (``db.name``) and its database over plain HTTP."""
    db = table.split(".", 1)[0]
    for sql in (f"CREATE DATABASE IF NOT EXISTS {_quoted(db)}",
                EVENTS_DDL.format(table=_quoted(table), engine=engine)):
        resp = requests.post(url, data=sql.encode(), timeout=30)
        if resp.status_code != 200:
            raise RuntimeError(f"cannot create {table}: {resp.content.decode('utf-8')[:300]}")


def fed_table(table: str) -> str:
    """The table the target's materialized view fills (:func:`create_fed_view`)."""
    return f"{table}_fed"


def create_fed_view(url: str, table: str, engine: str = "MergeTree()") -> None:
    """A materialized view of the target (``db.name``) into ``db.name_fed`` (its ``TO``
    table, of ``engine``: a format string of ``{table}``, as the target's): every row's id
    and day, so the checker can count each id there too."""
    fed = fed_table(table)
    for sql in (f"CREATE TABLE {_quoted(fed)} (id UInt64, day Date) ENGINE = "
                f"{engine.format(table=fed)} PARTITION BY toYYYYMM(day) ORDER BY id",
                f"CREATE MATERIALIZED VIEW {_quoted(fed + '_mv')} TO {_quoted(fed)} AS "
                f"SELECT id, day FROM {_quoted(table)}"):
        resp = requests.post(url, data=sql.encode(), timeout=30)
        if resp.status_code != 200:
            raise RuntimeError(f"cannot create {fed}: {resp.content.decode('utf-8')[:300]}")


def check_with_view(url: str, table: str, expected: Iterable[int]) -> checker.CheckResult:
    """The checker's counts of the target; of the view's table where the target's are
    exactly once and the view's are not (every row must reach both exactly once)."""
    expected = list(expected)
    result = checker.check(url, table, expected)
    if result.exactly_once:
        fed = checker.check(url, fed_table(table), expected)
        if not fed.exactly_once:
            return fed
    return result


def event_lines(ids: Iterable[int]) -> Iterator[str]:
    for i in ids:
        yield json.dumps({"id": i, "day": f"2026-0{1 + i % 3}-15", "name": f"event-{i}",
                          "value": i / 2})


def write_epoch_file(source: Path, index: int, ids: Iterable[int]) -> Path:
    """Write one input file atomically (Spark ignores names starting with a dot)."""
    source.mkdir(parents=True, exist_ok=True)
    final = source / f"events-{index:06d}.json"
    tmp = source / f".{final.name}.tmp"
    tmp.write_text("\n".join(event_lines(ids)) + "\n")
    os.replace(tmp, final)
    return final


#: Tasks per epoch, per mode: a stream's 2 winners per table are published directly
#: (``SizeLimits.direct_max_winners``), a batch job's 3 through the combined table (one
#: of them attached from its own staging, two from the pre-combined table), so the crash
#: suites pass both publishes.
WRITE_TASKS = {"stream": 2, "batch": 3}


def input_files(source: Path) -> list[Path]:
    return sorted(source.glob("events-*.json"))


def committed_batches(checkpoint: Path) -> int:
    """Epochs recorded as done: Spark's ``commits/`` files (batch mode writes the same)."""
    commits = checkpoint / "commits"
    if not commits.is_dir():
        return 0
    return sum(1 for p in commits.iterdir() if p.name.isdigit())


def spark_session(master: str, register: bool = True):
    """The pipeline driver's Spark session; ``register``: with the sink's data sources
    registered (the data source way in: PySpark 4.0+)."""
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(master).appName("txsink-chaos")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    if register:
        import txsink

        txsink.register(spark)
    return spark


FAIL_AFTER_SECONDS = 1.0  # the sink's task begins its xid before it reads a row


def _fail_while(flag: str):
    """A mapInArrow function that fails every task while ``flag`` exists (a bad epoch).

    The failure comes after the task's rows were handed on and a second has passed, so
    that the sink's task has begun the epoch's xid by then: failing at once raced the
    sink's task start-up, and an epoch whose xid never began has nothing for Spark's
    abort to roll back (the ``abort.*`` crash points would then never be reached).
    """

    def fn(batches):
        yield from batches
        if os.path.exists(flag):
            time.sleep(FAIL_AFTER_SECONDS)
            raise RuntimeError(f"injected task failure: {flag} exists")

    return fn


WARM_UP_SOURCE = "txsink_chaos_warmup"


def warm_up_source():
    """A data source that writes nothing; a standby runs one job through it to start
    Python workers. Made on call: ``pyspark.sql.datasource`` is PySpark 4's.

    It imports the sink's modules where the real sink will need them (planner, tasks),
    so a promoted standby pays neither process start-up nor imports, and it never
    touches ClickHouse or ZooKeeper (a standby must not fence the sink).
    """
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    class NullWriter(DataSourceArrowWriter):
        def write(self, iterator) -> WriterCommitMessage:
            import txsink.spark.datasource  # noqa: F401 - the import is the warm-up

            for _ in iterator:
                pass
            return WriterCommitMessage()

    class WarmUpDataSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return WARM_UP_SOURCE

        def writer(self, schema, overwrite: bool) -> DataSourceArrowWriter:
            import txsink.spark.datasource  # noqa: F401 - the import is the warm-up

            return NullWriter()

    return WarmUpDataSource


def _import_the_tasks(batches):
    """A ``mapInArrow`` function of the standby's warm-up under the ``mapInArrow`` ways:
    the tasks' modules imported in the Python workers, nothing written."""
    import txsink.core.attempt  # noqa: F401 - the import is the warm-up
    import txsink.spark.job  # noqa: F401

    yield from batches


def _warm_up(spark, way: str) -> None:
    """Start the Python workers and import what the way in will need there."""
    if way == DATASOURCE:
        source = warm_up_source()
        spark.dataSource.register(source)
        spark.range(4, numPartitions=2).write.format(WARM_UP_SOURCE).mode("append").save()
        return
    import txsink.spark.job  # noqa: F401 - the planner, in this driver

    spark.range(4, numPartitions=2).mapInArrow(_import_the_tasks, "id long").collect()


def _say(message: str) -> None:
    """One timestamped progress line in the driver's log."""
    print(f"{time.strftime('%H:%M:%S')}.{int(time.time() * 1000) % 1000:03d} {message}",
          flush=True)


def _stand_by(spark, way: str, go_file: Path, stop_file: Path) -> bool:
    """Warm up (JVM, Python workers), then wait for ``go_file``; False if told to stop.

    A standby driver has not read the checkpoint nor reached the sink yet, so promoting
    it is the same as starting a fresh driver, minus the JVM's start-up time.
    """
    _warm_up(spark, way)
    _say(STANDBY_LINE)
    while not go_file.exists():
        if stop_file.exists():
            return False
        time.sleep(0.05)
    _say("promoted")
    return True


def die_with_crash_points(once_dir: Path) -> None:
    """Kill this driver's whole session as soon as a crash point fires in any process.

    A crash point in ``group`` mode kills its own process group. In a task that is the
    group of PySpark's daemon and its workers, not the driver's (the daemon calls
    ``os.setpgid(0, 0)``), so the driver and its JVM would live on and retry the task.
    This thread makes "crashed at a point" mean what a fault test wants: the worker
    dies at the point, the rest of the driver milliseconds later.
    """
    already = fired_markers(once_dir)

    def watch() -> None:
        nonlocal already
        while True:
            now = fired_markers(once_dir)
            if now - already:
                kill_session(os.getsid(0))
            already = now
            time.sleep(0.01)

    threading.Thread(target=watch, name="crash-point-watch", daemon=True).start()


def _sink_options(args: argparse.Namespace) -> dict[str, str]:
    options = {"url": args.url, "zookeeper": args.zookeeper, "table": args.table}
    if args.sink == "clickhouse_tx":
        options["zk_root"] = args.zk_root
    if args.sink_id:
        options["sink_id"] = args.sink_id
    for item in args.option:
        key, _, value = item.partition("=")
        options[key] = value
    if options.get("coordinator") == KEEPERMAP:  # records in KeeperMap: no ZooKeeper
        del options["zookeeper"]
    return options


#: The sink options that name the coordinator's store; an operator command takes each as
#: the argument of the same name (``--coordinator``, ``--records-url``, ...).
STORE_OPTION_NAMES = ("coordinator", *STORE_OPTIONS[KEEPERMAP])


def store_options(options: Mapping[str, str]) -> dict[str, str]:
    """The options of ``options`` that name the coordinator's store (none: ZooKeeper's)."""
    return {name: options[name] for name in STORE_OPTION_NAMES if name in options}


def _function_options(args: argparse.Namespace) -> dict[str, str]:
    """The sink's options as keyword arguments of a function way in (no ``table``)."""
    options = _sink_options(args)
    del options["table"]
    return options


def foreach_batch_function(args: argparse.Namespace):
    """The ``foreachBatch`` function of ``--way foreach_batch``: the sink's, or the
    at-least-once baseline's plain insert."""
    if args.sink == "clickhouse_plain":
        from txsink.spark.plain_batches import plain_foreach_batch

        return plain_foreach_batch(table=args.table, **_function_options(args))
    import txsink

    return txsink.foreach_batch(table=args.table, **_function_options(args))


def write_batch(df, args: argparse.Namespace) -> None:
    """One batch job of ``--mode batch``, appended the way ``--way`` names."""
    if args.way == DATASOURCE:
        df.write.format(args.sink).options(**_sink_options(args)).mode("append").save()
    elif args.sink == "clickhouse_plain":
        foreach_batch_function(args)(df, 0)  # a plain insert, as the data source's
    else:
        import txsink

        txsink.write(df, table=args.table, mode="append", **_function_options(args))


def _store_args(args: argparse.Namespace) -> dict[str, str]:
    """The operator's arguments for the store the sink's options name."""
    return store_options(_sink_options(args))


def _run_stream(spark, args: argparse.Namespace) -> None:
    Path(args.source).mkdir(parents=True, exist_ok=True)
    df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(args.source)
    df = df.repartition(WRITE_TASKS["stream"])
    if args.fail_flag:
        df = df.mapInArrow(_fail_while(args.fail_flag), df.schema)
    if args.way == FOREACH_BATCH:
        writer = df.writeStream.foreachBatch(foreach_batch_function(args))
    else:
        writer = df.writeStream.format(args.sink).options(**_sink_options(args))
    writer = writer.option("checkpointLocation", args.checkpoint)
    if args.trigger == "available-now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=args.interval)
    query = writer.start()
    _say(RUNNING_LINE)
    stop_file = Path(args.checkpoint + ".stop")
    while query.isActive:
        if stop_file.exists():
            query.stop()
            break
        query.awaitTermination(0.5)
    if query.exception():
        raise query.exception()


def _visible(args: argparse.Namespace, ids: list[int]) -> int:
    from tests.harness.chaos.checker import count_in_range

    return count_in_range(args.url, args.table, min(ids), max(ids) + 1)


def _recover_sink(args: argparse.Namespace) -> None:
    """What an operator runs before re-running a failed job: ``txsink recover --sink``.

    A job whose decision was written is rolled forward (its rows become visible); an
    undecided one stays invisible and is rolled back by the next job's writer. Like an
    operator, it does not rerun anything while recover reports an xid ``in_progress``
    (a killed driver's publish lease lives until its ZooKeeper session expires): which
    jobs are visible is known only once that xid is finished.
    """
    from txsink.ops.commands import Operations

    deadline = time.monotonic() + RECOVER_PATIENCE_SECONDS
    ops = Operations(zookeeper=args.zookeeper, url=args.url,
                     zk_root=_sink_options(args).get("zk_root", args.zk_root),
                     **_store_args(args))
    try:
        while _in_progress(ops.recover(args.sink_id)) and time.monotonic() < deadline:
            time.sleep(1.0)
    finally:
        ops.close()
    _say(RECOVERED_LINE)


def _in_progress(report: dict) -> bool:
    return any("in_progress" in action for sink in report["sinks"] for action in sink["actions"])


def _run_batch(spark, args: argparse.Namespace) -> int:
    if not args.sink_id:
        raise SystemExit("--mode batch needs --sink-id (the restarted job must be the same sink)")
    _recover_sink(args)
    stop_file = Path(args.checkpoint + ".stop")
    commits = Path(args.checkpoint) / "commits"
    commits.mkdir(parents=True, exist_ok=True)
    done: set[Path] = set()
    while not stop_file.exists():
        pending = [p for p in input_files(Path(args.source)) if p not in done]
        if not pending and args.trigger == "available-now":
            return 0
        for path in pending:
            ids = [json.loads(line)["id"] for line in path.read_text().splitlines() if line]
            visible = _visible(args, ids)
            if 0 < visible != len(ids) or visible > len(ids):
                print(f"pipeline failed: {path.name} is partly visible ({visible} of "
                      f"{len(ids)} rows): the job was not atomic", flush=True)
                return EXIT_NOT_ATOMIC
            if visible == 0:
                df = spark.read.schema(SCHEMA).json(str(path)).repartition(WRITE_TASKS["batch"])
                if args.fail_flag:
                    df = df.mapInArrow(_fail_while(args.fail_flag), df.schema)
                write_batch(df, args)
                _say(f"{path.name} written")
            done.add(path)
            (commits / str(len(done) - 1)).touch()
        time.sleep(0.2)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.harness.chaos.pipeline",
                                description="the streaming (or batch) job under test")
    p.add_argument("--source", required=True, help="folder of events-*.json input files")
    p.add_argument("--checkpoint", required=True, help="streaming checkpoint folder")
    p.add_argument("--table", required=True, help="target db.table")
    p.add_argument("--sink", choices=SINKS, default="clickhouse_tx")
    p.add_argument("--url", required=True)
    p.add_argument("--zookeeper", required=True)
    p.add_argument("--zk-root", default="/txsink")
    p.add_argument("--sink-id", default=None)
    p.add_argument("--mode", choices=("stream", "batch"), default="stream")
    p.add_argument("--way", choices=WAYS, default=DATASOURCE,
                   help="how the job reaches the sink: the data source (PySpark 4.0+), "
                        "foreach_batch (streams) or write (batch jobs), on every PySpark")
    p.add_argument("--trigger", choices=("available-now", "processing-time"),
                   default="processing-time")
    p.add_argument("--interval", default="1 second")
    p.add_argument("--master", default="local[2,3]")
    p.add_argument("--fail-flag", default=None, help="tasks fail while this file exists")
    p.add_argument("--option", action="append", default=[], help="extra sink option k=v")
    p.add_argument("--go-file", default=None,
                   help="start Spark, then wait for this file before touching the sink")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.way not in MODE_WAYS[args.mode]:
        parser.error(f"--mode {args.mode} takes --way {' or '.join(MODE_WAYS[args.mode])}")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = spark_session(args.master, register=args.way == DATASOURCE)
    try:
        stop_file = Path(args.checkpoint + ".stop")
        if args.go_file and not _stand_by(spark, args.way, Path(args.go_file), stop_file):
            return 0
        once_dir = os.environ.get("TXSINK_CRASH_ONCE_DIR")
        if once_dir and os.environ.get("TXSINK_CRASH_MODE", "group") == "group":
            die_with_crash_points(Path(once_dir))
        if args.mode == "batch":
            return _run_batch(spark, args)
        _run_stream(spark, args)
        return 0
    except Exception as exc:  # noqa: BLE001 - the harness reads this one line
        text = " ".join(str(exc).split())
        print(f"pipeline failed: {type(exc).__name__}: {text[:1500]}", flush=True)
        return EXIT_FAILED
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
