"""Whether every value of a batch fits its target column, checked before any is sent.

``check_batch`` raises ``InvalidValue`` naming the column, the first offending row and its
value: a null into a non-Nullable column, an integer out of the column's range, a string
longer than FixedString(N), a Date/DateTime/Date32/DateTime64 outside what the server
stores and reads back (``ValueRanges``, measured by ``capabilities``), a timestamp finer
than DateTime64(p), a decimal that does not fit Decimal(P, S) exactly (never rounded), an
Enum label or code not in the type, a UUID or IP address not in canonical text, a JSON
text that is no object the server stores as written, Nested sub-columns of unequal
lengths, a Map or Tuple element that fails these checks (named ``col (value)`` /
``col.element``). With a collecting row map (``bad_values.Collect``,
``bad_rows=quarantine``) the same checks report every bad row instead, each charged to its
outer row. The checks run on a prepared batch (``prepare``), vectorised (pyarrow
compute) except JSON text (``json_values``); pure, safe from any thread.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from server_ext.types.arrow_schema import check_family, struct_fields_for
from server_ext.types.bad_values import Collect, Rows, shown_value
from server_ext.types.chtypes import (
    INTEGER_TYPES,
    STORAGE_RANGES,
    WIDE_INTEGER_TYPES,
    ChType,
    ValueRanges,
)
from server_ext.types.conversions import (
    UNIT_DIGITS,
    day_text,
    instant_text,
    to_days,
    to_seconds,
    to_ticks,
)
from server_ext.types.json_values import json_text_problem
from server_ext.types.nested import check_sibling_lengths
from server_ext.types.target_table import Column

RowOf = Rows  # index in the checked array -> row of the batch, and where bad values go


def check_batch(target_columns: list[Column], batch: pa.RecordBatch,
                ranges: ValueRanges = STORAGE_RANGES, rows: Rows | None = None) -> None:
    """Raise ``InvalidValue`` for the first value of ``batch`` that its column cannot hold.

    ``target_columns`` is what ``check_arrow_schema`` returned; the batch's fields are
    found by name. ``ranges`` are the Date/DateTime ranges of the server the batch goes to
    (``Capabilities.value_ranges``); the default checks the storage limits only, which
    some servers cannot read back. Nothing is sent by this function: call it before
    encoding. ``rows``: the batch's row map with its collector
    (``bad_values.Collect``: every bad row is recorded there instead of raised).
    """
    rows = rows or Rows.fail_fast()
    order = {name: index for index, name in enumerate(batch.schema.names)}
    # the batch's (the DataFrame's) order: a row's first problem is that of its first column
    for column in sorted(target_columns, key=lambda c: order.get(c.name, len(order))):
        array = batch.column(column.name)
        _check_array(column.name, array, column.chtype, rows, ranges)
    check_sibling_lengths([(c.name, c.chtype) for c in target_columns], batch, rows)


def _check_array(name: str, array: pa.Array, target: ChType, row_of: RowOf,
                 ranges: ValueRanges) -> None:
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    nullable = target.unwrap_low_cardinality().is_nullable
    if array.null_count and not nullable:
        _fail(name, array, pc.is_null(array), row_of, f"null value into non-Nullable {target}")
    ch = target.value_type()
    check = _VALUE_CHECKS.get(check_family(ch))
    if check is not None:
        check(name, array, ch, row_of, ranges)


def _check_json(name: str, array: pa.Array, ch: ChType, row_of: RowOf,
                ranges: ValueRanges) -> None:
    """Texts: each one JSON object the server stores as written (``json_values``; a
    Python loop, see there). Structs and maps: no NaN or infinity, which JSON lacks."""
    if not (pa.types.is_string(array.type) or pa.types.is_large_string(array.type)):
        _check_finite(name, array, row_of)
        return
    problems = [None if text is None else json_text_problem(text)
                for text in array.to_pylist()]
    row_of.report(name, array, np.array([p is not None for p in problems], bool), problems)


def _check_finite(name: str, array: pa.Array, row_of: RowOf) -> None:
    if pa.types.is_floating(array.type):
        bad = pc.and_(pc.is_valid(array), pc.invert(pc.is_finite(array)))
        if pc.any(bad).as_py():
            _fail(name, array, bad, row_of, "NaN or infinity, which JSON has no number for")
    elif pa.types.is_struct(array.type):
        for field, child in zip(array.type, array.flatten(), strict=True):
            _check_finite(f"{name}.{field.name}", child, row_of)
    elif pa.types.is_map(array.type) and len(array):
        values, element_row = list_values(array, row_of)
        _check_finite(f"{name} (value)", values.field(1), element_row)
    elif (pa.types.is_list(array.type) or pa.types.is_large_list(array.type)) and len(array):
        values, element_row = list_values(array, row_of)
        _check_finite(name, values, element_row)


def _check_integer(name: str, array: pa.Array, ch: ChType, row_of: RowOf,
                   ranges: ValueRanges) -> None:
    _check_integer_range(name, array, ch, row_of)


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _check_float(name: str, array: pa.Array, ch: ChType, row_of: RowOf,
                 ranges: ValueRanges) -> None:
    """A double into ``Float32``: a finite value that rounds beyond Float32's range would
    be stored as infinity (both servers convert it without a word). NaN and infinities
    are stored as they are; a value within the range is rounded to the nearest Float32."""
    if ch.base != "Float32" or not pa.types.is_float64(array.type):
        return
    extremes = pc.min_max(array)  # nulls and NaN ignored
    low, high = extremes["min"].as_py(), extremes["max"].as_py()
    if low is None or (-_FLOAT32_MAX <= low and high <= _FLOAT32_MAX):
        return
    values = pc.fill_null(array, 0.0).to_numpy(zero_copy_only=False)
    with np.errstate(over="ignore"):
        overflows = np.isfinite(values) & np.isinf(values.astype(np.float32))
    if overflows.any():
        _fail(name, array, overflows, row_of,
              f"value out of range for {ch} (beyond ±{_FLOAT32_MAX:.7g}: stored as infinity)")


def _check_date(name: str, array: pa.Array, ch: ChType, row_of: RowOf,
                ranges: ValueRanges) -> None:
    low, high = ranges.date_days if ch.base == "Date" else ranges.date32_days
    if not _extremes_fit(array, to_days, low, high):
        _check_range(name, to_days(array), low, high, array, row_of,
                     f"date outside the range of {ch}{_on(ranges)} "
                     f"({day_text(low)} .. {day_text(high)})")


def _check_datetime(name: str, array: pa.Array, ch: ChType, row_of: RowOf,
                    ranges: ValueRanges) -> None:
    """In this server's range of the DateTime or DateTime64 column ``ch``."""
    low, high = (ranges.datetime64_bounds(ch) if ch.base == "DateTime64"
                 else ranges.datetime_seconds(ch))
    if not _extremes_fit(array, to_seconds, low, high):
        _check_range(name, to_seconds(array), low, high, array, row_of,
                     f"timestamp outside the range of {ch}{_on(ranges)} "
                     f"({instant_text(low)} .. {instant_text(high)} UTC)")


