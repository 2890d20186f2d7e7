"""Compressed INSERT bodies (option ``compression``) against both real servers.

18.16 reads gzip and deflate request bodies only; 26.x reads zstd and lz4 as well. The
server is asked, never assumed (``server_ext.client.encoding_problem``).
"""

from __future__ import annotations

import pytest

import txsink
from server_ext.client.compression import ENCODINGS, encoding_problem
from server_ext.client.http_client import ClickHouseClient
from server_ext.sql import qualified_name
from tests.conftest import run_sql
from tests.sinkutil import assert_exactly_once, create_events, events_df, save, staging_tables

READS = {"ch18": {"gzip", "deflate"}, "ch26": set(ENCODINGS)}


@pytest.fixture(autouse=True)
def _registered(spark) -> None:
    txsink.register(spark)


@pytest.fixture
def options(server_options: dict[str, str]) -> dict[str, str]:
    return server_options


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_the_server_is_asked_which_encodings_it_reads(server, server_url, encoding):
    problem = encoding_problem(ClickHouseClient(server_url), encoding)
    assert (problem is None) == (encoding in READS[server]), problem


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_a_compressed_insert_arrives_whole(server, server_url, server_db, encoding):
    if encoding not in READS[server]:
        pytest.skip(f"{server} does not read {encoding}")
    client = ClickHouseClient(server_url)
    table = qualified_name(server_db, "t")
    client.execute(f"CREATE TABLE {table} (x UInt32) ENGINE = Memory", purpose="create")
    chunks = [b"".join(b"%d\n" % i for i in range(start, start + 1000))
              for start in range(0, 5000, 1000)]
    client.insert(table, chunks, fmt="TabSeparated", purpose="insert", encoding=encoding)
    assert run_sql(server_url, f"SELECT count(), sum(x) FROM {table}").split() == [
        "5000", str(sum(range(5000)))]


def test_compressed_writes_commit_every_row_once(spark, server_url, server_db, options):
    table = create_events(server_url, server_db)
    save(events_df(spark, 0, 3000), options, table, compression="gzip")
    assert_exactly_once(server_url, table, range(3000))


def test_an_encoding_the_server_cannot_read_is_refused_before_anything_is_staged(
        spark, clickhouse_url, ch_db, zk_hosts, zk_chroot):
    options = {"url": clickhouse_url, "zookeeper": zk_hosts + zk_chroot}
    table = create_events(clickhouse_url, ch_db)
    before = staging_tables(clickhouse_url, options)
    with pytest.raises(Exception, match="compression='zstd' cannot be used.*Unknown Content"):
        save(events_df(spark, 0, 10), options, table, compression="zstd")
    assert staging_tables(clickhouse_url, options) == before
    assert run_sql(clickhouse_url, f"SELECT count() FROM {table}").strip() == "0"


def test_an_unknown_compression_is_refused_naming_the_choices(spark, clickhouse_url, ch_db,
                                                              zk_hosts, zk_chroot):
    options = {"url": clickhouse_url, "zookeeper": zk_hosts + zk_chroot}
    table = create_events(clickhouse_url, ch_db)
    with pytest.raises(Exception, match="compression='brotli' is not one of none, gzip"):
        save(events_df(spark, 0, 10), options, table, compression="brotli")
