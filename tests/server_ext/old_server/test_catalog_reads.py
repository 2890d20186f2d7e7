"""Reading ``system.tables`` on the real 18.16 server while tables of the database are
dropped: 18.16 fails such a query now and then with UNKNOWN_TABLE naming the dropped
table; the catalog reads answer all the same."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from server_ext.client.catalog import catalog_rows
from server_ext.client.http_client import ClickHouseClient
from server_ext.sql import qualified_name, sql_string, table_filter
from server_ext.types.target_table import describe_table

READS = 300


@pytest.fixture
def churning(clickhouse_url: str, ch_db: str) -> Iterator[ClickHouseClient]:
    """A client of 18.16 while four threads create, fill and drop tables in ``ch_db``."""
    client = ClickHouseClient(clickhouse_url)
    client.execute(f"CREATE TABLE {qualified_name(ch_db, 'kept')} (x UInt8) "
                   "ENGINE = MergeTree ORDER BY x", purpose="create the kept table")
    done = threading.Event()

    def churn(worker: int) -> None:
        own = ClickHouseClient(clickhouse_url)
        n = 0
        while not done.is_set():
            table = qualified_name(ch_db, f"t{worker}_{n}")
            own.execute(f"CREATE TABLE {table} (x UInt8) ENGINE = MergeTree ORDER BY x",
                        purpose="create a churned table")
            own.execute(f"INSERT INTO {table} VALUES (1)", purpose="fill a churned table")
            own.execute(f"DROP TABLE {table}", purpose="drop a churned table")
            n += 1

    threads = [threading.Thread(target=churn, args=(i,), daemon=True) for i in range(4)]
    for thread in threads:
        thread.start()
    yield client
    done.set()
    for thread in threads:
        thread.join()


def test_listing_a_database_answers_while_its_tables_are_dropped(
        churning: ClickHouseClient, ch_db: str) -> None:
    for _ in range(READS):
        names = {row["name"] for row in catalog_rows(
            churning, f"SELECT name FROM system.tables WHERE database = {sql_string(ch_db)}",
            purpose="list the database")}
        assert "kept" in names


def test_describing_a_table_answers_while_its_neighbours_are_dropped(
        churning: ClickHouseClient, ch_db: str) -> None:
    for _ in range(READS):
        assert describe_table(churning, f"{ch_db}.kept").engine == "MergeTree"


def test_a_missing_table_is_still_reported_missing(churning: ClickHouseClient,
                                                   ch_db: str) -> None:
    rows = catalog_rows(churning, "SELECT name FROM system.tables WHERE "
                        f"{table_filter(ch_db, 'absent', name_column='name')}",
                        purpose="look for an absent table")
    assert rows == []