def _check_datetime64(name: str, array: pa.Array, ch: ChType, row_of: RowOf,
                      ranges: ValueRanges) -> None:
    """In this server's range, and no digit below 10^-p: DateTime64 is never rounded."""
    _check_datetime(name, array, ch, row_of, ranges)
    if not pa.types.is_timestamp(array.type):
        return
    lost = UNIT_DIGITS[array.type.unit] - int(ch.params[0])
    if lost <= 0 or array.null_count == len(array):
        return
    inexact = to_ticks(array) % (10**lost) != 0
    if array.null_count:
        inexact &= pc.is_valid(array).to_numpy(zero_copy_only=False)
    row_of.report(name, array, inexact,
                  f"timestamp has digits below the {ch.params[0]} decimals of {ch} "
                  "(DateTime64 is never rounded: truncate it in Spark, e.g. "
                  "date_trunc('millisecond', t))")


def _check_list(name: str, array: pa.Array, ch: ChType, row_of: RowOf,
                ranges: ValueRanges) -> None:
    if ch.inner is None or len(array) == 0:
        return
    values, element_row = list_values(array, row_of)
    _check_array(name, values, ch.inner, element_row, ranges)


def _check_map(name: str, array: pa.Array, ch: ChType, row_of: RowOf,
               ranges: ValueRanges) -> None:
    if len(array) == 0:
        return
    offsets = array.offsets
    start, stop = offsets[0].as_py(), offsets[-1].as_py()
    _, element_row = list_values(array, row_of)
    key_type, value_type = ch.elements
    _check_array(f"{name} (key)", array.keys.slice(start, stop - start), key_type,
                 element_row, ranges)
    _check_array(f"{name} (value)", array.items.slice(start, stop - start), value_type,
                 element_row, ranges)


