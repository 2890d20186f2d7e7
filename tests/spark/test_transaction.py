"""``txsink.transaction()``: several writes become visible together, or not at all.

Every test here runs on ClickHouse 18.16 and 26.x (``[ch18]``/``[ch26]``), but those of a
call refused after the transaction failed, committed or aborted, which run on 18.16 only
(``on_18_16_only``): the refusal is the transaction object's, and what the server holds
after it (the rows of the commit, or none) is what the commit and abort tests here check
on both servers.
"""

from __future__ import annotations

import pytest

import txsink
from tests.conftest import on_18_16_only, on_servers, run_sql
from tests.harness.services import READONLY_USER
from tests.sinkutil import assert_exactly_once, create_events, events_df, staging_tables
from txsink.spark.transaction import TransactionFailed, TransactionFinished


@pytest.fixture
def tables(server_url, server_db):
    return tuple(create_events(server_url, server_db, name) for name in ("facts", "daily"))


def test_writes_to_two_tables_commit_together(spark, server_url, zk_hosts, zk_chroot, tables):
    facts, daily = tables
    with txsink.transaction(spark, url=server_url, zookeeper=zk_hosts + zk_chroot,
                            sink_id="nightly") as tx:
        tx.write(events_df(spark, 0, 500), facts)
        tx.write(events_df(spark, 1000, 300), daily)
        assert_exactly_once(server_url, facts, [])  # nothing visible inside the block
    assert_exactly_once(server_url, facts, range(500))
    assert_exactly_once(server_url, daily, range(1000, 1300))


def test_exception_inside_the_block_aborts_every_write(
    spark, server_url, zk_hosts, zk_chroot, tables
):
    facts, daily = tables
    root = {"zookeeper": zk_hosts + zk_chroot}
    before = staging_tables(server_url, root)
    with pytest.raises(RuntimeError, match="stop here"):
        with txsink.transaction(spark, url=server_url, zookeeper=zk_hosts + zk_chroot,
                                sink_id="nightly") as tx:
            tx.write(events_df(spark, 0, 500), facts)
            tx.write(events_df(spark, 1000, 300), daily)
            raise RuntimeError("stop here")
    assert_exactly_once(server_url, facts, [])
    assert_exactly_once(server_url, daily, [])
    assert staging_tables(server_url, root) == before


def test_a_failed_write_caught_inside_the_block_aborts_the_transaction_at_its_end(
    spark, server_url, zk_hosts, zk_chroot, tables
):
    """Interleaving: a write stages; the next write is refused (a column the table lacks)
    and the caller catches it; the block ends normally. Nothing commits."""
    facts, daily = tables
    root = {"zookeeper": zk_hosts + zk_chroot}
    before = staging_tables(server_url, root)
    with pytest.raises(TransactionFailed, match=f"its write to {daily} failed"):
        with txsink.transaction(spark, url=server_url, zookeeper=zk_hosts + zk_chroot,
                                sink_id="nightly") as tx:
            tx.write(events_df(spark, 0, 500), facts)
            with pytest.raises(Exception, match="unknown column"):
                tx.write(events_df(spark, 1000, 300).withColumnRenamed("name", "nmae"), daily)
    assert_exactly_once(server_url, facts, [])
    assert_exactly_once(server_url, daily, [])
    assert staging_tables(server_url, root) == before


@on_18_16_only
def test_a_write_after_a_failed_write_aborts_the_transaction_instead_of_staging(
    spark, server_url, zk_hosts, zk_chroot, tables
):
    facts, daily = tables
    with pytest.raises(TransactionFailed, match="so tx.write aborted it"):
        with txsink.transaction(spark, url=server_url, zookeeper=zk_hosts + zk_chroot,
                                sink_id="nightly") as tx:
            with pytest.raises(Exception, match="unknown column"):
                tx.write(events_df(spark, 1000, 300).withColumnRenamed("name", "nmae"), daily)
            tx.write(events_df(spark, 0, 500), facts)
    assert_exactly_once(server_url, facts, [])


@on_18_16_only
def test_a_write_after_the_transaction_committed_is_refused_not_dropped(
        spark, server_url, zk_hosts, zk_chroot, tables):
    facts, _ = tables
    with txsink.transaction(spark, url=server_url, zookeeper=zk_hosts + zk_chroot,
                            sink_id="nightly") as tx:
        tx.write(events_df(spark, 0, 500), facts)
    with pytest.raises(TransactionFinished, match="nightly/.* is committed: tx.write must"):
        tx.write(events_df(spark, 500, 100), facts)
    tx.commit()  # a repeat does nothing
    assert_exactly_once(server_url, facts, range(500))


