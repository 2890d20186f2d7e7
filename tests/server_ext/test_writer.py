"""BranchWriter against the real 18.16 server (Native path), and the modern one where
it differs (synchronous inserts, deduplicated repeats)."""

from __future__ import annotations

import datetime as dt
import itertools
import uuid
from decimal import Decimal

import pyarrow as pa
import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server_ext.capabilities import Capabilities, detect_capabilities
from server_ext.client.http_client import ClickHouseClient
from server_ext.errors import ClickHouseError, InvalidValue, SchemaMismatch
from server_ext.sql import qualified_name, sql_string
from server_ext.staging.writer import BranchWriter
from server_ext.types.target_table import TargetTable, describe_table
from tests import roundtrip

COLUMNS = ("id UInt64, name String, code FixedString(2), amount Decimal(9, 2), "
           "ts DateTime, small UInt8")


@pytest.fixture
def caps(client: ClickHouseClient) -> Capabilities:
    return detect_capabilities(client)


def make_table(client: ClickHouseClient, database: str, columns: str = COLUMNS,
               name: str = "staging") -> TargetTable:
    table = qualified_name(database, name)
    client.execute(f"CREATE TABLE {table} ({columns}) ENGINE = MergeTree() "
                   "PARTITION BY tuple() ORDER BY tuple()", purpose="create table")
    client.execute(f"SYSTEM STOP MERGES {table}", purpose="stop merges")
    return describe_table(client, f"{database}.{name}")


@pytest.fixture
def table(client: ClickHouseClient, ch_db: str) -> TargetTable:
    return make_table(client, ch_db)


def rows_batch(start: int, count: int, **overrides: pa.Array) -> pa.RecordBatch:
    ids = list(range(start, start + count))
    arrays = {
        "id": pa.array(ids, pa.int64()),
        "name": pa.array([f"name-{i}" for i in ids], pa.string()),
        "code": pa.array(["ab"] * count, pa.string()),
        "amount": pa.array([Decimal("1.25")] * count, pa.decimal128(38, 18)),
        "ts": pa.array([dt.datetime(2024, 1, 1)] * count, pa.timestamp("us", tz="UTC")),
        "small": pa.array([7] * count, pa.int64()),
    }
    arrays.update(overrides)
    return pa.record_batch(arrays)


def count(client: ClickHouseClient, table: TargetTable) -> int:
    return int(client.query_value(f"SELECT count() FROM {table.qualified}", purpose="count"))


def part_rows(client: ClickHouseClient, table: TargetTable) -> list[int]:
    rows = client.query_rows(
        f"SELECT rows FROM system.parts WHERE database = '{table.database}' "
        f"AND table = '{table.name}' AND active ORDER BY min_block_number", purpose="parts")
    return [int(r["rows"]) for r in rows]


def test_writer_sends_every_row_and_counts_them(client, table, caps) -> None:
    writer = BranchWriter(client, table, table.qualified, caps)
    for start in range(0, 1000, 100):
        writer.write(rows_batch(start, 100))
    writer.flush()
    assert writer.rows_sent == count(client, table) == 1000
    assert writer.bytes_sent > 1000 and writer.format == "Native"
    ids = client.query_value(f"SELECT sum(id) FROM {table.qualified}", purpose="sum")
    assert int(ids) == sum(range(1000))


def test_no_insert_carries_more_than_block_rows(client, table, caps) -> None:
    writer = BranchWriter(client, table, table.qualified, caps, block_rows=100, chunk_rows=40)
    for start in range(0, 250, 30):
        writer.write(rows_batch(start, min(30, 250 - start)))
    writer.flush()
    assert part_rows(client, table) == [100, 100, 50]  # one part per INSERT


def test_rows_wait_for_a_full_block_or_flush(client, table, caps) -> None:
    writer = BranchWriter(client, table, table.qualified, caps, block_rows=100)
    writer.write(rows_batch(0, 50))
    assert (writer.rows_sent, count(client, table)) == (0, 0)
    writer.flush()
    assert (writer.rows_sent, count(client, table)) == (50, 50)


