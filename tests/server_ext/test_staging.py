"""Staging tables ("temporary parts"): names, structure, merges, rollback. Real 18.16 server."""

from __future__ import annotations

import time
import uuid

import pytest

from server_ext.client.http_client import ClickHouseClient
from server_ext.staging.staging_tables import (
    STAGING_DATABASE,
    StagingName,
    UnsupportedTarget,
    branch_key,
    create_staging_table,
    parse_staging_table_name,
    rollback,
    sink_key,
    staging_table_name,
)
from server_ext.types.target_table import describe_table
from tests.conftest import run_sql

MONTHLY = ("(d Date, k UInt64, s String DEFAULT 'x', n Nullable(Int32), a Array(UInt8)) "
           "ENGINE = {engine} PARTITION BY toYYYYMM(d) ORDER BY (k, d) "
           "SETTINGS index_granularity = 1024")


def table_meta(url: str, database: str, table: str) -> dict[str, str]:
    keys = ("engine", "partition_key", "sorting_key", "primary_key", "engine_full")
    line = run_sql(url, f"SELECT {', '.join(keys)} FROM system.tables WHERE database = "
                        f"'{database}' AND name = '{table}' FORMAT TSV").rstrip("\n")
    return dict(zip(keys, line.split("\t"), strict=True))


def columns(url: str, database: str, table: str) -> str:
    return run_sql(url, f"DESCRIBE TABLE `{database}`.`{table}`")


def active_parts(url: str, database: str, table: str) -> int:
    return int(run_sql(url, f"SELECT count() FROM system.parts WHERE database = '{database}' "
                            f"AND table = '{table}' AND active"))


# -- names ---------------------------------------------------------------------------------


def test_staging_name_parses_back_to_sink_key_epoch_and_branch_key() -> None:
    name = staging_table_name("nightly/events", 42, "p3-a1-1a2b3c4d")
    assert parse_staging_table_name(name) == StagingName(
        sink_key("nightly/events"), 42, branch_key("p3-a1-1a2b3c4d"))


def test_staging_name_is_a_plain_identifier_for_any_sink_id() -> None:
    for sink in ("s3://bucket/ckpt/q1", "Ünïcode sink", "`drop`;--", "x" * 500, ""):
        name = staging_table_name(sink, 7, "p0-a0-deadbeef")
        assert name.replace("_", "").isalnum() and name.isascii() and len(name) < 120
        assert parse_staging_table_name(name).sink_key == sink_key(sink)


def test_staging_name_differs_per_branch_and_per_epoch_of_one_sink() -> None:
    names = {staging_table_name("sink", epoch, f"p0-a{attempt}-00000000")
             for epoch in (1, 2) for attempt in (0, 1)}
    assert len(names) == 4


def test_sink_ids_with_the_same_slug_get_different_keys() -> None:
    assert sink_key("a/b") != sink_key("a-b")


def test_other_table_names_do_not_parse_as_staging() -> None:
    for name in ("events", "txs_x", "txs_abc_0123456789ab_e1_p0_0123456", ".inner.mv"):
        assert parse_staging_table_name(name) is None


def test_negative_epoch_is_refused() -> None:
    with pytest.raises(ValueError):
        staging_table_name("sink", -1, "b")


# -- structure -------------------------------------------------------------------------------


def test_staging_of_plain_target_has_its_columns_keys_and_granularity(
        client: ClickHouseClient, clickhouse_url: str, ch_db: str, staging_name: str) -> None:
    run_sql(clickhouse_url, f"CREATE TABLE `{ch_db}`.t " + MONTHLY.format(engine="MergeTree()"))
    create_staging_table(client, describe_table(client, f"{ch_db}.t"), staging_name)
    target, staged = (table_meta(clickhouse_url, ch_db, "t"),
                      table_meta(clickhouse_url, STAGING_DATABASE, staging_name))
    for key in ("engine", "partition_key", "sorting_key", "primary_key"):
        assert staged[key] == target[key]
    assert "index_granularity = 1024" in staged["engine_full"]
    assert columns(clickhouse_url, STAGING_DATABASE, staging_name) == columns(
        clickhouse_url, ch_db, "t")


