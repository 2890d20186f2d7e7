"""Materialized views the target feeds: staged with every branch, published under the same
decision, each committed row reaching every view exactly once; views the sink cannot
stage refused by name before anything is staged or any xid opened."""

from __future__ import annotations

import json
import logging
import uuid

import pytest
from kazoo.client import KazooClient

import txsink
from server_ext.ddl.views import ViewNode, staging_select
from server_ext.sql import tokenize
from tests.conftest import on_servers, run_sql
from tests.sinkutil import assert_exactly_once, create_events, events_df, save, staging_tables
from txsink.core.plan_checks import check_target
from txsink.ops import cli
from txsink.options import parse_options

ROWS = 3000


@pytest.fixture(autouse=True)
def _registered(spark) -> None:
    txsink.register(spark)


@pytest.fixture
def options(server_options: dict[str, str]) -> dict[str, str]:
    return {**server_options, "sink_id": "views"}


def rows(url: str, sql: str) -> list[tuple[str, ...]]:
    return [tuple(line.split("\t")) for line in run_sql(url, sql + " FORMAT TSV").splitlines()]


def summing_view(url: str, db: str, source: str = "events", name: str = "by_day") -> str:
    """A per-day rollup: a SummingMergeTree ``TO`` table and the view that fills it."""
    run_sql(url, f"CREATE TABLE `{db}`.`{name}` (day Date, n UInt64, total Float64) "
                 "ENGINE = SummingMergeTree() PARTITION BY toYYYYMM(day) ORDER BY day")
    run_sql(url, f"CREATE MATERIALIZED VIEW `{db}`.`{name}_mv` TO `{db}`.`{name}` AS "
                 f"SELECT day, count() AS n, sum(value) AS total FROM `{db}`.`{source}` "
                 "GROUP BY day")
    return f"`{db}`.`{name}`"


def doubled_inner_view(url: str, db: str) -> None:
    run_sql(url, f"CREATE MATERIALIZED VIEW `{db}`.`doubled` "
                 "ENGINE = MergeTree() PARTITION BY toYYYYMM(day) ORDER BY id "
                 f"AS SELECT id, day, value * 2 AS v2 FROM `{db}`.`events`")


def even_copy_view(url: str, db: str) -> None:
    run_sql(url, f"CREATE TABLE `{db}`.`copy` (id UInt64, day Date, value Float64) "
                 "ENGINE = MergeTree() PARTITION BY toYYYYMM(day) ORDER BY id")
    run_sql(url, f"CREATE MATERIALIZED VIEW `{db}`.`copy_mv` TO `{db}`.`copy` AS "
                 f"SELECT id, day, value FROM `{db}`.`events` WHERE id % 2 = 0")


def contents(url: str, db: str) -> dict[str, list[tuple[str, ...]]]:
    """Every table of ``db`` that holds rows (views' inner tables included), read by an
    independent query: rows grouped by all columns with their count, so that parts the
    server has not merged yet do not matter (a rollup is summed per key)."""
    tables = rows(url, "SELECT name, engine FROM system.tables WHERE database = "
                       f"'{db}' AND engine LIKE '%MergeTree' ORDER BY name")
    found = {}
    for name, engine in tables:
        qualified = f"`{db}`.`{name}`"
        columns = [r[0] for r in rows(url, f"DESCRIBE TABLE {qualified}")]
        key = ", ".join(f"`{c}`" for c in columns)
        if engine == "SummingMergeTree":
            sums = ", ".join(f"sum(`{c}`)" for c in columns[1:])
            found[name.split(".")[-1] if name.startswith(".inner.") else name] = rows(
                url, f"SELECT `{columns[0]}`, {sums} FROM {qualified} GROUP BY `{columns[0]}` "
                     f"ORDER BY `{columns[0]}`")
        else:
            label = "inner" if name.startswith(".inner") else name
            found[label] = rows(url, f"SELECT {key}, count() FROM {qualified} GROUP BY {key} "
                                     f"ORDER BY {key}")
    return found