def test_flush_may_be_called_again(client, table, caps) -> None:
    writer = BranchWriter(client, table, table.qualified, caps)
    writer.write(rows_batch(0, 10))
    writer.flush()
    writer.flush()
    assert count(client, table) == writer.rows_sent == 10


def test_empty_and_uneven_batches_keep_every_row_in_order(client, table, caps) -> None:
    writer = BranchWriter(client, table, table.qualified, caps, block_rows=64, chunk_rows=7)
    start = 0
    for size in (0, 1, 13, 0, 200, 2, 64, 5):
        writer.write(rows_batch(start, size))
        start += size
    writer.flush()
    got = client.query_rows(f"SELECT id FROM {table.qualified} ORDER BY id", purpose="ids")
    assert [int(r["id"]) for r in got] == list(range(start))


def test_schema_mismatch_is_raised_before_anything_is_sent(client, table, caps) -> None:
    writer = BranchWriter(client, table, table.qualified, caps)
    bad = rows_batch(0, 3, id=pa.array(["x", "y", "z"])).drop_columns(["name"])
    with pytest.raises(SchemaMismatch) as caught:
        writer.write(bad)
    assert "`id`" in str(caught.value) and "`name`" in str(caught.value)
    writer.flush()
    assert count(client, table) == 0


BAD_VALUES = {
    "null": {"id": pa.array([1, None, 3], pa.int64())},
    "out-of-range": {"small": pa.array([1, 300, 2])},
    "negative-unsigned": {"id": pa.array([1, 2, -3])},
    "fixed-string-too-long": {"code": pa.array(["ab", "abc", "ab"])},
    "datetime-out-of-range": {"ts": pa.array([0, 2**32, 0], pa.timestamp("s"))},
    "decimal-overflow": {"amount": pa.array([Decimal(1), Decimal("12345678.9"), Decimal(0)],
                                            pa.decimal128(38, 18))},
}


@pytest.mark.parametrize("kind", list(BAD_VALUES))
def test_bad_value_is_rejected_before_anything_is_inserted(client, table, caps, kind) -> None:
    writer = BranchWriter(client, table, table.qualified, caps, block_rows=5)
    writer.write(rows_batch(0, 3))  # buffered, not yet sent
    column = next(iter(BAD_VALUES[kind]))
    with pytest.raises(InvalidValue) as caught:
        writer.write(rows_batch(3, 3, **BAD_VALUES[kind]))  # would complete a block
    assert caught.value.column == column
    assert count(client, table) == 0 and writer.rows_sent == 0


def test_a_failing_insert_leaves_none_of_its_rows(client, ch_db, caps) -> None:
    # The server fails on row 45 while evaluating a column: after chunks 1..4 arrived.
    table = make_table(client, ch_db, "id UInt64, guard UInt8 MATERIALIZED throwIf(id = 45)")
    writer = BranchWriter(client, table, table.qualified, caps, block_rows=100, chunk_rows=10)
    writer.write(pa.record_batch({"id": pa.array(range(60), pa.uint64())}))
    with pytest.raises(ClickHouseError) as caught:
        writer.flush()
    assert caught.value.code == 395
    assert count(client, table) == 0 and writer.rows_sent == 0


def test_after_a_failed_insert_the_writer_refuses_more_work(client, ch_db, caps) -> None:
    table = make_table(client, ch_db, "id UInt64, guard UInt8 MATERIALIZED throwIf(id = 1)")
    writer = BranchWriter(client, table, table.qualified, caps)
    writer.write(pa.record_batch({"id": pa.array([1], pa.uint64())}))
    with pytest.raises(ClickHouseError):
        writer.flush()
    with pytest.raises(ClickHouseError, match="roll the branch back"):
        writer.write(pa.record_batch({"id": pa.array([2], pa.uint64())}))


