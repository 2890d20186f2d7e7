"""Exactly-once writes into a sharded, replicated target (the 2 shards x 2 replicas cluster).

Every test counts rows per id straight from each shard server over HTTP (never through
the sink), on every replica of a replicated table after ``SYSTEM SYNC REPLICA``, and
checks that each id is visible exactly once across the shards and on the shard that the
sharding key names: the server itself evaluates ``key % 2`` (weights 1, 1) over the rows
it holds, so the check does not trust the sink's router.

Fault tests SIGKILL cluster servers at a named moment and start them again in a
``finally`` (the ``topology`` fixture). Where the moment is a driver-side crash point,
note that the driver side of a Python data source does *not* run in the pytest process:
Spark runs ``writer()`` and ``commit()``/``abort()`` in Python planner workers that it
spawns, so ``monkeypatch.setattr("txsink.core.crashpoints.hit", ...)`` here would never be
called. The tests therefore write through ``clickhouse_tx_hooked`` (:class:`HookedSource`,
pickled by value into those workers): its ``commit`` replaces ``txsink.core.crashpoints.hit``
(read at call time by ``connections.coordinator()`` and ``BranchPublisher.publish``) with
a rendezvous that stops the commit at the named step until the test, in this process, has
acted (killed a server) — see :class:`Rendezvous`.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests
from pyspark import cloudpickle

import txsink
import txsink.core.crashpoints
import txsink.core.publisher
from coordinator import BranchState, Coordinator, XidState
from coordinator.sink_admin import SinkAdmin
from server_ext.publish.publish_ledger import ATTACHING
from server_ext.staging.staging_tables import sink_key
from tests.conftest import kazoo_client, run_sql
from tests.harness.services import Cluster, ClusterServer
from tests.sinkutil import assert_counts_exactly_once, events_df, task_winners
from tests.spark.test_sink_streaming import SCHEMA, write_input_file
from txsink.core.combine import PRECOMBINED_PREFIX
from txsink.ops.commands import Operations
from txsink.spark.datasource import BatchWriter, ClickHouseTxDataSource

EVENTS_COLUMNS = "(id UInt64, day Date, name String, value Float64)"
LOCAL = "events"  # the local table on every shard server
DISTRIBUTED = "events_all"  # the Distributed table on the main server
FAULT_OPTIONS = {"timeout": "3", "retries": "1"}  # a dead server fails a call within ~1 s
HOOK_OPTION = "test_hook"

# HookedSource and its writer travel by value into Spark's Python workers, which then need
# not import this test module (nor pytest).
cloudpickle.register_pickle_by_value(sys.modules[__name__])


# -- a commit that stops at a named crash point (runs in Spark's planner worker) -----------


@contextlib.contextmanager
def _armed(spec: dict) -> Iterator[None]:
    """Replace ``txsink.core.crashpoints.hit`` for the duration of one commit.

    At a step named in ``spec["steps"]`` (and, if ``spec["servers"]`` is given, only while
    a branch of one of those servers is being published) the hook writes
    ``<dir>/<step>.reached`` holding that server's URL and waits for ``<dir>/<step>.go``.
    Each step stops once.
    """
    folder, steps = Path(spec["dir"]), set(spec["steps"])
    servers = set(spec.get("servers") or ())
    publishing = threading.local()  # per thread: winners of different servers publish at once
    original_hit = txsink.core.crashpoints.hit
    original_server_of = txsink.core.publisher.server_of

    def server_of(record):
        publishing.server = original_server_of(record)
        return publishing.server

    def hit(name: str) -> None:
        original_hit(name)
        server = getattr(publishing, "server", None)
        if name not in steps or (servers and server not in servers):
            return
        reached = folder / f"{name}.reached"
        if reached.exists():
            return
        tmp = folder / f"{name}.tmp"
        tmp.write_text(server or "")
        tmp.rename(reached)
        deadline = time.monotonic() + 240
        while not (folder / f"{name}.go").exists() and time.monotonic() < deadline:
            time.sleep(0.05)

    txsink.core.crashpoints.hit, txsink.core.publisher.server_of = hit, server_of
    try:
        yield
    finally:
        txsink.core.crashpoints.hit = original_hit
        txsink.core.publisher.server_of = original_server_of


class HookedBatchWriter(BatchWriter):
    def __init__(self, plan, spec: dict) -> None:
        super().__init__(plan)
        self.spec = spec

    def commit(self, messages) -> None:
        with _armed(self.spec):
            super().commit(messages)


class HookedSource(ClickHouseTxDataSource):
    """``clickhouse_tx`` with one more option, ``test_hook`` (JSON for :func:`_armed`)."""

    @classmethod
    def name(cls) -> str:
        return "clickhouse_tx_hooked"

    def writer(self, schema, overwrite):
        options = {k: v for k, v in self.options.items() if k.lower() != HOOK_OPTION}
        spec = json.loads(self.options[HOOK_OPTION])
        self.options = options
        return HookedBatchWriter(super().writer(schema, overwrite).plan, spec)


class Rendezvous:
    """The test's side of :func:`_armed`: when the commit reaches ``step``, run
    ``action(server)`` here, then let the commit go on."""

    def __init__(self, folder: Path, step: str, action: Callable[[str | None], None],
                 servers: list[str] | None = None) -> None:
        self.folder, self.step, self.action = folder, step, action
        self.servers = servers
        self.reached_with: str | None = None
        self.reached = threading.Event()
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        folder.mkdir(parents=True, exist_ok=True)

    def option(self) -> str:
        return json.dumps({"dir": str(self.folder), "steps": [self.step],
                           "servers": self.servers})

    def __enter__(self) -> Rendezvous:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        marker = self.folder / f"{self.step}.reached"
        while not self._stop.is_set():
            if marker.exists():
                self.reached_with = marker.read_text() or None
                try:
                    self.action(self.reached_with)
                except BaseException as exc:  # noqa: BLE001 - re-raised in __exit__
                    self.error = exc
                finally:
                    self.reached.set()
                    (self.folder / f"{self.step}.go").touch()
                return
            time.sleep(0.05)


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _registered(spark) -> None:
    txsink.register(spark)
    spark.dataSource.register(HookedSource)


@pytest.fixture
def sink_id() -> str:
    return f"cluster-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def zk_sink(zk_hosts: str, zk_chroot: str) -> str:
    """The ``zookeeper`` option of the test: its own chroot."""
    return zk_hosts + zk_chroot


@pytest.fixture
def topology(cluster: Cluster, cluster_db: str) -> Iterator[Cluster]:
    """The cluster, every server started again after the test whatever happened (before
    ``cluster_db`` drops the test's database everywhere)."""
    try:
        yield cluster
    finally:
        cluster.up()


# -- setup ---------------------------------------------------------------------------------


def replicated_local_tables(cluster: Cluster, db: str) -> str:
    """`db`.events as ReplicatedMergeTree on every server, one replica set per shard."""
    for server in cluster.servers:
        run_sql(server.url, f"""
            CREATE TABLE `{db}`.`{LOCAL}` {EVENTS_COLUMNS}
            ENGINE = ReplicatedMergeTree('/clickhouse/tables/{{shard}}/{db}/{LOCAL}',
                                         '{{replica}}')
            PARTITION BY toYYYYMM(day) ORDER BY id""")
    return f"{db}.{LOCAL}"


def distributed_table(cluster: Cluster, db: str, key: str = "id") -> str:
    """`db`.events_all on the main server over the shards' `db`.events; its name."""
    assert cluster.main is not None
    run_sql(cluster.main.url, f"""
        CREATE TABLE `{db}`.`{DISTRIBUTED}` {EVENTS_COLUMNS}
        ENGINE = Distributed({cluster.name}, '{db}', '{LOCAL}', {key})""")
    return f"{db}.{DISTRIBUTED}"


def plain_sharded_target(cluster: Cluster, db: str, zk: str, sink: str
                         ) -> tuple[list[list[str]], str, dict[str, str]]:
    """`db`.events as plain MergeTree on each shard's first replica (no replication: one
    server per shard), and options writing there with the key ``cityHash64(name)``:
    (the shards' URLs, the table, the options)."""
    shards = [[replicas[0]] for replicas in cluster.shard_urls()]
    for (url,) in shards:
        run_sql(url, f"CREATE TABLE `{db}`.`{LOCAL}` {EVENTS_COLUMNS} "
                     "ENGINE = MergeTree() PARTITION BY toYYYYMM(day) ORDER BY id")
    table = f"{db}.{LOCAL}"
    return shards, table, {"url": shards[0][0], "table": table,
                           "shards": shards_option(shards), "sharding_key": "cityHash64(name)",
                           "zookeeper": zk, "sink_id": sink}


def shards_option(urls: list[list[str]]) -> str:
    return ";".join(",".join(replicas) for replicas in urls)


def distributed_options(cluster: Cluster, db: str, zk: str, sink: str,
                        **extra: str) -> dict[str, str]:
    """Options writing through the Distributed table (layout and key read from it)."""
    assert cluster.main is not None
    return {"url": cluster.main.url, "table": distributed_table(cluster, db),
            "shards": shards_option(cluster.shard_urls()), "zookeeper": zk,
            "sink_id": sink, **extra}


def save(df, options: dict[str, str], source: str = "clickhouse_tx") -> None:
    df.write.format(source).options(**options).mode("append").save()


# -- independent checks --------------------------------------------------------------------


def id_counts(url: str, table: str) -> dict[int, int]:
    body = run_sql(url, f"SELECT id, count() FROM {table} GROUP BY id FORMAT TSV")
    return {int(a): int(b) for a, b in (line.split("\t") for line in body.splitlines())}


def assert_sharded_exactly_once(shards: list[list[str]], table: str, expected_ids,
                                key: str = "id", replicated: bool = True) -> None:
    """Each id exactly once across the shards, on the shard ``key % shards`` names, and
    every replica of a shard holding the same rows (``shards``: URLs per shard)."""
    per_shard: list[dict[int, int]] = []
    for index, replicas in enumerate(shards):
        urls = replicas if replicated else replicas[:1]
        counts = []
        for url in urls:
            if replicated:
                run_sql(url, f"SYSTEM SYNC REPLICA {table}")
            counts.append(id_counts(url, table))
            misplaced = run_sql(url, f"SELECT count() FROM {table} "
                                     f"WHERE ({key}) % {len(shards)} != {index}").strip()
            assert misplaced == "0", f"{misplaced} rows on {url} belong to another shard"
        for url, other in zip(urls[1:], counts[1:], strict=True):
            assert other == counts[0], f"replica {url} holds other rows than {urls[0]}"
        per_shard.append(counts[0])
    total: dict[int, int] = {}
    for counts in per_shard:
        for i, c in counts.items():
            total[i] = total.get(i, 0) + c
    assert_counts_exactly_once(total, expected_ids)
    assert all(per_shard), "a shard got no rows at all"


def row_count(url: str, table: str) -> int:
    return int(run_sql(url, f"SELECT count() FROM {table}").strip())


def staging_of(url: str, sink: str) -> list[str]:
    """The sink's staging tables on ``url``."""
    body = run_sql(url, "SELECT name FROM system.tables WHERE database = 'txsink_staging' "
                        f"AND startsWith(name, 'txs_{sink_key(sink)}_')")
    return body.split()


def staging_left(cluster: Cluster, sink: str) -> dict[str, list[str]]:
    """Staging tables of ``sink`` on every cluster server (all must answer)."""
    return {server.url: tables for server in cluster.servers
            if (tables := staging_of(server.url, sink))}


def wait_writable(url: str, db: str, timeout: float = 60.0) -> None:
    """Wait until the server's replicated tables of ``db`` have left read-only mode.

    A SIGKILLed replica stays read-only after its restart until its old ZooKeeper
    session has expired.
    """
    deadline = time.monotonic() + timeout
    query = f"SELECT count() FROM system.replicas WHERE database = '{db}' AND is_readonly"
    while True:
        try:
            if run_sql(url, query).strip() == "0":
                return
        except (AssertionError, requests.RequestException):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{url}: replicas of {db} still read-only after {timeout}s")
        time.sleep(0.2)


def restart(server: ClusterServer, db: str) -> None:
    server.start()
    wait_writable(server.url, db)


def server_at(cluster: Cluster, url: str) -> ClusterServer:
    return next(server for server in cluster.servers if server.url == url)


@contextlib.contextmanager
def coordinator_of(zk: str, sink: str) -> Iterator[Coordinator]:
    client = kazoo_client(zk)
    client.start(timeout=15)
    try:
        yield Coordinator(client, sink)
    finally:
        client.stop()
        client.close()


@contextlib.contextmanager
def operations(zk: str) -> Iterator[Operations]:
    ops = Operations(zk)
    try:
        yield ops
    finally:
        ops.close()


def winner_servers(zk: str, sink: str, epoch: int = 0) -> dict[str, str]:
    """Winner branch id -> URL of the server holding its staging (where it publishes)."""
    with coordinator_of(zk, sink) as coord:
        record = coord.xid(epoch)
        branches = {b.branch_id: b for b in coord.branches(epoch)}
    assert record is not None
    return {w: (branches[w].owner or {}).get("server") for w in record.winners}


# -- tests ---------------------------------------------------------------------------------


def test_append_through_distributed_table_lands_where_distributed_would_put_each_row(
    spark, cluster: Cluster, cluster_db: str, zk_sink: str, sink_id: str
) -> None:
    """The layout and key come from the Distributed table (``shards`` only gives the HTTP
    URLs): each row goes to shard ``id % 2`` (weights 1, 1), staged on one replica and
    copied to the other by replication."""
    table = replicated_local_tables(cluster, cluster_db)
    options = distributed_options(cluster, cluster_db, zk_sink, sink_id)
    save(events_df(spark, 0, 3000), options)
    assert_sharded_exactly_once(cluster.shard_urls(), table, range(3000), key="id")
    assert staging_left(cluster, sink_id) == {}


def test_append_with_shards_option_and_city_hash_key_to_plain_merge_tree(
    spark, cluster: Cluster, cluster_db: str, zk_sink: str, sink_id: str
) -> None:
    """Plain MergeTree has no replication, so each shard is one server (its first
    replica); the expression key is routed by chdb in the Spark workers and checked by
    the servers' own cityHash64."""
    shards, table, options = plain_sharded_target(cluster, cluster_db, zk_sink, sink_id)
    save(events_df(spark, 0, 3000), options)
    assert_sharded_exactly_once(shards, table, range(3000), key="cityHash64(name)",
                                replicated=False)
    assert staging_left(cluster, sink_id) == {}


def test_rows_with_a_null_sharding_key_are_quarantined_on_the_first_shard_with_quarantine(
    spark, cluster: Cluster, cluster_db: str, zk_sink: str, sink_id: str
) -> None:
    """A null key gives a row no shard: with ``bad_rows=quarantine`` it is a bad row (kept
    once, in the first shard's quarantine table), the others land where the key puts them."""
    shards, table, options = plain_sharded_target(cluster, cluster_db, zk_sink, sink_id)
    options.update(bad_rows="quarantine", quarantine_table=f"{cluster_db}.bad")
    df = events_df(spark, 0, 300).selectExpr(
        "id", "day", "IF(id % 50 = 0, NULL, name) AS name", "value")
    save(df, options)
    keyless = list(range(0, 300, 50))
    assert_sharded_exactly_once(shards, table, [i for i in range(300) if i not in keyless],
                                key="cityHash64(name)", replicated=False)
    kept = run_sql(shards[0][0], f"SELECT visitParamExtractUInt(row, 'id'), reason FROM "
                                 f"`{cluster_db}`.bad FORMAT TSV").splitlines()
    assert sorted(int(line.split("\t")[0]) for line in kept) == keyless
    assert all("null in sharding key cityHash64(name)" in line for line in kept), kept
    assert run_sql(shards[1][0], f"SELECT count() FROM `{cluster_db}`.bad").strip() == "0"
    assert staging_left(cluster, sink_id) == {}


def test_a_nullable_key_column_is_refused_before_any_xid_even_with_quarantine(
    spark, cluster: Cluster, cluster_db: str, zk_sink: str, sink_id: str
) -> None:
    """The server refuses a Distributed key on a Nullable column: every task would fail
    after the xid opened."""
    shards = [[replicas[0]] for replicas in cluster.shard_urls()]
    for (url,) in shards:
        run_sql(url, f"CREATE TABLE `{cluster_db}`.`{LOCAL}` (id Nullable(Int64), day Date) "
                     "ENGINE = MergeTree() PARTITION BY toYYYYMM(day) ORDER BY day")
    options = {"url": shards[0][0], "table": f"{cluster_db}.{LOCAL}",
               "shards": shards_option(shards), "sharding_key": "id", "zookeeper": zk_sink,
               "sink_id": sink_id, "bad_rows": "quarantine",
               "quarantine_table": f"{cluster_db}.bad"}
    df = spark.range(0, 10, numPartitions=2).selectExpr("id", "DATE'2026-01-15' AS day")
    with pytest.raises(Exception, match=r"sharding key column `id` is Nullable\(Int64\), not "
                                        r"an integer type"):
        save(df, options)
    with coordinator_of(zk_sink, sink_id) as coord:
        assert SinkAdmin(coord).xids() == []
    assert staging_left(cluster, sink_id) == {}


def test_an_expression_key_the_server_computes_otherwise_than_chdb_is_refused_leaving_nothing(
    spark, cluster: Cluster, cluster_db: str, zk_sink: str, sink_id: str
) -> None:
    """18.16 computes ``toInt32(-8) % 70001`` as 55933, chdb as -8: rows would go to other
    shards than the Distributed table puts them. The task's probe refuses the key."""
    shards = [[replicas[0]] for replicas in cluster.shard_urls()]
    for (url,) in shards:
        run_sql(url, f"CREATE TABLE `{cluster_db}`.`{LOCAL}` (id Int32, day Date) "
                     "ENGINE = MergeTree() PARTITION BY toYYYYMM(day) ORDER BY id")
    table = f"{cluster_db}.{LOCAL}"
    options = {"url": shards[0][0], "table": table, "shards": shards_option(shards),
               "sharding_key": "id % 70001", "zookeeper": zk_sink, "sink_id": sink_id}
    df = spark.range(-50, 50, numPartitions=2).selectExpr(
        "CAST(id AS INT) AS id", "DATE'2026-01-15' AS day")
    with pytest.raises(Exception, match="computed differently by the server than by chdb"):
        save(df, options)
    assert [row_count(url, table) for (url,) in shards] == [0, 0]
    assert staging_left(cluster, sink_id) == {}


def run_stream(spark, source: Path, checkpoint: Path, options: dict[str, str]) -> list:
    """Process every input file present now, one file per micro-batch, then stop; the
    query's progress reports."""
    query = (
        spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(source))
        .writeStream.format("clickhouse_tx").options(**options)
        .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    )
    query.awaitTermination(180)
    if query.exception():
        raise query.exception()
    return query.recentProgress