def _check_tuple(name: str, array: pa.Array, ch: ChType, row_of: RowOf,
                 ranges: ValueRanges) -> None:
    order = struct_fields_for(array.type, ch) or []
    children = array.flatten()  # sliced like the struct; a null struct row nulls them
    for position, index in enumerate(order):
        element_name = f"{name}.{ch.tuple_names[position]}"
        _check_array(element_name, children[index], ch.elements[position], row_of, ranges)


def list_values(array: pa.Array, row_of: Callable[[int], int]
                ) -> tuple[pa.Array, Callable[[int], int]]:
    """The elements of a list (or map) array's rows, and each element's row."""
    offsets = _list_offsets(array)
    base = offsets[0].as_py()
    values = array.values.slice(base, offsets[-1].as_py() - base)
    ends = pc.subtract(offsets, base).to_numpy()
    if isinstance(row_of, Rows):
        return values, row_of.elements(ends)

    def element_row(index: int) -> int:
        return row_of(int(np.searchsorted(ends, index, side="right")) - 1)

    return values, element_row


# Canonical texts the server parses (checked here so a bad one is named with its row,
# before anything is staged: the server would fail the whole INSERT without a row).
_UUID_RE = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_IPV4 = rf"{_OCTET}(\.{_OCTET}){{3}}"
_H = r"[0-9a-fA-F]{1,4}"
_IPV6 = ("(" + "|".join([
    rf"({_H}:){{7}}{_H}",
    rf"({_H}:){{1,7}}:",
    rf"({_H}:){{1,6}}:{_H}",
    rf"({_H}:){{1,5}}(:{_H}){{1,2}}",
    rf"({_H}:){{1,4}}(:{_H}){{1,3}}",
    rf"({_H}:){{1,3}}(:{_H}){{1,4}}",
    rf"({_H}:){{1,2}}(:{_H}){{1,5}}",
    rf"{_H}:(:{_H}){{1,6}}",
    rf":((:{_H}){{1,7}}|:)",
    rf"({_H}:){{6}}{_IPV4}",
    rf"({_H}:){{0,5}}:{_IPV4}",
    rf"::({_H}:){{0,5}}{_IPV4}",
    rf"{_IPV4}",  # the server reads a bare IPv4 address as ::ffff:a.b.c.d
]) + ")")
_TEXT_FORMS = {"UUID": ("a UUID", _UUID_RE), "IPv4": ("an IPv4 address", f"^{_IPV4}$"),
               "IPv6": ("an IPv6 address", f"^{_IPV6}$")}


def _check_text_form(name: str, array: pa.Array, ch: ChType, row_of: RowOf,
                     ranges: ValueRanges) -> None:
    what, pattern = _TEXT_FORMS[ch.base]
    bad = pc.invert(pc.match_substring_regex(array, pattern))
    if pc.any(bad).as_py():
        _fail(name, array, bad, row_of, f"not {what} in canonical text form for {ch}")


