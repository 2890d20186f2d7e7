"""Finding every bad row of a batch (``bad_rows=quarantine``) and the first one
(``bad_rows=fail``) with the same checks: pure logic, no server."""

from __future__ import annotations

import decimal
import json
import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server_ext.ddl.quarantine_table import (
    ARROW_SCHEMA,
    KeptRows,
    quarantine_records,
    rows_json,
    to_json,
)
from server_ext.errors import InvalidValue
from server_ext.types.chtypes import STORAGE_RANGES
from server_ext.types.json_values import as_json_texts
from server_ext.types.prepare import checked_batch, split_batch
from server_ext.types.row_checks import _failing_rows, check_batch
from server_ext.types.target_table import Column

UINT8 = [Column("id", "UInt64"), Column("code", "UInt8")]
small_ints = st.lists(st.one_of(st.none(), st.integers(-300, 300)), min_size=1, max_size=60)


def coded(codes: list[int | None]) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(range(len(codes)), pa.int64()),
                            "code": pa.array(codes, pa.int32())})


@settings(max_examples=60, deadline=None)
@given(small_ints)
def test_every_row_with_a_value_out_of_range_is_found(codes):
    columns = [Column("id", "UInt64"), Column("code", "Nullable(UInt8)")]
    good, bad = split_batch(columns, coded(codes), STORAGE_RANGES)
    expected = [i for i, c in enumerate(codes) if c is not None and not 0 <= c <= 255]
    assert bad.rows.tolist() == expected
    assert good.column("id").to_pylist() == [i for i in range(len(codes)) if i not in expected]
    assert list(bad.values) == [codes[i] for i in expected]
    assert set(bad.columns) <= {"code"}


@settings(max_examples=60, deadline=None)
@given(small_ints)
def test_fail_mode_raises_for_a_bad_row_the_quarantine_mode_finds_with_its_problem(codes):
    """Fail mode stops at the first bad value of the first check that finds one (nulls
    before ranges), quarantine mode quarantine_records each row's first problem in that order."""
    batch = coded(codes)
    _, bad = split_batch(UINT8, batch, STORAGE_RANGES)
    if not len(bad):
        checked_batch(UINT8, batch, STORAGE_RANGES)
        return
    with pytest.raises(InvalidValue) as raised:
        check_batch(UINT8, batch)
    at = bad.rows.tolist().index(raised.value.row)
    assert (raised.value.column, raised.value.reason) == (bad.columns[at], bad.reasons[at])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.lists(st.integers(-5, 300), max_size=4)),
                min_size=1, max_size=40))
def test_a_bad_element_of_an_array_marks_its_outer_row(lists):
    batch = pa.record_batch({"xs": pa.array(lists, pa.list_(pa.int32()))})
    columns = [Column("xs", "Array(UInt8)")]
    _, bad = split_batch(columns, batch, STORAGE_RANGES)
    expected = [i for i, xs in enumerate(lists)  # Array is never Nullable: null is bad
                if xs is None or any(not 0 <= x <= 255 for x in xs)]
    assert bad.rows.tolist() == expected
    assert list(bad.values) == [None if lists[i] is None
                                else next(x for x in lists[i] if not 0 <= x <= 255)
                                for i in expected]


def test_a_bad_map_value_and_a_bad_tuple_element_mark_their_rows():
    batch = pa.record_batch({
        "m": pa.array([[("a", 1)], [("b", 999)], [], [("c", 2), ("d", -1)]],
                      pa.map_(pa.string(), pa.int32())),
        "t": pa.array([{"x": 1}, {"x": 2}, {"x": 700}, {"x": 3}],
                      pa.struct([("x", pa.int32())])),
    })
    columns = [Column("m", "Map(String, UInt8)"), Column("t", "Tuple(x UInt8)")]
    _, bad = split_batch(columns, batch, STORAGE_RANGES)
    assert bad.rows.tolist() == [1, 2, 3]
    assert bad.columns == ("m (value)", "t.x", "m (value)")
    assert bad.values == (999, 700, -1)


def test_unequal_nested_lengths_mark_their_rows():
    batch = pa.record_batch({
        "n.a": pa.array([[1], [1, 2], []], pa.list_(pa.int32())),
        "n.b": pa.array([["x"], ["y"], ["z"]], pa.list_(pa.string())),
    })
    columns = [Column("n.a", "Array(UInt8)"), Column("n.b", "Array(String)")]
    _, bad = split_batch(columns, batch, STORAGE_RANGES)
    assert bad.rows.tolist() == [1, 2]
    assert all("equal lengths" in reason for reason in bad.reasons)


