"""The DDL of a created target and of an added column, and the Spark → ClickHouse type
mapping they use (``server_ext/ddl/create_table.py``), with the option checks of
``create_table`` / ``schema_evolution`` (``txsink/options/table_options.py``). Pure text: no
server. What the servers do with it is ``tests/core/test_table_creation.py``'s."""

from __future__ import annotations

import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DateType,
    DayTimeIntervalType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    NullType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
    VariantType,
)

from server_ext.ddl.create_table import (
    TableShape,
    TypeNotMapped,
    add_column_sql,
    column_type,
    column_types,
    creatable_engine_problem,
    create_table_sql,
)
from server_ext.types.arrow_schema import type_problem
from server_ext.types.chtypes import parse_type
from server_ext.types.target_table import Column, TargetTable
from txsink.core.spark_arrow import arrow_schema
from txsink.core.target_setup import column_changes
from txsink.options import OptionError, parse_options

MODERN = frozenset({"Bool", "Date32", "DateTime64", "Map"})  # what 26.x lists
CH18 = frozenset()  # 18.16 has none of them

BASE = {"url": "http://127.0.0.1:8123", "table": "db.t", "zookeeper": "127.0.0.1:2181"}


def created(spark_type, families=MODERN, nullable=True, key=False) -> str:
    field = arrow_schema(StructType([StructField("c", spark_type, nullable)])).field("c")
    return column_type(field, families, key=key)


MAPPING = [
    # (Spark type, type on 26.x, type on 18.16)
    (BooleanType(), "Bool", "UInt8"),
    (ByteType(), "Int8", "Int8"),
    (ShortType(), "Int16", "Int16"),
    (IntegerType(), "Int32", "Int32"),
    (LongType(), "Int64", "Int64"),
    (FloatType(), "Float32", "Float32"),
    (DoubleType(), "Float64", "Float64"),
    (DecimalType(20, 3), "Decimal(20, 3)", "Decimal(20, 3)"),
    (StringType(), "String", "String"),
    (BinaryType(), "String", "String"),
    (DateType(), "Date32", "Date"),
    (TimestampType(), "DateTime64(6, 'UTC')", "DateTime('UTC')"),
    (TimestampNTZType(), "DateTime64(6, 'UTC')", "DateTime('UTC')"),
    (ArrayType(LongType(), containsNull=False), "Array(Int64)", "Array(Int64)"),
    (ArrayType(StringType()), "Array(Nullable(String))", "Array(Nullable(String))"),
    (StructType([StructField("a", IntegerType(), False), StructField("b c", StringType())]),
     "Tuple(a Int32, `b c` Nullable(String))", "Tuple(a Int32, `b c` Nullable(String))"),
]


@pytest.mark.parametrize(("spark_type", "modern", "old"), MAPPING,
                         ids=[str(m[0]) for m in MAPPING])
def test_each_spark_type_maps_to_the_documented_type_per_server(spark_type, modern, old):
    assert created(spark_type, MODERN, nullable=False) == modern
    assert created(spark_type, CH18, nullable=False) == old


@pytest.mark.parametrize(("spark_type", "modern", "old"), MAPPING,
                         ids=[str(m[0]) for m in MAPPING])
def test_a_created_type_takes_the_spark_type_back(spark_type, modern, old):
    """The created column passes the sink's own schema check for the field it came from."""
    field = arrow_schema(StructType([StructField("c", spark_type)])).field("c")
    for families in (MODERN, CH18):
        assert type_problem(field.type, parse_type(column_type(field, families))) is None


def test_a_nullable_scalar_field_makes_a_nullable_column():
    assert created(LongType(), nullable=True) == "Nullable(Int64)"
    assert created(LongType(), nullable=False) == "Int64"


def test_arrays_maps_and_tuples_are_never_nullable():
    assert created(ArrayType(LongType()), nullable=True) == "Array(Nullable(Int64))"
    assert created(MapType(StringType(), LongType()), nullable=True) == \
        "Map(String, Nullable(Int64))"
    assert created(StructType([StructField("a", LongType())]), nullable=True) == \
        "Tuple(a Nullable(Int64))"


def test_a_key_column_is_not_nullable():
    assert created(LongType(), nullable=True, key=True) == "Int64"


def test_map_is_refused_where_the_server_has_none():
    with pytest.raises(TypeNotMapped, match="no Map type"):
        created(MapType(StringType(), LongType()), CH18)


@pytest.mark.parametrize("spark_type", [NullType(), DayTimeIntervalType()])
def test_a_type_no_column_holds_is_refused_by_name(spark_type):
    schema = arrow_schema(StructType([StructField("bad", spark_type),
                                      StructField("ok", LongType())]))
    columns, problems = column_types(schema, MODERN)
    assert columns == [("ok", "Nullable(Int64)")]
    assert len(problems) == 1 and problems[0].startswith("column `bad`: ")


def test_create_statement_quotes_names_and_makes_key_columns_not_nullable():
    schema = arrow_schema(StructType([StructField("id", LongType()), StructField("day", DateType()),
                                      StructField("odd `name`", StringType())]))
    shape = TableShape("ReplacingMergeTree", order_by="id, day", partition_by="toYYYYMM(day)")
    columns, problems = column_types(schema, CH18, shape.keys(schema.names))
    assert not problems
    assert create_table_sql("`db`.`t`", columns, shape) == (
        "CREATE TABLE IF NOT EXISTS `db`.`t` (`id` Int64, `day` Date, "
        "`odd \\`name\\`` Nullable(String)) ENGINE = ReplacingMergeTree() "
        "PARTITION BY toYYYYMM(day) ORDER BY (`id`, `day`)")


