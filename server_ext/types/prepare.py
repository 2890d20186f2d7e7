"""A batch as Spark hands it over, shaped into the values its columns take, then checked.

Why a step before the checks: two of Spark's shapes do not mean what the same Arrow data
would mean to the server, and the checks and both encoders must see what is meant:
- a ``TimestampNTZType`` value is a wall-clock time without zone (Arrow: a timestamp
  without ``tz``, which the server would read as UTC). Into ``DateTime[64]('zone')`` it
  becomes the instant at which a clock in that zone shows it (the server's zone for a
  column without one), so it reads back as written; a time the zone skips (daylight
  saving) is refused naming the row. ``TimestampType`` is an instant already and is kept.
- an array of structs for a table that keeps Nested (or 18.16's ``Array(Tuple)``) as
  sub-columns ``n.a``, ``n.b`` is split into them (``nested``).
- a struct or map holding arrays, for a ``JSON`` column, becomes JSON text: the server
  would store a null array member as ``[]`` (``json_values``).
The checks (``schema.check_batch``) then run on the prepared batch, which is the one to
encode: ``checked_batch`` does both.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from server_ext.errors import InvalidValue
from server_ext.types.arrow_schema import struct_fields_for
from server_ext.types.bad_values import BadRows, Collect, Rows
from server_ext.types.chtypes import ChType, ValueRanges
from server_ext.types.conversions import wall_clock_instants
from server_ext.types.json_values import as_json_texts, holds_arrays
from server_ext.types.nested import flatten_batch
from server_ext.types.row_checks import RowOf, check_batch, list_values
from server_ext.types.target_table import Column


def checked_batch(columns: list[Column], batch: pa.RecordBatch, ranges: ValueRanges
                  ) -> pa.RecordBatch:
    """``batch`` prepared for ``columns`` (``prepare_batch``) and checked; the one to send."""
    prepared = prepare_batch(columns, batch, ranges.timezone)
    check_batch(columns, prepared, ranges)
    return prepared


def split_batch(columns: list[Column], batch: pa.RecordBatch, ranges: ValueRanges
                ) -> tuple[pa.RecordBatch, BadRows]:
    """``batch`` prepared and checked like :func:`checked_batch`, but every bad row found
    instead of the first raised: (the prepared good rows, the bad rows of ``batch``)."""
    collected = Collect(batch.num_rows)
    rows = Rows(collected)
    prepared = prepare_batch(columns, batch, ranges.timezone, rows)
    check_batch(columns, prepared, ranges, rows)
    bad = collected.result()
    if not len(bad):
        return prepared, bad
    keep = np.ones(batch.num_rows, bool)
    keep[bad.rows] = False
    return prepared.filter(pa.array(keep)), bad


def prepare_batch(columns: list[Column], batch: pa.RecordBatch, server_zone: str,
                  rows: Rows | None = None) -> pa.RecordBatch:
    """Nested sub-columns split out, wall-clock timestamps placed in their column's zone.

    ``server_zone`` is the zone of a DateTime column declared without one. Raises
    ``InvalidValue`` for a wall-clock time that does not exist in its column's zone (or
    reports it to ``rows``' collector).
    """
    rows = rows or Rows.fail_fast()
    batch = flatten_batch([(c.name, c.chtype) for c in columns], batch)
    arrays = dict(zip(batch.schema.names, batch.columns, strict=True))
    changed = False
    for column in columns:
        array = arrays.get(column.name)
        if array is None:
            continue
        if column.chtype.value_type().base == "JSON" and (
                pa.types.is_struct(array.type) or pa.types.is_map(array.type)) \
                and holds_arrays(array.type):
            arrays[column.name] = as_json_texts(array)
            changed = True
        elif _has_wall_clock(array.type):
            arrays[column.name] = _placed(column.name, array, column.chtype, server_zone,
                                          rows)
            changed = True
    if not changed:
        return batch
    return pa.RecordBatch.from_arrays(list(arrays.values()), names=list(arrays))


def _has_wall_clock(t: pa.DataType) -> bool:
    """Whether Arrow type ``t`` holds a timestamp without zone anywhere."""
    if pa.types.is_timestamp(t):
        return t.tz is None
    if pa.types.is_dictionary(t):
        return _has_wall_clock(t.value_type)
    if pa.types.is_map(t):
        return _has_wall_clock(t.key_type) or _has_wall_clock(t.item_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _has_wall_clock(t.value_type)
    if pa.types.is_struct(t):
        return any(_has_wall_clock(f.type) for f in t)
    return False


def _placed(name: str, array: pa.Array, target: ChType, server_zone: str,
            row_of: RowOf) -> pa.Array:
    """``array`` with every wall-clock timestamp under a DateTime[64] made an instant."""
    if not _has_wall_clock(array.type):
        return array
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    ch = target.value_type()
    if ch.base in ("DateTime", "DateTime64") and pa.types.is_timestamp(array.type):
        return _instants(name, array, ch, server_zone, row_of)
    if ch.base == "Array" and ch.inner is not None and not pa.types.is_fixed_size_list(
            array.type):
        values, element_row = list_values(array, row_of)
        placed = _placed(name, values, ch.inner, server_zone, element_row)
        kind = pa.LargeListArray if pa.types.is_large_list(array.type) else pa.ListArray
        return kind.from_arrays(_zero_based(array), placed, mask=_mask(array))
    if ch.base == "Map" and pa.types.is_map(array.type):
        values, element_row = list_values(array, row_of)
        keys = _placed(f"{name} (key)", values.field(0), ch.elements[0], server_zone,
                       element_row)
        items = _placed(f"{name} (value)", values.field(1), ch.elements[1], server_zone,
                        element_row)
        return pa.MapArray.from_arrays(_zero_based(array), keys, items, mask=_mask(array))
    if ch.base == "Tuple" and pa.types.is_struct(array.type):
        order = struct_fields_for(array.type, ch) or []
        element_of = {index: position for position, index in enumerate(order)}
        children = array.flatten()
        placed_children = [
            _placed(f"{name}.{ch.tuple_names[element_of[i]]}", child,
                    ch.elements[element_of[i]], server_zone, row_of)
            if i in element_of else child
            for i, child in enumerate(children)]
        return pa.StructArray.from_arrays(placed_children,
                                          names=[f.name for f in array.type],
                                          mask=_mask(array))
    return array


def _instants(name: str, array: pa.Array, ch: ChType, server_zone: str,
              row_of: RowOf) -> pa.Array:
    zone_index = 1 if ch.base == "DateTime64" else 0
    zone = str(ch.params[zone_index]) if len(ch.params) > zone_index else server_zone
    try:
        instants, missing = wall_clock_instants(array, zone)
    except (ValueError, KeyError) as exc:  # zoneinfo: a zone it does not know
        raise InvalidValue(name, row_of(0), array[0].as_py(),
                           f"the time zone {zone!r} of {ch} is unknown here ({exc})") from None
    row_of.report(name, array, np.asarray(missing, bool),
                  f"wall-clock time that does not exist in {zone} (skipped by a "
                  f"daylight-saving change), so {ch} cannot show it")
    return instants


def _zero_based(array: pa.Array) -> pa.Array:
    offsets = array.offsets
    return pc.subtract(offsets, offsets[0])


def _mask(array: pa.Array) -> pa.Array | None:
    return pc.is_null(array) if array.null_count else None