@pytest.fixture
def twin(server_url: str):
    """A second database for ``clickhouse_plain`` to write the same rows into, dropped
    after the test: what the sink leaves must be what a plain INSERT leaves."""
    name = f"t_plain_{uuid.uuid4().hex[:8]}"
    run_sql(server_url, f"CREATE DATABASE `{name}`")
    yield name
    run_sql(server_url, f"DROP DATABASE IF EXISTS `{name}`")


def plain_save(df, url: str, table: str) -> None:
    df.write.format("clickhouse_plain").option("url", url).option("table", table) \
        .mode("append").save()


def fail_first_attempt(batches):
    """Each task's first attempt stages some rows, then fails: Spark retries it."""
    from pyspark import TaskContext

    attempt = TaskContext.get().attemptNumber()
    for sent, batch in enumerate(batches):
        if attempt == 0 and sent >= 1:
            raise RuntimeError("injected task failure after staging")
        yield batch


def retried(df):
    return df.mapInArrow(fail_first_attempt, df.schema)


def copy_view(url: str, db: str, select: str) -> None:
    """A view ``select``-ing from ``events`` into a table of its columns."""
    run_sql(url, f"CREATE TABLE `{db}`.`copy` (id UInt64, day Date, value Float64) "
                 "ENGINE = MergeTree() PARTITION BY toYYYYMM(day) ORDER BY id")
    run_sql(url, f"CREATE MATERIALIZED VIEW `{db}`.`copy_mv` TO `{db}`.`copy` AS "
                 + select.format(source=f"`{db}`.`events`"))


TREES = {
    "a view with a TO table": lambda url, db: summing_view(url, db),
    "a view qualifying columns by its source's name": lambda url, db: copy_view(
        url, db, "SELECT events.id AS id, events.day AS day, events.value AS value "
                 "FROM {source} WHERE events.id % 3 = 0"),
    "a view reading its source under an alias": lambda url, db: copy_view(
        url, db, "SELECT e.id AS id, e.day AS day, e.value AS value FROM {source} AS e "
                 "WHERE e.id % 3 = 1"),
    "a view with an inner table": doubled_inner_view,
    # each task's share of it spans more partitions than a task contributes
    "a view into a table partitioned by day": lambda url, db: (
        run_sql(url, f"CREATE TABLE `{db}`.`daily` (id UInt64, day Date, value Float64) "
                     "ENGINE = MergeTree() PARTITION BY day ORDER BY id"),
        run_sql(url, f"CREATE MATERIALIZED VIEW `{db}`.`daily_mv` TO `{db}`.`daily` AS "
                     f"SELECT id, day, value FROM `{db}`.`events`")),
    "a chain of two views": lambda url, db: (even_copy_view(url, db),
                                             summing_view(url, db, source="copy")),
    "two views into one table, one of them chained": lambda url, db: (
        even_copy_view(url, db), summing_view(url, db, source="copy"),
        run_sql(url, f"CREATE MATERIALIZED VIEW `{db}`.`odd_mv` TO `{db}`.`copy` AS "
                     f"SELECT id, day, value FROM `{db}`.`events` WHERE id % 2 = 1")),
}


# -- what a view gets ---------------------------------------------------------------------


@pytest.mark.parametrize("tree", list(TREES))
def test_every_table_a_tree_of_views_fills_holds_what_a_plain_insert_leaves_despite_a_retried_task(
        spark, server_url, server_db, twin, options, tree):
    for db in (server_db, twin):
        create_events(server_url, db)
        TREES[tree](server_url, db)
    df = events_df(spark, 0, ROWS)
    plain_save(df, server_url, f"{twin}.events")
    save(retried(df), options, f"{server_db}.events")
    assert_exactly_once(server_url, f"{server_db}.events", range(ROWS))
    expected = contents(server_url, twin)
    # 18.16 does not fire a view on what another view wrote (a chain ends after one view)
    assert sum(1 for found in expected.values() if found) > 1
    assert contents(server_url, server_db) == expected
    assert staging_tables(server_url, options) == []