def test_streaming_commits_each_micro_batch_once_and_a_replay_writes_nothing(
    spark, tmp_path: Path, cluster: Cluster, cluster_db: str, zk_sink: str, sink_id: str
) -> None:
    """Three micro-batches through the Distributed table, one xid each; the replay of a
    committed micro-batch re-reads its rows but stages nothing on any shard."""
    table = replicated_local_tables(cluster, cluster_db)
    options = distributed_options(cluster, cluster_db, zk_sink, sink_id)
    source, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    for n in range(3):
        write_input_file(source, n, range(n * 300, n * 300 + 300))
    run_stream(spark, source, checkpoint, options)
    assert_sharded_exactly_once(cluster.shard_urls(), table, range(900))
    # As if the driver died after the sink committed batch 2 but before Spark recorded it:
    # Spark replays batch 2, whose xid is Committed, so no task may stage anything.
    (checkpoint / "commits" / "2").unlink()
    (checkpoint / "commits" / ".2.crc").unlink(missing_ok=True)
    replay = run_stream(spark, source, checkpoint, options)
    assert [(p.batchId, p.numInputRows) for p in replay] == [(2, 300)]
    assert_sharded_exactly_once(cluster.shard_urls(), table, range(900))
    with coordinator_of(zk_sink, sink_id) as coord:
        assert SinkAdmin(coord).last_committed() == 2
        assert [b for b in coord.branches(2) if b.state is not BranchState.COMMITTED
                and not b.branch_id.startswith(PRECOMBINED_PREFIX)] == []
    assert staging_left(cluster, sink_id) == {}


