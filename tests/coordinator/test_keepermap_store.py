"""The KeeperMap store (``coordinator=keepermap``): the measured facts it rests on, its lease
and liveness semantics, a Spark job through it, and its refusals.

Against the real modern ClickHouse with a ``<zookeeper>`` section (``keepermap_url``),
ClickHouse 18.16 (a server without KeeperMap) and Spark. The sink gets no ZooKeeper
address at all: every record lives in the KeeperMap table.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable

import pytest
import requests
from kazoo.exceptions import BadVersionError

import txsink
from coordinator import Coordinator, PublishLeaseLost, SinkTreeDamaged, XidState
from coordinator.plumbing.keepermap import KeeperMapNodes
from coordinator.plumbing.multi import Multi, MultiFailed
from coordinator.plumbing.nodes import NodeStore
from coordinator.protocol.publish_lease import LEASE, PublishLease
from coordinator.sink_admin import SinkAdmin
from server_ext.client.http_client import ClickHouseClient
from server_ext.ddl.records_table import FORMAT_KEY, KeeperMapTable
from server_ext.staging.staging_tables import root_tag
from tests.conftest import RECORDS_DATABASE, run_sql
from tests.sinkutil import assert_exactly_once, create_events, events_df
from txsink.core import connections
from txsink.core.connections import RecordsUnusable
from txsink.options import parse_options

STRICT = {"keeper_map_strict_mode": "1"}


def sql(url: str, statement: str, **settings: str) -> requests.Response:
    return requests.post(url, params=settings, data=statement.encode(), timeout=30)


@pytest.fixture
def kv(keepermap_url: str) -> str:
    """A fresh KeeperMap table (k String, v String) of its own, dropped after the test."""
    name = f"`{RECORDS_DATABASE}`.`kv_{uuid.uuid4().hex[:8]}`"
    sql(keepermap_url, f"CREATE DATABASE IF NOT EXISTS `{RECORDS_DATABASE}`")
    answer = sql(keepermap_url, f"CREATE TABLE {name} (k String, v String) ENGINE = "
                 f"KeeperMap('/{RECORDS_DATABASE}/{name[-13:-1]}') PRIMARY KEY k")
    assert answer.status_code == 200, answer.text
    yield name
    sql(keepermap_url, f"DROP TABLE IF EXISTS {name} SYNC")


def rows(url: str, table: str) -> dict[str, tuple[str, int]]:
    body = sql(url, f"SELECT k, v, _version FROM {table} ORDER BY k FORMAT TSV").text
    return {k: (v, int(n)) for k, v, n in (line.split("\t") for line in body.splitlines())}


# -- the facts the store's design rests on (docs/design.md, "The KeeperMap store") -------


def test_a_strict_insert_of_several_keys_is_all_or_nothing(keepermap_url: str, kv: str) -> None:
    assert sql(keepermap_url, f"INSERT INTO {kv} VALUES ('a', '1')", **STRICT).ok
    answer = sql(keepermap_url, f"INSERT INTO {kv} VALUES ('new', '1'), ('a', '2')", **STRICT)
    assert answer.status_code != 200 and "Node exists" in answer.text
    assert rows(keepermap_url, kv) == {"a": ("1", 0)}


def test_a_conditional_update_that_matches_nothing_is_silent(keepermap_url: str, kv: str) -> None:
    """Why the store never writes by ALTER UPDATE: its caller cannot tell a lost
    compare-and-set from one that applied."""
    sql(keepermap_url, f"INSERT INTO {kv} VALUES ('a', '1')", **STRICT)
    stale = sql(keepermap_url, f"ALTER TABLE {kv} UPDATE v = '2' WHERE k = 'a' AND _version = 7",
                **STRICT)
    assert stale.status_code == 200 and rows(keepermap_url, kv) == {"a": ("1", 0)}


def test_keys_absent_from_the_table_are_simply_not_returned(keepermap_url: str) -> None:
    table = KeeperMapTable(ClickHouseClient(keepermap_url), RECORDS_DATABASE, "records")
    table.create(f"/{RECORDS_DATABASE}/records")
    assert table.problem() is None
    key = f"test:{uuid.uuid4().hex}"
    assert table.create_new({key: "x"}) is True
    assert table.create_new({f"{key}-2": "y", key: "z"}) is False
    assert table.get_many([key, f"{key}-2"]) == {key: "x"}


# -- sessions: a lost lease, a gone writer ------------------------------------------------


def short_sessions(keepermap_url: str, namespace: str) -> Callable[[], KeeperMapNodes]:
    table = KeeperMapTable(ClickHouseClient(keepermap_url), RECORDS_DATABASE, "records")
    return lambda: KeeperMapNodes(table, session_timeout=1.0, namespace=namespace)


def begun_xid(store: NodeStore, epoch: int = 1) -> Coordinator:
    coord = Coordinator(store, "s")
    generation = coord.fence()
    coord.begin(epoch, generation)
    return coord


def test_a_lease_whose_holder_stopped_refreshing_is_lost_and_taken_by_the_next_actor(
        records_table, keepermap_url: str) -> None:
    """A holder that freezes longer than its session timeout loses the lease: the next
    actor expires its session and takes the lease; the frozen holder's guarded writes
    and its check before a publish fail, as with a ZooKeeper session that expired."""
    open_store = short_sessions(keepermap_url, f"/tests/{uuid.uuid4().hex[:10]}")
    frozen, other = open_store(), open_store()
    begun_xid(frozen)
    first = PublishLease(Coordinator(frozen, "s").store, 1, "first")
    assert first.acquire()
    node = first.node
    second = PublishLease(Coordinator(other, "s").store, 1, "second")
    assert not second.acquire() and second.holder() == "first"  # alive: refreshed
    time.sleep(2.0)
    assert not second.acquire()  # a live holder keeps it past its first timeout
    frozen.suspend_heartbeat()
    time.sleep(1.0 + 2.0 + 0.5)  # its expiry, the clock margin, and a little
    assert second.acquire() and second.holder() == "second"
    with pytest.raises(PublishLeaseLost):
        first.check()
    with pytest.raises(MultiFailed) as failed:
        Multi(frozen).check(node, 0, label=LEASE).commit()
    assert failed.value.label == LEASE
    second.release()
    other.stop()


def test_a_writer_whose_session_ended_is_judged_gone(records_table, keepermap_url: str) -> None:
    open_store = short_sessions(keepermap_url, f"/tests/{uuid.uuid4().hex[:10]}")
    writer, operator = open_store(), open_store()
    coord = Coordinator(writer, "s")
    generation = coord.fence()
    coord.begin(3, generation, hold="batch driver")
    (verdict,) = SinkAdmin(Coordinator(operator, "s")).verdicts()
    assert verdict.reason == "alive"
    writer.stop()  # the process ended: its holders go with its session
    (verdict,) = SinkAdmin(Coordinator(operator, "s")).verdicts()
    assert verdict.reason == "writer_gone"
    operator.stop()


def test_a_keeper_holds_a_batch_xid_over_the_keepermap_store_until_its_decision(
        keepermap_url: str, keepermap_options: dict[str, str]) -> None:
    """The keeper process (``txsink/core/xid_keeper.py``) reaches the same store: it joins the
    holders of the planner's xid, holds it after the planner lets go, and leaves once the
    xid is decided."""
    from txsink.core import xid_keeper

    options = parse_options({**keepermap_options, "table": "db.t"}, env={})
    writer = connections.records(options, shared=False)
    coord = Coordinator(writer, "km-keeper", root=options.store.zk_root)
    generation = coord.fence()
    coord.begin(0, generation, hold="batch driver")
    assert xid_keeper.start(options, "km-keeper", 0)
    coord.release(0)
    (verdict,) = SinkAdmin(coord).verdicts()
    assert verdict.reason == "alive" and any("keeper" in h for h in verdict.holders)
    coord.abort(0, generation, rollback=lambda _: None)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and "live" in writer.get_children(
            coord.layout.sink) and writer.get_children(coord.layout.live):
        time.sleep(0.2)
    assert writer.get_children(coord.layout.live) == []  # the keeper let go
    writer.stop()


# -- snapshots: a process new to a sink does not read its whole log -----------------------


class CountingTable:
    """The records table, counting the SELECTs sent through it."""

    def __init__(self, table: KeeperMapTable) -> None:
        self.table, self.reads = table, 0

    def get_many(self, keys):
        self.reads += 1
        return self.table.get_many(keys)

    def __getattr__(self, name: str):
        return getattr(self.table, name)


SINK = "/r/sinks/s"


def tree(store: NodeStore, path: str = SINK) -> dict[str, tuple[bytes, int]]:
    """Every node under ``path``: its data and version."""
    data, stat = store.get(path)
    found = {path: (data, stat.version)}
    for child in store.get_children(path):
        found.update(tree(store, f"{path}/{child}"))
    return found


def write_entries(store: KeeperMapNodes, count: int, first: int = 0) -> None:
    store.ensure_path(f"{SINK}/a")
    for i in range(first, first + count):
        store.set(f"{SINK}/a", f"value {i}".encode())
        if i % 10 == 0:
            store.create(f"{SINK}/child-{i:04d}", bytes([i % 256]) * 3)


def test_a_process_new_to_a_sink_reads_its_newest_snapshot_and_only_the_entries_after_it(
        records_table) -> None:
    namespace = f"/tests/{uuid.uuid4().hex[:10]}"
    writer = KeeperMapNodes(records_table, namespace=namespace, compact_every=50)
    write_entries(writer, 103)
    counting = CountingTable(records_table)
    reader = KeeperMapNodes(counting, namespace=namespace)
    reader.get(SINK)
    # 116 entries (2 paths, 103 sets, 11 children), snapshots at 50 and 100: the pointer
    # with the first entries, the head, its chunk, the 16 entries after it (3 reads of 8
    # keys); not 15 reads of every entry
    assert counting.reads == 6
    assert tree(reader) == tree(writer)
    writer.stop()
    reader.stop()


def test_writers_that_snapshot_in_turn_leave_every_reader_the_same_tree(
        records_table, monkeypatch) -> None:
    """Snapshots of several chunks, taken by two writers at interleaved entries: a fresh
    reader, which starts from the newest one, folds the same tree as the writers."""
    monkeypatch.setattr("coordinator.plumbing.keepermap.snapshot.SNAPSHOT_CHUNK", 64)
    namespace = f"/tests/{uuid.uuid4().hex[:10]}"
    first, second = (KeeperMapNodes(records_table, namespace=namespace, compact_every=3)
                     for _ in range(2))
    for turn in range(6):
        write_entries(first if turn % 2 else second, 4, first=turn * 4)
    reader = KeeperMapNodes(records_table, namespace=namespace)
    assert tree(reader) == tree(first) == tree(second)
    for store in (first, second, reader):
        store.stop()


def test_entries_below_a_snapshot_past_the_retention_are_deleted_from_the_table(
        records_table, keepermap_url: str) -> None:
    """The retention over the real table: ALTER DELETE of the old entries and snapshots;
    a reader new to the sink and a reader whose copy went stale both read the same tree."""
    namespace = f"/tests/{uuid.uuid4().hex[:10]}"
    writer, stale = (KeeperMapNodes(records_table, namespace=namespace, compact_every=10,
                                    retain=0.5) for _ in range(2))
    write_entries(writer, 5)
    tree(stale)  # its copy ends at entry 8, below the entries deleted next
    write_entries(writer, 30, first=5)
    time.sleep(0.75)
    write_entries(writer, 30, first=35)
    entries = run_sql(keepermap_url, f"SELECT k FROM `{RECORDS_DATABASE}`.records "
                      f"WHERE startsWith(k, 'log:{namespace}')").split()
    assert len(entries) <= 40 and f"log:{namespace}{SINK}:{1:020d}" not in entries
    assert tree(KeeperMapNodes(records_table, namespace=namespace)) == tree(writer)
    assert tree(stale) == tree(writer)
    writer.stop()
    stale.stop()


def test_a_writer_with_a_copy_older_than_the_snapshots_is_refused_by_version(
        records_table) -> None:
    """A stale writer cannot append at a taken number: its conditional write is judged
    against the newest tree."""
    namespace = f"/tests/{uuid.uuid4().hex[:10]}"
    stale = KeeperMapNodes(records_table, namespace=namespace)
    stale.ensure_path(f"{SINK}/a")
    _, seen = stale.get(f"{SINK}/a")
    busy = KeeperMapNodes(records_table, namespace=namespace, compact_every=5)
    write_entries(busy, 12)
    with pytest.raises(BadVersionError):
        stale.set(f"{SINK}/a", b"late", version=seen.version)
    assert stale.get(f"{SINK}/a") == busy.get(f"{SINK}/a")
    stale.stop()
    busy.stop()


# -- a Spark job whose coordinator keeps its records in KeeperMap -------------------------


@pytest.fixture
def modern_db(keepermap_url: str):
    name = f"t_{uuid.uuid4().hex[:10]}"
    run_sql(keepermap_url, f"CREATE DATABASE `{name}`")
    yield name
    run_sql(keepermap_url, f"DROP DATABASE IF EXISTS `{name}`")


@pytest.fixture
def keepermap_options(keepermap_url: str, records_table) -> dict[str, str]:
    return {"url": keepermap_url, "coordinator": "keepermap",
            "records_table": f"{RECORDS_DATABASE}.records",
            "zk_root": f"/tests/{uuid.uuid4().hex[:10]}"}


def staging_of(url: str, options: dict[str, str]) -> list[str]:
    tag = root_tag(parse_options({**options, "table": "x"}).store.root_identity)
    body = run_sql(url, "SELECT name FROM system.tables WHERE database = 'txsink_staging'")
    return [name for name in body.split() if name.endswith(f"_r{tag}")]


def test_a_batch_job_commits_exactly_once_with_its_records_in_keepermap(
        spark, keepermap_url: str, modern_db: str, keepermap_options: dict[str, str],
        records_table) -> None:
    txsink.register(spark)
    table = create_events(keepermap_url, modern_db)
    (events_df(spark, 0, 3000).write.format("clickhouse_tx").options(**keepermap_options)
        .option("table", table).option("sink_id", "km-batch").mode("append").save())
    assert_exactly_once(keepermap_url, table, range(3000))
    assert staging_of(keepermap_url, keepermap_options) == []
    store = KeeperMapNodes(records_table)
    coord = Coordinator(store, "km-batch", root=keepermap_options["zk_root"])
    (record,) = SinkAdmin(coord).xids()
    assert record.state is XidState.COMMITTED and record.winners
    assert SinkAdmin(coord).last_committed() == record.epoch
    store.stop()


def test_a_streaming_query_commits_each_micro_batch_once_and_a_restart_goes_on(
        spark, tmp_path, keepermap_url: str, modern_db: str,
        keepermap_options: dict[str, str], records_table) -> None:
    from tests.spark.test_sink_streaming import run_stream, write_input_file

    txsink.register(spark)
    table = create_events(keepermap_url, modern_db)
    options = {**keepermap_options, "sink_id": "km-stream"}
    source, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    for n in range(2):
        write_input_file(source, n, range(n * 100, n * 100 + 100))
    run_stream(spark, source, checkpoint, options, table)
    write_input_file(source, 2, range(200, 350))
    run_stream(spark, source, checkpoint, options, table)  # a restart: a new run, fenced
    assert_exactly_once(keepermap_url, table, range(350))
    store = KeeperMapNodes(records_table)
    coord = Coordinator(store, "km-stream", root=keepermap_options["zk_root"])
    assert SinkAdmin(coord).last_committed() == 2 and coord.generation() == 2
    store.stop()


def test_a_transaction_of_two_tables_commits_both_with_its_records_in_keepermap(
        spark, keepermap_url: str, modern_db: str, keepermap_options: dict[str, str]) -> None:
    first, second = (create_events(keepermap_url, modern_db, name) for name in ("a", "b"))
    with txsink.transaction(spark, url=keepermap_url, sink_id="km-tx",
                            **{k: v for k, v in keepermap_options.items() if k != "url"}) as tx:
        tx.write(events_df(spark, 0, 200), first)
        tx.write(events_df(spark, 200, 300), second)
    assert_exactly_once(keepermap_url, first, range(200))
    assert_exactly_once(keepermap_url, second, range(200, 500))


# -- refusals before anything is staged ----------------------------------------------------


def refused(spark, options: dict[str, str], table: str) -> str:
    txsink.register(spark)
    with pytest.raises(Exception) as failed:  # noqa: PT011 - Spark wraps the sink's error
        (events_df(spark, 0, 100).write.format("clickhouse_tx").options(**options)
            .option("table", table).mode("append").save())
    return str(failed.value)


def test_a_missing_records_table_is_refused_before_anything_is_staged(
        spark, keepermap_url: str, modern_db: str, keepermap_options: dict[str, str]) -> None:
    table = create_events(keepermap_url, modern_db)
    options = {**keepermap_options, "records_table": f"{modern_db}.no_records"}
    message = refused(spark, options, table)
    assert RecordsUnusable.__name__ in message and "does not exist" in message
    assert f"{modern_db}.no_records" in message
    assert staging_of(keepermap_url, options) == []


def test_a_records_table_of_another_format_is_refused(
        spark, keepermap_url: str, modern_db: str, keepermap_options: dict[str, str]) -> None:
    table = create_events(keepermap_url, modern_db)
    run_sql(keepermap_url, f"CREATE TABLE `{modern_db}`.`kv` (k String, v String) ENGINE = "
            f"KeeperMap('/{modern_db}/kv') PRIMARY KEY k")
    run_sql(keepermap_url, f"INSERT INTO `{modern_db}`.`kv` VALUES "
            f"('{FORMAT_KEY}', '{json.dumps({'format': 'something else'})}')")
    message = refused(spark, {**keepermap_options, "records_table": f"{modern_db}.kv"}, table)
    assert "another format" in message
    message = refused(spark, {**keepermap_options, "records_table": f"{modern_db}.events"},
                      table)
    assert "is a MergeTree table, not a KeeperMap table" in message


def test_a_server_without_keepermap_is_refused_naming_the_other_store(
        spark, clickhouse_url: str, ch_db: str, keepermap_options: dict[str, str]) -> None:
    table = create_events(clickhouse_url, ch_db)
    message = refused(spark, {**keepermap_options, "url": clickhouse_url}, table)
    assert "no KeeperMap table engine" in message and "coordinator=zookeeper" in message
    assert staging_of(clickhouse_url, {**keepermap_options, "url": clickhouse_url}) == []


# -- operators over the KeeperMap store -------------------------------------------------------


def operator(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    from txsink.ops import cli

    code = cli.main(list(args))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_operators_create_the_records_table_and_read_a_sink_from_it(
        spark, keepermap_url: str, modern_db: str, keepermap_options: dict[str, str],
        capsys: pytest.CaptureFixture[str]) -> None:
    records = f"{modern_db}.records"
    store = ("--coordinator", "keepermap", "--records-url", keepermap_url,
             "--records-table", records, "--zk-root", keepermap_options["zk_root"])
    code, out = operator(capsys, "records", "create", "--url", keepermap_url,
                         "--records-table", records, "--keeper-path", f"/{modern_db}/records")
    assert code == 0, out
    txsink.register(spark)
    table = create_events(keepermap_url, modern_db)
    (events_df(spark, 0, 500).write.format("clickhouse_tx")
        .options(**{**keepermap_options, "records_table": records}).option("table", table)
        .option("sink_id", "km-ops").mode("append").save())
    code, out = operator(capsys, "status", *store, "--json")
    assert code == 0, out
    (sink,) = json.loads(out)["sinks"]
    assert sink["sink_id"] == "km-ops" and sink["last_committed"] == 0, sink
    code, out = operator(capsys, "recover", *store, "--url", keepermap_url, "--json")
    assert code == 0, out
    code, out = operator(capsys, "verify", *store, "--url", keepermap_url, "--json")
    assert code == 0, out
    code, out = operator(capsys, "gc", *store, "--url", keepermap_url, "--grace", "0",
                         "--prune-older-than", "0", "--json")
    assert code == 0, out
    coord = Coordinator(connections.records(parse_options(
        {**keepermap_options, "records_table": records, "table": table}), shared=False),
        "km-ops", root=keepermap_options["zk_root"])
    admin = SinkAdmin(coord)
    assert admin.xids() == [] and admin.last_committed() == 0  # pruned, still answered
    coord.store.client.stop()
    assert_exactly_once(keepermap_url, table, range(500))


def test_records_create_on_a_server_without_keepermap_fails_naming_it(
        clickhouse_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = operator(capsys, "records", "create", "--url", clickhouse_url,
                         "--records-table", f"t_{uuid.uuid4().hex[:8]}.records")
    assert code != 0 and "KeeperMap" in out, out


# -- the option (fast tier: no server) -------------------------------------------------------


@pytest.mark.parametrize("options, problem", [
    ({"coordinator": "zookeeper,keepermap"}, "names both stores"),
    ({"coordinator": "keepermap", "zookeeper": "127.0.0.1:2181"},
     "option(s) zookeeper name the zookeeper store"),
    ({"coordinator": "keepermap", "zookeeper_ca_file": "/ca.pem"},
     "option(s) zookeeper_ca_file name the zookeeper store"),
    ({"zookeeper": "127.0.0.1:2181", "records_table": "db.records"},
     "option(s) records_table name the keepermap store"),
    ({"coordinator": "keepermap", "records_table": "records"}, "must be database.table"),
    ({"coordinator": "etcd"}, "is not one of zookeeper, keepermap"),
])
def test_an_option_naming_both_stores_or_neither_is_refused_by_name(
        options: dict[str, str], problem: str) -> None:
    from txsink.options import OptionError

    with pytest.raises(OptionError, match=re.escape(problem)):
        parse_options({"url": "http://127.0.0.1:8123", "table": "db.t", **options}, env={})


def test_the_keepermap_store_needs_no_zookeeper_address() -> None:
    options = parse_options({"url": "http://127.0.0.1:8124", "table": "db.t",
                             "coordinator": "keepermap"}, env={})
    assert options.store.zookeeper == "" and options.records_server == "http://127.0.0.1:8124"
    assert options.store.root_identity == "/keepermap/txsink.records/txsink"


def test_the_reset_a_stream_refusal_prints_reaches_the_keepermap_store_it_came_from(
        records_table, capsys: pytest.CaptureFixture[str]) -> None:
    """The refused stream's message names the records table, not a ZooKeeper: run as
    printed, the reset finds the sink (a command without the store's flags would reach
    the default ZooKeeper and create an empty sink there instead)."""
    import shlex

    from coordinator.protocol.stream import reset_command

    store = KeeperMapNodes(records_table)
    root = f"/tests/{uuid.uuid4().hex[:10]}"
    coord = Coordinator(store, "km-reset", root=root)
    coord.own_stream("query-a", 0)  # the sink belongs to query-a from its epoch 0
    command = reset_command(coord.store, "--forget-epochs")
    store.stop()
    assert "--coordinator keepermap" in command and "--zookeeper" not in command, command
    assert f"--records-table {RECORDS_DATABASE}.records" in command, command
    words = shlex.split(command)
    assert words[:2] == ["txsink", "reset"]
    code, out = operator(capsys, *words[1:])
    assert code == 0 and "created now" not in out, out


def test_a_deleted_log_row_between_others_is_refused_naming_it_not_read_as_the_end(
        records_table) -> None:
    """Rows after the gap exist: reading the log as ending there would forget them (and a
    writer would append into the gap)."""
    root = f"/tests/{uuid.uuid4().hex[:10]}"
    store = KeeperMapNodes(records_table)
    coord = Coordinator(store, "km-gap", root=root)
    generation = coord.fence()
    for epoch in (0, 1):
        coord.begin(epoch, generation)
        coord.commit(epoch, generation, [], publish=lambda b: None, rollback=lambda b: None)
    store.stop()
    keys = sorted(k for k in records_table.keys_with_prefix(f"log:{root}/sinks/"))
    records_table.delete([keys[len(keys) // 2]])
    fresh = KeeperMapNodes(records_table)
    with pytest.raises(SinkTreeDamaged, match=f"lacks entry {re.escape(keys[len(keys) // 2])}"):
        SinkAdmin(Coordinator(fresh, "km-gap", root=root)).xids()
    fresh.stop()