def test_a_null_ingest_table_feeds_its_views_and_keeps_nothing(
        spark, server_url, server_db, twin, options):
    for db in (server_db, twin):
        run_sql(server_url, f"CREATE TABLE `{db}`.`ingest` (id UInt64, day Date, name String, "
                            "value Float64) ENGINE = Null")
        create_events(server_url, db)
        run_sql(server_url, f"CREATE MATERIALIZED VIEW `{db}`.`ingest_mv` TO `{db}`.`events` "
                            f"AS SELECT * FROM `{db}`.`ingest`")
        summing_view(server_url, db)
    df = events_df(spark, 0, ROWS)
    plain_save(df, server_url, f"{twin}.ingest")
    save(retried(df), options, f"{server_db}.ingest")
    assert_exactly_once(server_url, f"{server_db}.events", range(ROWS))
    assert contents(server_url, server_db) == contents(server_url, twin)
    assert staging_tables(server_url, options) == []


def test_a_failed_job_leaves_every_view_without_its_rows(
        spark, server_url, server_db, options):
    table = create_events(server_url, server_db)
    rollup = summing_view(server_url, server_db)

    def always_fail(batches):
        yield from batches
        raise RuntimeError("injected failure of every attempt")

    df = events_df(spark, 0, ROWS)
    with pytest.raises(Exception, match="injected failure"):
        save(df.mapInArrow(always_fail, df.schema), options, table)
    assert rows(server_url, f"SELECT count() FROM {rollup}") == [("0",)]
    assert staging_tables(server_url, options) == []


def test_materialized_views_ignore_leaves_the_views_without_the_rows(
        spark, server_url, server_db, options):
    table = create_events(server_url, server_db)
    rollup = summing_view(server_url, server_db)
    save(events_df(spark, 0, 100), options, table, materialized_views="ignore")
    assert_exactly_once(server_url, table, range(100))
    assert rows(server_url, f"SELECT count() FROM {rollup}") == [("0",)]


def test_materialized_views_ignore_names_the_views_left_without_the_rows_in_the_log(
        spark, server_url, server_db, options, caplog):
    table = create_events(server_url, server_db)
    summing_view(server_url, server_db)
    chosen = parse_options({**options, "table": table, "materialized_views": "ignore"})
    with caplog.at_level(logging.WARNING, logger="txsink.core.plan_checks"):
        checked = check_target(chosen, events_df(spark, 0, 1).schema)
    assert checked.views == ()
    assert "by_day_mv" in caplog.text


def test_verify_judges_the_tables_the_views_fill_and_finds_a_duplicate_there(
        spark, server_url, server_db, options, zk_hosts, zk_chroot, capsys):
    table = create_events(server_url, server_db)
    even_copy_view(server_url, server_db)
    save(events_df(spark, 0, ROWS), options, table)

    def verify() -> tuple[int, dict]:
        code = cli.main(["verify", "--zookeeper", zk_hosts + zk_chroot, "--url", server_url,
                         "--sink", "views", "--exclusive-target", "--json"])
        return code, json.loads(capsys.readouterr().out)["sinks"][0]["target"]

    code, target = verify()
    assert (code, target["anomalies"], target["not_judged"]) == (0, [], [])
    assert target["partitions_ok"] == 2 * len(partitions(server_url, table))
    assert target["partitions_ok_by_count"] == 0  # the view shares recorded digests too
    run_sql(server_url, f"INSERT INTO `{server_db}`.`copy` SELECT * FROM `{server_db}`.`copy` "
                        "WHERE id < 10")
    code, target = verify()
    (finding,) = target["anomalies"]
    assert (code, finding["kind"], finding["table"]) == (
        1, "duplicate_rows", f"{server_db}.copy")


def partitions(url: str, table: str) -> list[str]:
    db, name = table.split(".")
    return run_sql(url, "SELECT DISTINCT partition_id FROM system.parts WHERE "
                        f"database = '{db}' AND table = '{name}' AND active").split()


# -- refusals, before anything is staged or any xid opened --------------------------------


def assert_refused_untouched(spark, server_url, options, table, match, zk_hosts, zk_chroot,
                             mode="append"):
    with pytest.raises(Exception, match=match) as caught:
        save(events_df(spark, 0, 10), options, table, mode=mode)
    assert staging_tables(server_url, options) == []
    zk = KazooClient(hosts=zk_hosts + zk_chroot)
    zk.start()
    try:
        sink = "/txsink/sinks/views/xids"
        assert not zk.exists(sink) or zk.get_children(sink) == []
    finally:
        zk.stop()
    return str(caught.value)