def spark_conf(spark, key: str, value: str):
    """Set a Spark SQL conf for one block."""

    @contextlib.contextmanager
    def scope() -> Iterator[None]:
        spark.conf.set(key, value)
        try:
            yield
        finally:
            spark.conf.unset(key)

    return scope()


class StagingKiller(threading.Thread):
    """SIGKILLs the first cluster server on which ``sink``'s staging parts appear (a task
    is streaming rows into it), starts it again ``down_for`` seconds later and waits until
    its replicated tables accept writes again."""

    def __init__(self, cluster: Cluster, sink: str, db: str, down_for: float = 3.0) -> None:
        super().__init__(daemon=True)
        self.cluster, self.sink, self.db, self.down_for = cluster, sink, db, down_for
        self.killed: ClusterServer | None = None
        self.back = threading.Event()
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        query = ("SELECT count() FROM system.parts WHERE database = 'txsink_staging' "
                 f"AND startsWith(table, 'txs_{sink_key(self.sink)}_')")
        try:
            while self.killed is None and not self.stop.is_set():
                for server in self.cluster.servers:
                    if run_sql(server.url, query).strip() != "0":
                        server.kill()
                        self.killed = server
                        break
                else:
                    time.sleep(0.02)
            if self.killed is not None:
                time.sleep(self.down_for)
                restart(self.killed, self.db)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            self.back.set()