def test_a_double_that_float32_would_store_as_infinity_is_a_bad_value():
    limit = float(np.finfo(np.float32).max)
    values = [1.0, limit, -1e39, 1e300, math.inf, -math.inf, math.nan, None,
              limit * (1 + 2**-30)]  # the last rounds to Float32's largest value
    batch = pa.record_batch({"f": pa.array(values, pa.float64())})
    _, bad = split_batch([Column("f", "Nullable(Float32)")], batch, STORAGE_RANGES)
    assert bad.rows.tolist() == [2, 3]
    assert all("out of range for Float32" in reason for reason in bad.reasons)


def test_a_row_with_two_bad_values_is_charged_to_its_first_column():
    batch = pa.record_batch({"a": pa.array([1, 300], pa.int32()),
                             "b": pa.array([400, 500], pa.int32())})
    columns = [Column("a", "UInt8"), Column("b", "UInt8")]
    _, bad = split_batch(columns, batch, STORAGE_RANGES)
    assert list(zip(bad.rows.tolist(), bad.columns, strict=True)) == [(0, "b"), (1, "a")]


def test_a_row_with_two_bad_values_is_charged_to_its_first_column_in_the_dataframe():
    batch = pa.record_batch({"z": pa.array([400, 1], pa.int32()),
                             "a": pa.array([500, 1], pa.int32())})
    columns = [Column("a", "UInt8"), Column("z", "UInt8")]  # the table's order differs
    _, bad = split_batch(columns, batch, STORAGE_RANGES)
    assert list(zip(bad.rows.tolist(), bad.columns, strict=True)) == [(0, "z")]
    with pytest.raises(InvalidValue, match="column `z`"):
        check_batch(columns, batch)


@pytest.mark.parametrize("arrow_type", [pa.int64(), pa.int32(), pa.uint64(), pa.int8()])
def test_integers_that_fit_a_narrow_decimal_are_good_and_the_others_named(arrow_type):
    values = [0, 5, 0 if pa.types.is_unsigned_integer(arrow_type) else -100, 99, None] + (
        [10**7] if arrow_type != pa.int8() else [])
    batch = pa.record_batch({"v": pa.array(values, arrow_type)})
    columns = [Column("v", "Nullable(Decimal(9, 2))")]
    _, bad = split_batch(columns, batch, STORAGE_RANGES)
    assert bad.rows.tolist() == ([5] if arrow_type != pa.int8() else [])
    assert checked_batch(columns, batch.slice(0, 5), STORAGE_RANGES).num_rows == 5


FAR = -62135596800 * 10**6 + 3600 * 10**6  # 0001-01-01 01:00 UTC: year 0 in Los Angeles


def test_a_far_instant_python_cannot_show_in_its_zone_is_named_not_an_overflow():
    batch = pa.record_batch({"t": pa.array([FAR], pa.timestamp("us", "America/Los_Angeles"))})
    with pytest.raises(InvalidValue, match="0000-12-31") as caught:
        check_batch([Column("t", "DateTime64(6, 'Asia/Tokyo')")], batch)
    assert caught.value.row == 0


def test_quarantine_records_show_a_far_instant_python_cannot_show_in_its_zone():
    batch = pa.record_batch({"code": pa.array([300], pa.int32()),
                             "t": pa.array([FAR], pa.timestamp("us", "America/Los_Angeles"))})
    _, bad = split_batch([Column("code", "UInt8"), Column("t", "DateTime64(6)")], batch,
                         STORAGE_RANGES)
    (kept,) = quarantine_records([KeptRows.of(bad, batch, 0)], sink_id="s", epoch=1,
                      task="t").to_pylist()
    assert kept["column"] == "code" and "0000-12-31" in kept["row"]


def test_a_struct_holding_arrays_becomes_json_text_without_its_null_members():
    kind = pa.struct([("x", pa.int64()), ("y", pa.list_(pa.int64())),
                      ("m", pa.map_(pa.int32(), pa.list_(pa.string())))])
    array = pa.array([{"x": 1, "y": None, "m": [(7, None), (8, ["a"])]},
                      {"x": None, "y": [], "m": None}, None], kind)
    assert as_json_texts(array).to_pylist() == ['{"x": 1, "m": {"8": ["a"]}}', '{"y": []}',
                                                None]


def test_a_null_into_a_non_nullable_column_and_bad_json_are_bad_rows():
    batch = pa.record_batch({"s": pa.array(["x", None, "y"]),
                             "j": pa.array(['{"a":1}', '{"a":1}', "[1]"])})
    columns = [Column("s", "String"), Column("j", "JSON")]
    _, bad = split_batch(columns, batch, STORAGE_RANGES)
    assert bad.rows.tolist() == [1, 2]
    assert "null value" in bad.reasons[0] and "not an object" in bad.reasons[1]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.decimals(min_value=-200, max_value=200, places=3, allow_nan=False),
                min_size=1, max_size=50))
