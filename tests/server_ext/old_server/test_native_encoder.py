"""The Arrow -> Native encoder: byte layouts (pure) and round trips through the real 18.16
server, including a hypothesis property over every supported type."""

from __future__ import annotations

import itertools
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings

from server_ext.client.http_client import ClickHouseClient
from server_ext.old_server.native_encoder import encode_column, encode_native_block
from server_ext.types.arrow_schema import check_arrow_schema
from server_ext.types.chtypes import STORAGE_RANGES
from server_ext.types.prepare import checked_batch
from server_ext.types.target_table import Column, describe_table
from tests import roundtrip


def native(array: pa.Array, type_: str) -> bytes:
    return b"".join(bytes(p) for p in encode_column(array, Column("c", type_).chtype))


# -- layouts --------------------------------------------------------------------------------


def test_string_is_varint_length_then_bytes() -> None:
    long = "x" * 200
    assert native(pa.array(["ab", "", long]), "String") == (
        b"\x02ab" + b"\x00" + b"\xc8\x01" + long.encode())


def test_string_of_a_sliced_array_starts_at_the_slice() -> None:
    assert native(pa.array(["skip", "ab", "c"]).slice(1), "String") == b"\x02ab\x01c"


def test_fixed_string_is_zero_padded() -> None:
    assert native(pa.array(["ab", "abc"]), "FixedString(3)") == b"ab\x00abc"


def test_integers_are_little_endian_in_the_column_width() -> None:
    assert native(pa.array([1, 258], pa.int64()), "UInt16") == b"\x01\x00\x02\x01"


def test_nullable_is_null_map_then_values() -> None:
    assert native(pa.array([None, 7], pa.int64()), "Nullable(UInt8)")[:2] == b"\x01\x00"
    assert native(pa.array([None, 7], pa.int64()), "Nullable(UInt8)")[3:] == b"\x07"


def test_array_is_end_offsets_then_flattened_values() -> None:
    encoded = native(pa.array([[1, 2], [], [3]]), "Array(UInt8)")
    offsets = b"".join(n.to_bytes(8, "little") for n in (2, 2, 3))
    assert encoded == offsets + b"\x01\x02\x03"


def test_decimal_uses_the_width_of_its_precision() -> None:
    value = pa.array([Decimal("-1.25")], pa.decimal128(38, 18))
    assert native(value, "Decimal(9, 2)") == (-125).to_bytes(4, "little", signed=True)
    assert native(value, "Decimal(18, 2)") == (-125).to_bytes(8, "little", signed=True)
    assert native(value, "Decimal(38, 2)") == (-125).to_bytes(16, "little", signed=True)


def test_datetime_is_whole_seconds_rounded_down() -> None:
    micros = pa.array([1_500_000, 2_999_999], pa.timestamp("us", tz="UTC"))
    assert native(micros, "DateTime") == b"\x01\x00\x00\x00\x02\x00\x00\x00"


def test_uuid_is_the_layout_clickhouse_connect_writes() -> None:
    """Checked against an independent implementation: clickhouse-connect's UUID column."""
    import uuid

    from clickhouse_connect.datatypes.registry import get_from_name
    from clickhouse_connect.driver.insert import InsertContext

    values = ["01234567-89ab-cdef-0123-456789ABCDEF", "00000000-0000-0000-0000-000000000001"]
    theirs = bytearray()
    column = get_from_name("UUID")
    column.write_column([uuid.UUID(v) for v in values], theirs, InsertContext("t", ["c"], [column]))
    assert native(pa.array(values), "UUID") == bytes(theirs)


def test_enum_is_its_codes_looked_up_by_label() -> None:
    assert native(pa.array(["b", "a", "b"]), "Enum8('a' = -1, 'b' = 2)") == b"\x02\xff\x02"
    assert native(pa.array(["a"]), "Enum16('a' = 1000)") == (1000).to_bytes(2, "little")


def test_tuple_is_each_element_column_in_turn_matched_by_name() -> None:
    struct = pa.array([{"b": "x", "a": 1}, {"b": "", "a": 2}],
                      pa.struct([("b", pa.string()), ("a", pa.uint8())]))
    assert native(struct, "Tuple(a UInt8, b String)") == b"\x01\x02" + b"\x01x\x00"


def test_low_cardinality_sends_a_dictionary_and_indexes() -> None:
    encoded = native(pa.array(["b", "a", "b"]), "LowCardinality(String)")
    flags = (1 << 9 | 1 << 10).to_bytes(8, "little")
    assert encoded == (flags + (2).to_bytes(8, "little") + b"\x01b\x01a"
                       + (3).to_bytes(8, "little") + b"\x00\x01\x00")


def test_block_header_counts_columns_and_rows() -> None:
    batch = pa.record_batch({"x": pa.array([1, 2], pa.uint8())})
    block = b"".join(bytes(p) for p in encode_native_block(batch, [Column("x", "UInt8")]))
    assert block == b"\x01\x02" + b"\x01x" + b"\x05UInt8" + b"\x01\x02"


# -- round trips through the server ---------------------------------------------------------


@pytest.fixture
def table(client: ClickHouseClient, ch_db: str) -> str:
    return roundtrip.create_table(client, ch_db)


def insert_native(client: ClickHouseClient, ch_db: str, table: str,
                  batch: pa.RecordBatch) -> None:
    target = describe_table(client, f"{ch_db}.roundtrip")
    columns = check_arrow_schema(target, batch.schema)
    batch = checked_batch(columns, batch, STORAGE_RANGES)  # what the encoder is given
    body = list(encode_native_block(batch, columns))
    client.insert(table, body, fmt="Native", purpose="insert round trip",
                  columns=[c.name for c in columns])


_examples = itertools.count(1)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rows=roundtrip.tables())
def test_random_arrow_tables_come_back_unchanged(client, ch_db, table, rows) -> None:
    example = next(_examples)
    insert_native(client, ch_db, table, roundtrip.to_batch(rows, example))
    got = roundtrip.read_back(client, table, example)
    assert roundtrip.by_column(got) == roundtrip.by_column(roundtrip.expected(rows))


def test_several_native_blocks_in_one_insert_all_land(client, ch_db, table) -> None:
    rows = [roundtrip.SAMPLE_ROW] * 3
    batch = roundtrip.to_batch(rows, 0)
    target = describe_table(client, f"{ch_db}.roundtrip")
    columns = check_arrow_schema(target, batch.schema)
    batch = checked_batch(columns, batch, STORAGE_RANGES)
    body = [bytes(p) for part in (batch.slice(0, 1), batch.slice(1))
            for p in encode_native_block(part, columns)]
    client.insert(table, body, fmt="Native", purpose="insert two blocks",
                  columns=[c.name for c in columns])
    assert roundtrip.read_back(client, table, 0) == roundtrip.expected(rows)
