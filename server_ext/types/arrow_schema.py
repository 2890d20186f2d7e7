"""Whether an Arrow schema can be written into a target table, checked before anything
is created.

``check_arrow_schema`` raises one ``SchemaMismatch`` naming every bad column: a missing
column without a default, an unknown column, a column that cannot be written
(MATERIALIZED/ALIAS), a type that cannot be converted (string into UInt64), a type the
writer does not support. Pure: no server, safe from any thread. ClickHouse would accept
much of this silently (an omitted column becomes 0) or refuse it one problem at a time,
after staging exists (``docs/design.md``, "Checks on our side").
"""

from __future__ import annotations

import pyarrow as pa

from server_ext.errors import SchemaMismatch
from server_ext.sql import (
    quote_identifier,
    shown_name,
)
from server_ext.types.chtypes import FLOAT_TYPES, INTEGER_TYPES, WIDE_INTEGER_TYPES, ChType
from server_ext.types.json_values import is_spark_variant, json_source_problem
from server_ext.types.nested import flatten_schema
from server_ext.types.target_table import Column, TargetTable


def check_arrow_schema(target: TargetTable, schema: pa.Schema) -> list[Column]:
    """The target columns to send, in the target's order; raises ``SchemaMismatch``.

    Every problem is collected before raising, so the message names every bad column.
    Nullability of the Arrow fields is not judged here (Spark marks most fields nullable):
    nulls are checked per batch by ``check_batch``.
    """
    schema, problems = flatten_schema([(c.name, c.chtype) for c in target.columns], schema)
    incoming = {f.name: f for f in schema}
    known = {c.name for c in target.columns}
    for arrow_field in schema:
        if arrow_field.name not in known:
            problems.append(_unknown_column(arrow_field.name, known))
    send: list[Column] = []
    for column in target.columns:
        arrow_field = incoming.get(column.name)
        if arrow_field is None:
            if column.writable and not column.may_be_omitted:
                problems.append(f"missing column `{column.name}` ({column.type}) has no default")
            continue
        if not column.writable:
            problems.append(f"column `{column.name}` is {column.default_kind} and cannot be "
                            "written")
            continue
        reason = type_problem(arrow_field.type, column.chtype)
        if reason:
            problems.append(f"column `{column.name}`: {reason}")
            continue
        send.append(column)
    if problems:
        raise SchemaMismatch(shown_name(target.database, target.name), problems)
    return send


def _unknown_column(name: str, known: set[str]) -> str:
    near = [k for k in known if k.lower() == name.lower()]
    hint = f" (did you mean {quote_identifier(near[0])}?)" if near else ""
    return f"unknown column {quote_identifier(name)}: the target has no such column{hint}"


def type_problem(arrow_type: pa.DataType, target: ChType) -> str | None:
    """Why values of ``arrow_type`` cannot be written to ``target``, or None if they can."""
    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    if is_spark_variant(arrow_type):
        return ("Spark's VariantType is not written (no ClickHouse type takes its binary "
                "encoding): turn it into JSON text with to_json() in Spark")
    ch = target.unwrap_low_cardinality()
    if ch.is_nullable and ch.inner is not None:
        ch = ch.inner.unwrap_low_cardinality()
    if pa.types.is_null(arrow_type):
        if target.unwrap_low_cardinality().is_nullable:
            return None
        return f"a field of Arrow type null (always null) cannot go into non-Nullable {target}"
    if ch.base == "Array":
        if not _is_list(arrow_type):
            return f"cannot convert {arrow_type} to {target}"
        inner = type_problem(arrow_type.value_type, ch.inner) if ch.inner else "bad Array"
        return f"element: {inner}" if inner else None
    if ch.base == "Map":
        if not pa.types.is_map(arrow_type):
            return f"cannot convert {arrow_type} to {target}"
        key = type_problem(arrow_type.key_type, ch.elements[0])
        value = type_problem(arrow_type.item_type, ch.elements[1])
        return f"key: {key}" if key else f"value: {value}" if value else None
    if ch.base == "Tuple":
        return _tuple_problem(arrow_type, ch)
    if ch.base == "JSON" and (pa.types.is_struct(arrow_type) or pa.types.is_map(arrow_type)):
        problem = json_source_problem(arrow_type)
        return f"{problem} (into {target})" if problem else None
    if ch.base in ("Variant", "Dynamic"):
        return _variant_problem(arrow_type, ch)
    accepts = _ACCEPTS.get(check_family(ch))
    if accepts is None:
        return f"type {target} is not supported by the writer"
    if not any(test(arrow_type) for test in accepts):
        return f"cannot convert {arrow_type} to {target}"
    return None


