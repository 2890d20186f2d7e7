"""Every MergeTree variant and table TTL: what the sink makes visible is what a plain INSERT
of the same rows makes visible, read with and without ``FINAL``.

Each case writes the same rows with ``clickhouse_plain`` into a twin table and with
``clickhouse_tx`` into the table under test, on each server that has the shape.
"""

from __future__ import annotations

import time
import uuid

import pytest

import txsink
from tests.conftest import run_sql
from tests.sinkutil import staging_tables

COLUMNS = "k UInt64, d Date, v UInt64, sign Int8"
SHAPES = {
    "ReplacingMergeTree": ("ReplacingMergeTree(v)", True),
    "CollapsingMergeTree": ("CollapsingMergeTree(sign)", True),
    "SummingMergeTree": ("SummingMergeTree()", True),
    "AggregatingMergeTree": ("AggregatingMergeTree()", False),  # SimpleAggregateFunction: 26.x
}


@pytest.fixture(autouse=True)
def _registered(spark) -> None:
    txsink.register(spark)


@pytest.fixture
def twin(server_url: str):
    name = f"t_plain_{uuid.uuid4().hex[:8]}"
    run_sql(server_url, f"CREATE DATABASE `{name}`")
    yield name
    run_sql(server_url, f"DROP DATABASE IF EXISTS `{name}`")


def rows_df(spark, days: str = "DATE'2024-01-15'"):
    """1,000 rows in one task and one block: 100 keys, ten rows each."""
    return spark.range(0, 1000, numPartitions=1).selectExpr(
        "id % 100 AS k", f"{days} AS d", "id AS v",
        "CAST(IF(id % 2 = 0, 1, -1) AS TINYINT) AS sign")


def write_both(df, server_url, zk, db, twin, name) -> None:
    df.write.format("clickhouse_plain").option("url", server_url) \
        .option("table", f"{twin}.{name}").mode("append").save()
    df.write.format("clickhouse_tx").option("url", server_url).option("zookeeper", zk) \
        .option("table", f"{db}.{name}").mode("append").save()


def read(url: str, table: str, final: bool) -> list[str]:
    return run_sql(url, f"SELECT k, d, v, sign FROM {table} {'FINAL' if final else ''} "
                        "ORDER BY k, d, v, sign FORMAT TSV").splitlines()


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_merging_variant_reads_as_after_a_plain_insert_with_and_without_final(
        spark, server, server_url, server_db, twin, zk_hosts, zk_chroot, shape):
    engine, on_18 = SHAPES[shape]
    if server == "ch18" and not on_18:
        pytest.skip("ClickHouse 18.16 has no SimpleAggregateFunction")
    columns = (COLUMNS if shape != "AggregatingMergeTree" else
               "k UInt64, d Date, v SimpleAggregateFunction(max, UInt64), "
               "sign SimpleAggregateFunction(min, Int8)")
    for db in (server_db, twin):
        run_sql(server_url, f"CREATE TABLE `{db}`.`shaped` ({columns}) ENGINE = {engine} "
                            "PARTITION BY toYYYYMM(d) ORDER BY k")
    write_both(rows_df(spark), server_url, zk_hosts + zk_chroot, server_db, twin, "shaped")
    for final in (False, True):
        assert read(server_url, f"`{server_db}`.`shaped`", final) == \
            read(server_url, f"`{twin}`.`shaped`", final), f"FINAL={final}"


