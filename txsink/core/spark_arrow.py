"""The Arrow schema Spark hands the tasks for a DataFrame's schema, built here.

Spark's JVM converts rows to Arrow (``ArrowUtils.toArrowSchema``) for the Arrow writers of
the data source API and for ``mapInArrow`` alike, so the tasks of every way in see the
same schema. The driver needs it before any task runs (to check and create the target);
PySpark's own converter is private and its signature differs between minors (3.5:
``(schema)``; 4.0/4.1: no ``timezone``; 4.3: ``timezone``), so this module builds it from
the public ``pyspark.sql.types`` classes alone. Measured equal to what ``mapInArrow`` hands
the tasks on PySpark 3.5.9, 4.0.5, 4.1.4 and 4.3.0 for every type below
(``tests/spark/test_spark_ways_in.py``). Timestamps carry the zone ``UTC``: the values are
instants, the zone Spark writes is the session's and changes no value.
"""

from __future__ import annotations

import pyarrow as pa

from txsink.options import OptionError


def arrow_schema(spark_schema) -> pa.Schema:
    """The Arrow schema of a ``StructType`` as the tasks receive it (timestamps: UTC)."""
    return pa.schema([_field(f.name, f.dataType, f.nullable) for f in spark_schema.fields])


def _field(name: str, data_type, nullable: bool) -> pa.Field:
    return pa.field(name, arrow_type(data_type), nullable=nullable)


def arrow_type(data_type) -> pa.DataType:
    """The Arrow type of one Spark type; :class:`OptionError` for one Spark cannot send."""
    from pyspark.sql import types as T

    simple = {T.BooleanType: pa.bool_(), T.ByteType: pa.int8(), T.ShortType: pa.int16(),
              T.IntegerType: pa.int32(), T.LongType: pa.int64(), T.FloatType: pa.float32(),
              T.DoubleType: pa.float64(), T.StringType: pa.string(), T.BinaryType: pa.binary(),
              T.DateType: pa.date32(), T.NullType: pa.null(),
              T.TimestampType: pa.timestamp("us", tz="UTC"),
              T.TimestampNTZType: pa.timestamp("us"),
              T.DayTimeIntervalType: pa.duration("us")}
    for spark_class, arrow in simple.items():
        if type(data_type) is spark_class:
            return arrow
    if isinstance(data_type, T.DecimalType):
        return pa.decimal128(data_type.precision, data_type.scale)
    if isinstance(data_type, T.ArrayType):
        return pa.list_(_field("element", data_type.elementType, data_type.containsNull))
    if isinstance(data_type, T.MapType):
        return pa.map_(_field("key", data_type.keyType, False),
                       _field("value", data_type.valueType, data_type.valueContainsNull))
    if type(data_type).__name__ == "VariantType":  # PySpark 4.0+: refused by name later
        return pa.struct([pa.field("value", pa.binary(), nullable=False),
                          pa.field("metadata", pa.binary(), nullable=False,
                                   metadata={b"variant": b"true"})])
    if isinstance(data_type, T.StructType):
        return pa.struct([_field(f.name, f.dataType, f.nullable) for f in data_type.fields])
    raise OptionError(f"a column of Spark type {data_type.simpleString()} cannot be sent to "
                      "ClickHouse through Arrow; cast it (for example to string) first")