def test_server_killed_while_tasks_stage_retries_them_on_the_other_replica(
    spark, tmp_path: Path, cluster_db: str, topology: Cluster, zk_sink: str, sink_id: str
) -> None:
    """Killed at the first staged part, the server fails the task attempts staging on it;
    Spark retries them and round_robin moves attempt 1 to the shard's other replica, so
    the job succeeds. The commit is held at ``commit.after_decision`` until the server is
    back and writable: branches staged there before the kill (and the failed attempts'
    staging, dropped as losers) need it, and a dead server at publish time is the subject
    of the next tests."""
    table = replicated_local_tables(topology, cluster_db)
    options = distributed_options(topology, cluster_db, zk_sink, sink_id,
                                  insert_block_rows="50", **FAULT_OPTIONS)
    killer = StagingKiller(topology, sink_id, cluster_db)
    held = Rendezvous(tmp_path / "hook", "commit.after_decision",
                      lambda _: killer.back.wait(120))
    options[HOOK_OPTION] = held.option()
    killer.start()
    try:
        with held, spark_conf(spark, "spark.sql.execution.arrow.maxRecordsPerBatch", "50"):
            save(events_df(spark, 0, 4000), options, source="clickhouse_tx_hooked")
    finally:
        killer.stop.set()
        killer.join(timeout=120)
    assert killer.error is None, killer.error
    assert killer.killed is not None, "no staging part ever appeared"
    assert held.reached.is_set()
    killed = killer.killed.url
    with coordinator_of(zk_sink, sink_id) as coord:
        record = coord.xid(0)
        branches = coord.branches(0)
        winners = task_winners(coord, 0)
    assert record is not None and record.state is XidState.COMMITTED
    failed = [b for b in branches if (b.owner or {}).get("server") == killed
              and b.branch_id not in winners and not b.branch_id.startswith("combined-")
              and not b.branch_id.startswith(PRECOMBINED_PREFIX)]
    assert failed, f"no task attempt failed on {killed}: {[b.branch_id for b in branches]}"
    for branch in failed:
        assert branch.state is BranchState.ABORTED
        partition, attempt, shard = branch.branch_id.split("-")[:3]
        retried = [w for w in winners if w.startswith(f"{partition}-")
                   and w.split("-")[2] == shard and int(w.split("-")[1][1:]) > int(attempt[1:])]
        assert retried, f"{branch.branch_id} was not retried by a later attempt"
    assert_sharded_exactly_once(topology.shard_urls(), table, range(4000))
    assert staging_left(topology, sink_id) == {}


