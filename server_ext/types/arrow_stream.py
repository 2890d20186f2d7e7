"""Arrow record batches as an ArrowStream INSERT body, and the seam to the body formats.

On servers that read ArrowStream (every server with Date32, Map, DateTime64 ...) the batch
is cast to the Arrow types matching the columns (``stream_array``) and sent as an IPC
stream (``to_arrow_stream_batch`` + ``arrow_stream_chunks``); the server parses text types
and widens integers (exact after the checks).

``InsertFormat`` is what the staging writer sends a body through: ``ARROW_STREAM`` here,
or the Native encoder of the old-server wing (``server_ext.old_server.native_encoder``) on
a server without ArrowStream input; ``Capabilities.insert_format`` chooses between them.

Contract: the batch must be what ``prepare.checked_batch`` returned for the same columns
(prepared and checked: values are converted without further range checks). Each call
encodes exactly the rows it is given.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from server_ext.types.arrow_schema import struct_fields_for
from server_ext.types.chtypes import FLOAT_TYPES, INTEGER_TYPES, WIDE_INTEGER_TYPES, ChType
from server_ext.types.conversions import to_seconds
from server_ext.types.row_checks import decimal_arrow_type, list_values, to_decimal
from server_ext.types.target_table import Column

Piece = bytes | memoryview

# The end-of-stream marker of the Arrow IPC stream format.
ARROW_STREAM_END = b"\xff\xff\xff\xff\x00\x00\x00\x00"


class InsertFormat(Protocol):
    """The format of a staging INSERT's body: its name (the INSERT's ``FORMAT``), why a
    column of type ``ch`` cannot be sent in it (None: it can), and the body of prepared
    batches for ``columns`` (a new iterator each call, so a body can be sent again)."""

    name: str

    def column_problem(self, ch: ChType) -> str | None: ...

    def body(self, batches: Iterable[pa.RecordBatch], columns: list[Column]
             ) -> Iterator[Piece]: ...


class _ArrowStream:
    name = "ArrowStream"

    def column_problem(self, ch: ChType) -> str | None:
        return None  # a server that reads ArrowStream has every type the checks let through

    def body(self, batches: Iterable[pa.RecordBatch], columns: list[Column]
             ) -> Iterator[Piece]:
        return arrow_stream_chunks(to_arrow_stream_batch(b, columns) for b in batches)


ARROW_STREAM: InsertFormat = _ArrowStream()



def arrow_type_for(ch: ChType) -> pa.DataType:
    """The Arrow type that carries values of ClickHouse ``ch`` exactly into ArrowStream input.

    Types the server parses from text (UUID, IPv4/IPv6, JSON, Enum labels) travel as
    strings; wide integers as int64 (``stream_array`` keeps a decimal source as it is).
    """
    ch = ch.unwrap_low_cardinality()
    if ch.is_nullable and ch.inner is not None:
        return arrow_type_for(ch.inner)
    if ch.base == "Array" and ch.inner is not None:
        return pa.list_(arrow_type_for(ch.inner))
    if ch.base == "Map":
        return pa.map_(arrow_type_for(ch.elements[0]), arrow_type_for(ch.elements[1]))
    if ch.base == "Tuple":
        return pa.struct([pa.field(name, arrow_type_for(element))
                          for name, element in zip(ch.tuple_names, ch.elements, strict=True)])
    if ch.base in INTEGER_TYPES:
        return pa.from_numpy_dtype(np.dtype(INTEGER_TYPES[ch.base][0]))
    if ch.base in FLOAT_TYPES:
        return pa.from_numpy_dtype(np.dtype(FLOAT_TYPES[ch.base]))
    if ch.base == "Decimal":
        return decimal_arrow_type(ch)
    if ch.base in ("String", "FixedString"):
        return pa.binary()
    if ch.base in ("Date", "Date32"):
        return pa.date32()
    if ch.base == "DateTime":
        return pa.timestamp("s", tz="UTC")
    if ch.base == "DateTime64":
        return pa.timestamp(_unit_for(int(ch.params[0])), tz="UTC")
    if ch.base == "Bool":
        return pa.bool_()
    if ch.base in _PARSED_BY_SERVER:
        return pa.string()
    if ch.base in WIDE_INTEGER_TYPES:
        return pa.int64()
    raise TypeError(f"the encoder does not support {ch}")


# Sent as the caller's Arrow values; the server converts them (measured exact on 26.x for
# what ``schema.check_batch`` lets through: canonical text, existing labels or codes).
_PARSED_BY_SERVER = frozenset({"UUID", "IPv4", "IPv6", "JSON", "Enum8", "Enum16", "Variant",
                               "Dynamic"})


def _unit_for(precision: int) -> str:
    """The coarsest Arrow unit holding 10^-precision s: the server rescales exactly from it
    (26.x truncates toward zero when it must drop digits; the checks leave none to drop)."""
    return "s" if precision == 0 else "ms" if precision <= 3 else "us" if precision <= 6 \
        else "ns"


def to_arrow_stream_batch(batch: pa.RecordBatch, columns: list[Column]) -> pa.RecordBatch:
    """``batch`` reduced to ``columns``, each as ``stream_array`` makes it."""
    arrays = [stream_array(batch.column(column.name), column.chtype) for column in columns]
    fields = [pa.field(column.name, array.type, nullable=True)
              for column, array in zip(columns, arrays, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


def stream_array(array: pa.Array, ch: ChType) -> pa.Array:
    """``array`` in the Arrow types ``arrow_type_for`` gives, for an ArrowStream INSERT.

    Scalars and lists of scalars are one ``cast`` (none when the type already matches);
    Map and Tuple, and lists of them, are rebuilt around their converted children (struct
    fields renamed and ordered as the Tuple's elements: the server matches by name).
    """
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    ch = ch.value_type()
    if pa.types.is_null(array.type):
        return pa.nulls(len(array), arrow_type_for(ch))
    if ch.base in _PARSED_BY_SERVER or (ch.base in WIDE_INTEGER_TYPES
                                         and not pa.types.is_boolean(array.type)):
        return array
    if ch.base == "Tuple":
        children = array.flatten()
        order = struct_fields_for(array.type, ch) or []
        converted = [stream_array(children[index], ch.elements[position])
                     for position, index in enumerate(order)]
        return pa.StructArray.from_arrays(converted, names=list(ch.tuple_names),
                                          mask=_null_mask_array(array))
    if ch.base == "Map":
        values, _ = list_values(array, _same_row)
        keys = stream_array(values.field(0), ch.elements[0])
        items = stream_array(values.field(1), ch.elements[1])
        return pa.MapArray.from_arrays(_zero_based(array), keys, items,
                                       mask=_null_mask_array(array))
    if ch.base == "Array" and ch.inner is not None and _is_composite(ch.inner):
        values, _ = list_values(array, _same_row)
        return pa.ListArray.from_arrays(_zero_based(array), stream_array(values, ch.inner),
                                        mask=_null_mask_array(array))
    wanted = arrow_type_for(ch)
    return array if array.type == wanted else _cast_exact(array, wanted)


def _is_composite(ch: ChType) -> bool:
    t = ch.value_type()
    return t.base in ("Map", "Tuple") or t.base in _PARSED_BY_SERVER \
        or t.base in WIDE_INTEGER_TYPES or (t.base == "Array" and t.inner is not None
                                            and _is_composite(t.inner))


def _same_row(index: int) -> int:
    return index


def _zero_based(array: pa.Array) -> pa.Array:
    """A list or map array's offsets, rebased to start at 0 (int32)."""
    offsets = array.offsets
    return pc.subtract(offsets, offsets[0]).cast(pa.int32())


def _null_mask_array(array: pa.Array) -> pa.Array | None:
    return pc.is_null(array) if array.null_count else None


def _cast_exact(array: pa.Array, wanted: pa.DataType) -> pa.Array:
    if pa.types.is_timestamp(wanted) and pa.types.is_timestamp(array.type) \
            and wanted.unit == "s":  # DateTime: whole seconds, rounded down
        seconds = pa.array(to_seconds(array), pa.int64(), mask=_null_mask(array))
        return seconds.cast(wanted)
    if pa.types.is_timestamp(wanted):  # DateTime64: exact (checked), so a safe cast
        return pc.cast(array, wanted, safe=True)
    if pa.types.is_decimal(wanted):
        return to_decimal(array, wanted)
    # values were checked to fit; unsafe only skips the truncation of sub-units
    return pc.cast(array, wanted, safe=False)


def _null_mask(array: pa.Array) -> np.ndarray | None:
    return pc.is_null(array).to_numpy(zero_copy_only=False) if array.null_count else None


def arrow_stream_chunks(batches: Iterable[pa.RecordBatch]) -> Iterator[Piece]:
    """An Arrow IPC stream (schema, batches, end marker) as pieces, one per batch.

    All batches must share the first one's schema. No batch, no stream (empty output).
    """
    schema_sent = False
    for batch in batches:
        if not schema_sent:
            yield memoryview(batch.schema.serialize()).cast("B")
            schema_sent = True
        yield memoryview(batch.serialize()).cast("B")
    if schema_sent:
        yield ARROW_STREAM_END
