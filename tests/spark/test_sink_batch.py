"""Batch writes through ``clickhouse_tx``: exactly once, or nothing visible."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient
from pyspark.sql import functions as F

import txsink
from coordinator import Coordinator
from tests.conftest import run_sql
from tests.sinkutil import (
    assert_exactly_once,
    create_events,
    events_df,
    id_counts,
    moves_into,
    save,
    staging_insert_settings,
    staging_tables,
    write_in_threads,
)
from txsink.core.payload import CombinedBranch, StagedBranch, from_record


@pytest.fixture
def sink_options(clickhouse_url: str, zk_hosts: str, zk_chroot: str) -> dict[str, str]:
    return {"url": clickhouse_url, "zookeeper": zk_hosts + zk_chroot}


@pytest.fixture
def server_sink_options(server_options: dict[str, str]) -> dict[str, str]:
    """Options for the test's server: tests taking it run on 18.16 and 26.x."""
    return server_options


@pytest.fixture(autouse=True)
def _registered(spark) -> None:
    txsink.register(spark)


def fail_first_attempt_after(rows_before_failure: int):
    """A mapInArrow function that fails each task's first attempt mid-stream."""

    def fn(batches):
        from pyspark import TaskContext

        attempt = TaskContext.get().attemptNumber()
        sent = 0
        for batch in batches:
            if attempt == 0 and sent >= rows_before_failure:
                raise RuntimeError("injected task failure after staging")
            sent += batch.num_rows
            yield batch

    return fn


def test_append_makes_every_row_visible_exactly_once(
    spark, server, server_url, server_db, server_sink_options
):
    table = create_events(server_url, server_db)
    save(events_df(spark, 0, 5000), server_sink_options, table)
    assert_exactly_once(server_url, table, range(5000))
    if server == "ch26":  # the server has MOVE PARTITION: strategy `move`
        assert moves_into(server_url, table) > 0
        # its default is async_insert = 1: every staging INSERT turned it off
        inserts = staging_insert_settings(server_url, server_sink_options)
        assert inserts and set(inserts) == {"0"}, inserts


def test_append_leaves_no_staging_behind(spark, server_url, server_db, server_sink_options):
    table = create_events(server_url, server_db)
    before = staging_tables(server_url, server_sink_options)
    save(events_df(spark, 0, 1000), server_sink_options, table)
    assert staging_tables(server_url, server_sink_options) == before


def first_xid(zk_hosts: str, zk_chroot: str, sink_id: str) -> tuple[list, list[str]]:
    """The winners' records of the sink's first xid, and every branch id it registered."""
    client = KazooClient(hosts=zk_hosts + zk_chroot)
    client.start(timeout=15)
    try:
        coord = Coordinator(client, sink_id)
        return (coord.branches(0, coord.xid(0).winners),
                [b.branch_id for b in coord.branches(0)])
    finally:
        client.stop()
        client.close()


def combined_winner(zk_hosts: str, zk_chroot: str, sink_id: str) -> CombinedBranch:
    """The combined branch that won the sink's first xid."""
    (winner,), _ = first_xid(zk_hosts, zk_chroot, sink_id)
    combined = from_record(winner.manifest)
    assert isinstance(combined, CombinedBranch)
    return combined


def test_a_job_of_two_tasks_publishes_each_task_branch_directly(
    spark, server_url, server_db, server_sink_options, zk_hosts, zk_chroot
):
    table = create_events(server_url, server_db)
    save(events_df(spark, 0, 2000, partitions=2), server_sink_options, table,
         sink_id="direct")
    assert_exactly_once(server_url, table, range(2000))
    winners, registered = first_xid(zk_hosts, zk_chroot, "direct")
    payloads = [from_record(w.manifest) for w in winners]
    assert len(payloads) == 2 and all(isinstance(p, StagedBranch) for p in payloads)
    assert not any(b.startswith(("combined-", "precombined-")) for b in registered)


def test_small_branches_reach_the_target_through_the_precombined_table(
    spark, server_url, server_db, server_sink_options, zk_hosts, zk_chroot
):
    table = create_events(server_url, server_db)
    save(events_df(spark, 0, 2000, partitions=4), server_sink_options, table,
         sink_id="precombined")
    assert_exactly_once(server_url, table, range(2000))
    combined = combined_winner(zk_hosts, zk_chroot, "precombined")
    assert len(combined.sources) == 4
    assert combined.precombined.startswith("txs_")