def _check_enum(name: str, array: pa.Array, ch: ChType, row_of: RowOf,
                ranges: ValueRanges) -> None:
    if pa.types.is_integer(array.type):
        known = pa.array([code for _, code in ch.labels], pa.int64())
        found = pc.is_in(array.cast(pa.int64(), safe=False), value_set=known)
        what = "code"
    else:
        known = pa.array([label for label, _ in ch.labels], array.type)
        found = pc.is_in(array, value_set=known)
        what = "label"
    bad = pc.and_(pc.is_valid(array), pc.invert(found))  # a null finds nothing: no fault
    if pc.any(bad).as_py():
        shown = ", ".join(label for label, _ in ch.labels)
        _fail(name, array, bad, row_of, f"{what} is not one of {ch.base}'s ({shown[:200]})")


def _check_wide_integer(name: str, array: pa.Array, ch: ChType, row_of: RowOf,
                        ranges: ValueRanges) -> None:
    """Int64 and Decimal(38, 0) fit every signed wide integer; unsigned refuse negatives."""
    if WIDE_INTEGER_TYPES[ch.base][0] < 0 or array.null_count == len(array):
        return
    if pa.types.is_unsigned_integer(array.type):
        return
    negative = pc.less(array, pa.scalar(0, pa.int64()).cast(array.type))
    if pc.any(negative).as_py():
        _fail(name, array, negative, row_of, f"negative value into {ch}")


_VALUE_CHECKS: dict[str, Callable[[str, pa.Array, ChType, RowOf, ValueRanges], None]] = {
    "Array": _check_list,
    "Map": _check_map,
    "Tuple": _check_tuple,
    "int": _check_integer,
    "wide int": _check_wide_integer,
    "float": _check_float,
    "Decimal": lambda name, array, ch, row_of, _: _check_decimal(name, array, ch, row_of),
    "FixedString": lambda name, array, ch, row_of, _: _check_fixed_string(name, array, ch,
                                                                           row_of),
    "Date": _check_date,
    "Date32": _check_date,
    "DateTime": _check_datetime,
    "DateTime64": _check_datetime64,
    "UUID": _check_text_form,
    "IPv4": _check_text_form,
    "IPv6": _check_text_form,
    "Enum": _check_enum,
    "JSON": _check_json,
}


def _on(ranges: ValueRanges) -> str:
    return f" on {ranges.server}" if ranges.server else ""


def _extremes_fit(array: pa.Array, convert: Callable[[pa.Array], np.ndarray], low: int,
                  high: int) -> bool:
    """Fast path: the converted smallest and largest values (nulls ignored) lie in low..high.

    The conversions are monotonic, so checking the two extremes checks every value.
    """
    if array.null_count == len(array):
        return True
    extremes = pc.min_max(array)
    width = np.int32 if array.type.bit_width == 32 else np.int64  # date32 / the others
    raw = np.array([extremes["min"].value, extremes["max"].value], width)
    low_high = convert(pa.Array.from_buffers(array.type, 2, [None, pa.py_buffer(raw)]))
    return bool(low_high[0] >= low and low_high[1] <= high)


def _list_offsets(array: pa.Array) -> pa.Array:
    if pa.types.is_fixed_size_list(array.type):
        size = array.type.list_size
        return pa.array(range(array.offset * size, (array.offset + len(array) + 1) * size, size),
                        pa.int64())
    return array.offsets


def _check_integer_range(name: str, array: pa.Array, ch: ChType, row_of: RowOf) -> None:
    _, low, high = INTEGER_TYPES[ch.base]
    if pa.types.is_boolean(array.type):
        return
    source_low, source_high = _INT_BOUNDS[str(array.type)]
    if source_low >= low and source_high <= high:
        return  # every value of the source type fits
    extremes = pc.min_max(array)  # nulls ignored
    if extremes["min"].as_py() is None or (
            extremes["min"].as_py() >= low and extremes["max"].as_py() <= high):
        return
    values = (pc.fill_null(array, 0) if array.null_count else array).to_numpy(
        zero_copy_only=False)
    # bounds clipped to the source type, so numpy never compares across signedness limits
    _check_range(name, values, max(low, source_low), min(high, source_high), array, row_of,
                 f"value out of range for {ch} ({low} .. {high})")


_INT_BOUNDS = {
    f"{'u' if unsigned else ''}int{bits}": (
        0 if unsigned else -(2 ** (bits - 1)),
        2**bits - 1 if unsigned else 2 ** (bits - 1) - 1,
    )
    for bits in (8, 16, 32, 64)
    for unsigned in (False, True)
}