# The type the server gives an Arrow column of each type (ArrowStream input), for Variant
# and Dynamic, which store values under that type (measured on 26.9: int32 -> Int32).
_SERVER_TYPE_OF = {
    **{f"int{b}": f"Int{b}" for b in (8, 16, 32, 64)},
    **{f"uint{b}": f"UInt{b}" for b in (8, 16, 32, 64)},
    "float": "Float32", "double": "Float64", "bool": "Bool",
    "string": "String", "large_string": "String",
}


def _variant_problem(arrow_type: pa.DataType, ch: ChType) -> str | None:
    """Dynamic takes the scalars the server types by themselves; Variant those of them
    whose type is one of its own (the server refuses any other: CANNOT_CONVERT_TYPE).
    Nulls are refused per batch like any null into a non-Nullable column: the server's
    Arrow reader stores the type's default for them ('' or false, measured on 26.9)."""
    stored = _SERVER_TYPE_OF.get(str(arrow_type))
    if stored is None:
        return (f"cannot convert {arrow_type} to {ch}: it takes integers, floats, booleans "
                "and strings")
    if ch.base == "Variant" and stored not in [str(e) for e in ch.elements]:
        return (f"{arrow_type} is stored as {stored}, which is none of the types of {ch}; "
                "cast it to one of them in Spark")
    return None


def struct_fields_for(arrow_type: pa.StructType, ch: ChType) -> list[int] | None:
    """Which struct field (by index) carries each Tuple element, or None if none match.

    A named Tuple takes the struct's fields by name, in any order (the server would fill
    elements it finds no field for with defaults, silently); an unnamed one by position.
    """
    names = [arrow_type.field(i).name for i in range(arrow_type.num_fields)]
    if len(names) != len(ch.elements):
        return None
    if not ch.names:
        return list(range(len(names)))
    if sorted(names) != sorted(ch.names):
        return None
    return [names.index(name) for name in ch.names]


def _tuple_problem(arrow_type: pa.DataType, ch: ChType) -> str | None:
    if not pa.types.is_struct(arrow_type):
        return f"cannot convert {arrow_type} to {ch}"
    order = struct_fields_for(arrow_type, ch)
    if order is None:
        return (f"the struct's fields ({', '.join(f.name for f in arrow_type)}) do not match "
                f"the elements of {ch}" + (" by name" if ch.names else " in number"))
    for position, index in enumerate(order):
        element = type_problem(arrow_type.field(index).type, ch.elements[position])
        if element:
            return f"element {ch.tuple_names[position]}: {element}"
    return None


def check_family(ch: ChType) -> str:
    """The group of column types that one type check and one value check serve."""
    if ch.base in INTEGER_TYPES:
        return "int"
    if ch.base in WIDE_INTEGER_TYPES:
        return "wide int"
    if ch.base in FLOAT_TYPES:
        return "float"
    if ch.base in ("Enum8", "Enum16"):
        return "Enum"
    return ch.base


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _is_text(t: pa.DataType) -> bool:
    return (_is_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t))


def _is_whole(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_boolean(t)


def _is_whole_decimal(t: pa.DataType) -> bool:
    return pa.types.is_decimal(t) and t.scale == 0


def _is_date(t: pa.DataType) -> bool:
    return pa.types.is_date32(t) or pa.types.is_date64(t)


_ACCEPTS = {
    "int": (_is_whole,),
    "wide int": (pa.types.is_integer, _is_whole_decimal),
    "float": (_is_whole, pa.types.is_floating, pa.types.is_decimal),
    "Decimal": (_is_whole, pa.types.is_decimal),
    "String": (_is_text,),
    "FixedString": (_is_text,),
    "Date": (_is_date,),
    "Date32": (_is_date,),
    "DateTime": (_is_date, pa.types.is_timestamp),
    "DateTime64": (_is_date, pa.types.is_timestamp),
    "Bool": (pa.types.is_boolean,),
    "UUID": (_is_string,),
    "Enum": (_is_string, pa.types.is_integer),
    "IPv4": (_is_string,),
    "IPv6": (_is_string,),
    "JSON": (_is_string,),
}