def test_branches_over_many_partitions_are_combined_at_the_commit_one_part_per_partition(
    spark, server_url, server_db, server_sink_options, zk_hosts, zk_chroot
):
    run_sql(server_url, f"CREATE TABLE `{server_db}`.`daily` (id UInt64, day Date, "
                        "name String, value Float64) ENGINE = MergeTree() "
                        "PARTITION BY day ORDER BY id")
    table = f"{server_db}.daily"
    save(events_df(spark, 0, 2000, partitions=4), server_sink_options, table,
         sink_id="spread")  # each task: 90 days, more than contribute_max_partitions
    assert_exactly_once(server_url, table, range(2000))
    combined = combined_winner(zk_hosts, zk_chroot, "spread")
    assert len(combined.sources) == 4 and combined.precombined == ""
    parts = run_sql(server_url, "SELECT count() FROM system.parts WHERE active AND "
                                f"database = '{server_db}' AND table = 'daily'")
    assert int(parts) == 90


def test_task_retried_after_staging_publishes_each_row_once(
    spark, server_url, server_db, server_sink_options
):
    table = create_events(server_url, server_db)
    df = events_df(spark, 0, 4000)
    flaky = df.mapInArrow(fail_first_attempt_after(200), df.schema)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    try:
        save(flaky, server_sink_options, table, insert_block_rows="100")
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert_exactly_once(server_url, table, range(4000))


def test_failed_job_leaves_target_untouched(spark, server_url, server_db, server_sink_options):
    table = create_events(server_url, server_db)
    save(events_df(spark, 0, 100), server_sink_options, table)
    doomed = events_df(spark, 1000, 2000).withColumn(
        "value", F.when(F.col("id") == 2500, F.raise_error(F.lit("boom"))).otherwise(F.col("value"))
    )
    with pytest.raises(Exception, match="boom"):
        save(doomed, server_sink_options, table, insert_block_rows="100")
    assert_exactly_once(server_url, table, range(100))


def test_overwrite_replaces_only_the_partitions_present(
    spark, server_url, server_db, server_sink_options
):
    table = create_events(server_url, server_db)
    save(events_df(spark, 0, 900), server_sink_options, table)  # January..March
    january = events_df(spark, 10_000, 3100).where("month(day) = 1")
    save(january, server_sink_options, table, mode="overwrite")
    counts = id_counts(server_url, table)
    new_ids = {r.id for r in january.select("id").collect()}
    old_kept = {i for i in range(900) if i % 90 >= 31}  # February and March rows stay
    assert set(counts) == new_ids | old_kept
    assert set(counts.values()) == {1}


def test_unknown_option_is_rejected_naming_it(spark, clickhouse_url, ch_db, sink_options):
    table = create_events(clickhouse_url, ch_db)
    with pytest.raises(Exception, match="unknown option.*tabel"):
        save(events_df(spark, 0, 10), sink_options, table, tabel="x")


def test_unknown_table_fails_naming_it_before_anything_is_staged(
    spark, clickhouse_url, ch_db, sink_options
):
    before = staging_tables(clickhouse_url, sink_options)
    with pytest.raises(Exception, match="no_such_table"):
        save(events_df(spark, 0, 10), sink_options, f"{ch_db}.no_such_table")
    assert staging_tables(clickhouse_url, sink_options) == before


def test_schema_mismatch_names_the_column_and_changes_nothing(
    spark, clickhouse_url, ch_db, sink_options
):
    table = create_events(clickhouse_url, ch_db)
    wrong = events_df(spark, 0, 10).withColumnRenamed("value", "valeu")
    with pytest.raises(Exception, match="valeu"):
        save(wrong, sink_options, table)
    assert run_sql(clickhouse_url, f"SELECT count() FROM {table}").strip() == "0"


def test_unreachable_server_fails_naming_it(spark, ch_db, sink_options):
    options = {**sink_options, "url": "http://127.0.0.1:1", "retries": "1", "timeout": "1"}
    with pytest.raises(Exception, match="127.0.0.1:1"):
        save(events_df(spark, 0, 10), options, f"{ch_db}.events")


def test_wrong_password_fails_without_showing_it(
    spark, server_url, server_db, server_sink_options
):
    # Both servers have the same users (the modern one answers AUTHENTICATION_FAILED, 516).
    table = create_events(server_url, server_db)
    options = {**server_sink_options, "user": "txsink_secret", "password": "not-the-password"}
    with pytest.raises(Exception) as info:
        save(events_df(spark, 0, 10), options, table)
    assert "not-the-password" not in str(info.value)
    assert "txsink_secret" in str(info.value) or "password" in str(info.value).lower()


def test_two_threads_writing_two_tables_at_once_each_get_every_row_once(
        spark, clickhouse_url, ch_db, sink_options):
    """One session, two Python threads, two sink ids (docs/usage.md, "several threads"):
    each thread calls ``txsink.register``, which makes the session its active one."""
    tables = [create_events(clickhouse_url, ch_db, name) for name in ("left", "right")]
    write_in_threads(spark, 2, lambda index: save(
        events_df(spark, index * 10_000, 2000), sink_options, tables[index],
        sink_id=f"thread-{index}"))
    for index, table in enumerate(tables):
        assert_exactly_once(clickhouse_url, table, range(index * 10_000, index * 10_000 + 2000))
