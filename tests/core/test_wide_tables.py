"""Wide tables (thousands of columns) through ``clickhouse_tx``: written exactly once where
one staging INSERT fits the server, refused before anything happens where it cannot.

What limits a wide table, measured on the test servers (docs/usage.md, "Wide tables"):
the statement's column list travels in the INSERT's body, so no URL limit applies; what
remains is the server's per-query memory: 18.16 holds ~2 MiB per column file while it
writes a part and its ``max_memory_usage`` is 4 GB (~1,900 plain columns), while the
26.x server sizes its buffers to the data and has no per-query limit. Each test writes a
few rows: the widths, not the rows, are what is tested. One width per side of the limit:
5,000 columns written on 26.x (a narrower table takes the same path with less), 2,000
refused on 18.16 (the estimate grows with the columns, and 2,000 is the width nearest
the limit; a wider one is refused by the same comparison).
"""

from __future__ import annotations

import pytest

import txsink
from coordinator.sink_admin import SinkAdmin
from server_ext.old_server.insert_memory import column_files
from server_ext.types.chtypes import parse_type
from tests.conftest import run_sql
from tests.sinkutil import assert_exactly_once, staging_tables
from txsink.options import OptionError

ROWS = 5


@pytest.fixture(autouse=True)
def _registered(spark) -> None:
    txsink.register(spark)


@pytest.fixture
def sink_options(server_url: str, zk_hosts: str, zk_chroot: str) -> dict[str, str]:
    return {"url": server_url, "zookeeper": zk_hosts + zk_chroot}


def wide_table(url: str, db: str, columns: int) -> str:
    """A MergeTree of ``columns`` columns: ``id`` and ``c1`` … as Int64."""
    values = ", ".join(f"`c{i}` Int64" for i in range(1, columns))
    run_sql(url, f"CREATE TABLE `{db}`.`wide` (`id` UInt64, {values}) "
                 "ENGINE = MergeTree() ORDER BY `id`")
    return f"{db}.wide"


def wide_rows(spark, columns: int):
    """``ROWS`` rows of ``columns`` columns, column ``c<i>`` holding ``id * i``; built with
    one selectExpr (column by column, Spark would re-analyse the plan each time)."""
    return spark.range(ROWS, numPartitions=2).selectExpr(
        "id", *(f"id * {i} AS c{i}" for i in range(1, columns)))


def save(df, options: dict[str, str], table: str) -> None:
    df.write.format("clickhouse_tx").options(**options).option("table", table) \
        .mode("append").save()


def assert_values_written(url: str, table: str, columns: int) -> None:
    """Every row's last column holds ``id * (columns - 1)``: the columns matched by name."""
    last = f"c{columns - 1}"
    db, name = table.split(".")
    wrong = run_sql(url, f"SELECT count() FROM `{db}`.`{name}` "
                         f"WHERE `{last}` != toInt64(id) * {columns - 1}").strip()
    assert wrong == "0"


@pytest.mark.parametrize("columns", [5000])
@pytest.mark.parametrize("server", ["ch26"], indirect=True)
def test_a_wide_table_is_written_exactly_once_on_a_server_without_a_memory_limit(
        spark, server_url, server_db, sink_options, columns):
    table = wide_table(server_url, server_db, columns)
    save(wide_rows(spark, columns), sink_options, table)
    assert_exactly_once(server_url, table, range(ROWS))
    assert_values_written(server_url, table, columns)


@pytest.mark.parametrize("server", ["ch18"], indirect=True)
def test_a_table_wider_than_a_url_allows_is_written_exactly_once_within_the_memory_limit(
        spark, server_url, server_db, sink_options):
    # 1,500 columns: a column list of ~21 KB URL-encoded (18.16 refuses request lines over
    # 16 KiB) and ~3.2 GB of the 4 GB an INSERT may take
    table = wide_table(server_url, server_db, 1500)
    save(wide_rows(spark, 1500), sink_options, table)
    assert_exactly_once(server_url, table, range(ROWS))
    assert_values_written(server_url, table, 1500)


@pytest.mark.parametrize("columns", [2000])
@pytest.mark.parametrize("server", ["ch18"], indirect=True)
def test_a_table_too_wide_for_the_servers_memory_is_refused_before_any_xid_or_staging(
        spark, server_url, server_db, sink_options, zk, columns):
    table = wide_table(server_url, server_db, columns)
    with pytest.raises(Exception, match=(
            rf"wide.*{columns} columns.*per-query limit of 3\.73 GiB \(max_memory_usage\)"
            r".*Nothing was staged")) as caught:
        save(wide_rows(spark, columns), sink_options, table)
    assert not isinstance(caught.value, OptionError)
    assert staging_tables(server_url, sink_options) == []
    assert SinkAdmin.sinks(zk) == []  # no sink opened, hence no xid
    assert run_sql(server_url, f"SELECT count() FROM `{server_db}`.`wide`").strip() == "0"


@pytest.mark.parametrize(("type_name", "files"), [
    ("Int64", 1), ("String", 1), ("Nullable(Int64)", 2), ("Array(Int64)", 2),
    ("LowCardinality(String)", 2), ("Array(Nullable(String))", 3),
    ("Tuple(a Int64, b Nullable(String))", 3)])
def test_a_column_costs_one_part_file_per_stream_of_its_type(type_name, files):
    # measured on 18.16: Nullable, Array and LowCardinality columns each cost two ~2 MiB
    # buffers in a one-row INSERT, plain columns one
    assert column_files(parse_type(type_name)) == files