def test_a_batch_with_other_columns_than_the_first_is_refused(client, ch_db, caps) -> None:
    table = make_table(client, ch_db, "id UInt64, note String DEFAULT 'none'")
    writer = BranchWriter(client, table, table.qualified, caps)
    writer.write(pa.record_batch({"id": pa.array([1], pa.uint64()), "note": pa.array(["a"])}))
    with pytest.raises(ClickHouseError, match="other columns"):
        writer.write(pa.record_batch({"id": pa.array([2], pa.uint64())}))


def test_abort_drops_buffered_rows_and_ends_the_writer(client, table, caps) -> None:
    writer = BranchWriter(client, table, table.qualified, caps, block_rows=10)
    writer.write(rows_batch(0, 15))  # one block sent (in flight), five rows buffered
    writer.abort()
    assert count(client, table) in (0, 10)
    with pytest.raises(ClickHouseError, match="aborted"):
        writer.flush()
    assert count(client, table) in (0, 10)


_examples = itertools.count(1)


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(rows=roundtrip.tables(max_rows=40), data=st.data())
def test_random_tables_written_in_random_batches_come_back_unchanged(
        client, ch_db, caps, rows, data) -> None:
    example = next(_examples)
    roundtrip.create_table(client, ch_db)
    target = describe_table(client, f"{ch_db}.roundtrip")
    block_rows = data.draw(st.integers(2, 50), label="block_rows")
    chunk_rows = data.draw(st.integers(1, 20), label="chunk_rows")
    writer = BranchWriter(client, target, target.qualified, caps, block_rows=block_rows,
                          chunk_rows=chunk_rows)
    batch = roundtrip.to_batch(rows, example)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(rows)), max_size=4), label="cuts"))
    for start, end in zip([0, *cuts], [*cuts, len(rows)], strict=True):
        writer.write(batch.slice(start, end - start))
    writer.flush()
    got = roundtrip.read_back(client, target.qualified, example)
    assert roundtrip.by_column(got) == roundtrip.by_column(roundtrip.expected(rows))


# -- the modern server (26.x): staging inserts are synchronous -----------------------------

def test_staging_insert_on_the_modern_server_is_synchronous(modern_clickhouse_url) -> None:
    """The modern server reports ``async_insert = 1`` as its default; a staging INSERT
    must not be buffered (the seal counts the rows right after ``flush``), so the writer
    sends ``async_insert=0``: the query log shows the setting on the INSERT, the server
    counted no asynchronous insert, its queue holds nothing for the table, and every row
    is in the table when ``flush`` returns."""
    client = ClickHouseClient(modern_clickhouse_url)
    caps = detect_capabilities(client)
    default = client.query_value("SELECT value FROM system.settings WHERE name = 'async_insert'",
                                 purpose="read the server's default")
    assert caps.async_insert and default == "1"
    database = f"t_{uuid.uuid4().hex[:10]}"
    client.execute(f"CREATE DATABASE `{database}`", purpose="create database")
    try:
        table = make_table(client, database)
        writer = BranchWriter(client, table, table.qualified, caps, block_rows=100)
        writer.write(rows_batch(0, 250))
        writer.flush()
        assert count(client, table) == writer.rows_sent == 250
        client.execute("SYSTEM FLUSH LOGS", purpose="flush query log")
        inserts = client.query_rows(
            "SELECT Settings['async_insert'] AS async_insert, "
            "ProfileEvents['AsyncInsertQuery'] AS queued FROM system.query_log "
            "WHERE type = 'QueryFinish' AND query_kind = 'Insert' "
            f"AND position(query, {sql_string(table.qualified)}) > 0",
            purpose="read the inserts from the query log")
        assert [(r["async_insert"], int(r["queued"])) for r in inserts] == [("0", 0)] * 3
        queued = client.query_value(
            "SELECT count() FROM system.asynchronous_inserts "
            f"WHERE database = {sql_string(database)}", purpose="read the async insert queue")
        assert queued == "0"
    finally:
        client.execute(f"DROP DATABASE IF EXISTS `{database}`", purpose="drop database")


