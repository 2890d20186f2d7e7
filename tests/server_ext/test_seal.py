"""Sealing a branch into a manifest. Real 18.16 server."""

from __future__ import annotations

import json

import pytest

from server_ext.client.http_client import ClickHouseClient
from server_ext.staging.manifest import Manifest
from server_ext.staging.seal import StagedRowsMismatch, seal
from server_ext.staging.staging_tables import STAGING_DATABASE, create_staging_table
from server_ext.types.target_table import describe_table
from tests.conftest import run_sql

TARGET = ("(d Date, k UInt64, s String DEFAULT 'x') ENGINE = {engine} "
          "PARTITION BY toYYYYMM(d) ORDER BY k")


def make_staging(client: ClickHouseClient, url: str, ch_db: str, staging_name: str,
                 engine: str = "MergeTree()") -> tuple[object, str]:
    run_sql(url, f"CREATE TABLE `{ch_db}`.t " + TARGET.format(engine=engine))
    target = describe_table(client, f"{ch_db}.t")
    return target, create_staging_table(client, target, staging_name)


def test_seal_lists_parts_rows_and_bytes_per_partition(
        client: ClickHouseClient, clickhouse_url: str, ch_db: str, staging_name: str) -> None:
    target, staging = make_staging(client, clickhouse_url, ch_db, staging_name)
    for start in (0, 100):  # two inserts: two parts per month
        run_sql(clickhouse_url, f"INSERT INTO {staging} (d, k) SELECT toDate('2024-01-01') + "
                                f"number % 60, {start} + number FROM system.numbers LIMIT 100")
    manifest = seal(client, target, staging, expected_rows=200)
    assert (manifest.target_database, manifest.target_table) == (ch_db, "t")
    assert (manifest.staging_database, manifest.staging_table) == (STAGING_DATABASE, staging_name)
    assert manifest.partition_ids == ("202401", "202402")
    january = manifest.partition("202401")
    assert january.value == "202401"
    assert [p.rows for p in january.parts] == [62, 62]
    assert all(p.bytes > 0 and p.level == 0 for p in january.parts)
    assert (january.min_block, january.max_block) == (1, 3)
    assert manifest.rows == 200


def test_seal_refuses_when_staging_holds_other_than_the_rows_sent(
        client: ClickHouseClient, clickhouse_url: str, ch_db: str, staging_name: str) -> None:
    target, staging = make_staging(client, clickhouse_url, ch_db, staging_name)
    run_sql(clickhouse_url, f"INSERT INTO {staging} (d, k) VALUES ('2024-01-01', 1)")
    with pytest.raises(StagedRowsMismatch, match="holds 1 rows but the branch sent 2") as err:
        seal(client, target, staging, expected_rows=2)
    assert (err.value.expected, err.value.found) == (2, 1)


def test_seal_of_a_branch_that_wrote_nothing_gives_an_empty_manifest(
        client: ClickHouseClient, clickhouse_url: str, ch_db: str, staging_name: str) -> None:
    target, staging = make_staging(client, clickhouse_url, ch_db, staging_name)
    manifest = seal(client, target, staging, expected_rows=0)
    assert manifest.is_empty and manifest.rows == 0


def test_seal_can_be_repeated(
        client: ClickHouseClient, clickhouse_url: str, ch_db: str, staging_name: str) -> None:
    target, staging = make_staging(client, clickhouse_url, ch_db, staging_name)
    run_sql(clickhouse_url, f"INSERT INTO {staging} (d, k) VALUES ('2024-01-01', 1)")
    assert seal(client, target, staging, 1) == seal(client, target, staging, 1)


def test_seal_merges_identical_parts_of_a_partition_for_a_replicated_target(
        client: ClickHouseClient, clickhouse_url: str, ch_db: str, staging_name: str) -> None:
    engine = f"ReplicatedMergeTree('/clickhouse/tables/{ch_db}/t', '{{replica}}')"
    target, staging = make_staging(client, clickhouse_url, ch_db, staging_name, engine)
    for _ in range(2):
        run_sql(clickhouse_url, f"INSERT INTO {staging} (d, k) VALUES ('2024-01-01', 7)")
    run_sql(clickhouse_url, f"INSERT INTO {staging} (d, k) VALUES ('2024-02-01', 8)")
    manifest = seal(client, target, staging, expected_rows=3)
    assert [len(p.parts) for p in manifest.partitions] == [1, 1]
    assert manifest.partition("202401").rows == 2
    with pytest.raises(Exception, match="Cancelled merging parts"):  # merges stopped again
        client.execute(f"OPTIMIZE TABLE {staging} FINAL", purpose="test", retry=False)


def test_seal_keeps_identical_parts_for_a_plain_target(
        client: ClickHouseClient, clickhouse_url: str, ch_db: str, staging_name: str) -> None:
    target, staging = make_staging(client, clickhouse_url, ch_db, staging_name)
    for _ in range(2):
        run_sql(clickhouse_url, f"INSERT INTO {staging} (d, k) VALUES ('2024-01-01', 7)")
    assert len(seal(client, target, staging, expected_rows=2).partitions[0].parts) == 2


def test_manifest_round_trips_through_json(
        client: ClickHouseClient, clickhouse_url: str, ch_db: str, staging_name: str) -> None:
    target, staging = make_staging(client, clickhouse_url, ch_db, staging_name)
    run_sql(clickhouse_url, f"INSERT INTO {staging} (d, k) SELECT toDate('2024-01-01') + "
                            "number * 31, number FROM system.numbers LIMIT 12")
    manifest = seal(client, target, staging, expected_rows=12)
    text = json.dumps(manifest.to_dict())
    assert Manifest.from_dict(json.loads(text)) == manifest
    assert len(text) < 120 * len(manifest.partitions) + 200  # compact: it lives in ZooKeeper


def test_manifest_from_an_unknown_version_is_refused() -> None:
    with pytest.raises(ValueError, match="version"):
        Manifest.from_dict({"v": 99, "target": ["d", "t"], "staging": ["s", "t"],
                            "partitions": []})


def test_empty_manifest_of_a_branch_without_staging_names_target_and_staging(
        client: ClickHouseClient, clickhouse_url: str, ch_db: str) -> None:
    run_sql(clickhouse_url, f"CREATE TABLE `{ch_db}`.t (k UInt64) ENGINE = MergeTree() "
                            "ORDER BY k")
    manifest = Manifest.empty(describe_table(client, f"{ch_db}.t"), "txs_never_created")
    assert manifest.is_empty
    assert Manifest.from_dict(manifest.to_dict()) == manifest
    assert (manifest.staging_database, manifest.staging_table) == (STAGING_DATABASE,
                                                                   "txs_never_created")
