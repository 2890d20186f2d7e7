"""Statements a caller's work sends from the seal's merge pool are counted in the caller's
scope (``txsink.core.message_count``), against the real server."""

from __future__ import annotations

from server_ext.capabilities import known_settings
from server_ext.client.http_client import ClickHouseClient
from server_ext.staging.seal import SKIP_MERGED, merge_partitions
from tests.conftest import run_sql
from txsink.core.message_count import MessageCount, count_statement, counting


def test_the_merges_of_several_partitions_are_counted_in_the_callers_scope(clickhouse_url,
                                                                           ch_db):
    table = f"`{ch_db}`.`parts`"
    run_sql(clickhouse_url, f"CREATE TABLE {table} (p UInt8, v UInt32) ENGINE = MergeTree "
                            "PARTITION BY p ORDER BY v")
    for _ in range(2):  # two parts in each of three partitions
        run_sql(clickhouse_url, f"INSERT INTO {table} SELECT number % 3 + 1, number "
                                "FROM numbers(30)")
    client = ClickHouseClient(clickhouse_url, on_statement=count_statement)
    known_settings(client, (SKIP_MERGED,))  # its one query, before counting
    with counting() as meter:
        merge_partitions(client, table, ["1", "2", "3"])
    # START MERGES, an OPTIMIZE per partition (in the pool), STOP MERGES
    assert meter.read() == MessageCount(statements=5)