@on_18_16_only
def test_a_write_after_an_explicit_commit_inside_the_block_is_refused(
        spark, server_url, zk_hosts, zk_chroot, tables):
    facts, _ = tables
    with pytest.raises(TransactionFinished):
        with txsink.transaction(spark, url=server_url, zookeeper=zk_hosts + zk_chroot,
                                sink_id="nightly") as tx:
            tx.write(events_df(spark, 0, 500), facts)
            tx.commit()
            tx.write(events_df(spark, 500, 100), facts)
    assert_exactly_once(server_url, facts, range(500))  # the commit stands


@on_18_16_only
def test_a_write_after_the_transaction_aborted_is_refused(
        spark, server_url, zk_hosts, zk_chroot, tables):
    facts, _ = tables
    with pytest.raises(RuntimeError, match="stop here"):
        with txsink.transaction(spark, url=server_url, zookeeper=zk_hosts + zk_chroot,
                                sink_id="nightly") as tx:
            raise RuntimeError("stop here")
    with pytest.raises(TransactionFinished, match="is aborted"):
        tx.write(events_df(spark, 0, 100), facts)
    assert_exactly_once(server_url, facts, [])


@on_servers(ch26=pytest.mark.skip(reason="the users with credentials exist on 18.16 only"))
def test_credentials_set_after_the_session_started_reach_every_write(
        spark, server_url, zk_hosts, zk_chroot, tables, monkeypatch):
    """Spark's workers see the environment the session started with; ``transaction()``
    reads the variables in the caller's process when it starts, so a read-only user set
    now is the one every write uses (and is refused, naming the mode)."""
    facts, _ = tables
    monkeypatch.setenv("TXSINK_CLICKHOUSE_USER", READONLY_USER)
    with pytest.raises(Exception, match=r"(?i)read-?only"):
        with txsink.transaction(spark, url=server_url, zookeeper=zk_hosts + zk_chroot,
                                sink_id="late-credentials") as tx:
            tx.write(events_df(spark, 0, 100), facts)
    monkeypatch.delenv("TXSINK_CLICKHOUSE_USER")
    txsink.register(spark)  # transaction() registered with the variable: later writes not
    assert_exactly_once(server_url, facts, [])


def test_two_tables_of_different_columns_commit_together(
        spark, server_url, server_db, zk_hosts, zk_chroot):
    """Both tables' branches stage under one xid; each table's combine reads its own
    sources only (a combine that took its columns from the other table's staging broke)."""
    facts = create_events(server_url, server_db, "facts")
    run_sql(server_url, f"CREATE TABLE `{server_db}`.narrow (id Int64, day Date) "
                        "ENGINE = MergeTree() PARTITION BY toYYYYMM(day) ORDER BY id")
    with txsink.transaction(spark, url=server_url, zookeeper=zk_hosts + zk_chroot,
                            sink_id="two-shapes") as tx:
        tx.write(events_df(spark, 0, 400), facts)
        tx.write(events_df(spark, 1000, 400).select("id", "day"), f"{server_db}.narrow")
    assert_exactly_once(server_url, facts, range(400))
    assert_exactly_once(server_url, f"{server_db}.narrow", range(1000, 1400))


def test_two_writes_of_one_table_each_publish_from_their_own_pre_combined_table(
        spark, server_url, zk_hosts, zk_chroot, tables, caplog):
    """Both writes stage under one xid: each write's tasks contribute to a pre-combined
    table of that write alone, so neither combine finds the other's rows there."""
    facts, _ = tables
    with caplog.at_level("INFO", logger="server_ext.publish.combined"):
        with txsink.transaction(spark, url=server_url, zookeeper=zk_hosts + zk_chroot,
                                sink_id="twice") as tx:
            tx.write(events_df(spark, 0, 400), facts)
            tx.write(events_df(spark, 1000, 300), facts)
    assert_exactly_once(server_url, facts, [*range(400), *range(1000, 1300)])
    combined = [r.getMessage() for r in caplog.records if r.getMessage().startswith("combined")]
    assert len(combined) == 2 and all(" from " in m for m in combined), combined
    assert not [r for r in caplog.records if "not used" in r.getMessage()]


def test_status_shows_a_transaction_commit_finished_by_its_writer_with_timings(
        spark, server_url, zk_hosts, zk_chroot, tables):
    """Recovery is claimed only where recovery finished an xid: the transaction's own
    commit records its timings like a batch job's."""
    from txsink.ops.commands import Operations, render

    facts, daily = tables
    with txsink.transaction(spark, url=server_url, zookeeper=zk_hosts + zk_chroot,
                            sink_id="nightly") as tx:
        tx.write(events_df(spark, 0, 50), facts)
        tx.write(events_df(spark, 100, 30), daily)
    ops = Operations(zk_hosts + zk_chroot)
    try:
        status = ops.status("nightly")
    finally:
        ops.close()
    [recent] = status["sinks"][0]["recent"]
    assert recent["finished_by"] == "writer" and recent["rows"] == 80
    assert recent["commit_ms"] >= 0 and recent["latency_ms"] >= recent["commit_ms"]
    assert "finished by recovery" not in render("status", status)