def test_staging_of_replicated_target_is_plain_merge_tree_with_same_keys(
        client: ClickHouseClient, clickhouse_url: str, ch_db: str, staging_name: str) -> None:
    engine = f"ReplicatedMergeTree('/clickhouse/tables/{ch_db}/t', '{{replica}}')"
    run_sql(clickhouse_url, f"CREATE TABLE `{ch_db}`.t " + MONTHLY.format(engine=engine))
    create_staging_table(client, describe_table(client, f"{ch_db}.t"), staging_name)
    target, staged = (table_meta(clickhouse_url, ch_db, "t"),
                      table_meta(clickhouse_url, STAGING_DATABASE, staging_name))
    assert staged["engine"] == "MergeTree"
    for key in ("partition_key", "sorting_key", "primary_key"):
        assert staged[key] == target[key]
    assert "index_granularity = 1024" in staged["engine_full"]
    assert columns(clickhouse_url, STAGING_DATABASE, staging_name) == columns(
        clickhouse_url, ch_db, "t")


def test_staging_keeps_a_primary_key_shorter_than_the_sorting_key(
        client: ClickHouseClient, clickhouse_url: str, ch_db: str, staging_name: str) -> None:
    run_sql(clickhouse_url, f"CREATE TABLE `{ch_db}`.t (d Date, k UInt64, v UInt64) "
                            "ENGINE = SummingMergeTree() PARTITION BY d PRIMARY KEY k "
                            "ORDER BY (k, d)")
    create_staging_table(client, describe_table(client, f"{ch_db}.t"), staging_name)
    staged = table_meta(clickhouse_url, STAGING_DATABASE, staging_name)
    assert (staged["partition_key"], staged["sorting_key"], staged["primary_key"]) == (
        "d", "k, d", "k")


def test_staging_of_unpartitioned_unsorted_target_has_no_keys_either(
        client: ClickHouseClient, clickhouse_url: str, ch_db: str, staging_name: str) -> None:
    run_sql(clickhouse_url, f"CREATE TABLE `{ch_db}`.t (k UInt64) ENGINE = MergeTree() "
                            "ORDER BY tuple()")
    create_staging_table(client, describe_table(client, f"{ch_db}.t"), staging_name)
    staged = table_meta(clickhouse_url, STAGING_DATABASE, staging_name)
    assert (staged["partition_key"], staged["sorting_key"]) == ("", "")


def test_create_staging_is_idempotent(
        client: ClickHouseClient, clickhouse_url: str, ch_db: str, staging_name: str) -> None:
    run_sql(clickhouse_url, f"CREATE TABLE `{ch_db}`.t " + MONTHLY.format(engine="MergeTree()"))
    target = describe_table(client, f"{ch_db}.t")
    first = create_staging_table(client, target, staging_name)
    run_sql(clickhouse_url, f"INSERT INTO {first} (d, k) VALUES ('2024-01-01', 1)")
    assert create_staging_table(client, target, staging_name) == first
    assert run_sql(clickhouse_url, f"SELECT count() FROM {first}").strip() == "1"


def test_target_in_deprecated_merge_tree_syntax_is_refused(
        client: ClickHouseClient, clickhouse_url: str, ch_db: str, staging_name: str) -> None:
    run_sql(clickhouse_url, f"CREATE TABLE `{ch_db}`.t (d Date, k UInt64) "
                            "ENGINE = MergeTree(d, k, 8192)")
    with pytest.raises(UnsupportedTarget, match="deprecated"):
        create_staging_table(client, describe_table(client, f"{ch_db}.t"), staging_name)


# -- merges ----------------------------------------------------------------------------------


def test_staging_does_not_copy_a_target_setting_that_forces_merges_by_age(
        modern_clickhouse_url: str) -> None:
    """The table settings alone keep staging's parts unmerged (no ``SYSTEM STOP MERGES``
    is sent), so a target's ``min_age_to_force_merge_seconds`` (a modern server's) must not
    reach it."""
    client = ClickHouseClient(modern_clickhouse_url)
    db = f"t_{uuid.uuid4().hex[:10]}"
    run_sql(modern_clickhouse_url, f"CREATE DATABASE `{db}`")
    try:
        run_sql(modern_clickhouse_url, f"CREATE TABLE `{db}`.t (k UInt64) ENGINE = MergeTree() "
                                       "ORDER BY k SETTINGS min_age_to_force_merge_seconds = 1")
        staging = create_staging_table(client, describe_table(client, f"{db}.t"),
                                 f"test_forced_{uuid.uuid4().hex[:8]}")
        shown = run_sql(modern_clickhouse_url, f"SHOW CREATE TABLE {staging}")
        run_sql(modern_clickhouse_url, f"DROP TABLE {staging}")
    finally:
        run_sql(modern_clickhouse_url, f"DROP DATABASE `{db}`")
    assert "min_age_to_force_merge" not in shown and "max_bytes_to_merge_at" in shown