def test_a_ttl_target_expires_the_sinks_rows_as_it_expires_a_plain_inserts(
        spark, server, server_url, server_db, twin, zk_hosts, zk_chroot):
    if server == "ch18":
        pytest.skip("ClickHouse 18.16 has no TTL")
    for db in (server_db, twin):
        run_sql(server_url, f"CREATE TABLE `{db}`.`aging` ({COLUMNS}) ENGINE = MergeTree() "
                            "PARTITION BY toYYYYMM(d) ORDER BY k TTL d + INTERVAL 1 MONTH "
                            "SETTINGS merge_with_ttl_timeout = 1")
    # half of the rows expired long ago, half expire in a year
    df = rows_df(spark, "IF(id % 2 = 0, DATE'2024-01-15', date_add(current_date(), 365))")
    write_both(df, server_url, zk_hosts + zk_chroot, server_db, twin, "aging")
    assert run_sql(server_url, f"SELECT count() FROM `{server_db}`.`aging`").strip() == "500"
    deadline = time.monotonic() + 60  # the plain INSERT's TTL merge: usually done already
    while run_sql(server_url, f"SELECT count() FROM `{twin}`.`aging`").strip() != "500":
        assert time.monotonic() < deadline, "the plain INSERT's rows did not expire"
        time.sleep(0.5)
    for db in (server_db, twin):  # every visible part knows when its rows expire
        assert run_sql(server_url, "SELECT countIf(delete_ttl_info_max < '2000-01-01') "
                                   f"FROM system.parts WHERE database = '{db}' AND "
                                   "table = 'aging' AND active AND rows > 0").strip() == "0"


TTL_WAYS_IN = ("data source", "txsink.write", "txsink.transaction", "SQL view")


@pytest.mark.parametrize("way", TTL_WAYS_IN)
def test_rows_a_ttl_expired_already_are_not_visible_when_the_write_returns(
        spark, server, server_url, server_db, zk_hosts, zk_chroot, way):
    if server == "ch18":
        pytest.skip("ClickHouse 18.16 has no TTL")
    table = f"{server_db}.aging"
    run_sql(server_url, f"CREATE TABLE `{server_db}`.`aging` ({COLUMNS}) ENGINE = MergeTree() "
                        "PARTITION BY toYYYYMM(d) ORDER BY k TTL d + INTERVAL 1 MONTH "
                        "WHERE v % 4 != 1")
    # rows with v % 4 = 0 expired long ago, v % 4 = 1 too but the rule's WHERE keeps them
    df = rows_df(spark, "IF(id % 2 = 0, DATE'2024-01-15', "
                        "IF(id % 4 = 1, DATE'2024-02-15', date_add(current_date(), 365)))")
    options = {"url": server_url, "zookeeper": zk_hosts + zk_chroot}
    if way == "data source":
        df.write.format("clickhouse_tx").options(**options).option("table", table) \
            .mode("append").save()
    elif way == "txsink.write":
        txsink.write(df, table=table, **options)
    elif way == "txsink.transaction":
        with txsink.transaction(spark, sink_id="aging", **options) as tx:
            tx.write(df, table)
    else:
        df.createOrReplaceTempView("aging_rows")
        spark.sql("CREATE OR REPLACE TEMPORARY VIEW aging_tx USING clickhouse_tx OPTIONS ("
                  + ", ".join(f"{k} '{v}'" for k, v in {**options, "table": table}.items())
                  + ")")
        spark.sql("INSERT INTO aging_tx SELECT * FROM aging_rows")
    assert run_sql(server_url, f"SELECT countIf(v % 2 = 0), countIf(v % 4 = 1), count() "
                               f"FROM `{server_db}`.`aging`").split() == ["0", "250", "500"]


def test_a_target_that_refuses_staged_partitions_is_refused_before_anything_is_staged(
        spark, server_url, server_db, server_options):
    # the engine appends its version column to the sorting key, which no staging
    # table the commit can fill without collapsing rows matches
    run_sql(server_url, f"CREATE TABLE `{server_db}`.`versioned` ({COLUMNS}) ENGINE = "
                        "VersionedCollapsingMergeTree(sign, v) PARTITION BY toYYYYMM(d) "
                        "ORDER BY k")
    options = server_options
    with pytest.raises(Exception, match="versioned.*refuses the partitions of a staging table"):
        rows_df(spark).write.format("clickhouse_tx").options(**options) \
            .option("table", f"{server_db}.versioned").mode("append").save()
    assert staging_tables(server_url, options) == []
    assert run_sql(server_url, f"SELECT count() FROM `{server_db}`.`versioned`").strip() == "0"