def kill_shard_staging(cluster: Cluster, zk: str, sink: str, shard: int,
                       killed: list[ClusterServer]) -> Callable[[str | None], None]:
    """An action killing the one server that holds the winners of ``shard`` (0-based)."""

    def action(_: str | None) -> None:
        urls = set(cluster.shard_urls()[shard])
        servers = {url for url in winner_servers(zk, sink).values() if url in urls}
        assert len(servers) == 1, f"shard {shard + 1} staged on {servers}"
        server = server_at(cluster, servers.pop())
        server.kill()
        killed.append(server)

    return action


def assert_in_doubt(zk: str, sink: str, epoch: int = 0) -> None:
    """``txsink status``: the xid is Committing (in doubt) and nothing else is open."""
    with operations(zk) as ops:
        (status,) = ops.status(sink)["sinks"]
    assert [(x["epoch"], x["state"]) for x in status["open"]] == [(epoch, "Committing")]
    assert status["in_doubt"] == [epoch]


def test_server_killed_after_commit_decision_stays_committing_until_recover_publishes(
    spark, tmp_path: Path, cluster_db: str, topology: Cluster, zk_sink: str, sink_id: str
) -> None:
    """Killed at ``commit.after_decision``, the server holding shard 2's staging cannot be
    published on: the job fails with the xid Committing (never rolled back) and shard 2's
    rows invisible; ``Operations.recover`` (``txsink recover``) publishes them once the
    server is back. One Spark partition, so each shard has exactly one branch."""
    table = replicated_local_tables(topology, cluster_db)
    options = distributed_options(topology, cluster_db, zk_sink, sink_id, **FAULT_OPTIONS)
    killed: list[ClusterServer] = []
    with Rendezvous(tmp_path / "hook", "commit.after_decision",
                    kill_shard_staging(topology, zk_sink, sink_id, 1, killed)) as hook:
        options[HOOK_OPTION] = hook.option()
        with pytest.raises(Exception, match="stays Committing"):
            save(events_df(spark, 0, 2000, partitions=1), options,
                 source="clickhouse_tx_hooked")
    (server,) = killed
    assert_in_doubt(zk_sink, sink_id)
    (live,) = [url for url in topology.shard_urls()[1] if url != server.url]
    assert row_count(live, table) == 0
    restart(server, cluster_db)
    with operations(zk_sink) as ops:
        (report,) = ops.recover(sink_id)["sinks"]
    assert report["failed"] == [] and len(report["actions"]) == 1, report
    assert_sharded_exactly_once(topology.shard_urls(), table, range(2000))
    assert staging_left(topology, sink_id) == {}