def _check_range(name: str, values: np.ndarray, low: int, high: int, shown: pa.Array,
                 row_of: RowOf, reason: str) -> None:
    """Fail on the first of ``values`` outside ``low..high`` (nulls arrive as 0)."""
    if len(values) == 0:
        return
    outside = (values < values.dtype.type(low)) | (values > values.dtype.type(high))
    if shown.null_count:
        outside &= pc.is_valid(shown).to_numpy(zero_copy_only=False)
    row_of.report(name, shown, outside, reason)


def _check_fixed_string(name: str, array: pa.Array, ch: ChType, row_of: RowOf) -> None:
    size = int(ch.params[0])
    if pa.types.is_fixed_size_binary(array.type):
        if array.type.byte_width > size and len(array) > array.null_count:
            _fail(name, array, pc.is_valid(array), row_of,
                  f"value longer than {ch} ({array.type.byte_width} bytes)")
        return
    too_long = pc.greater(pc.binary_length(array), size)
    if pc.any(too_long).as_py():
        _fail(name, array, too_long, row_of, f"string longer than {size} bytes for {ch}")


def _check_decimal(name: str, array: pa.Array, ch: ChType, row_of: RowOf) -> None:
    target = decimal_arrow_type(ch)
    if _cast_fits(array, target):
        return
    reason = f"value does not fit {ch} without rounding or overflow"
    if isinstance(row_of.sink, Collect):
        bad = np.zeros(len(array), bool)
        bad[_failing_rows(array, lambda part: _cast_fits(part, target))] = True
    else:
        bad = np.arange(len(array)) == _first_failing_row(
            array, lambda part: _cast_fits(part, target))
    row_of.report(name, array, bad, reason)


def decimal_arrow_type(ch: ChType) -> pa.DataType:
    """The Arrow decimal type that holds exactly the values of ClickHouse ``Decimal(P, S)``."""
    if ch.precision <= 38:
        return pa.decimal128(ch.precision, ch.scale)
    return pa.decimal256(ch.precision, ch.scale)


def _cast_fits(array: pa.Array, target: pa.DataType) -> bool:
    try:
        to_decimal(array, target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False
    return True


def to_decimal(array: pa.Array, target: pa.DataType) -> pa.Array:
    """``array`` as decimal type ``target``, exactly (``ArrowInvalid`` for a value that does
    not fit). Integers go through Decimal(38, 0): Arrow casts an integer type straight to a
    decimal only if the decimal holds every value of the type, whatever the values are."""
    if pa.types.is_integer(array.type):
        array = pc.cast(array, pa.decimal128(38, 0))
    return pc.cast(array, target, safe=True)


def _first_failing_row(array: pa.Array, fits: Callable[[pa.Array], bool]) -> int:
    """Bisect to the first row for which ``fits`` fails: log2(n) vectorised calls."""
    low, high = 0, len(array)  # the failure lies in array[low:high]
    while high - low > 1:
        middle = (low + high) // 2
        if fits(array.slice(low, middle - low)):
            low = middle
        else:
            high = middle
    return low


def _failing_rows(array: pa.Array, fits: Callable[[pa.Array], bool]) -> list[int]:
    """Every row for which ``fits`` fails, by halving only the halves that fail: about
    k·log2(n/k) vectorised calls for k bad rows, never one per row."""
    found: list[int] = []
    pending = [(0, len(array))] if len(array) and not fits(array) else []
    while pending:
        low, high = pending.pop()
        if high - low == 1:
            found.append(low)
            continue
        middle = (low + high) // 2
        for start, stop in ((middle, high), (low, middle)):
            if stop > start and not fits(array.slice(start, stop - start)):
                pending.append((start, stop))
    return sorted(found)


def _fail(name: str, shown: pa.Array, mask: pa.Array, row_of: RowOf, reason: str) -> None:
    """Report the values ``mask`` marks (null: no fault) as bad."""
    row_of.report(name, shown, mask, reason)


_shown = shown_value