# -- the modern server: an INSERT whose answer was lost is sent again, once ------------------

class LoseFirstAnswer:
    """Wraps a session's ``post``: the first INSERT reaches the server and is written, then
    its answer is "lost" (``ReadTimeout``), as when a connection drops after the body."""

    def __init__(self, post):
        self.post, self.lost = post, 0

    def __call__(self, url, params=None, **kwargs):
        answer = self.post(url, params=params, **kwargs)
        # the writer's INSERTs are the requests with a streamed body (statement and data);
        # every other statement is sent as bytes
        if not isinstance(kwargs.get("data"), bytes) and not self.lost:
            self.lost += 1
            raise requests.ReadTimeout("answer lost")
        return answer


@pytest.fixture
def tokened_staging(modern_clickhouse_url):
    """26.x: (client, capabilities, target, staging) where the staging table has a
    deduplication window; the posts of ``client`` lose the first INSERT's answer."""
    from server_ext.staging.staging_tables import create_staging_table

    client = ClickHouseClient(modern_clickhouse_url)
    caps = detect_capabilities(client)
    assert caps.insert_deduplication_token and caps.non_replicated_deduplication_window
    database = f"t_{uuid.uuid4().hex[:10]}"
    client.execute(f"CREATE DATABASE `{database}`", purpose="create database")
    try:
        target = make_table(client, database, name="target")
        staging = create_staging_table(client, target, f"{database}.staging", dedup_window=True)
        client._session.post = LoseFirstAnswer(client._session.post)
        yield client, caps, target, staging
    finally:
        client.execute(f"DROP DATABASE IF EXISTS `{database}`", purpose="drop database")


def test_insert_repeated_after_a_lost_answer_keeps_its_rows_once(tokened_staging) -> None:
    """The staging table has a deduplication window and each INSERT a token, so the
    client sends an INSERT whose answer was lost again, and the server drops the repeat."""
    client, caps, target, staging = tokened_staging
    writer = BranchWriter(client, target, staging, caps, block_rows=100,
                          dedup_token="branch-1")
    writer.write(rows_batch(0, 250))
    writer.flush()
    assert client._session.post.lost == 1
    assert writer.rows_sent == 250
    assert int(client.query_value(f"SELECT count() FROM {staging}", purpose="count")) == 250


def test_insert_whose_answer_was_lost_fails_a_writer_that_may_not_repeat_inserts(
        tokened_staging) -> None:
    """A staging table that staging views read (``repeat_inserts=False``): even with a
    token and a deduplication window the INSERT is not sent again, since the views'
    shares of the block may have been written apart from the table's."""
    client, caps, target, staging = tokened_staging
    writer = BranchWriter(client, target, staging, caps, block_rows=100,
                          dedup_token="branch-1", repeat_inserts=False)
    with pytest.raises(ClickHouseError, match="may or may not have run"):
        writer.write(rows_batch(0, 250))
        writer.flush()
    assert client._session.post.lost == 1


def test_insert_whose_answer_was_lost_fails_the_writer_without_a_token(clickhouse_url) -> None:
    """18.16 has no insert_deduplication_token: a lost answer leaves the outcome unknown,
    so the writer fails (the branch is rolled back) instead of risking a double."""
    client = ClickHouseClient(clickhouse_url)
    caps = detect_capabilities(client)
    database = f"t_{uuid.uuid4().hex[:10]}"
    client.execute(f"CREATE DATABASE `{database}`", purpose="create database")
    try:
        table = make_table(client, database)
        writer = BranchWriter(client, table, table.qualified, caps, block_rows=100)
        client._session.post = LoseFirstAnswer(client._session.post)
        with pytest.raises(ClickHouseError, match="may or may not have run"):
            writer.write(rows_batch(0, 250))
            writer.flush()
    finally:
        client.execute(f"DROP DATABASE IF EXISTS `{database}`", purpose="drop database")
