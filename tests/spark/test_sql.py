"""Spark SQL users' forms: a temporary view over ``clickhouse_tx``, ``INSERT INTO`` and
``INSERT OVERWRITE`` exactly once, and the catalog table Spark hands no options, refused
before anything is written (docs/usage.md, "From SQL"). PySpark 4.0 and later; each test
runs on both servers, and under every PySpark's virtualenv (``every_spark``)."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient

import txsink
from tests.conftest import run_sql
from tests.sinkutil import assert_exactly_once, create_events, events_df, staging_tables
from tests.spark.test_spark_ways_in import fail_first_attempt_after
from txsink.spark.versions import has_data_source

pytestmark = [pytest.mark.every_spark,
              pytest.mark.skipif(not has_data_source(), reason="no data source API (3.5)")]


@pytest.fixture
def target(spark, server_url: str, server_db: str) -> str:
    txsink.register(spark)
    return create_events(server_url, server_db)


@pytest.fixture
def view_options(server_options: dict[str, str], target: str) -> str:
    return ", ".join(f"{name} '{value}'" for name, value in  # blocks of 100: staged early
                     {**server_options, "table": target, "insert_block_rows": "100"}.items())


@pytest.fixture
def view(spark, view_options: str):
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW events_tx USING clickhouse_tx "
              f"OPTIONS ({view_options})")
    yield "events_tx"
    spark.catalog.dropTempView("events_tx")


def source_view(spark, start: int, count: int, name: str = "incoming") -> str:
    """A view of ``count`` events whose tasks each fail their first attempt once it has
    handed on 100 rows (they are staged by then)."""
    df = events_df(spark, start, count)
    df.mapInArrow(fail_first_attempt_after(100), df.schema).createOrReplaceTempView(name)
    return name


def count(url: str, table: str) -> int:
    db, name = table.split(".")
    return int(run_sql(url, f"SELECT count() FROM `{db}`.`{name}`").strip())


def test_a_view_without_a_column_list_has_the_targets_writable_columns(
        spark, server_url, server_db, server_options):
    run_sql(server_url, f"CREATE TABLE `{server_db}`.`wide` (id Int64, u UInt64, "
                        "n Nullable(String), a Array(Int32), d Decimal(12, 3), ts DateTime, "
                        "m Int64 MATERIALIZED id * 2) ENGINE = MergeTree ORDER BY id")
    txsink.register(spark)
    options = ", ".join(f"{k} '{v}'" for k, v in
                        {**server_options, "table": f"{server_db}.wide"}.items())
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW wide_tx USING clickhouse_tx OPTIONS ({options})")
    assert spark.table("wide_tx").schema.simpleString() == (
        "struct<id:bigint,u:bigint,n:string,a:array<int>,d:decimal(12,3),"
        "ts:timestamp>")


@pytest.fixture
def small_batches(spark):
    """Arrow batches of 100 rows, so a task fails after some of its rows were staged."""
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    yield
    spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")


def test_insert_into_a_view_writes_every_row_exactly_once_despite_retried_tasks(
        spark, server_url, target, view, small_batches):
    spark.sql(f"INSERT INTO {view} SELECT * FROM {source_view(spark, 0, 2000)}")
    assert_exactly_once(server_url, target, range(2000))


def test_insert_overwrite_of_a_view_replaces_the_partitions_its_rows_fall_in(
        spark, server_url, target, view, small_batches):
    spark.sql(f"INSERT INTO {view} SELECT * FROM {source_view(spark, 0, 900)}")
    # ids 0..899 span three months by id % 90; the overwrite's 90 rows hold all three
    spark.sql(f"INSERT OVERWRITE {view} SELECT * FROM {source_view(spark, 5000, 90)}")
    assert_exactly_once(server_url, target, range(5000, 5090))


def test_a_catalog_tables_insert_is_refused_naming_the_temporary_view_before_anything(
        spark, server_url, server_options, zk_hosts, zk_chroot, target, view_options):
    spark.sql("DROP TABLE IF EXISTS events_catalog")
    spark.sql("CREATE TABLE events_catalog (id BIGINT, day DATE, name STRING, value DOUBLE) "
              f"USING clickhouse_tx OPTIONS ({view_options})")
    try:
        rows = events_df(spark, 0, 10)
        for write in (lambda: spark.sql("INSERT INTO events_catalog SELECT * FROM VALUES "
                                        "(1L, DATE'2026-01-01', 'a', 0.5)"),
                      lambda: rows.writeTo("events_catalog").append(),
                      lambda: rows.write.insertInto("events_catalog")):
            with pytest.raises(Exception, match="no options reached clickhouse_tx.*catalog.*"
                                                "CREATE TEMPORARY VIEW"):
                write()
    finally:
        spark.sql("DROP TABLE IF EXISTS events_catalog")
    assert count(server_url, target) == 0
    assert staging_tables(server_url, server_options) == []
    zk = KazooClient(hosts=zk_hosts + zk_chroot)
    zk.start(timeout=15)
    try:  # nothing decided: no sink was opened
        assert zk.get_children("/") == []
    finally:
        zk.stop()


def test_a_catalog_table_without_a_column_list_is_refused_when_it_is_made(
        spark, target, view_options):
    with pytest.raises(Exception, match="no options reached clickhouse_tx"):
        spark.sql(f"CREATE TABLE events_nolist USING clickhouse_tx OPTIONS ({view_options})")
    spark.sql("DROP TABLE IF EXISTS events_nolist")