def test_every_decimal_that_does_not_fit_is_found_by_halving(values):
    array = pa.array(values, pa.decimal128(10, 3))
    target = pa.decimal128(4, 1)

    def fits(part: pa.Array) -> bool:
        try:
            part.cast(target)
        except pa.ArrowInvalid:
            return False
        return True

    assert _failing_rows(array, fits) == [i for i in range(len(values))
                                          if not fits(array.slice(i, 1))]


def test_quarantine_records_carry_the_row_and_the_value_as_json():
    batch = pa.record_batch({"id": pa.array([5, 6], pa.int64()),
                             "code": pa.array([1, 300], pa.int32())})
    _, bad = split_batch(UINT8, batch, STORAGE_RANGES)
    kept = quarantine_records([KeptRows.of(bad, batch, 100)], sink_id="s", epoch=3,
                              task="p0-a0-s0-x")
    assert kept.schema == ARROW_SCHEMA
    assert kept.to_pylist() == [{
        "sink_id": "s", "epoch": 3, "task": "p0-a0-s0-x", "row_number": 101,
        "column": "code", "reason": bad.reasons[0], "value": "300",
        "row": '{"id":6,"code":300}'}]


def test_quarantine_records_of_several_batches_number_rows_by_each_batch_start():
    first, second = coded([300, 1]), coded([2, -1, 400])
    kept = [KeptRows.of(split_batch(UINT8, b, STORAGE_RANGES)[1], b, start)
            for b, start in ((first, 0), (second, 2))]
    built = quarantine_records(kept, sink_id="s", epoch=1, task="t").to_pylist()
    assert [(r["row_number"], r["value"]) for r in built] == [(0, "300"), (3, "-1"),
                                                              (4, "400")]


def test_quarantine_records_show_each_bad_value_of_its_own_column():
    batch = pa.record_batch({"code": pa.array([300, 1, 2], pa.int32()),
                             "name": pa.array(["ok", "far too long", "fine"]),
                             "ts": pa.array([0, 0, -1], pa.timestamp("us", tz="UTC"))})
    columns = [Column("code", "UInt8"), Column("name", "FixedString(4)"),
               Column("ts", "DateTime")]
    _, bad = split_batch(columns, batch, STORAGE_RANGES)
    kept = KeptRows.of(bad, batch, 0)
    built = quarantine_records([kept, kept], sink_id="s", epoch=1, task="t").to_pylist()
    assert [(r["row_number"], r["column"], r["value"]) for r in built] == [
        (0, "code", "300"), (1, "name", '"far too long"'), (2, "ts", to_json(bad.values[2])),
        (0, "code", "300"), (1, "name", '"far too long"'), (2, "ts", to_json(bad.values[2]))]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.one_of(st.none(), st.datetimes(timezones=st.none())), min_size=1,
                max_size=20),
       st.sampled_from([None, "UTC", "Europe/Berlin", "America/St_Johns", "Asia/Kolkata",
                        "+05:45", "Africa/Monrovia"]))
def test_row_json_shows_timestamps_and_dates_as_isoformat_does(values, zone):
    """Dates and times are built column-wise; they read as ``to_json`` of each value."""
    column = pa.array(values, pa.timestamp("us")).cast(pa.timestamp("us", tz=zone))
    dates = pa.array([None if v is None else v.date() for v in values], pa.date32())
    batch = pa.record_batch({"t": column, "d": dates})
    assert rows_json(batch).to_pylist() == [
        f'{{"t":{to_json(t)},"d":{to_json(d)}}}'
        for t, d in zip(column.to_pylist(), dates.to_pylist(), strict=True)]


def test_values_json_lacks_are_written_as_text():
    assert json.loads(to_json({"f": math.nan, "d": decimal.Decimal("1.50"), "b": b"\xff",
                               "m": [("k", math.inf)]})) == {
        "f": "NaN", "d": "1.50", "b": "/w==", "m": [["k", "Infinity"]]}


def test_a_million_rows_with_one_percent_bad_are_split_in_linear_time():
    codes = np.arange(1_000_000) % 256
    codes[::100] = 300
    batch = pa.record_batch({"id": pa.array(np.arange(1_000_000)), "code": pa.array(codes)})
    good, bad = split_batch(UINT8, batch, STORAGE_RANGES)
    assert (len(bad), good.num_rows) == (10_000, 990_000)