def test_an_overwrite_of_a_table_that_feeds_views_is_refused_naming_them(
        spark, server_url, server_db, options, zk_hosts, zk_chroot):
    table = create_events(server_url, server_db)
    summing_view(server_url, server_db)
    assert_refused_untouched(spark, server_url, options, table, "overwrite.*by_day_mv",
                             zk_hosts, zk_chroot, mode="overwrite")


def test_a_view_into_a_table_no_partition_can_be_published_into_is_refused_naming_it(
        spark, server_url, server_db, options, zk_hosts, zk_chroot):
    table = create_events(server_url, server_db)
    run_sql(server_url, f"CREATE TABLE `{server_db}`.`log` (id UInt64) ENGINE = Log")
    run_sql(server_url, f"CREATE MATERIALIZED VIEW `{server_db}`.`log_mv` TO "
                        f"`{server_db}`.`log` AS SELECT id FROM `{server_db}`.`events`")
    assert_refused_untouched(spark, server_url, options, table, "log_mv.*engine is Log",
                             zk_hosts, zk_chroot)


def chained_log_view(url: str, db: str) -> None:
    """A view below the first level whose table no partition can be published into."""
    run_sql(url, f"CREATE TABLE `{db}`.`log` (id UInt64) ENGINE = Log")
    run_sql(url, f"CREATE MATERIALIZED VIEW `{db}`.`log_mv` TO `{db}`.`log` AS "
                 f"SELECT id FROM `{db}`.`copy`")


@pytest.mark.parametrize("server", ["ch18"], indirect=True)
def test_a_view_the_server_never_fires_below_another_view_does_not_refuse_the_write(
        spark, server_url, server_db, twin, options):
    """18.16 fires no view on what a view writes: the second view gets nothing from a
    plain INSERT either, whatever its table is."""
    for db in (server_db, twin):
        create_events(server_url, db)
        even_copy_view(server_url, db)
        chained_log_view(server_url, db)
    df = events_df(spark, 0, ROWS)
    plain_save(df, server_url, f"{twin}.events")
    save(df, options, f"{server_db}.events")
    assert contents(server_url, server_db) == contents(server_url, twin)
    assert rows(server_url, f"SELECT count() FROM `{server_db}`.`log`") == [("0",)]


@pytest.mark.parametrize("server", ["ch26"], indirect=True)
def test_a_view_below_another_view_into_a_table_no_partition_can_be_published_into_is_refused(
        spark, server_url, server_db, options, zk_hosts, zk_chroot):
    table = create_events(server_url, server_db)
    even_copy_view(server_url, server_db)
    chained_log_view(server_url, server_db)
    assert_refused_untouched(spark, server_url, options, table, "log_mv.*engine is Log",
                             zk_hosts, zk_chroot)


def test_a_view_into_a_table_its_staging_cannot_match_is_refused_naming_the_view(
        spark, server_url, server_db, options, zk_hosts, zk_chroot):
    table = create_events(server_url, server_db)
    run_sql(server_url, f"CREATE TABLE `{server_db}`.`vc` (id UInt64, sign Int8, v UInt8) "
                        "ENGINE = VersionedCollapsingMergeTree(sign, v) ORDER BY id")
    run_sql(server_url, f"CREATE MATERIALIZED VIEW `{server_db}`.`vc_mv` TO "
                        f"`{server_db}`.`vc` AS SELECT id, toInt8(1) AS sign, toUInt8(1) AS v "
                        f"FROM `{server_db}`.`events`")
    assert_refused_untouched(spark, server_url, options, table,
                             r"vc` \(the table of materialized view [^)]*vc_mv\)",
                             zk_hosts, zk_chroot)