def test_server_killed_after_publish_intent_stays_committing_until_next_job_recovers(
    spark, tmp_path: Path, cluster_db: str, topology: Cluster, zk_sink: str, sink_id: str
) -> None:
    """Killed at ``publish.after_intent`` of shard 2's branch (the intent is in the ledger,
    the ATTACH not sent), the job fails with the xid Committing and shard 2's rows
    invisible; the next batch job of the same sink finishes the publish in ``open_sink``
    (the server deduplicates nothing: the ATTACH never ran) and adds its own rows."""
    table = replicated_local_tables(topology, cluster_db)
    options = distributed_options(topology, cluster_db, zk_sink, sink_id, **FAULT_OPTIONS)
    shard2 = topology.shard_urls()[1]
    killed: list[ClusterServer] = []

    def kill(url: str | None) -> None:
        assert url in shard2
        server = server_at(topology, url)
        server.kill()
        killed.append(server)

    with Rendezvous(tmp_path / "hook", "publish.after_intent", kill, servers=shard2) as hook:
        options[HOOK_OPTION] = hook.option()
        with pytest.raises(Exception, match="stays Committing"):
            save(events_df(spark, 0, 2000, partitions=1), options,
                 source="clickhouse_tx_hooked")
    (server,) = killed
    assert_in_doubt(zk_sink, sink_id)
    (branch,) = [b for b, url in winner_servers(zk_sink, sink_id).items() if url == server.url]
    with coordinator_of(zk_sink, sink_id) as coord:
        intents = coord.ledger(0, branch).items()
    assert [record["state"] for record in intents.values()] == [ATTACHING]
    (live,) = [url for url in shard2 if url != server.url]
    assert row_count(live, table) == 0
    restart(server, cluster_db)
    options.pop(HOOK_OPTION)
    options["table"] = f"{cluster_db}.{DISTRIBUTED}"
    save(events_df(spark, 2000, 1000), options)
    assert_sharded_exactly_once(topology.shard_urls(), table, range(3000))
    with coordinator_of(zk_sink, sink_id) as coord:
        assert coord.is_committed(0) and coord.is_committed(1)
    assert staging_left(topology, sink_id) == {}


