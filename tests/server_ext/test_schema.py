"""Target introspection on the real 18.16 server, the Arrow schema check and the per-batch
value checks (pure functions on Arrow data)."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal

import pyarrow as pa
import pytest

from server_ext.client.http_client import ClickHouseClient
from server_ext.errors import ClickHouseError, InvalidValue, SchemaMismatch
from server_ext.sql import qualified_name
from server_ext.types.arrow_schema import check_arrow_schema
from server_ext.types.row_checks import check_batch
from server_ext.types.target_table import Column, TargetTable, describe_table

TARGET_COLUMNS = """
    d Date, id UInt64, name String, code FixedString(3), amount Decimal(9, 2),
    ts DateTime, note Nullable(String), tags Array(String),
    source String DEFAULT 'spark', doubled UInt64 MATERIALIZED id * 2
"""


@pytest.fixture
def target(client: ClickHouseClient, ch_db: str) -> TargetTable:
    client.execute(
        f"CREATE TABLE {qualified_name(ch_db, 'events')} ({TARGET_COLUMNS}) "
        "ENGINE = MergeTree() PARTITION BY toYYYYMM(d) ORDER BY (id, name) "
        "SETTINGS index_granularity = 1024", purpose="create target")
    return describe_table(client, f"{ch_db}.events")


def good_schema() -> pa.Schema:
    """What Spark sends for the target: longs, strings, decimal(38,18), UTC timestamps."""
    return pa.schema([
        ("d", pa.date32()), ("id", pa.int64()), ("name", pa.string()),
        ("code", pa.string()), ("amount", pa.decimal128(38, 18)),
        ("ts", pa.timestamp("us", tz="UTC")), ("note", pa.large_string()),
        ("tags", pa.list_(pa.string())),
    ])


# -- describe_table -------------------------------------------------------------------------


def test_describe_table_reads_columns_keys_engine_and_granularity(target: TargetTable) -> None:
    assert [c.name for c in target.columns][:3] == ["d", "id", "name"]
    assert target.column("source") == Column("source", "String", "DEFAULT", "'spark'")
    assert target.column("doubled").default_kind == "MATERIALIZED"
    assert (target.partition_key, target.sorting_key) == ("toYYYYMM(d)", "id, name")
    assert (target.engine, target.replicated, target.index_granularity) == (
        "MergeTree", False, 1024)
    assert "CREATE TABLE" in target.create_table_query


def test_describe_table_sees_a_replicated_engine(client: ClickHouseClient, ch_db: str) -> None:
    zk_path = f"/clickhouse/tests/{uuid.uuid4().hex}"
    client.execute(f"CREATE TABLE {qualified_name(ch_db, 'r')} (k UInt64) ENGINE = "
                   f"ReplicatedMergeTree('{zk_path}', 'r1') ORDER BY k", purpose="create target")
    target = describe_table(client, f"{ch_db}.r")
    assert target.replicated and target.engine == "ReplicatedMergeTree"


def test_describe_unknown_table_names_it(client: ClickHouseClient, ch_db: str) -> None:
    with pytest.raises(ClickHouseError) as caught:
        describe_table(client, f"{ch_db}.nope")
    assert caught.value.name == "UNKNOWN_TABLE" and f"`{ch_db}`.`nope`" in str(caught.value)


def test_describe_unknown_database_names_it(client: ClickHouseClient) -> None:
    with pytest.raises(ClickHouseError) as caught:
        describe_table(client, "no_such_db_here.t")
    assert caught.value.name == "UNKNOWN_DATABASE" and "no_such_db_here" in str(caught.value)


# -- check_arrow_schema ---------------------------------------------------------------------


def test_matching_schema_gives_the_columns_to_send_in_target_order(
        target: TargetTable) -> None:
    schema = pa.schema(list(reversed(list(good_schema()))))
    assert [c.name for c in check_arrow_schema(target, schema)] == [
        "d", "id", "name", "code", "amount", "ts", "note", "tags"]


def test_columns_with_a_default_or_nullable_may_be_left_out(target: TargetTable) -> None:
    schema = pa.schema([f for f in good_schema() if f.name != "note"])
    assert "note" not in [c.name for c in check_arrow_schema(target, schema)]


def test_schema_mismatch_names_every_bad_column(target: TargetTable) -> None:
    schema = pa.schema([
        ("d", pa.date32()), ("id", pa.string()),           # string into UInt64
        ("code", pa.string()), ("amount", pa.decimal128(38, 18)),
        ("ts", pa.float64()),                              # float into DateTime
        ("tags", pa.list_(pa.int64())),                    # Array(String) from list<int64>
        ("doubled", pa.int64()),                           # MATERIALIZED
        ("extra", pa.int32()),                             # unknown
    ])                                                     # name: missing, no default
    with pytest.raises(SchemaMismatch) as caught:
        check_arrow_schema(target, schema)
    problems = caught.value.problems
    assert len(problems) == 6
    for column in ("id", "ts", "tags", "doubled", "extra", "name"):
        assert f"`{column}`" in str(caught.value)
    assert any("missing column `name`" in p for p in problems)
    assert any("cannot convert string to UInt64" in p for p in problems)


def test_unsupported_column_type_is_a_mismatch(client: ClickHouseClient, ch_db: str) -> None:
    client.execute(f"CREATE TABLE {qualified_name(ch_db, 'e')} (k UInt8, "
                   "mood AggregateFunction(uniq, UInt64)) ENGINE = Memory", purpose="create")
    target = describe_table(client, f"{ch_db}.e")
    with pytest.raises(SchemaMismatch, match="`mood`: type AggregateFunction.* is not supported"):
        check_arrow_schema(target, pa.schema([("k", pa.int64()), ("mood", pa.string())]))


def test_a_differently_cased_name_gets_a_hint(target: TargetTable) -> None:
    schema = pa.schema([f if f.name != "id" else pa.field("ID", pa.int64())
                        for f in good_schema()])
    with pytest.raises(SchemaMismatch, match="did you mean `id`"):
        check_arrow_schema(target, schema)


# -- check_batch ----------------------------------------------------------------------------


def columns(*pairs: tuple[str, str]) -> list[Column]:
    return [Column(name, type_) for name, type_ in pairs]


def batch(**arrays: pa.Array) -> pa.RecordBatch:
    return pa.record_batch(arrays)


def test_valid_values_pass(target: TargetTable) -> None:
    good = pa.record_batch([
        pa.array([dt.date(2024, 1, 1)]), pa.array([1], pa.int64()), pa.array(["a"]),
        pa.array(["abc"]), pa.array([Decimal("1.50")], pa.decimal128(38, 18)),
        pa.array([dt.datetime(2024, 1, 1)], pa.timestamp("us", tz="UTC")),
        pa.array([None], pa.large_string()), pa.array([["x"]])], schema=good_schema())
    check_batch(check_arrow_schema(target, good.schema), good)


@pytest.mark.parametrize(("column", "array", "message", "row", "value"), [
    (("id", "UInt64"), pa.array([1, None]), "null value into non-Nullable UInt64", 1, None),
    (("small", "UInt8"), pa.array([1, 300, 2]), "out of range for UInt8", 1, 300),
    (("count", "UInt32"), pa.array([0, 5, -1]), "out of range for UInt32", 2, -1),
    (("tiny", "Int8"), pa.array([-129], pa.int16()), "out of range for Int8", 0, -129),
    (("code", "FixedString(3)"), pa.array(["abc", "abcd"]), "longer than 3 bytes", 1, "abcd"),
    (("ts", "DateTime"),
     pa.array([dt.datetime(1969, 12, 31, 23, 59, 59)], pa.timestamp("us", tz="UTC")),
     "outside the range of DateTime", 0, dt.datetime(1969, 12, 31, 23, 59, 59,
                                                     tzinfo=dt.UTC)),
    (("ts", "DateTime"), pa.array([2**32], pa.timestamp("s")), "outside the range", 0,
     dt.datetime(2106, 2, 7, 6, 28, 16)),
    (("d", "Date"), pa.array([dt.date(1969, 1, 1)]), "outside the range of Date", 0,
     dt.date(1969, 1, 1)),
    (("d", "Date"), pa.array([dt.date(2000, 1, 1), dt.date(2149, 6, 7)]),
     "outside the range of Date", 1, dt.date(2149, 6, 7)),
    (("amount", "Decimal(9, 2)"), pa.array([Decimal("1"), Decimal("10000000")],
                                           pa.decimal128(38, 18)),
     "does not fit Decimal(9, 2)", 1, Decimal("10000000")),
    (("amount", "Decimal(9, 2)"), pa.array([Decimal("0.125")], pa.decimal128(10, 3)),
     "without rounding", 0, Decimal("0.125")),
    (("tags", "Array(String)"), pa.array([["a"], None]), "null value into non-Nullable", 1,
     None),
    (("ids", "Array(UInt8)"), pa.array([[1], [2, 256]]), "out of range for UInt8", 1, 256),
], ids=["null", "too-big", "negative-unsigned", "too-small", "fixed-string-too-long",
        "before-1970", "after-2106", "date-before-1970", "date-after-2149", "decimal-overflow",
        "decimal-rounding", "null-array", "array-element-out-of-range"])
def test_bad_value_names_column_row_and_value(column, array, message, row, value) -> None:
    name, type_ = column
    with pytest.raises(InvalidValue) as caught:
        check_batch(columns(column), batch(**{name: array}))
    error = caught.value
    assert (error.column, error.row) == (name, row)
    assert error.value == value or (value is not None and str(value) in str(error.value))
    assert message in str(error) and f"`{name}`" in str(error)


def test_nulls_are_fine_for_a_nullable_column() -> None:
    check_batch(columns(("n", "Nullable(UInt8)")), batch(n=pa.array([None, 1])))


def test_unsigned_source_into_a_wider_signed_column_needs_no_check() -> None:
    check_batch(columns(("n", "Int64")), batch(n=pa.array([2**32 - 1], pa.uint32())))


def test_a_sliced_batch_reports_rows_of_the_slice() -> None:
    data = batch(n=pa.array([1000, 1, 2, 3, 300])).slice(1)
    with pytest.raises(InvalidValue) as caught:
        check_batch(columns(("n", "UInt8")), data)
    assert caught.value.row == 3


@pytest.mark.parametrize("printed, shown", [
    ("Tuple(\n    a Int32,\n    b String)", "Tuple(a Int32, b String)"),  # as 26.x prints it
    ("Array(Tuple(\n    a Int32,\n    b String\n))", "Array(Tuple(a Int32, b String))"),
    ("Enum8('a  b' = 1)", "Enum8('a  b' = 1)"),  # spaces inside a label kept
])
def test_a_type_is_named_on_one_line_in_messages(printed: str, shown: str) -> None:
    from server_ext.types.chtypes import parse_type

    assert str(parse_type(printed)) == shown
