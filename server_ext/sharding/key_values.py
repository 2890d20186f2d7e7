"""Key values as the server computes them, and the bare-integer-column key (numpy).

The server makes each key value unsigned as C++ casts it (Int8/16/32 sign-extended to
32 bits, Int64 to 64; a constant key at its own width) before taking it modulo the total
weight. ``column_key`` reproduces that for a key that is one integer column, vectorised.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from server_ext.errors import ShardingError
from server_ext.types.chtypes import INTEGER_TYPES

_ARROW_INTEGERS = {(bits, signed): f"{'' if signed else 'U'}Int{bits}"
                   for bits in (8, 16, 32, 64) for signed in (True, False)}


KeyValues = Callable[[pa.RecordBatch], np.ndarray]  # batch -> unsigned key value per row


def column_key(key: str, column: str, schema: pa.Schema, types: dict[str, str]) -> KeyValues:
    """A bare integer column: its values, made unsigned as the server does."""
    if column not in schema.names:
        raise ShardingError(f"sharding key {key} is column `{column}`, which the data does "
                            f"not have (columns: {', '.join(schema.names)})")
    arrow_type = schema.field(column).type
    ch_type = types.get(column) or _integer_name(arrow_type)
    if ch_type not in INTEGER_TYPES:
        shown = ch_type or str(arrow_type)
        raise ShardingError(f"sharding key column `{column}` is {shown}, not an integer type "
                            "(UInt8..UInt64, Int8..Int64): the server refuses such a key")
    target = pa.from_numpy_dtype(np.dtype(INTEGER_TYPES[ch_type][0]))
    _as_integers(pa.array([], arrow_type), target, column)  # fails now if it never can

    def values(batch: pa.RecordBatch) -> np.ndarray:
        array = batch.column(column)
        reject_nulls(array, column, key)
        array = _as_integers(array, target, column)
        return unsigned_key_values(array.to_numpy(zero_copy_only=False), ch_type)

    return values


def _as_integers(array: pa.Array, target: pa.DataType, column: str) -> pa.Array:
    """``array`` as the key column's integer type, wrapping like the server's conversion."""
    if array.type == target:
        return array
    try:
        return pc.cast(array, target, safe=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ShardingError(f"sharding key column `{column}` holds {array.type}, which "
                            f"cannot become {target}: {exc}") from None


def _integer_name(arrow_type: pa.DataType) -> str | None:
    """The ClickHouse name of an Arrow integer type (int32 -> Int32), else None."""
    if not pa.types.is_integer(arrow_type):
        return None
    return _ARROW_INTEGERS[arrow_type.bit_width, pa.types.is_signed_integer(arrow_type)]


def unsigned_key_values(values: np.ndarray, ch_type: str, constant: bool = False) -> np.ndarray:
    """Key values as the server makes them unsigned before taking them modulo the weight.

    Int8/16/32 are sign-extended to UInt32 and Int64 to UInt64 (a C++ ``static_cast``);
    a constant key is cast to the unsigned type of its own width instead.
    """
    dtype = np.dtype(INTEGER_TYPES[ch_type][0])
    values = values.astype(dtype, copy=False)
    if dtype.kind == "u":
        return values
    if constant or dtype.itemsize == 8:
        return values.view(np.dtype(f"<u{dtype.itemsize}"))
    return values.astype(np.uint32)  # sign-extends, then wraps modulo 2**32


def reject_nulls(array: pa.Array, column: str, key: str) -> None:
    if array.null_count:
        row = pc.index(pc.is_null(array), True).as_py()
        raise ShardingError(f"column `{column}` of sharding key {key} is null in row {row} "
                            "of the batch; a null key has no shard")
