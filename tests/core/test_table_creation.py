"""``create_table=if_missing`` and ``schema_evolution=add_columns`` against the real
servers (fixture ``server``: 18.16 and 26.x): the target made on the first write, a
missing column added, both before anything is staged; every refusal before any xid is
opened, nothing staged and nothing created or altered. The DDL text and the type mapping
are ``tests/server_ext/test_create_table.py``'s (fast)."""

from __future__ import annotations

import json

import pytest

import txsink
from tests.conftest import run_sql
from tests.sinkutil import assert_exactly_once, events_df, save, staging_tables, write_in_threads

ROWS = 200


@pytest.fixture(autouse=True)
def _registered(spark) -> None:
    txsink.register(spark)


@pytest.fixture
def options(server_options: dict[str, str]) -> dict[str, str]:
    return server_options


def columns(url: str, table: str) -> dict[str, str]:
    db, name = table.split(".")
    body = run_sql(url, f"SELECT name, type FROM system.columns WHERE database = '{db}' "
                        f"AND table = '{name}' FORMAT JSONEachRow")
    return {row["name"]: row["type"] for row in map(json.loads, body.splitlines())}


def table_exists(url: str, table: str) -> bool:
    db, name = table.split(".")
    return run_sql(url, f"EXISTS TABLE `{db}`.`{name}`").strip() == "1"


def nothing_opened(url: str, options: dict[str, str], zk, sink_id: str) -> None:
    """No sink record (so no xid) in ZooKeeper and no staging table of this root."""
    assert zk.exists(f"/txsink/sinks/{sink_id}") is None
    assert staging_tables(url, options) == []


def create_plain(url: str, table: str) -> None:
    db, name = table.split(".")
    run_sql(url, f"CREATE TABLE `{db}`.`{name}` (id Int64, day Date, name String, "
                 "value Float64) ENGINE = MergeTree() ORDER BY id")


def test_first_write_creates_the_table_and_lands_every_row_once(spark, server, server_url,
                                                                 server_db, options):
    table = f"{server_db}.events"
    save(events_df(spark, 0, ROWS, partitions=2), options, table, create_table="if_missing")
    assert_exactly_once(server_url, table, range(ROWS))
    day = "Date32" if server == "ch26" else "Date"
    # nullable where Spark's field is: date_add may give null, the others never do
    assert columns(server_url, table) == {"id": "Int64", "day": f"Nullable({day})",
                                          "name": "String", "value": "Float64"}


def test_created_table_has_the_given_engine_and_keys(spark, server_url, server_db, options):
    table = f"{server_db}.events"
    save(events_df(spark, 0, 20, partitions=1), options, table, create_table="if_missing",
         engine="ReplacingMergeTree", order_by="id, day", partition_by="toYYYYMM(day)")
    db, name = table.split(".")
    found = json.loads(run_sql(server_url, (
        "SELECT engine, sorting_key, partition_key FROM system.tables "
        f"WHERE database = '{db}' AND name = '{name}' FORMAT JSONEachRow")))
    assert found == {"engine": "ReplacingMergeTree", "sorting_key": "id, day",
                     "partition_key": "toYYYYMM(day)"}
    assert columns(server_url, table)["day"] in ("Date", "Date32")  # a key: not Nullable
    assert_exactly_once(server_url, table, range(20))


