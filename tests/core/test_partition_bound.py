"""The bound on the partitions one write may span (``max_partitions_per_job``).

Each test runs on 18.16 and 26.x. A write that crosses the bound is refused with an error
naming the bound, the count and the option; its xid is aborted, its staging dropped, the
target unchanged; and the sink takes the next write. Small bounds show what 100,000
partitions would (that probe's figures are in ``docs/usage.md``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pytest
from kazoo.client import KazooClient

import txsink
from coordinator import Coordinator, XidState
from server_ext.errors import PartitionLimitExceeded
from server_ext.staging.partition_bound import PartitionCounter, partition_key_columns
from server_ext.types.target_table import Column, TargetTable
from tests.conftest import run_sql
from tests.sinkutil import assert_exactly_once, id_counts, staging_tables

SINK = "bounded"


@pytest.fixture
def options(server_options: dict[str, str]) -> dict[str, str]:
    return {**server_options, "sink_id": SINK}


@pytest.fixture
def coordinator(zk_hosts: str, zk_chroot: str) -> Iterator[Coordinator]:
    client = KazooClient(hosts=zk_hosts + zk_chroot)
    client.start(timeout=15)
    yield Coordinator(client, SINK)
    client.stop()
    client.close()


def table(url: str, db: str, partition_by: str) -> str:
    run_sql(url, f"CREATE TABLE `{db}`.`t` (id UInt64, name String) ENGINE = MergeTree() "
                 f"PARTITION BY {partition_by} ORDER BY id")
    return f"{db}.t"


def save(spark, options: dict[str, str], target: str, ids: range, tasks: int = 1,
         **extra: str) -> None:
    txsink.register(spark)
    df = spark.range(ids.start, ids.stop, numPartitions=tasks).selectExpr(
        "id", "CAST(id AS STRING) AS name")
    (df.write.format("clickhouse_tx").options(**options).options(**extra)
       .option("table", target).mode("append").save())


def refused(spark, options: dict[str, str], target: str, ids: range, **extra: str) -> str:
    with pytest.raises(Exception) as info:
        save(spark, options, target, ids, **extra)
    return str(info.value)


def assert_nothing_left(url: str, options: dict[str, str], target: str,
                        coordinator: Coordinator) -> None:
    assert id_counts(url, target) == {}, "rows became visible"
    assert coordinator.xid(0).state == XidState.ABORTED
    assert staging_tables(url, options) == [], "staging left behind"


def described(partition_key: str) -> TargetTable:
    columns = [Column("id", "UInt64"), Column("region", "LowCardinality(String)"),
               Column("ts", "DateTime"), Column("day", "Date")]
    return TargetTable("db", "t", columns, partition_key, "id", "id", "MergeTree",
                       "MergeTree", False, 8192, "")


@pytest.mark.parametrize(("key", "columns"), [
    ("id", ("id",)), ("(region, `day`)", ("region", "day")), ("tuple()", ()),
    ("toYYYYMM(day)", None), ("ts", None),  # an expression; DateTime drops Spark's fractions
])
def test_only_bare_columns_of_exact_types_are_counted_before_sending(key, columns):
    table = described(key)
    assert partition_key_columns(table, table.columns) == columns


def test_a_batch_crossing_the_bound_is_refused_by_the_task_before_it_is_sent():
    table = described("(region, day)")
    counter = PartitionCounter(table, table.columns, 2, "max_partitions_per_job")
    batch = pa.RecordBatch.from_pydict({"region": ["eu", "eu", "us"], "day": [1, 1, 1]})
    counter.admit(batch.slice(0, 2))  # one partition so far
    with pytest.raises(PartitionLimitExceeded, match=r"span 3 partitions .*=2"):
        counter.admit(pa.RecordBatch.from_pydict({"region": ["eu", "us", "ap"],
                                                  "day": [1, 1, 1]}))


def test_a_task_crossing_the_bound_is_refused_naming_bound_count_and_option(
        spark, server_url, server_db, options, coordinator):
    target = table(server_url, server_db, "id")
    message = refused(spark, options, target, range(6), max_partitions_per_job="5")
    assert "one task (so far) span 6 partitions" in message, message[-600:]
    assert "max_partitions_per_job=5" in message
    assert_nothing_left(server_url, options, target, coordinator)


def test_the_bound_counts_the_partitions_of_all_tasks_together(
        spark, server_url, server_db, options, coordinator):
    target = table(server_url, server_db, "id")
    with pytest.raises(Exception) as info:  # 3 partitions per task, 6 in the write
        save(spark, options, target, range(6), tasks=2, max_partitions_per_job="5")
    assert "the rows of the write span 6 partitions" in str(info.value)
    assert_nothing_left(server_url, options, target, coordinator)


def test_an_expression_key_is_counted_in_the_servers_partitions(
        spark, server_url, server_db, options, coordinator):
    target = table(server_url, server_db, "intDiv(id, 10)")
    message = refused(spark, options, target, range(30), max_partitions_per_job="2")
    # 18.16 counts the sealed staging table; 26.x refuses the INSERT block itself
    assert "max_partitions_per_job=2" in message, message[-600:]
    assert_nothing_left(server_url, options, target, coordinator)


def test_many_key_values_in_few_partitions_stay_within_the_bound(
        spark, server_url, server_db, options):
    target = table(server_url, server_db, "intDiv(id, 50)")
    save(spark, options, target, range(100), max_partitions_per_job="2")
    assert_exactly_once(server_url, target, range(100))


def test_the_default_bound_is_the_servers_100_partitions(
        spark, server_url, server_db, options, coordinator):
    target = table(server_url, server_db, "id")
    message = refused(spark, options, target, range(101))
    assert "max_partitions_per_job=100" in message, message[-600:]
    assert_nothing_left(server_url, options, target, coordinator)


def test_zero_lifts_the_bound_on_every_server(spark, server_url, server_db, options):
    target = table(server_url, server_db, "id")  # 26.x alone refuses >100 per INSERT block
    save(spark, options, target, range(150), max_partitions_per_job="0")
    assert_exactly_once(server_url, target, range(150))


def test_a_refused_write_leaves_the_sink_writable(
        spark, server_url, server_db, options, coordinator):
    target = table(server_url, server_db, "id")
    refused(spark, options, target, range(6), max_partitions_per_job="5")
    save(spark, options, target, range(5), max_partitions_per_job="5")
    assert_exactly_once(server_url, target, range(5))
    assert coordinator.xid(1).state == XidState.COMMITTED


@pytest.mark.parametrize("server", ["ch26"], indirect=True)
def test_a_block_crossing_the_bound_in_a_views_table_is_refused_naming_that_table(
        spark, server_url, server_db, options, coordinator):
    """26.x refuses the staging view's block; the target itself has one partition."""
    target = table(server_url, server_db, "tuple()")
    run_sql(server_url, f"CREATE TABLE `{server_db}`.`by_id` (id UInt64) ENGINE = MergeTree() "
                        "PARTITION BY id ORDER BY id")
    run_sql(server_url, f"CREATE MATERIALIZED VIEW `{server_db}`.`by_id_mv` TO "
                        f"`{server_db}`.`by_id` AS SELECT id FROM `{server_db}`.`t`")
    message = refused(spark, options, target, range(6), max_partitions_per_job="5")
    assert (f"more than 5 partitions of a table the views of `{server_db}`.`t` write into "
            f"(`{server_db}`.`by_id`)") in message, message[-600:]
    assert_nothing_left(server_url, options, target, coordinator)
