"""The modern-server data path on the ClickHouse 26.9 engine (chdb, in-process):
capability detection, and BranchWriter streaming ArrowStream (and Native when forced).

chdb opens one data path per process for the life of the process, so every test shares
``ChdbClient.for_process()`` and works in its own database. Nothing here forks.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server_ext.capabilities import Capabilities, detect_capabilities
from server_ext.client.chdb_client import ChdbClient
from server_ext.errors import ClickHouseError
from server_ext.publish.strategy_choice import choose_strategy
from server_ext.sql import qualified_name
from server_ext.staging.writer import BranchWriter
from server_ext.types.target_table import TargetTable, describe_table
from tests import roundtrip


@pytest.fixture(scope="module")
def chdb() -> ChdbClient:
    return ChdbClient.for_process()


@pytest.fixture(scope="module")
def caps(chdb: ChdbClient) -> Capabilities:
    return detect_capabilities(chdb)


@pytest.fixture
def database(chdb: ChdbClient) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:10]}"
    chdb.execute(f"CREATE DATABASE `{name}`", purpose="test setup")
    yield name
    chdb.execute(f"DROP DATABASE IF EXISTS `{name}`", purpose="test cleanup")


def test_modern_engine_has_move_partition_and_arrow_stream(caps: Capabilities) -> None:
    assert caps.version >= (26, 9) and caps.move_partition and caps.arrow_stream
    assert caps.insert_deduplication_token and caps.async_insert and not caps.keeper


def test_plain_target_on_the_modern_engine_gets_move(chdb, caps, database) -> None:
    chdb.execute(f"CREATE TABLE {qualified_name(database, 't')} (k UInt8) "
                 "ENGINE = MergeTree() ORDER BY k", purpose="create target")
    assert choose_strategy(caps, describe_table(chdb, f"{database}.t")) == "move"


def test_writer_chooses_arrow_stream_on_the_modern_engine(chdb, caps, database) -> None:
    target = roundtrip_target(chdb, database)
    assert BranchWriter(chdb, target, target.qualified, caps).format == "ArrowStream"


def roundtrip_target(chdb: ChdbClient, database: str) -> TargetTable:
    roundtrip.create_table(chdb, database)
    return describe_table(chdb, f"{database}.roundtrip")


def write_rows(chdb, target, caps, rows, example, block_rows=1000, chunk_rows=7) -> None:
    writer = BranchWriter(chdb, target, target.qualified, caps, block_rows=block_rows,
                          chunk_rows=chunk_rows)
    writer.write(roundtrip.to_batch(rows, example))
    writer.flush()
    assert writer.rows_sent == len(rows)


def test_sample_row_comes_back_through_arrow_stream(chdb, caps, database) -> None:
    target = roundtrip_target(chdb, database)
    rows = [roundtrip.SAMPLE_ROW] * 20
    write_rows(chdb, target, caps, rows, example=1)
    got = roundtrip.read_back(chdb, target.qualified, 1)
    assert roundtrip.by_column(got) == roundtrip.by_column(roundtrip.expected(rows))


def test_sample_row_comes_back_through_native_when_forced(chdb, caps, database) -> None:
    target = roundtrip_target(chdb, database)
    native_caps = caps.with_overrides(arrow_stream=False)
    rows = [roundtrip.SAMPLE_ROW] * 20
    write_rows(chdb, target, native_caps, rows, example=1)
    got = roundtrip.read_back(chdb, target.qualified, 1)
    assert roundtrip.by_column(got) == roundtrip.by_column(roundtrip.expected(rows))


def test_arrow_stream_insert_is_split_at_block_rows(chdb, caps, database) -> None:
    table = qualified_name(database, "s")
    chdb.execute(f"CREATE TABLE {table} (id UInt64) ENGINE = MergeTree() ORDER BY id",
                 purpose="create table")
    chdb.execute(f"SYSTEM STOP MERGES {table}", purpose="stop merges")
    target = describe_table(chdb, f"{database}.s")
    writer = BranchWriter(chdb, target, table, caps, block_rows=100, chunk_rows=30)
    writer.write(pa.record_batch({"id": pa.array(range(250), pa.int64())}))
    writer.flush()
    parts = chdb.query_rows(f"SELECT rows FROM system.parts WHERE database = '{database}' "
                            "AND table = 's' AND active ORDER BY min_block_number",
                            purpose="parts")
    assert [int(p["rows"]) for p in parts] == [100, 100, 50]


def test_a_failing_arrow_stream_insert_leaves_none_of_its_rows(chdb, caps, database) -> None:
    table = qualified_name(database, "g")
    chdb.execute(f"CREATE TABLE {table} (id UInt64, guard UInt8 MATERIALIZED "
                 "throwIf(id = 45)) ENGINE = MergeTree() ORDER BY id", purpose="create table")
    target = describe_table(chdb, f"{database}.g")
    writer = BranchWriter(chdb, target, table, caps, block_rows=100, chunk_rows=10)
    writer.write(pa.record_batch({"id": pa.array(range(60), pa.uint64())}))
    with pytest.raises(ClickHouseError):
        writer.flush()
    assert chdb.query_value(f"SELECT count() FROM {table}", purpose="count") == "0"


_examples = itertools.count(1)


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(rows=roundtrip.tables(max_rows=40), data=st.data())
def test_random_tables_come_back_unchanged_through_arrow_stream(
        chdb, caps, database, rows, data) -> None:
    example = next(_examples)
    target = roundtrip_target(chdb, database)
    block_rows = data.draw(st.integers(2, 50), label="block_rows")
    write_rows(chdb, target, caps, rows, example, block_rows=block_rows)
    got = roundtrip.read_back(chdb, target.qualified, example)
    assert roundtrip.by_column(got) == roundtrip.by_column(roundtrip.expected(rows))
