"""Column types beyond numbers, strings and Date/DateTime: DateTime64, Date32, Bool, UUID,
Enum8/16, Map, Tuple, wide integers, Decimal256, IPv4/IPv6 and JSON, written exactly on
each server that has them (18.16 has UUID, Enum and Tuple; 26.x all of them).

Each type gets a property test (hypothesis, derandomized): random values, with their
boundaries, nulls, empty collections and unicode, go through the writer the tasks use
(``BranchWriter``: the value checks, then Native on 18.16, ArrowStream on 26.x) and are
read back by plain HTTP as text or numbers the server computes, compared exactly with
what Python computes from the values. Values a column cannot hold are refused before
anything is sent, naming the column, the row and the value.
"""

from __future__ import annotations

import datetime as dt
import decimal
import ipaddress
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import pyarrow as pa
import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import txsink
from server_ext.capabilities import detect_capabilities
from server_ext.client.http_client import ClickHouseClient
from server_ext.errors import InvalidValue, SchemaMismatch
from server_ext.staging.writer import BranchWriter
from server_ext.types.arrow_schema import check_arrow_schema
from server_ext.types.chtypes import STORAGE_RANGES
from server_ext.types.prepare import checked_batch
from server_ext.types.row_checks import check_batch
from server_ext.types.target_table import Column, TargetTable, describe_table
from tests.conftest import run_sql


def _micro_text(value: dt.datetime, digits: int) -> str:
    """``YYYY-MM-DD hh:mm:ss.fff…`` as the server prints DateTime64(digits) in UTC."""
    value = value.astimezone(dt.UTC) if value.tzinfo else value
    fraction = f"{value.microsecond:06d}".ljust(9, "0")[:digits]
    return (f"{value.year:04d}-{value.month:02d}-{value.day:02d} "
            f"{value.hour:02d}:{value.minute:02d}:{value.second:02d}.{fraction}")


def _date_text(value: dt.date) -> str:
    return value.isoformat()


def _decimal_text(value: str) -> Decimal:
    return Decimal(value)


_INSTANTS = st.datetimes(min_value=dt.datetime(1, 1, 1),
                         max_value=dt.datetime(9999, 12, 31, 23, 59, 59, 999_999),
                         timezones=st.just(dt.UTC))
_WALL_CLOCKS = st.datetimes(min_value=dt.datetime(1, 1, 1),
                            max_value=dt.datetime(9999, 12, 31, 23, 59, 59, 999_999))