def test_staging_parts_stay_unmerged_when_the_server_forgets_stop_merges(
        client: ClickHouseClient, clickhouse_url: str, ch_db: str, staging_name: str) -> None:
    """A restart forgets SYSTEM STOP MERGES; the table settings must still hold the parts."""
    run_sql(clickhouse_url, f"CREATE TABLE `{ch_db}`.t (k UInt64) ENGINE = MergeTree() "
                            "ORDER BY k")
    staging = create_staging_table(client, describe_table(client, f"{ch_db}.t"), staging_name)
    run_sql(clickhouse_url, f"SYSTEM START MERGES {staging}")  # as after a restart
    for i in range(6):
        run_sql(clickhouse_url, f"INSERT INTO {staging} VALUES ({i})")
        run_sql(clickhouse_url, f"INSERT INTO `{ch_db}`.t VALUES ({i})")
    deadline = time.monotonic() + 10
    while active_parts(clickhouse_url, ch_db, "t") == 6 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert active_parts(clickhouse_url, ch_db, "t") < 6  # the control table did merge
    assert active_parts(clickhouse_url, STAGING_DATABASE, staging_name) == 6


# -- rollback --------------------------------------------------------------------------------


def test_rollback_after_partial_writes_drops_the_staging_table(
        client: ClickHouseClient, clickhouse_url: str, ch_db: str, staging_name: str) -> None:
    run_sql(clickhouse_url, f"CREATE TABLE `{ch_db}`.t " + MONTHLY.format(engine="MergeTree()"))
    staging = create_staging_table(client, describe_table(client, f"{ch_db}.t"), staging_name)
    run_sql(clickhouse_url, f"INSERT INTO {staging} (d, k) SELECT toDate('2024-01-01') + "
                            "number, number FROM system.numbers LIMIT 100")
    rollback(client, staging_name)
    assert run_sql(clickhouse_url, f"EXISTS TABLE {staging}").strip() == "0"
    assert run_sql(clickhouse_url, f"SELECT count() FROM `{ch_db}`.t").strip() == "0"


def test_rollback_is_idempotent_and_accepts_a_qualified_name(
        client: ClickHouseClient, clickhouse_url: str, ch_db: str, staging_name: str) -> None:
    run_sql(clickhouse_url, f"CREATE TABLE `{ch_db}`.t (k UInt64) ENGINE = MergeTree() "
                            "ORDER BY k")
    staging = create_staging_table(client, describe_table(client, f"{ch_db}.t"), staging_name)
    rollback(client, staging)
    rollback(client, staging)
    rollback(client, staging_name)
    assert run_sql(clickhouse_url, f"EXISTS TABLE {staging}").strip() == "0"


def test_staging_database_dropped_since_the_last_staging_table_is_made_again() -> None:
    """The database is created once per server and process; a vanished one is remade.

    In-process ClickHouse (chdb), so that dropping the staging database disturbs nobody.
    """
    from server_ext.client.chdb_client import ChdbClient

    chdb = ChdbClient.for_process()
    chdb.execute("CREATE DATABASE IF NOT EXISTS remade", purpose="test")
    chdb.execute("CREATE TABLE IF NOT EXISTS remade.t (d Date, k UInt64) ENGINE = MergeTree "
                 "PARTITION BY d ORDER BY k", purpose="test")
    target = describe_table(chdb, "remade.t")
    create_staging_table(chdb, target, "txs_remade_first")
    chdb.execute(f"DROP DATABASE {STAGING_DATABASE}", purpose="test")
    create_staging_table(chdb, target, "txs_remade_second")
    assert chdb.query_value(f"SELECT count() FROM system.tables WHERE database = "
                            f"'{STAGING_DATABASE}' AND name = 'txs_remade_second'",
                            purpose="test") in (1, "1")
