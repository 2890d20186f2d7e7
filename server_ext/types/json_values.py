"""What a ClickHouse ``JSON`` column takes from Spark, and why a JSON text is refused.

Why checks here: 26.x fails a whole INSERT for one bad JSON text, without its row, and
silently changes some values it accepts (measured on 26.9): ``null`` (the text) becomes
``{}``; an integer beyond Int64/UInt64 becomes a string; a repeated key fails the INSERT.
So every text is parsed here first (the standard library's ``json``: pyarrow has no JSON
validator for single values, and the server parses each text anyway, so one pass in
Python per row is the price) and refused naming its row unless it is one JSON object the
server stores as written.

Spark structs and maps go to the server as they are: it serializes them to JSON itself
(measured: fields by name, map keys as text, arrays as arrays, a null field or element
left out of its object), except that it stores a null array member as ``[]`` (measured on
26.9): a struct or map that holds arrays is therefore turned into JSON text here
(:func:`as_json_texts`), a null member left out. Their leaves must be numbers, booleans or
strings; a decimal
would become a Float64, and dates, timestamps and binary would become text the server
may read back as another type, so those are refused by name: cast them in Spark.
"""

from __future__ import annotations

import json
import math

import pyarrow as pa

_INT_RANGE = (-(2**63), 2**64 - 1)  # Int64 .. UInt64: what the server keeps a number as


class _Refused(ValueError):
    """A JSON text the server would store otherwise, or refuse."""


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        repeated = next(key for key in keys if keys.count(key) > 1)
        raise _Refused(f"the key {repeated!r} appears twice in one object")
    return dict(pairs)


def _integer(text: str) -> int:
    value = int(text)
    if not _INT_RANGE[0] <= value <= _INT_RANGE[1]:
        raise _Refused(f"the integer {text[:40]} is beyond Int64/UInt64 (the server would "
                       "store it as a string)")
    return value


def _float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _Refused(f"the number {text[:40]} is beyond Float64")
    return value


def _constant(text: str) -> float:
    raise _Refused(f"{text} is not JSON")


_DECODER = json.JSONDecoder(object_pairs_hook=_unique_keys, parse_int=_integer,
                            parse_float=_float, parse_constant=_constant)


_JSON_KINDS = {type(None): "null", list: "an array", str: "a string", int: "a number",
               float: "a number", bool: "a boolean"}


def json_text_problem(text: str) -> str | None:
    """Why ``text`` is no JSON object the server stores as written, or None."""
    try:
        value = _DECODER.decode(text)
    except _Refused as exc:
        return f"JSON the server would not store as written: {exc}"
    except ValueError as exc:  # json.JSONDecodeError
        return f"not JSON text ({exc})"
    if not isinstance(value, dict):
        return f"JSON text that is not an object ({_JSON_KINDS.get(type(value), 'a value')})"
    return None


def json_source_problem(arrow_type: pa.DataType, path: str = "") -> str | None:
    """Why values of a struct or map type cannot become JSON exactly, naming the field."""
    where = f"field `{path}`" if path else "the value"
    if pa.types.is_struct(arrow_type):
        for child in arrow_type:
            problem = json_source_problem(child.type, f"{path}.{child.name}".lstrip("."))
            if problem:
                return problem
        return None
    if pa.types.is_map(arrow_type):
        key = arrow_type.key_type
        if not (pa.types.is_integer(key) or pa.types.is_string(key)
                or pa.types.is_large_string(key)):
            return f"{where} is a map with {key} keys (JSON keys are strings or integers)"
        return json_source_problem(arrow_type.item_type, f"{path}[value]")
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        return json_source_problem(arrow_type.value_type, f"{path}[]")
    if (pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type)
            or pa.types.is_boolean(arrow_type) or pa.types.is_string(arrow_type)
            or pa.types.is_large_string(arrow_type) or pa.types.is_null(arrow_type)):
        return None
    return (f"{where} is {arrow_type}, which JSON holds only as another type; cast it to "
            "a string or a number in Spark")


def holds_arrays(arrow_type: pa.DataType) -> bool:
    """Whether a struct or map type has an array anywhere inside."""
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        return True
    if pa.types.is_struct(arrow_type):
        return any(holds_arrays(field.type) for field in arrow_type)
    if pa.types.is_map(arrow_type):
        return holds_arrays(arrow_type.item_type)
    return False


def as_json_texts(array: pa.Array) -> pa.Array:
    """Struct or map values as the JSON texts of their objects, a null member left out
    (as a JSON text sent with it absent stores it). One Python pass per row."""
    kind = array.type
    return pa.array([None if value is None else json.dumps(
        _plain(value, kind), ensure_ascii=False, allow_nan=True)
        for value in array.to_pylist()], pa.string())


def _plain(value: object, kind: pa.DataType) -> object:
    """A ``to_pylist`` value of type ``kind`` as JSON data: structs and maps as objects
    without their null members, maps' keys as text."""
    if value is None:
        return None
    if pa.types.is_struct(kind):
        assert isinstance(value, dict)
        return {field.name: _plain(value[field.name], field.type) for field in kind
                if value.get(field.name) is not None}
    if pa.types.is_map(kind):
        assert isinstance(value, list)
        return {str(key): _plain(item, kind.item_type) for key, item in value
                if item is not None}
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        assert isinstance(value, list)
        return [_plain(item, kind.value_type) for item in value]
    return value


def is_spark_variant(arrow_type: pa.DataType) -> bool:
    """Whether ``arrow_type`` is how Spark hands over its ``VariantType`` (a struct of
    ``value`` and ``metadata`` binaries, the latter marked ``variant``)."""
    return (pa.types.is_struct(arrow_type) and arrow_type.num_fields == 2
            and [f.name for f in arrow_type] == ["value", "metadata"]
            and (arrow_type.field(1).metadata or {}).get(b"variant") == b"true")
