"""The target's columns as a Spark schema: what ``clickhouse_tx``'s ``schema()`` returns.

Spark asks a data source for its schema when a SQL user creates a view over it without a
column list (``CREATE TEMPORARY VIEW v USING clickhouse_tx OPTIONS (…)``), and then
resolves ``INSERT INTO v`` against it. Each writable column of the target (MATERIALIZED,
ALIAS and EPHEMERAL ones are left out, as an INSERT cannot supply them) becomes the Spark
type the sink's type check takes for it. Every field is nullable: a NULL into a
non-Nullable column is refused by the sink's own value check, naming the column, where a
``NOT NULL`` field would fail inside Spark's tasks. A type with no Spark counterpart the
sink writes (an AggregateFunction state, a geometry) is refused by name, asking for the
view's column list instead.
"""

from __future__ import annotations

import server_ext
from server_ext.types import ChType, TargetTable
from txsink.core import connections
from txsink.options import OptionError, parse_options

_SCALARS = {
    "Int8": "TINYINT", "Int16": "SMALLINT", "Int32": "INT", "Int64": "BIGINT",
    "UInt8": "SMALLINT", "UInt16": "INT", "UInt32": "BIGINT", "UInt64": "BIGINT",
    "Int128": "DECIMAL(38,0)", "UInt128": "DECIMAL(38,0)",
    "Int256": "DECIMAL(38,0)", "UInt256": "DECIMAL(38,0)",
    "Float32": "FLOAT", "Float64": "DOUBLE", "BFloat16": "FLOAT", "Bool": "BOOLEAN",
    "String": "STRING", "FixedString": "STRING", "UUID": "STRING", "IPv4": "STRING",
    "IPv6": "STRING", "Enum8": "STRING", "Enum16": "STRING", "JSON": "STRING",
    "Object": "STRING", "Variant": "STRING", "Dynamic": "STRING",
    "Date": "DATE", "Date32": "DATE", "DateTime": "TIMESTAMP", "DateTime64": "TIMESTAMP",
}
#: Spark's widest decimal.
_SPARK_MAX_PRECISION = 38


class NoSparkType(OptionError):
    """A target column whose type has no Spark type the sink writes into it."""


def spark_ddl(table: TargetTable) -> str:
    """The target's writable columns as a Spark DDL schema (``"`id` BIGINT, `k` STRING"``)."""
    fields = []
    for column in table.columns:
        if not column.writable:
            continue
        try:
            fields.append(f"{_quoted(column.name)} {spark_type(column.chtype)}")
        except NoSparkType as exc:
            raise NoSparkType(
                f"column {_quoted(column.name)} of {table.qualified} has type {exc}, which "
                "no Spark type is written into by clickhouse_tx: give the view a column "
                "list (CREATE TEMPORARY VIEW v (id BIGINT, …) USING clickhouse_tx OPTIONS "
                "(…)) without it") from None
    return ", ".join(fields)


def spark_type(ch: ChType) -> str:
    """The Spark SQL type whose values the sink writes into a column of type ``ch``."""
    t = ch.value_type()
    if t.base in _SCALARS:
        return _SCALARS[t.base]
    if t.base == "Decimal":  # Decimal32(S) and the others are parsed as Decimal(P, S)
        if t.scale > _SPARK_MAX_PRECISION:
            raise NoSparkType(str(ch))
        return f"DECIMAL({min(t.precision, _SPARK_MAX_PRECISION)},{t.scale})"
    if t.base == "Array" and t.inner is not None:
        return f"ARRAY<{spark_type(t.inner)}>"
    if t.base == "Map" and len(t.elements) == 2:
        return f"MAP<{spark_type(t.elements[0])}, {spark_type(t.elements[1])}>"
    if t.base == "Tuple" and t.elements:
        return "STRUCT<" + ", ".join(
            f"{_quoted(name)}: {spark_type(element)}"
            for name, element in zip(t.tuple_names, t.elements, strict=True)) + ">"
    raise NoSparkType(str(ch))


def _quoted(name: str) -> str:
    """A Spark SQL identifier: backticks, a backtick doubled."""
    return "`" + name.replace("`", "``") + "`"


def describe_schema(raw_options: dict[str, str]) -> str:
    """The Spark DDL schema of the target the options name (described on its server)."""
    options = parse_options(raw_options)
    return spark_ddl(server_ext.describe_table(connections.clickhouse(options), options.table))
