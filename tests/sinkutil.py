"""Helpers for Spark sink tests: an independent row counter and table setup.

Counting goes straight to ClickHouse over HTTP, never through the sink's own code.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Iterator

from tests.conftest import run_sql


def driver_env(**extra: str) -> dict[str, str]:
    """The environment of a Spark driver a test starts as its own process: this Python for
    its workers, and the fast start-up of the fault runs (``tests.harness.chaos.jvm``: a
    class-data-sharing archive, ~13 s -> ~5 s per driver start on 2 cores, and the worker
    site for its Python workers)."""
    from tests.harness.chaos import jvm

    return {**os.environ, "PYSPARK_PYTHON": sys.executable, **jvm.submit_env(), **extra}


#: The option ``session_timeout`` of writers a test kills: the next writer finishes the dead
#: one's xid once its publish lease expires with its session, 4 s later (default 10 s).
SHORT_SESSION = {"session_timeout": "4"}

EVENTS_DDL = (
    "CREATE TABLE {table} (id UInt64, day Date, name String, value Float64) "
    "ENGINE = {engine} PARTITION BY toYYYYMM(day) ORDER BY id"
)


def create_events(url: str, db: str, name: str = "events", engine: str = "MergeTree()") -> str:
    table = f"`{db}`.`{name}`"
    run_sql(url, EVENTS_DDL.format(table=table, engine=engine))
    return f"{db}.{name}"


def save(df, options: dict[str, str], table: str, mode: str = "append", **extra: str) -> None:
    """Write ``df`` into ``table`` through ``clickhouse_tx`` with ``options`` and ``extra``."""
    (df.write.format("clickhouse_tx").options(**options).options(**extra)
        .option("table", table).mode(mode).save())


def coordinator_root(zk_hosts: str, parent: str) -> Iterator[str]:
    """A fresh coordinator root under ``parent`` for a module's subprocess job (which
    cannot use the per-test chroot); the root, and ``parent`` if then empty, deleted
    after."""
    from kazoo.exceptions import NoNodeError, NotEmptyError

    from tests.conftest import kazoo_client

    root = f"{parent}/{uuid.uuid4().hex[:10]}"
    yield root
    admin = kazoo_client(zk_hosts)
    admin.start(timeout=15)
    for path in (root, parent):
        try:
            admin.delete(path, recursive=path == root)
        except (NoNodeError, NotEmptyError):  # never created / another run's root is there
            pass
    admin.stop()
    admin.close()


def write_in_threads(spark, count: int, write: Callable[[int], None]) -> None:
    """Run ``write(0)`` .. ``write(count - 1)`` at once, each in its own Python thread
    with ``txsink.register(spark)`` first (a new thread has no active session); fail with
    every thread's error."""
    from pyspark import InheritableThread

    import txsink

    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            txsink.register(spark)
            write(index)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [InheritableThread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=240)
    assert not errors, errors


def id_counts(url: str, table: str) -> dict[int, int]:
    """How many times each id is visible in ``table``."""
    db, name = table.split(".", 1)
    body = run_sql(url, f"SELECT id, count() FROM `{db}`.`{name}` GROUP BY id FORMAT TSV")
    return {int(a): int(b) for a, b in (line.split("\t") for line in body.splitlines())}


def assert_exactly_once(url: str, table: str, expected_ids) -> None:
    assert_counts_exactly_once(id_counts(url, table), expected_ids)


def assert_counts_exactly_once(counts: dict[int, int], expected_ids) -> None:
    """Every expected id counted once: none duplicated, lost or unexpected."""
    expected = set(expected_ids)
    duplicated = sorted(i for i, c in counts.items() if c > 1)
    lost = sorted(expected - counts.keys())
    unexpected = sorted(counts.keys() - expected)
    assert not duplicated, f"{len(duplicated)} ids duplicated, e.g. {duplicated[:5]}"
    assert not lost, f"{len(lost)} ids lost, e.g. {lost[:5]}"
    assert not unexpected, f"{len(unexpected)} unexpected ids, e.g. {unexpected[:5]}"


def staging_tables(url: str, options: dict[str, str]) -> list[str]:
    """Staging tables of the sinks of ``options``' coordinator root (tests running beside
    this one write into the same staging database under other roots)."""
    from server_ext.staging.staging_tables import root_tag
    from txsink.options import parse_options, root_identity

    if options.get("coordinator") == "keepermap":  # the root is the records table's
        identity = parse_options({"url": url, "table": "x.y", **options},
                                 env={}).store.root_identity
    else:
        identity = root_identity(options["zookeeper"], options.get("zk_root", "/txsink"))
    tag = root_tag(identity)
    body = run_sql(url, "SELECT name FROM system.tables WHERE database = 'txsink_staging'")
    return [name for name in body.split() if name.endswith(f"_r{tag}")]


def staging_insert_settings(url: str, options: dict[str, str],
                            setting: str = "async_insert") -> list[str]:
    """The ``setting`` of every finished INSERT of rows (``... FORMAT``, not the combine's
    ``INSERT ... SELECT``) into the staging tables of ``options``' coordinator root, from
    ``system.query_log`` ('' where the INSERT did not set it; the modern test server keeps
    the log, 18.16 logs no settings)."""
    from server_ext.staging.staging_tables import root_tag
    from txsink.options import parse_options, root_identity

    if options.get("coordinator") == "keepermap":  # the root is the records table's
        identity = parse_options({"url": url, "table": "x.y", **options},
                                 env={}).store.root_identity
    else:
        identity = root_identity(options["zookeeper"], options.get("zk_root", "/txsink"))
    tag = root_tag(identity)
    run_sql(url, "SYSTEM FLUSH LOGS")
    body = run_sql(url, (
        f"SELECT Settings['{setting}'] FROM system.query_log WHERE type = 'QueryFinish' "
        "AND query_kind = 'Insert' AND position(query, '`txsink_staging`.') > 0 "
        "AND position(query, ' FORMAT ') > 0 "
        f"AND position(query, '_r{tag}`') > 0"))
    return body.splitlines()


def events_df(spark, start: int, count: int, partitions: int = 4):
    """``count`` rows with unique ids from ``start``, spread over three months."""
    return spark.range(start, start + count, numPartitions=partitions).selectExpr(
        "id",
        "date_add(DATE'2026-01-01', CAST(id % 90 AS INT)) AS day",
        "concat('event-', CAST(id AS STRING)) AS name",
        "CAST(id AS DOUBLE) * 0.5 AS value",
    )


def moves_into(url: str, table: str) -> int:
    """How many ``ALTER … MOVE PARTITION`` statements naming ``table``'s database finished
    on the server (``system.query_log``; the modern test server keeps one)."""
    db = table.split(".", 1)[0]
    run_sql(url, "SYSTEM FLUSH LOGS")
    return int(run_sql(url, (
        "SELECT count() FROM system.query_log WHERE type = 'QueryFinish' "
        "AND positionCaseInsensitive(query, 'MOVE PARTITION') > 0 "
        f"AND position(query, '{db}') > 0")))


def task_winners(coord, epoch: int) -> set[str]:
    """The task branches whose rows an xid's decision made visible: its winners, with each
    combined winner replaced by its sources."""
    from txsink.core.payload import CombinedBranch, from_record

    record = coord.xid(epoch)
    found: set[str] = set()
    for branch in coord.branches(epoch, record.winners):
        payload = from_record(branch.manifest)
        found.update(payload.sources if isinstance(payload, CombinedBranch)
                     else (branch.branch_id,))
    return found
