"""The orphan sweeper. Real 18.16 server.

Other tests run concurrently and keep staging tables in the same database, so every
``is_live`` here treats the tables of any other sink as live.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from server_ext.client import ClickHouseClient
from server_ext.schema import describe_table
from server_ext.staging import (
    STAGING_DATABASE,
    StagingName,
    create_staging,
    sink_key,
    staging_table_name,
)
from server_ext.sweeper import sweep
from tests.conftest import run_sql

HOUR = 3600.0


@pytest.fixture
def sink() -> str:
    return f"sweeper-test-{uuid.uuid4().hex}"


@pytest.fixture
def stagings(client: ClickHouseClient, clickhouse_url: str, ch_db: str,
             sink: str) -> Iterator[dict[int, str]]:
    """Staging tables of epochs 1, 2 and 3 of this test's sink; dropped after the test."""
    run_sql(clickhouse_url, f"CREATE TABLE `{ch_db}`.t (k UInt64) ENGINE = MergeTree() "
                            "ORDER BY k")
    target = describe_table(client, f"{ch_db}.t")
    names = {epoch: staging_table_name(sink, epoch, "p0-a0-00000000") for epoch in (1, 2, 3)}
    for name in names.values():
        create_staging(client, target, name)
    yield names
    for name in names.values():
        run_sql(clickhouse_url, f"DROP TABLE IF EXISTS `{STAGING_DATABASE}`.`{name}`")


def exists(url: str, name: str) -> bool:
    return run_sql(url, f"EXISTS TABLE `{STAGING_DATABASE}`.`{name}`").strip() == "1"


def only_epochs_live(sink: str, *epochs: int):
    """is_live: this sink's given epochs, and every table of any other sink."""
    return lambda owner: owner.sink_key != sink_key(sink) or owner.epoch in epochs


def test_sweep_drops_staging_of_xids_that_are_not_live(
        client, clickhouse_url, sink, stagings) -> None:
    dropped = sweep(client, only_epochs_live(sink, 2), grace_seconds=60,
                    now=time.time() + HOUR)
    assert sorted(dropped) == sorted([stagings[1], stagings[3]])
    assert [exists(clickhouse_url, stagings[e]) for e in (1, 2, 3)] == [False, True, False]


def test_sweep_keeps_staging_younger_than_the_grace_period(
        client, clickhouse_url, sink, stagings) -> None:
    assert sweep(client, only_epochs_live(sink), grace_seconds=HOUR) == []
    assert all(exists(clickhouse_url, name) for name in stagings.values())


def test_sweep_hands_is_live_the_owner_parsed_from_the_name(
        client, sink, stagings) -> None:
    seen: list[StagingName] = []

    def record(owner: StagingName) -> bool:
        if owner.sink_key == sink_key(sink):
            seen.append(owner)
        return True

    sweep(client, record, grace_seconds=0, now=time.time() + HOUR)
    assert sorted(owner.epoch for owner in seen) == [1, 2, 3]


def test_sweep_leaves_tables_whose_names_are_not_staging_names(
        client, clickhouse_url, sink, stagings) -> None:
    other = f"not_staging_{uuid.uuid4().hex}"
    run_sql(clickhouse_url, f"CREATE TABLE `{STAGING_DATABASE}`.`{other}` (k UInt8) "
                            "ENGINE = MergeTree() ORDER BY k")
    try:
        sweep(client, only_epochs_live(sink), grace_seconds=0, now=time.time() + HOUR)
        assert exists(clickhouse_url, other)
    finally:
        run_sql(clickhouse_url, f"DROP TABLE `{STAGING_DATABASE}`.`{other}`")


def test_repeated_sweep_drops_nothing_more(client, sink, stagings) -> None:
    first = sweep(client, only_epochs_live(sink), grace_seconds=0, now=time.time() + HOUR)
    second = sweep(client, only_epochs_live(sink), grace_seconds=0, now=time.time() + HOUR)
    assert len(first) == 3 and second == []