def test_replica_down_for_the_whole_job_succeeds_on_the_live_replica_and_catches_up(
    spark, cluster_db: str, topology: Cluster, zk_sink: str, sink_id: str
) -> None:
    """Shard 1's first replica is dead from before the job until after it: the plan
    describes shard 1 on its second replica, task attempts that round_robin assigns to the
    dead replica fail and are retried on the live one, and the restarted replica fetches
    the published parts from ZooKeeper's replication log."""
    table = replicated_local_tables(topology, cluster_db)
    options = distributed_options(topology, cluster_db, zk_sink, sink_id, **FAULT_OPTIONS)
    dead = topology.shards[0][0]
    dead.kill()
    save(events_df(spark, 0, 3000), options)
    with coordinator_of(zk_sink, sink_id) as coord:
        record = coord.xid(0)
        branches = {b.branch_id: b for b in coord.branches(0)}
        winners = task_winners(coord, 0)
    assert record is not None and record.state is XidState.COMMITTED
    on_dead = [b for b in branches.values() if (b.owner or {}).get("server") == dead.url]
    assert on_dead, "round_robin sent no task attempt to the dead replica"
    assert all(b.state is BranchState.ABORTED for b in on_dead)
    assert not {b.branch_id for b in on_dead} & winners
    restart(dead, cluster_db)
    assert_sharded_exactly_once(topology.shard_urls(), table, range(3000))
    assert staging_left(topology, sink_id) == {}


def test_unreachable_shard_fails_up_front_naming_it_and_changes_nothing(
    spark, cluster_db: str, topology: Cluster, zk_sink: str, sink_id: str
) -> None:
    """Both replicas of shard 2 dead: the plan asks every shard before the sink is opened,
    so the job fails before any xid, branch or staging table exists."""
    table = replicated_local_tables(topology, cluster_db)
    options = distributed_options(topology, cluster_db, zk_sink, sink_id, **FAULT_OPTIONS)
    for server in topology.shards[1]:
        server.kill()
    with pytest.raises(Exception, match=r"127\.0\.0\.1:2852[12]") as info:
        save(events_df(spark, 0, 1000), options)
    assert "shard 2" in str(info.value)
    for server in topology.shards[1]:
        server.start()
    for server in topology.servers:
        assert row_count(server.url, table) == 0
        assert staging_of(server.url, sink_id) == []
    with coordinator_of(zk_sink, sink_id) as coord:
        assert SinkAdmin(coord).xids() == []  # failed before the sink was even opened


def test_shards_whose_local_tables_differ_in_partition_key_are_refused_before_any_xid(
    spark, cluster: Cluster, cluster_db: str, zk_sink: str, sink_id: str
) -> None:
    """Staging copies shard 1's table: shard 2's ATTACH would fail after the decision,
    with shard 1's rows visible and the xid stuck."""
    for index, replicas in enumerate(cluster.shards):
        for server in replicas:
            run_sql(server.url, f"CREATE TABLE `{cluster_db}`.`{LOCAL}` {EVENTS_COLUMNS} "
                                "ENGINE = MergeTree() PARTITION BY "
                                f"{'toYYYYMM(day)' if index == 0 else 'toMonday(day)'} "
                                "ORDER BY id")
    options = distributed_options(cluster, cluster_db, zk_sink, sink_id)
    with pytest.raises(Exception, match=r"shard 2's local table differs from shard 1's: "
                                        r"partition key 'toMonday\(day\)'"):
        save(events_df(spark, 0, 100), options)
    for server in cluster.servers:
        assert row_count(server.url, f"`{cluster_db}`.`{LOCAL}`") == 0
    assert staging_left(cluster, sink_id) == {}
    with coordinator_of(zk_sink, sink_id) as coord:
        assert SinkAdmin(coord).xids() == []


