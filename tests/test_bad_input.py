"""Bad input fails the write with an error naming the problem and changes nothing.

For every kind of bad input the write must fail with a message that names the column,
value, table, user or option at fault; the target must hold exactly the rows it held
before (compared row by row); and after ``txsink gc`` no staging table may remain.

These tests use a private ClickHouse + ZooKeeper pair (ports 28401..28404): ``txsink gc
--grace 0`` sweeps every staging table its ZooKeeper root does not know, which on the
shared servers would include other tests' staging.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date

import pytest
import requests

import txsink
from txsink import cli
from txsink.harness.chaos.faults import private_services
from txsink.harness.services import READONLY_USER, SECRET_PASSWORD, SECRET_USER, Services

PORT_BASE = 28400
SCHEMA = "id LONG, day DATE, code STRING, small INT, name STRING"
GOOD_ROW = (10, date(2026, 3, 1), "wxyz", 7, "ten")


@pytest.fixture(scope="module")
def private(tmp_path_factory) -> Iterator[Services]:
    services = private_services(tmp_path_factory.mktemp("bad-input-servers"), PORT_BASE)
    services.up()
    yield services
    services.down()


def sql(services: Services, query: str, **params: str) -> str:
    resp = requests.post(services.clickhouse.url, data=query.encode(), params=params, timeout=30)
    body = resp.content.decode("utf-8")
    assert resp.status_code == 200, body
    return body


@dataclass
class Target:
    services: Services
    table: str
    options: dict[str, str]
    before: str

    def rows(self) -> str:
        db, name = self.table.split(".")
        return sql(self.services, f"SELECT * FROM `{db}`.`{name}` ORDER BY id FORMAT TSV")


@pytest.fixture
def target(private: Services) -> Iterator[Target]:
    """A table with two rows, and sink options with a sink id of its own."""
    db = f"bad_{uuid.uuid4().hex[:8]}"
    sql(private, f"CREATE DATABASE `{db}`")
    sql(private, f"CREATE TABLE `{db}`.`t` (id UInt64, day Date, code FixedString(4), "
                 "small UInt8, name String) ENGINE = MergeTree() "
                 "PARTITION BY toYYYYMM(day) ORDER BY id")
    sql(private, f"INSERT INTO `{db}`.`t` VALUES "
                 "(1, '2026-01-15', 'abcd', 1, 'one'), (2, '2026-02-15', 'efgh', 2, 'two')")
    options = {"url": private.clickhouse.url, "zookeeper": private.zookeeper.hosts,
               "table": f"{db}.t", "sink_id": f"bad-{db}"}
    t = Target(private, f"{db}.t", options, "")
    t.before = t.rows()
    yield t
    sql(private, f"DROP DATABASE IF EXISTS `{db}`")


@pytest.fixture(autouse=True)
def _registered(spark) -> None:
    txsink.register(spark)


def frame(spark, *rows: tuple, schema: str = SCHEMA):
    return spark.createDataFrame(list(rows), schema)


def rejected(target: Target, df, **options: str) -> str:
    """Write ``df``; return the error text after checking that nothing changed."""
    with pytest.raises(Exception) as info:
        (df.write.format("clickhouse_tx").options(**{**target.options, **options})
           .mode("append").save())
    message = str(info.value)
    assert SECRET_PASSWORD not in message
    assert target.rows() == target.before, "the target changed"
    code = cli.main(["gc", "--zookeeper", target.services.zookeeper.hosts,
                     "--url", target.services.clickhouse.url, "--grace", "0"])
    assert code == 0
    left = sql(target.services,
               "SELECT count() FROM system.tables WHERE database = 'txsink_staging'")
    assert left.strip() == "0", "staging tables left after txsink gc"
    return message


def names(pattern: str, message: str) -> bool:
    return re.search(pattern, message, re.DOTALL) is not None


def test_unknown_column_is_named(spark, target):
    df = frame(spark, GOOD_ROW).withColumnRenamed("name", "nmae")
    assert names(r"unknown column `nmae`", rejected(target, df))


def test_column_of_wrong_type_is_named_with_both_types(spark, target):
    df = frame(spark, GOOD_ROW).selectExpr("id", "CAST(day AS STRING) AS day", "code",
                                           "small", "name")
    assert names(r"column `day`: cannot convert string to Date", rejected(target, df))


def test_every_bad_column_is_named_in_one_error(spark, target):
    df = frame(spark, GOOD_ROW).selectExpr("CAST(id AS STRING) AS id", "day", "code",
                                           "small", "name AS nom")
    message = rejected(target, df)
    assert names(r"column `id`: cannot convert string to UInt64", message)
    assert names(r"unknown column `nom`", message)
    assert names(r"missing column `name`", message)


def test_missing_column_without_default_is_named(spark, target):
    df = frame(spark, GOOD_ROW).drop("name")
    assert names(r"missing column `name` \(String\) has no default", rejected(target, df))


def test_null_into_non_nullable_column_names_column_and_row(spark, target):
    df = frame(spark, GOOD_ROW, (11, date(2026, 3, 2), "qrst", 8, None))
    assert names(r"column `name`: null value into non-Nullable String", rejected(target, df))


def test_string_too_long_for_fixed_string_names_the_value(spark, target):
    df = frame(spark, GOOD_ROW, (11, date(2026, 3, 2), "toolong", 8, "eleven"))
    message = rejected(target, df)
    assert names(r"column `code`: string longer than 4 bytes for FixedString\(4\)", message)
    assert names(r"value 'toolong'", message)


def test_number_out_of_range_names_the_value(spark, target):
    df = frame(spark, GOOD_ROW, (11, date(2026, 3, 2), "qrst", 300, "eleven"))
    assert names(r"column `small`: value out of range for UInt8.*value 300", rejected(target, df))


def test_negative_number_into_unsigned_column_names_the_value(spark, target):
    df = frame(spark, GOOD_ROW, (-5, date(2026, 3, 2), "qrst", 8, "minus five"))
    assert names(r"column `id`: value out of range for UInt64.*value -5", rejected(target, df))


def test_unknown_table_is_named(spark, target):
    db = target.table.split(".")[0]
    message = rejected(target, frame(spark, GOOD_ROW), table=f"{db}.no_such_table")
    assert names(r"no_such_table.*does not exist", message)


def test_unknown_database_is_named(spark, target):
    message = rejected(target, frame(spark, GOOD_ROW), table="no_such_db.t")
    assert names(r"database `no_such_db` does not exist", message)


def test_wrong_password_is_refused_without_showing_it(spark, target):
    message = rejected(target, frame(spark, GOOD_ROW), user=SECRET_USER,
                       password="not-the-password")
    assert "not-the-password" not in message
    assert names(r"(?i)password|authenticat", message)


def test_right_password_never_appears_in_an_error(spark, target):
    db = target.table.split(".")[0]
    message = rejected(target, frame(spark, GOOD_ROW), user=SECRET_USER,
                       password=SECRET_PASSWORD, table=f"{db}.no_such_table")
    assert names(r"no_such_table", message)


def test_read_only_user_is_refused_naming_the_mode(spark, target):
    message = rejected(target, frame(spark, GOOD_ROW), user=READONLY_USER)
    assert names(r"(?i)read-?only", message)


MALFORMED_OPTIONS = {
    "unknown_option": ({"tabel": "x"}, r"unknown option\(s\): tabel"),
    "url_without_scheme": ({"url": "127.0.0.1:8123"}, r"url must start with http"),
    "url_with_credentials": ({"url": "http://bob:hunter2@127.0.0.1:8123"},
                             r"url must not carry credentials"),
    "timeout_not_a_number": ({"timeout": "soon"}, r"timeout='soon' is not a float"),
    "negative_retries": ({"retries": "-1"}, r"retries='-1' must be at least 0"),
    "zero_insert_block_rows": ({"insert_block_rows": "0"}, r"insert_block_rows='0'"),
    "unknown_strategy": ({"strategy": "teleport"}, r"strategy='teleport' is not one of"),
    "relative_zk_root": ({"zk_root": "txsink"}, r"zk_root='txsink' must be an absolute"),
    "recover_on_start_not_boolean": ({"recover_on_start": "maybe"},
                                     r"recover_on_start='maybe' must be true or false"),
    "empty_table": ({"table": ""}, r"missing required option\(s\): table"),
    "empty_zookeeper": ({"zookeeper": ""}, r"missing required option\(s\): zookeeper"),
}


@pytest.mark.parametrize("case", MALFORMED_OPTIONS, ids=list(MALFORMED_OPTIONS))
def test_malformed_option_is_rejected_naming_it(spark, target, case):
    options, expected = MALFORMED_OPTIONS[case]
    message = rejected(target, frame(spark, GOOD_ROW), **options)
    assert names(expected, message), message[-500:]
    assert "hunter2" not in message