_MILLIS = _INSTANTS.map(lambda t: t.replace(microsecond=t.microsecond // 1000 * 1000))
_NANO_RANGE = st.datetimes(min_value=dt.datetime(1677, 9, 22),
                           max_value=dt.datetime(2262, 4, 10), timezones=st.just(dt.UTC))
_LABELS = (("ok", 1), ("fail", -128), ("ünï'code", 127), ("", 0), ("a,b", 5))
_ENUM8 = "Enum8(" + ", ".join(f"'{label.replace(chr(39), chr(92) + chr(39))}' = {code}"
                              for label, code in _LABELS) + ")"
_WORDS = st.text(max_size=8)
_KEYS = st.text("abcxyz", min_size=1, max_size=4)
_QUARTERS = st.integers(-(10**9), 10**9).map(lambda n: n / 4)  # exact in any float text
# Nested(a, b) from a Spark array of structs whose fields come in another order
_NESTED = "Nested(a Int32, b Nullable(String))"
_NESTED_ARROW = pa.list_(pa.struct([("b", pa.string()), ("a", pa.int32())]))
_NESTED_VALUES = st.lists(st.fixed_dictionaries(
    {"a": st.integers(-(2**31), 2**31 - 1), "b": st.none() | _WORDS}), max_size=3)
_NESTED_SELECT = "arrayMap((a, b) -> [toString(a), b], `{0}.a`, `{0}.b`)"


_JSON_STRUCT = pa.struct([("n", pa.int64()), ("s", pa.string()), ("l", pa.list_(pa.float64())),
                          ("m", pa.map_(pa.string(), pa.bool_()))])
_JSON_STRUCT_VALUES = st.fixed_dictionaries({
    "n": st.integers(-(2**63), 2**63 - 1), "s": st.none() | _WORDS,
    "l": st.lists(_QUARTERS, min_size=1, max_size=3),
    "m": st.dictionaries(_KEYS, st.booleans(), min_size=1, max_size=3)})


def _json_of_struct(value: dict) -> dict:
    """What the server stores for a struct: a null field is left out (JSON keeps no nulls)."""
    return {key: item for key, item in value.items() if item is not None}


def _nested_expected(value: list[dict]) -> list[list]:
    return [[str(e["a"]), e["b"]] for e in value]


def _exists_in(zone: str) -> Callable[[dt.datetime], bool]:
    """Whether a wall-clock time exists in ``zone`` (no daylight-saving gap skips it)."""
    def exists(wall: dt.datetime) -> bool:
        placed = wall.replace(tzinfo=ZoneInfo(zone))
        return placed.astimezone(dt.UTC).astimezone(ZoneInfo(zone)).replace(
            tzinfo=None) == wall
    return exists


# Spark TimestampNTZ values: wall-clock times the column's zone shows as written. 18.16's
# DateTime starts at the instant 0 (09:00 in Tokyo); DateTime64 in a zone other than UTC
# holds the calendar less 15 h at each end.
_TOKYO_WALL_CLOCKS = st.datetimes(min_value=dt.datetime(1971, 1, 1),
                                  max_value=dt.datetime(2105, 12, 31, 23, 59, 59)
                                  ).filter(_exists_in("Asia/Tokyo"))
_NEW_YORK_WALL_CLOCKS = st.datetimes(min_value=dt.datetime(1, 1, 2),
                                     max_value=dt.datetime(9999, 12, 30)
                                     ).filter(_exists_in("America/New_York"))


@dataclass
class Case:
    """One column type: the Arrow type Spark sends, values, the expression that reads a
    value back, and how the expected value is computed from what was written."""

    id: str
    ch_type: str
    arrow_type: pa.DataType
    values: st.SearchStrategy
    select: str = "toString({})"
    expect: Callable[[Any], Any] = str
    got: Callable[[Any], Any] = lambda v: v  # noqa: E731
    servers: tuple[str, ...] = ("ch26",)
    create_settings: tuple[tuple[str, int], ...] = ()  # query settings of the CREATE TABLE


def _nullable(case: Case, ch_type: str | None = None) -> Case:
    return Case(f"n_{case.id}", ch_type or f"Nullable({case.ch_type})", case.arrow_type,
                st.none() | case.values, case.select,
                lambda v: None if v is None else case.expect(v), case.got, case.servers,
                case.create_settings)


_UUIDS = st.uuids().flatmap(lambda u: st.sampled_from([str(u), str(u).upper()]))
CASES: list[Case] = [
    Case("dt64_6", "DateTime64(6)", pa.timestamp("us", tz="UTC"), _INSTANTS,
         expect=lambda v: _micro_text(v, 6)),
    Case("dt64_3_utc", "DateTime64(3, 'UTC')", pa.timestamp("us", tz="UTC"), _MILLIS,
         expect=lambda v: _micro_text(v, 3)),
    Case("dt64_9", "DateTime64(9)", pa.timestamp("us", tz="UTC"), _NANO_RANGE,
         expect=lambda v: _micro_text(v, 9)),
    Case("dt64_ntz", "DateTime64(6)", pa.timestamp("us"), _WALL_CLOCKS,
         expect=lambda v: _micro_text(v, 6)),
    Case("date32", "Date32", pa.date32(), st.dates(), expect=_date_text),
    Case("bool", "Bool", pa.bool_(), st.booleans(), expect=lambda v: str(v).lower()),
    Case("uuid", "UUID", pa.string(), _UUIDS, expect=str.lower, servers=("ch18", "ch26")),
    Case("enum8", _ENUM8, pa.string(), st.sampled_from([label for label, _ in _LABELS]),
         servers=("ch18", "ch26")),
    Case("enum8_codes", _ENUM8, pa.int32(), st.sampled_from([code for _, code in _LABELS]),
         select="toInt8({})", expect=lambda v: v, got=int, servers=("ch18", "ch26")),
    Case("enum16", "Enum16('low' = -32768, 'high' = 32767)", pa.string(),
         st.sampled_from(["low", "high"]), servers=("ch18", "ch26")),
    Case("map", "Map(String, Int64)", pa.map_(pa.string(), pa.int64()),
         st.dictionaries(_WORDS, st.integers(-(2**63), 2**63 - 1), max_size=4),
         select="(mapKeys({0}), mapValues({0}))",
         expect=lambda v: [list(v), list(v.values())]),
    Case("tuple", "Tuple(a Int32, b String)",
         pa.struct([("b", pa.string()), ("a", pa.int32())]),
         st.fixed_dictionaries({"a": st.integers(-(2**31), 2**31 - 1), "b": _WORDS}),
         select="[toString(tupleElement({0}, 1)), tupleElement({0}, 2)]",
         expect=lambda v: [str(v["a"]), v["b"]], servers=("ch18", "ch26")),
    Case("tuple_unnamed", "Tuple(Int64, Nullable(String))",
         pa.struct([("_1", pa.int64()), ("_2", pa.string())]),
         st.fixed_dictionaries({"_1": st.integers(-(2**63), 2**63 - 1),
                                "_2": st.none() | _WORDS}),
         select="[toString(tupleElement({0}, 1)), tupleElement({0}, 2)]",
         expect=lambda v: [str(v["_1"]), v["_2"]], servers=("ch18", "ch26")),
    Case("array_tuple", "Array(Tuple(String, Float64))",  # 18.16: Nested `c.1`, `c.2`
         pa.list_(pa.struct([("s", pa.string()), ("f", pa.float64())])),
         st.lists(st.fixed_dictionaries({"s": _WORDS, "f": _QUARTERS}), max_size=3),
         select="arrayMap((s, f) -> [s, toString(f)], `{0}.1`, `{0}.2`)",
         expect=lambda v: [[e["s"], e["f"]] for e in v],
         got=lambda v: [[s, float(f)] for s, f in v], servers=("ch18", "ch26")),
    Case("nested", _NESTED, _NESTED_ARROW, _NESTED_VALUES, select=_NESTED_SELECT,
         expect=_nested_expected, servers=("ch18", "ch26")),
    Case("nested_unflattened", _NESTED, _NESTED_ARROW, _NESTED_VALUES, select=_NESTED_SELECT,
         expect=_nested_expected, create_settings=(("flatten_nested", 0),)),
    Case("dt_ntz_tokyo", "DateTime('Asia/Tokyo')", pa.timestamp("us"), _TOKYO_WALL_CLOCKS,
         expect=lambda v: _micro_text(v, 0)[:19], servers=("ch18", "ch26")),
    Case("dt64_ntz_new_york", "DateTime64(6, 'America/New_York')", pa.timestamp("us"),
         _NEW_YORK_WALL_CLOCKS, expect=lambda v: _micro_text(v, 6)),
    Case("map_array_tuple", "Map(String, Array(Tuple(a String, b Float64)))",
         pa.map_(pa.string(), pa.list_(pa.struct([("a", pa.string()), ("b", pa.float64())]))),
         st.dictionaries(_KEYS, st.lists(st.fixed_dictionaries(
             {"a": _WORDS, "b": st.integers(-1000, 1000).map(float)}), max_size=2), max_size=3),
         select="arrayMap((k, v) -> [k, toJSONString(v)], mapKeys({0}), mapValues({0}))",
         expect=lambda v: [[k, [[e["a"], e["b"]] for e in items]] for k, items in v.items()],
         got=lambda v: [[k, [list(e.values()) if isinstance(e, dict) else e
                             for e in json.loads(j)]] for k, j in v]),
    Case("int128", "Int128", pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    Case("uint256", "UInt256", pa.decimal128(38, 0),
         st.integers(0, 10**38 - 1).map(Decimal), expect=lambda v: str(int(v))),
    Case("dec76", "Decimal(76, 20)", pa.decimal128(38, 20),
         st.integers(-(10**38 - 1), 10**38 - 1).map(
             lambda u: Decimal(u).scaleb(-20, decimal.Context(prec=100))),
         expect=lambda v: v, got=_decimal_text),
    Case("ipv4", "IPv4", pa.string(), st.ip_addresses(v=4).map(str)),
    Case("ipv6", "IPv6", pa.string(), st.ip_addresses(v=6).map(str), select="hex({})",
         expect=lambda v: ipaddress.IPv6Address(v).packed.hex().upper()),
    Case("json", "JSON", pa.string(),
         st.dictionaries(_KEYS, st.integers(-(2**31), 2**31) | _WORDS, max_size=4)
         .map(json.dumps),
         expect=json.loads, got=json.loads),
    Case("json_struct", "JSON", _JSON_STRUCT, _JSON_STRUCT_VALUES, select="toJSONString({})",
         expect=_json_of_struct, got=json.loads),
    Case("json_map", "JSON", pa.map_(pa.string(), pa.int64()),
         st.dictionaries(_KEYS, st.integers(-(2**63), 2**63 - 1), max_size=4),
         select="toJSONString({})", got=json.loads, expect=lambda v: v),
    Case("variant_int", "Variant(String, Int64)", pa.int64(),
         st.integers(-(2**63), 2**63 - 1), select="[toString({0}), variantType({0})]",
         expect=lambda v: [str(v), "Int64"]),
    Case("variant_string", "Variant(String, Int64)", pa.string(), _WORDS,
         select="[toString({0}), variantType({0})]", expect=lambda v: [v, "String"]),
    Case("dynamic", "Dynamic", pa.float64(), _QUARTERS,
         select="[toString({0}), dynamicType({0})]",
         expect=lambda v: [repr(v).removesuffix(".0"), "Float64"]),
]
CASES += [_nullable(c) for c in CASES if c.id in ("dt64_3_utc", "date32", "bool", "uuid",
                                                   "enum8", "int128", "ipv4")]
CASES.append(_nullable(next(c for c in CASES if c.id == "uuid"),
                       "LowCardinality(Nullable(UUID))"))
CASES[-1].id, CASES[-1].servers = "lc_uuid", ("ch26",)


def _params(case: Case) -> list:
    return [pytest.param(case, server, id=f"{case.id}-{server}")
            for server in ("ch18", "ch26") if server in case.servers]


def _server_url(request, server: str) -> str:
    return request.getfixturevalue("clickhouse_url" if server == "ch18"
                                   else "modern_clickhouse_url")


def _query(url: str, sql: str, fmt: str = " FORMAT JSON",
           settings: tuple[tuple[str, int], ...] = ()) -> list[dict]:
    """Plain HTTP, independent of server_ext: rows as JSON, 64-bit integers as numbers."""
    resp = requests.post(url, data=f"{sql}{fmt}".encode(), timeout=30,
                         params={"output_format_json_quote_64bit_integers": 0}
                         | ({"allow_suspicious_low_cardinality_types": 1}
                            if "LowCardinality(Nullable(UUID" in sql else {})
                         | dict(settings))
    assert resp.status_code == 200, resp.text
    return json.loads(resp.content.decode())["data"] if fmt else []


_examples = itertools.count(1)


@pytest.fixture
def database(request) -> Any:
    """A fresh database on the server a case runs on (by its ``server`` parameter)."""
    created: list[tuple[str, str]] = []

    def make(url: str) -> str:
        name = f"t_types_{next(_examples)}_{id(request) % 10_000}"
        run_sql(url, f"DROP DATABASE IF EXISTS `{name}`")
        run_sql(url, f"CREATE DATABASE `{name}`")
        created.append((url, name))
        return name

    yield make
    for url, name in created:
        run_sql(url, f"DROP DATABASE IF EXISTS `{name}`")


@pytest.mark.parametrize(("case", "server"),
                         [p for case in CASES for p in _params(case)])
def test_random_values_of_the_type_come_back_exactly(request, database, case: Case,
                                                     server: str) -> None:
    url = _server_url(request, server)
    db = database(url)
    client = ClickHouseClient(url)
    _query(url, f"CREATE TABLE `{db}`.t (k UInt32, row UInt32, c {case.ch_type}) "
                "ENGINE = MergeTree ORDER BY (k, row)", fmt="", settings=case.create_settings)
    target = describe_table(client, f"{db}.t")
    caps = detect_capabilities(client)
    examples = itertools.count()

    @settings(max_examples=20, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(values=st.lists(case.values, max_size=12))
    def round_trip(values: list) -> None:
        example = next(examples)
        batch = pa.record_batch({
            "k": pa.array([example] * len(values), pa.uint32()),
            "row": pa.array(range(len(values)), pa.uint32()),
            "c": _arrow(values, case.arrow_type)})
        writer = BranchWriter(client, target, target.qualified, caps)
        writer.write(batch)
        writer.flush()
        rows = _query(url, f"SELECT {case.select.format('c')} AS v FROM `{db}`.t "
                           f"WHERE k = {example} ORDER BY row")
        got = [None if r["v"] is None else case.got(r["v"]) for r in rows]
        assert got == [None if v is None else case.expect(v) for v in values]

    round_trip()


def _arrow(values: list, arrow_type: pa.DataType) -> pa.Array:
    if pa.types.is_map(arrow_type):
        return pa.array([None if v is None else list(v.items()) for v in values], arrow_type)
    if pa.types.is_struct(arrow_type) and any(pa.types.is_map(f.type) for f in arrow_type):
        values = [None if v is None else {k: list(i.items()) if isinstance(i, dict) else i
                                          for k, i in v.items()} for v in values]
    return pa.array(values, arrow_type)


# -- values a column cannot hold: named before anything is sent ------------------------------

REFUSED = [
    ("DateTime64(3)", pa.array([dt.datetime(2024, 1, 1), dt.datetime(2024, 1, 1, 0, 0, 0, 1)],
                               pa.timestamp("us", tz="UTC")), 1, "digits below the 3"),
    ("DateTime64(9)", pa.array([dt.datetime(2263, 1, 1)], pa.timestamp("us")), 0,
     "outside the range of DateTime64(9)"),
    ("UUID", pa.array(["00000000-0000-0000-0000-000000000000", "{1234}"]), 1, "not a UUID"),
    (f"Nullable({_ENUM8})", pa.array(["ok", None, "nope"]), 2,
     "label is not one of Enum8's"),
    (_ENUM8, pa.array([1, 2], pa.int64()), 1, "code is not one of Enum8's"),
    ("IPv4", pa.array(["1.2.3.4", "1.2.3.256"]), 1, "not an IPv4 address"),
    ("IPv6", pa.array(["::1", "2001:db8::g"]), 1, "not an IPv6 address"),
    ("Map(String, Int64)", pa.array([[("a", 1)], [("b", None)]],
                                    pa.map_(pa.string(), pa.int64())), 1,
     "null value into non-Nullable Int64"),
    ("Tuple(a Int32, b String)",
     pa.array([{"a": 1, "b": "x"}, {"a": 2**31, "b": "y"}],
              pa.struct([("a", pa.int64()), ("b", pa.string())])), 1, "out of range for Int32"),
    ("UInt128", pa.array([5, -1], pa.int64()), 1, "negative value into UInt128"),
    ("Decimal(76, 2)", pa.array([Decimal("1.001")], pa.decimal128(10, 3)), 0,
     "does not fit Decimal(76, 2)"),
    ("JSON", pa.array(['{"a": 1}', '{"a": 1']), 1, "not JSON text"),
    ("JSON", pa.array(["{}", "null"]), 1, "not an object (null)"),
    ("JSON", pa.array(['{"a": 1, "a": 2}']), 0, "the key 'a' appears twice"),
    ("JSON", pa.array(['{"a": 18446744073709551616}']), 0, "beyond Int64/UInt64"),
    ("JSON", pa.array([{"x": 1.5}, {"x": float("inf")}], pa.struct([("x", pa.float64())])), 1,
     "NaN or infinity"),
    ("Variant(String, Int64)", pa.array([1, None], pa.int64()), 1, "null value into"),
]


@pytest.mark.parametrize(("ch_type", "array", "row", "reason"), REFUSED,
                         ids=[f"{t.split('(')[0]}-{r}" for t, _, _, r in REFUSED])
def test_a_value_the_column_cannot_hold_is_named_with_its_row(ch_type: str, array: pa.Array,
                                                              row: int, reason: str) -> None:
    with pytest.raises(InvalidValue) as caught:
        check_batch([Column("c", ch_type)], pa.record_batch([array], names=["c"]))
    assert caught.value.row == row and reason in str(caught.value)
    assert "column `c" in str(caught.value)


def test_a_struct_whose_fields_do_not_match_a_named_tuple_is_refused_by_the_schema_check(
        ) -> None:
    target = _table(Column("c", "Tuple(a Int32, b String)"))
    schema = pa.schema([("c", pa.struct([("x", pa.int32()), ("b", pa.string())]))])
    with pytest.raises(SchemaMismatch, match="fields \\(x, b\\) do not match"):
        check_arrow_schema(target, schema)


def _table(*columns: Column) -> TargetTable:
    return TargetTable("db", "t", list(columns), "", "", "", "MergeTree", "", False, 8192, "")


def test_nested_sub_columns_of_unequal_lengths_are_refused_naming_the_row() -> None:
    batch = pa.record_batch({"n.a": pa.array([[1, 2], [3, 4]], pa.list_(pa.int32())),
                             "n.b": pa.array([["x", "y"], ["z"]], pa.list_(pa.string()))})
    with pytest.raises(InvalidValue, match="1 elements where `n.a` has 2") as caught:
        check_batch([Column("n.a", "Array(Int32)"), Column("n.b", "Array(String)")], batch)
    assert caught.value.row == 1 and caught.value.column == "n.b"


def test_array_columns_with_two_dots_in_the_name_are_no_nested_sub_columns() -> None:
    batch = pa.record_batch({"p.q.r": pa.array([[1, 2]], pa.list_(pa.int32())),
                             "p.s": pa.array([[3]], pa.list_(pa.int32()))})
    check_batch([Column("p.q.r", "Array(Int32)"), Column("p.s", "Array(Int32)")], batch)


def test_an_array_of_structs_whose_fields_miss_a_nested_sub_column_is_refused() -> None:
    target = _table(Column("n.a", "Array(Int32)"), Column("n.b", "Array(String)"))
    schema = pa.schema([("n", pa.list_(pa.struct([("a", pa.int32()), ("c", pa.string())])))])
    with pytest.raises(SchemaMismatch, match=r"column `n`: the struct's fields \(a, c\) do "
                                             "not match its Nested sub-columns n.a, n.b"):
        check_arrow_schema(target, schema)


def test_a_wall_clock_time_skipped_by_daylight_saving_is_refused_naming_the_row() -> None:
    column = Column("t", "DateTime64(3, 'America/New_York')")
    batch = pa.record_batch([pa.array([dt.datetime(2024, 3, 10, 1, 59),
                                       dt.datetime(2024, 3, 10, 2, 30)], pa.timestamp("us"))],
                            names=["t"])
    with pytest.raises(InvalidValue, match="does not exist in America/New_York") as caught:
        checked_batch([column], batch, STORAGE_RANGES)
    assert caught.value.row == 1


def test_a_wall_clock_time_shown_twice_gets_the_earlier_instant() -> None:
    column = Column("t", "DateTime('America/New_York')")
    batch = pa.record_batch([pa.array([dt.datetime(2024, 11, 3, 1, 30)], pa.timestamp("us"))],
                            names=["t"])
    placed = checked_batch([column], batch, STORAGE_RANGES).column("t")
    assert placed[0].as_py() == dt.datetime(2024, 11, 3, 5, 30, tzinfo=dt.UTC)  # EDT


def test_spark_variant_type_is_refused_by_name() -> None:
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructField, StructType, VariantType

    schema = to_arrow_schema(StructType([StructField("c", VariantType())]), timezone="UTC")
    with pytest.raises(SchemaMismatch, match="VariantType is not written.*to_json"):
        check_arrow_schema(_table(Column("c", "JSON")), schema)


def test_every_column_that_cannot_be_written_is_named_in_one_error(
        spark, _registered, modern_clickhouse_url, database, zk_hosts, zk_chroot) -> None:
    url, db = modern_clickhouse_url, database(modern_clickhouse_url)
    run_sql(url, f"CREATE TABLE `{db}`.t (k Int64, total AggregateFunction(sum, UInt64), "
                 "doc JSON, pick Variant(String, Int64), ok String) "
                 "ENGINE = MergeTree ORDER BY k")
    df = spark.sql("SELECT 1L AS k, 'x' AS total, named_struct('price', 1.5BD) AS doc, "
                   "1 AS pick, 'fine' AS ok")
    with pytest.raises(Exception) as caught:
        df.write.format("clickhouse_tx").option("url", url) \
            .option("zookeeper", zk_hosts + zk_chroot).option("table", f"{db}.t") \
            .mode("append").save()
    message = str(caught.value)
    assert message.count("SCHEMA_MISMATCH") >= 1
    assert "column `total`: type AggregateFunction(sum, UInt64) is not supported" in message
    assert "column `doc`: field `price` is decimal128(2, 1)" in message
    assert "column `pick`: int32 is stored as Int32, which is none of the types" in message
    assert "`ok`" not in message and "`k`" not in message
    assert run_sql(url, f"SELECT count() FROM `{db}`.t").strip() == "0"


def _table_writer(url: str, db: str, columns: str, order_by: str) -> BranchWriter:
    """A writer straight into a new MergeTree `db`.t of ``columns``: no staging, no sink."""
    run_sql(url, f"CREATE TABLE `{db}`.t ({columns}) ENGINE = MergeTree ORDER BY {order_by}")
    client = ClickHouseClient(url)
    target = describe_table(client, f"{db}.t")
    return BranchWriter(client, target, target.qualified, detect_capabilities(client))


def test_a_refused_value_sends_nothing(modern_clickhouse_url: str, database) -> None:
    db = database(modern_clickhouse_url)
    writer = _table_writer(modern_clickhouse_url, db, "c UUID", "tuple()")
    with pytest.raises(InvalidValue, match="row 2"):
        writer.write(pa.record_batch([pa.array([str(_ZERO), str(_ZERO), "bad"])], names=["c"]))
    writer.flush()
    assert run_sql(modern_clickhouse_url, f"SELECT count() FROM `{db}`.t").strip() == "0"


@pytest.mark.parametrize("server", ["ch18", "ch26"])
def test_integers_into_a_narrow_decimal_are_written_exactly(request, database,
                                                            server: str) -> None:
    url = _server_url(request, server)
    db = database(url)
    writer = _table_writer(url, db, "k UInt8, a Decimal(9, 2), b Decimal(18, 0)", "k")
    writer.write(pa.record_batch({"k": pa.array([0, 1, 2], pa.uint8()),
                                  "a": pa.array([0, -5, 9_999_999], pa.int64()),
                                  "b": pa.array([0, -10**17, 10**18 - 1], pa.int64())}))
    writer.flush()
    assert run_sql(url, f"SELECT toInt64(toFloat64(a) * 100), toString(b) FROM `{db}`.t ORDER BY k "
                        "FORMAT TSV").split("\n")[:3] == [
        "0\t0", "-500\t-100000000000000000", "999999900\t999999999999999999"]


def test_a_struct_with_null_arrays_into_json_is_stored_as_its_text_without_them(
        modern_clickhouse_url: str, database) -> None:
    url = modern_clickhouse_url
    db = database(url)
    writer = _table_writer(url, db, "k UInt8, j JSON", "k")
    kind = pa.struct([("x", pa.int64()), ("y", pa.list_(pa.int64()))])
    writer.write(pa.record_batch({"k": pa.array([0, 1], pa.uint8()),
                                  "j": pa.array([{"x": 1, "y": None}, {"x": None, "y": [2]}],
                                                kind)}))
    writer.flush()
    run_sql(url, f"INSERT INTO `{db}`.t FORMAT JSONEachRow "
                 '{"k": 10, "j": {"x": 1, "y": null}} {"k": 11, "j": {"x": null, "y": [2]}}')
    found = run_sql(url, f"SELECT k % 10, toString(j) FROM `{db}`.t ORDER BY k FORMAT TSV")
    ours, texts = found.strip().split("\n")[:2], found.strip().split("\n")[2:]
    assert ours == texts == ['0\t{"x":1}', '1\t{"y":[2]}']


def test_a_low_cardinality_column_is_written_on_18_16(
        spark, _registered, clickhouse_url, database, zk_hosts, zk_chroot) -> None:
    url, db = clickhouse_url, database(clickhouse_url)
    _query(url, f"CREATE TABLE `{db}`.t (id Int32, lc LowCardinality(Nullable(String))) "
                "ENGINE = MergeTree ORDER BY id", fmt="",
           settings=(("allow_experimental_low_cardinality_type", 1),))
    df = spark.sql("SELECT * FROM VALUES (1, 'a'), (2, NULL) AS v(id, lc)")
    df.write.format("clickhouse_tx").option("url", url).option("zookeeper", zk_hosts + zk_chroot) \
        .option("table", f"{db}.t").mode("append").save()
    assert run_sql(url, f"SELECT id, lc FROM `{db}`.t ORDER BY id FORMAT TSV") == "1\ta\n2\t\\N\n"


_ZERO = "00000000-0000-0000-0000-000000000000"


# -- through clickhouse_tx: an event row as Spark sends it -----------------------------------

_EVENT_26 = ("ts DateTime64(3), id UUID, kind LowCardinality(String), "
             "status Enum8('new' = 1, 'done' = 2), attrs Map(String, String), "
             "items Array(Tuple(String, Float64)), amount Nullable(Decimal(18, 4)), "
             "day Date32, flag Bool, big Int128, ip IPv4")
_EVENT_18 = ("ts DateTime, id UUID, status Enum8('new' = 1, 'done' = 2), "
             "pair Tuple(Int32, String), amount Nullable(Decimal(18, 4)), "
             "items Nested(name String, qty Int32)")


@pytest.fixture
def _registered(spark) -> None:
    txsink.register(spark)


def test_an_event_row_of_modern_types_is_written_exactly_once_by_clickhouse_tx(
        spark, _registered, modern_clickhouse_url, database, zk_hosts, zk_chroot) -> None:
    url, db = modern_clickhouse_url, database(modern_clickhouse_url)
    run_sql(url, f"CREATE TABLE `{db}`.events ({_EVENT_26}) ENGINE = MergeTree ORDER BY ts")
    df = spark.sql(
        "SELECT TIMESTAMP'1950-06-01 12:34:56.789' AS ts, "
        "'6f1c7a52-0b8e-4c55-9d2a-3f7e1b2c4d5e' AS id, 'click' AS kind, 'done' AS status, "
        "map('k', 'v', 'ü', '') AS attrs, array(named_struct('n', 'x', 'w', 1.5D)) AS items, "
        "CAST(NULL AS DECIMAL(18, 4)) AS amount, DATE'1900-01-01' AS day, true AS flag, "
        "CAST(-9223372036854775808 AS BIGINT) AS big, '10.0.0.1' AS ip")
    df.write.format("clickhouse_tx").option("url", url).option("zookeeper", zk_hosts + zk_chroot) \
        .option("table", f"{db}.events").mode("append").save()
    # TSV escapes the quotes inside toString's text: \\'
    assert run_sql(url, f"SELECT toString(ts), toString(id), kind, toString(status), "
                        f"toString(attrs), toString(items), toString(amount), toString(day), "
                        f"toString(flag), toString(big), toString(ip) FROM `{db}`.events "
                        "FORMAT TSV").strip().split("\t") == [
        "1950-06-01 12:34:56.789", "6f1c7a52-0b8e-4c55-9d2a-3f7e1b2c4d5e", "click", "done",
        "{\\'k\\':\\'v\\',\\'ü\\':\\'\\'}", "[(\\'x\\',1.5)]", "\\N", "1900-01-01", "true",
        "-9223372036854775808", "10.0.0.1"]


def test_an_event_row_of_uuid_enum_a_tuple_and_nested_is_written_exactly_once_on_18_16(
        spark, _registered, clickhouse_url, database, zk_hosts, zk_chroot) -> None:
    url, db = clickhouse_url, database(clickhouse_url)
    run_sql(url, f"CREATE TABLE `{db}`.events ({_EVENT_18}) ENGINE = MergeTree ORDER BY ts")
    df = spark.sql(
        "SELECT TIMESTAMP'2024-06-01 12:34:56' AS ts, "
        "'6F1C7A52-0B8E-4C55-9D2A-3F7E1B2C4D5E' AS id, 'new' AS status, "
        "named_struct('a', -1, 'b', 'ü') AS pair, CAST(12.3456 AS DECIMAL(18, 4)) AS amount, "
        "array(named_struct('qty', 2, 'name', 'x'), named_struct('qty', 0, 'name', '')) "
        "AS items")
    df.write.format("clickhouse_tx").option("url", url).option("zookeeper", zk_hosts + zk_chroot) \
        .option("table", f"{db}.events").mode("append").save()
    assert run_sql(url, f"SELECT toString(ts), toString(id), toString(status), "
                        f"toString(pair), toString(amount), toString(`items.name`), "
                        f"toString(`items.qty`) FROM `{db}`.events "
                        "FORMAT TSV").strip().split("\t") == [
        "2024-06-01 12:34:56", "6f1c7a52-0b8e-4c55-9d2a-3f7e1b2c4d5e", "new",
        "(-1,\\'ü\\')", "12.3456", "[\\'x\\',\\'\\']", "[2,0]"]


@pytest.mark.parametrize("server", ["ch18", "ch26"])
def test_a_spark_timestamp_keeps_its_instant_and_a_wall_clock_time_shows_as_written(
        spark, _registered, request, database, zk_hosts, zk_chroot, server: str) -> None:
    url = _server_url(request, server)
    db = database(url)
    tokyo = "DateTime('Asia/Tokyo')" if server == "ch18" else "DateTime64(3, 'Asia/Tokyo')"
    run_sql(url, f"CREATE TABLE `{db}`.t (instant {tokyo}, wall {tokyo}) "
                 "ENGINE = MergeTree ORDER BY tuple()")
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:  # the literal TIMESTAMP is 12:00 in New York: 17:00 UTC, 02:00 the next day in Tokyo
        spark.sql("SELECT TIMESTAMP'2024-01-01 12:00:00' AS instant, "
                  "TIMESTAMP_NTZ'2024-01-01 12:00:00' AS wall") \
            .write.format("clickhouse_tx").option("url", url) \
            .option("zookeeper", zk_hosts + zk_chroot).option("table", f"{db}.t") \
            .mode("append").save()
    finally:
        spark.conf.set("spark.sql.session.timeZone", "UTC")
    shown = run_sql(url, f"SELECT toString(instant), toString(wall) FROM `{db}`.t FORMAT TSV")
    fraction = "" if server == "ch18" else ".000"
    assert shown.strip().split("\t") == [f"2024-01-02 02:00:00{fraction}",
                                         f"2024-01-01 12:00:00{fraction}"]