def test_a_view_into_a_distributed_table_is_refused_without_offering_a_distributed_table(
        spark, clickhouse_url, ch_db, zk_hosts, zk_chroot, cluster):
    """18.16 only: the modern test server has no cluster for a Distributed table (the
    ``cluster`` fixture defines ``txsink_cluster`` on the main server)."""
    table = create_events(clickhouse_url, ch_db)
    run_sql(clickhouse_url, f"CREATE TABLE `{ch_db}`.`ids` (id UInt64) ENGINE = MergeTree() "
                            "ORDER BY id")
    run_sql(clickhouse_url, f"CREATE TABLE `{ch_db}`.`ids_all` AS `{ch_db}`.`ids` ENGINE = "
                            f"Distributed(txsink_cluster, `{ch_db}`, ids)")
    run_sql(clickhouse_url, f"CREATE MATERIALIZED VIEW `{ch_db}`.`ids_mv` TO "
                            f"`{ch_db}`.`ids_all` AS SELECT id FROM `{ch_db}`.`events`")
    options = {"url": clickhouse_url, "zookeeper": zk_hosts + zk_chroot, "sink_id": "views"}
    message = assert_refused_untouched(spark, clickhouse_url, options, table,
                                       "ids_mv.*engine is Distributed", zk_hosts, zk_chroot)
    assert "or a Distributed table" not in message


def test_a_view_that_reads_its_source_twice_is_refused_naming_it(
        spark, server_url, server_db, options, zk_hosts, zk_chroot):
    table = create_events(server_url, server_db)
    run_sql(server_url, f"CREATE TABLE `{server_db}`.`top` (id UInt64) "
                        "ENGINE = MergeTree() ORDER BY id")
    run_sql(server_url, f"CREATE MATERIALIZED VIEW `{server_db}`.`top_mv` TO "
                        f"`{server_db}`.`top` AS SELECT id FROM `{server_db}`.`events` "
                        f"WHERE id NOT IN (SELECT id FROM `{server_db}`.`events`)")
    assert_refused_untouched(spark, server_url, options, table, "top_mv.*more than once",
                             zk_hosts, zk_chroot)


# -- the view's query text (pure) ---------------------------------------------------------


def test_tokens_keep_quoted_identifiers_and_strings_apart():
    tokens = tokenize("SELECT `a``b`.\"c\" , 'x.y' FROM db.t -- db.t\n")
    assert [(t.kind, t.text) for t in tokens] == [
        ("word", "SELECT"), ("quoted", "a`b"), ("punct", "."), ("quoted", "c"),
        ("punct", ","), ("string", "'x.y'"), ("word", "FROM"), ("word", "db"),
        ("punct", "."), ("word", "t")]


@on_servers(ch18=pytest.mark.skip(reason="18.16 refuses the plain INSERT there too"))
def test_a_select_star_view_whose_source_gained_a_column_gets_what_a_plain_insert_leaves(
        spark, server_url, server_db, twin, options):
    """The view keeps the table's columns, as the server does when the real view fires."""
    for db in (server_db, twin):
        create_events(server_url, db)
        create_events(server_url, db, "mirror")
        run_sql(server_url, f"CREATE MATERIALIZED VIEW `{db}`.`mirror_mv` TO `{db}`.`mirror` "
                            f"AS SELECT * FROM `{db}`.`events`")
        run_sql(server_url, f"ALTER TABLE `{db}`.`events` ADD COLUMN note Nullable(String)")
    df = events_df(spark, 0, ROWS)
    plain_save(df, server_url, f"{twin}.events")
    save(df, options, f"{server_db}.events")
    expected = contents(server_url, twin)
    assert expected["mirror"] and contents(server_url, server_db) == expected


@pytest.mark.parametrize("select,staged", [
    ("SELECT src.id AS id FROM db.src", "SELECT src.id AS id FROM `stg` AS `src`"),
    ("SELECT db.src.id FROM db.src FINAL WHERE 1",
     "SELECT `stg`.id FROM `stg` AS `src` FINAL WHERE 1"),
    ("SELECT s.id FROM db.src AS s", "SELECT s.id FROM `stg` AS s"),
    ("SELECT s.id FROM db.src s", "SELECT s.id FROM `stg` s"),
    ("SELECT id FROM (SELECT id FROM db.src)", "SELECT id FROM (SELECT id FROM `stg` AS `src`)"),
])
def test_a_staging_view_reads_the_staging_table_under_the_name_its_select_uses(select, staged):
    node = ViewNode(0, -1, ("db", "mv"), ("db", "src"), None, select)  # type: ignore[arg-type]
    assert staging_select(node, "`stg`") == staged