def test_an_overwrite_leaving_a_shard_without_rows_of_a_partition_is_refused_before_its_decision(
    spark, cluster: Cluster, cluster_db: str, zk_sink: str, sink_id: str
) -> None:
    """Shard 2 would keep its old rows of the months the new rows (even ids: shard 1
    alone) replace on shard 1; an overwrite with rows for both shards replaces them."""
    table = replicated_local_tables(cluster, cluster_db)
    options = distributed_options(cluster, cluster_db, zk_sink, sink_id)
    save(events_df(spark, 0, 300), options)
    even = events_df(spark, 1000, 300).where("id % 2 = 0")
    with pytest.raises(Exception, match=r"would keep old rows.*no row for shard\(s\) 2"):
        even.write.format("clickhouse_tx").options(**options).mode("overwrite").save()
    assert_sharded_exactly_once(cluster.shard_urls(), table, range(300))
    events_df(spark, 1000, 300).write.format("clickhouse_tx").options(**options) \
        .mode("overwrite").save()
    assert_sharded_exactly_once(cluster.shard_urls(), table, range(1000, 1300))
    assert staging_left(cluster, sink_id) == {}


# -- materialized views on the shards ------------------------------------------------------


def test_each_shards_view_gets_exactly_the_rows_published_on_that_shard(
    spark, cluster: Cluster, cluster_db: str, zk_sink: str, sink_id: str
) -> None:
    """Every server's local table feeds a view into a plain MergeTree copy (no
    replication): each shard's rows reach the copy on the replica that published them."""
    table = replicated_local_tables(cluster, cluster_db)
    for server in cluster.servers:
        run_sql(server.url, f"CREATE TABLE `{cluster_db}`.`copy` (id UInt64, day Date) "
                            "ENGINE = MergeTree() PARTITION BY toYYYYMM(day) ORDER BY id")
        run_sql(server.url, f"CREATE MATERIALIZED VIEW `{cluster_db}`.`copy_mv` TO "
                            f"`{cluster_db}`.`copy` AS SELECT id, day "
                            f"FROM `{cluster_db}`.`{LOCAL}`")
    options = distributed_options(cluster, cluster_db, zk_sink, sink_id)
    save(events_df(spark, 0, 3000), options)
    assert_sharded_exactly_once(cluster.shard_urls(), table, range(3000), key="id")
    for index, replicas in enumerate(cluster.shard_urls()):
        copies: dict[int, int] = {}
        for url in replicas:
            for key, count in id_counts(url, f"`{cluster_db}`.`copy`").items():
                copies[key] = copies.get(key, 0) + count
        assert copies == {i: 1 for i in range(3000) if i % 2 == index}
    assert staging_left(cluster, sink_id) == {}


def test_a_view_reading_the_distributed_table_is_refused_before_anything_is_staged(
    spark, cluster: Cluster, cluster_db: str, zk_sink: str, sink_id: str
) -> None:
    replicated_local_tables(cluster, cluster_db)
    options = distributed_options(cluster, cluster_db, zk_sink, sink_id)
    assert cluster.main is not None
    run_sql(cluster.main.url, f"CREATE TABLE `{cluster_db}`.`copy` (id UInt64, day Date) "
                              "ENGINE = MergeTree() PARTITION BY toYYYYMM(day) ORDER BY id")
    run_sql(cluster.main.url, f"CREATE MATERIALIZED VIEW `{cluster_db}`.`all_mv` TO "
                              f"`{cluster_db}`.`copy` AS SELECT id, day "
                              f"FROM `{cluster_db}`.`{DISTRIBUTED}`")
    with pytest.raises(Exception, match="all_mv reads the Distributed table"):
        save(events_df(spark, 0, 100), options)
    assert staging_left(cluster, sink_id) == {}


def test_a_view_on_one_replica_only_is_refused_before_any_xid_naming_the_replica(
    spark, cluster: Cluster, cluster_db: str, zk_sink: str, sink_id: str
) -> None:
    """A branch staged on the replica with the view would leave the view without its
    rows; one staged on a replica without it would fail after the xid opened."""
    replicated_local_tables(cluster, cluster_db)
    second = cluster.shard_urls()[0][1]
    run_sql(second, f"CREATE TABLE `{cluster_db}`.`copy` (id UInt64, day Date) "
                    "ENGINE = MergeTree() PARTITION BY toYYYYMM(day) ORDER BY id")
    run_sql(second, f"CREATE MATERIALIZED VIEW `{cluster_db}`.`copy_mv` TO "
                    f"`{cluster_db}`.`copy` AS SELECT id, day FROM `{cluster_db}`.`{LOCAL}`")
    options = distributed_options(cluster, cluster_db, zk_sink, sink_id)
    with pytest.raises(Exception, match=r"replica .* of shard 1 .* feeds other materialized "
                                        r"views than"):
        save(events_df(spark, 0, 100), options)
    assert staging_left(cluster, sink_id) == {}
    with coordinator_of(zk_sink, sink_id) as coord:
        assert SinkAdmin(coord).xids() == []