def test_a_streaming_query_creates_its_table(spark, server_url, server_db, options, tmp_path):
    source = tmp_path / "in"
    source.mkdir()
    (source / "part-0.json").write_text("".join(
        json.dumps({"id": i, "name": f"e{i}"}) + "\n" for i in range(50)))
    table = f"{server_db}.stream"
    query = (spark.readStream.schema("id LONG, name STRING").json(str(source))
             .writeStream.format("clickhouse_tx").options(**options).option("table", table)
             .option("create_table", "if_missing").option("order_by", "id")
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert query.exception() is None, query.exception()
    assert_exactly_once(server_url, table, range(50))


def test_two_writers_racing_to_create_one_table_both_land_their_rows_once(
        spark, server_url, server_db, options):
    table = f"{server_db}.raced"
    write_in_threads(spark, 2, lambda index: save(
        events_df(spark, index * 1000, 100, partitions=1), options, table,
        create_table="if_missing", order_by="id"))
    assert_exactly_once(server_url, table, [*range(100), *range(1000, 1100)])


def test_an_existing_table_of_another_schema_is_refused_by_name(spark, server_url, server_db,
                                                                 options, zk):
    """What a writer that lost the race to create finds: the other's table, checked."""
    table = f"{server_db}.other"
    run_sql(server_url, f"CREATE TABLE `{server_db}`.`other` (id Int64, name UInt8) "
                        "ENGINE = MergeTree() ORDER BY id")
    with pytest.raises(Exception, match=r"column `name`: cannot convert string to UInt8") as info:
        save(events_df(spark, 0, 10, partitions=1).select("id", "name"), options, table,
             create_table="if_missing", sink_id="other")
    assert f"{server_db}.other" in str(info.value)
    nothing_opened(server_url, options, zk, "other")


def test_a_column_no_type_holds_is_refused_and_nothing_is_created(spark, server_url,
                                                                  server_db, options, zk):
    table = f"{server_db}.never"
    df = events_df(spark, 0, 10, partitions=1).selectExpr("id", "NULL AS nothing")
    with pytest.raises(Exception, match=r"column `nothing`: a column of Spark's NullType"):
        save(df, options, table, create_table="if_missing", sink_id="never")
    assert not table_exists(server_url, table)
    nothing_opened(server_url, options, zk, "never")


def test_a_sharding_key_without_shards_is_refused_and_nothing_is_created(
        spark, server_url, server_db, options, zk):
    table = f"{server_db}.unsharded"
    with pytest.raises(Exception, match=r"sharding_key needs the shards option .* Nothing was "
                                        r"created"):
        save(events_df(spark, 0, 10, partitions=1), options, table, create_table="if_missing",
             order_by="id", sharding_key="id", sink_id="unsharded")
    assert not table_exists(server_url, table)
    nothing_opened(server_url, options, zk, "unsharded")


def test_add_columns_adds_a_missing_column_and_fills_it(spark, server_url, server_db, options):
    table = f"{server_db}.events"
    create_plain(server_url, table)
    df = events_df(spark, 0, ROWS, partitions=2).selectExpr("*", "id * 2 AS score")
    save(df, options, table, schema_evolution="add_columns")
    assert columns(server_url, table)["score"] == "Int64"  # spark.range's id: not nullable
    assert_exactly_once(server_url, table, range(ROWS))
    wrong = run_sql(server_url, f"SELECT count() FROM {table} WHERE score != id * 2")
    assert wrong.strip() == "0"


def test_an_aborted_xid_leaves_only_the_empty_column(spark, server_url, server_db, options):
    """Adding a column is not transactional: it stays when the write's xid is aborted,
    holding its default for the rows that were there, and none of the write's rows."""
    table = f"{server_db}.events"
    create_plain(server_url, table)
    run_sql(server_url, f"INSERT INTO {table} (id, day, name, value) "
                        "VALUES (1, '2026-01-01', 'old', 0.5)")
    df = events_df(spark, 100, 50, partitions=1).selectExpr("*", "'new' AS note")
    with pytest.raises(RuntimeError, match="stop"), txsink.transaction(
            spark, url=server_url, zookeeper=options["zookeeper"], sink_id="aborted",
            schema_evolution="add_columns") as tx:
        tx.write(df, table)
        raise RuntimeError("stop")
    assert columns(server_url, table)["note"] == "String"  # a literal: never null
    rows = run_sql(server_url, f"SELECT id, note FROM {table} FORMAT TSV")
    assert rows == "1\t\n"  # the old row, with the column's default
    assert staging_tables(server_url, options) == []


def test_a_type_change_is_refused_naming_both_types_before_any_xid(spark, server_url,
                                                                   server_db, options, zk):
    table = f"{server_db}.events"
    create_plain(server_url, table)
    df = events_df(spark, 0, 10, partitions=1).selectExpr(
        "id", "day", "name", "CAST(value AS STRING) AS value", "1 AS extra")
    with pytest.raises(Exception, match=r"column `value`: the table has Float64, the "
                                        r"DataFrame has string"):
        save(df, options, table, schema_evolution="add_columns", sink_id="changed")
    assert "extra" not in columns(server_url, table)  # refused before any column was added
    nothing_opened(server_url, options, zk, "changed")


# -- sharded: the local table on every shard (the 2 x 2 cluster, 18.16) ----------------------


@pytest.fixture
def shard_servers(cluster, cluster_db: str, zk_hosts: str, zk_chroot: str):
    """Each shard's first replica (plain MergeTree has no replication) and the options
    naming them with ``shards``, rows routed by ``id % 2``."""
    shards = [replicas[0] for replicas in cluster.shard_urls()]
    options = {"url": shards[0], "shards": ";".join(shards), "sharding_key": "id",
               "zookeeper": zk_hosts + zk_chroot}
    return shards, options


def shard_ids(url: str, table: str) -> list[int]:
    return [int(i) for i in run_sql(url, f"SELECT id FROM {table} ORDER BY id").split()]


def test_create_table_makes_the_local_table_on_every_shard(spark, cluster_db, shard_servers):
    shards, options = shard_servers
    table = f"{cluster_db}.events"
    save(events_df(spark, 0, 40, partitions=2), options, table, create_table="if_missing",
         order_by="id")
    for index, url in enumerate(shards):
        assert shard_ids(url, table) == list(range(index, 40, 2))


def test_add_columns_adds_the_column_on_every_shard(spark, cluster_db, shard_servers):
    shards, options = shard_servers
    table = f"{cluster_db}.events"
    for url in shards:
        create_plain(url, table)
    df = events_df(spark, 0, 40, partitions=2).selectExpr("*", "id * 2 AS score")
    save(df, options, table, schema_evolution="add_columns")
    for index, url in enumerate(shards):
        assert columns(url, table)["score"] == "Int64"
        assert shard_ids(url, table) == list(range(index, 40, 2))