def test_a_transaction_publishes_a_targets_views_with_its_other_tables(
        spark, server_url, server_db, options):
    table = create_events(server_url, server_db)
    rollup = summing_view(server_url, server_db)
    other = create_events(server_url, server_db, name="other")
    with txsink.transaction(spark, url=server_url, zookeeper=options["zookeeper"],
                            sink_id="views-tx") as tx:
        tx.write(events_df(spark, 0, ROWS), table)
        tx.write(events_df(spark, ROWS, 100), other)
    assert_exactly_once(server_url, table, range(ROWS))
    assert_exactly_once(server_url, other, range(ROWS, ROWS + 100))
    assert per_day(server_url, rollup) == expected_per_day(server_url, server_db)
    assert staging_tables(server_url, options) == []


def per_day(url: str, table: str) -> list[tuple[str, ...]]:
    return rows(url, f"SELECT day, sum(n), round(sum(total), 3) FROM {table} "
                     "GROUP BY day ORDER BY day")


def expected_per_day(url: str, db: str) -> list[tuple[str, ...]]:
    """The rollup of ``db.events``'s visible rows, computed from the rows."""
    return rows(url, f"SELECT day, count(), round(sum(value), 3) FROM `{db}`.`events` "
                     "GROUP BY day ORDER BY day")


def test_an_overwrite_of_a_null_table_is_refused_before_anything_is_staged(
        spark, server_url, server_db, options, zk_hosts, zk_chroot):
    run_sql(server_url, f"CREATE TABLE `{server_db}`.`ingest` (id UInt64, day Date, "
                        "name String, value Float64) ENGINE = Null")
    assert_refused_untouched(spark, server_url, {**options, "materialized_views": "ignore"},
                             f"{server_db}.ingest", "Null table keeps none", zk_hosts,
                             zk_chroot, mode="overwrite")


# -- a Replicated view table on 18.16 -----------------------------------------------------


def test_a_view_output_repeated_byte_for_byte_in_later_epochs_reaches_a_replicated_view_table(
        spark, clickhouse_url, ch_db, zk_hosts, zk_chroot, capsys):
    """Rows per month into a ReplicatedSummingMergeTree: equal counts in two epochs are the
    same part, byte for byte, which the server drops from an ATTACH as a duplicate."""
    create_events(clickhouse_url, ch_db)
    run_sql(clickhouse_url, f"CREATE TABLE `{ch_db}`.per_month (month UInt32, n UInt64) "
                            f"ENGINE = ReplicatedSummingMergeTree('/clickhouse/tables/{ch_db}/"
                            "per_month', '{replica}') PARTITION BY month ORDER BY month")
    run_sql(clickhouse_url, f"CREATE MATERIALIZED VIEW `{ch_db}`.per_month_mv TO "
                            f"`{ch_db}`.per_month AS SELECT toYYYYMM(day) AS month, "
                            f"count() AS n FROM `{ch_db}`.events GROUP BY month")
    options = {"url": clickhouse_url, "zookeeper": zk_hosts + zk_chroot, "sink_id": "views"}
    for epoch in range(3):
        df = spark.range(epoch * 100, epoch * 100 + 100, numPartitions=1).selectExpr(
            "id", "DATE'2026-01-15' AS day", "'e' AS name", "0.0 AS value")
        save(df, options, f"{ch_db}.events")
    assert rows(clickhouse_url, f"SELECT sum(n) FROM `{ch_db}`.per_month") == [("300",)]
    assert_exactly_once(clickhouse_url, f"{ch_db}.events", range(300))
    code = cli.main(["verify", "--zookeeper", zk_hosts + zk_chroot, "--url", clickhouse_url,
                     "--sink", "views", "--exclusive-target", "--json"])
    found = json.loads(capsys.readouterr().out)["sinks"][0]["target"]
    assert (code, found["anomalies"]) == (0, [])