def test_create_statement_without_keys_orders_by_the_empty_tuple():
    assert create_table_sql("`db`.`t`", [("a", "Int64")], TableShape()) == (
        "CREATE TABLE IF NOT EXISTS `db`.`t` (`a` Int64) ENGINE = MergeTree() "
        "ORDER BY tuple()")


def test_engine_arguments_are_kept_as_written():
    shape = TableShape("ReplicatedMergeTree('/ch/{shard}/t', '{replica}')", order_by="a")
    assert create_table_sql("`db`.`t`", [("a", "Int64")], shape).endswith(
        "ENGINE = ReplicatedMergeTree('/ch/{shard}/t', '{replica}') ORDER BY `a`")


def test_add_column_statement_with_and_without_if_not_exists():
    assert add_column_sql("`db`.`t`", "new col", "Nullable(String)", if_not_exists=True) == \
        "ALTER TABLE `db`.`t` ADD COLUMN IF NOT EXISTS `new col` Nullable(String)"
    assert add_column_sql("`db`.`t`", "n", "Int64", if_not_exists=False) == \
        "ALTER TABLE `db`.`t` ADD COLUMN `n` Int64"


@pytest.mark.parametrize("engine", ["MergeTree", "ReplacingMergeTree(version)",
                                    "CollapsingMergeTree(sign)", "SummingMergeTree()",
                                    "ReplicatedMergeTree('/p', 'r')"])
def test_mergetree_engines_are_created(engine):
    assert creatable_engine_problem(engine) is None


@pytest.mark.parametrize(("engine", "named"), [
    ("VersionedCollapsingMergeTree(sign, v)", "VersionedCollapsingMergeTree cannot be published"),
    ("Log", "engine 'Log' is not one the sink creates"),
    ("Distributed(c, db, t)", "Distributed table is not created"),
])
def test_an_engine_the_sink_cannot_publish_into_is_refused_by_name(engine, named):
    with pytest.raises(OptionError, match=named):
        parse_options({**BASE, "create_table": "if_missing", "engine": engine}, env={})


def test_create_table_defaults_to_never_and_evolution_to_none():
    options = parse_options(BASE, env={})
    assert (options.target.create_table, options.target.schema_evolution) == ("never", "none")


def test_an_unknown_create_table_value_is_refused():
    with pytest.raises(OptionError, match=r"create_table='always' is not one of never, if_missing"):
        parse_options({**BASE, "create_table": "always"}, env={})


def test_an_unknown_schema_evolution_value_is_refused():
    with pytest.raises(OptionError, match=r"schema_evolution='widen' is not one of none"):
        parse_options({**BASE, "schema_evolution": "widen"}, env={})


def test_shape_options_without_create_table_are_refused_not_ignored():
    with pytest.raises(OptionError, match="order_by shape a table .* need create_table=if_missing"):
        parse_options({**BASE, "order_by": "id"}, env={})


def test_a_key_expression_that_would_end_the_statement_is_refused():
    with pytest.raises(OptionError, match="order_by='id; DROP TABLE x' is not one key"):
        parse_options({**BASE, "create_table": "if_missing", "order_by": "id; DROP TABLE x"},
                      env={})


def test_a_spark_variant_is_refused_naming_to_json():
    with pytest.raises(TypeNotMapped, match="to_json"):
        created(VariantType())


def target(*columns: tuple[str, str], engine: str = "MergeTree") -> TargetTable:
    return TargetTable("db", "t", [Column(n, t) for n, t in columns], "", "", "", engine,
                       engine, False, 8192, "")


def test_add_columns_finds_the_fields_the_table_lacks():
    schema = arrow_schema(StructType([StructField("id", LongType()),
                                      StructField("score", DoubleType())]))
    new, problems = column_changes(target(("id", "Int64")), schema)
    assert [f.name for f in new] == ["score"] and problems == []


def test_add_columns_refuses_a_type_change_naming_both_types():
    schema = arrow_schema(StructType([StructField("value", StringType())]))
    new, problems = column_changes(target(("value", "Float64")), schema)
    assert new == []
    assert problems == ["column `value`: the table has Float64, the DataFrame has string; "
                        "schema_evolution=add_columns adds columns and never changes a type "
                        "(cast the column in Spark)"]


def test_add_columns_refuses_a_name_that_differs_only_in_case():
    schema = arrow_schema(StructType([StructField("ID", LongType())]))
    new, problems = column_changes(target(("id", "Int64")), schema)
    assert new == [] and "`ID` differs from the table's `id` only in case" in problems[0]


def test_add_columns_refuses_to_alter_a_distributed_table():
    schema = arrow_schema(StructType([StructField("id", LongType()),
                                      StructField("extra", LongType())]))
    _, problems = column_changes(target(("id", "Int64"), engine="Distributed"), schema)
    assert "db.t is a Distributed table: add extra to it" in problems[0]


def test_nested_sub_columns_count_as_present():
    schema = arrow_schema(StructType([StructField("n", ArrayType(StructType([
        StructField("a", LongType()), StructField("b", StringType())])))]))
    new, problems = column_changes(target(("n.a", "Array(Int64)"), ("n.b", "Array(String)")),
                                   schema)
    assert new == [] and problems == []
