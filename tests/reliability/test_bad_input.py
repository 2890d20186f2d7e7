"""Bad input fails the write with an error naming the problem and changes nothing.

For every kind of bad input the write must fail with a message that names the column,
value, table, user or option at fault; the target must hold exactly the rows it held
before (compared row by row); and after ``txsink gc`` no staging table of the test's
coordinator root may remain.

Each test runs against ClickHouse 18.16 and the modern server (``[ch18]`` / ``[ch26]``,
fixture ``server``); the modern server has the same users. Where the server decides, the
expectation follows the server in hand: the last Date a server reads back is measured on
it (2105-12-31 on 18.16, 2149-06-06 on 26.x). The malformed-option cases run on 18.16
only: options are parsed before any server is asked, so a second server adds nothing.
Column types of the modern server the writer lacks (Variant, Dynamic, BFloat16) are refused
on [ch26] by name, before anything is staged.

On 18.16 the target lives on a private ClickHouse + ZooKeeper pair (ports 28401..28404);
on 26.x it lives on the shared modern server, with the private ZooKeeper. Every target
gets a coordinator root of its own (``zk_root``): ``txsink gc --grace 0`` drops every
staging table of its root that no live xid owns, and the root identity leaves the
ZooKeeper hosts out, so the default root would judge other runs' staging on a shared
server.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, timedelta

import pytest
import requests

import txsink
from server_ext.staging.staging_tables import STAGING_DATABASE, root_tag
from tests.harness.chaos.faults import discard, private_services
from tests.harness.services import READONLY_USER, SECRET_PASSWORD, SECRET_USER, Services
from txsink.ops import cli
from txsink.options import root_identity

PORT_BASE = 28400
SCHEMA = "id LONG, day DATE, code STRING, small INT, name STRING"
GOOD_ROW = (10, date(2026, 3, 1), "wxyz", 7, "ten")
LAST_DAY = {"ch18": date(2105, 12, 31), "ch26": date(2149, 6, 6)}  # read back unchanged


@pytest.fixture(scope="module")
def private(tmp_path_factory) -> Iterator[Services]:
    services = private_services(tmp_path_factory.mktemp("bad-input-servers"), PORT_BASE)
    services.up()
    yield services
    discard(services)


def sql(url: str, query: str, **params: str) -> str:
    resp = requests.post(url, data=query.encode(), params=params, timeout=30)
    body = resp.content.decode("utf-8")
    assert resp.status_code == 200, body
    return body


@dataclass
class Target:
    url: str
    zookeeper: str
    table: str
    options: dict[str, str]
    before: str

    def rows(self) -> str:
        db, name = self.table.split(".")
        return sql(self.url, f"SELECT * FROM `{db}`.`{name}` ORDER BY id FORMAT TSV")

    def staging_left(self) -> list[str]:
        """Staging tables of this target's coordinator root on its server."""
        tag = root_tag(root_identity(self.zookeeper, self.options["zk_root"]))
        names = sql(self.url, "SELECT name FROM system.tables "
                              f"WHERE database = '{STAGING_DATABASE}'").split()
        return [n for n in names if n.endswith(f"_r{tag}")]


@pytest.fixture
def target(request, private: Services, server: str) -> Iterator[Target]:
    """A table with two rows on the test's server, and sink options with a sink id and a
    coordinator root of their own."""
    url = (private.clickhouse.url if server == "ch18"
           else request.getfixturevalue("modern_clickhouse_url"))
    db = f"bad_{uuid.uuid4().hex[:8]}"
    sql(url, f"CREATE DATABASE `{db}`")
    sql(url, f"CREATE TABLE `{db}`.`t` (id UInt64, day Date, code FixedString(4), "
             "small UInt8, name String) ENGINE = MergeTree() "
             "PARTITION BY toYYYYMM(day) ORDER BY id")
    sql(url, f"INSERT INTO `{db}`.`t` VALUES "
             "(1, '2026-01-15', 'abcd', 1, 'one'), (2, '2026-02-15', 'efgh', 2, 'two')")
    options = {"url": url, "zookeeper": private.zookeeper.hosts, "table": f"{db}.t",
               "sink_id": f"bad-{db}", "zk_root": f"/txsink-{db}"}
    t = Target(url, private.zookeeper.hosts, f"{db}.t", options, "")
    t.before = t.rows()
    yield t
    sql(url, f"DROP DATABASE IF EXISTS `{db}`")


def on_18_16_only(test):
    """Run ``test`` on 18.16 alone (its id still names the server)."""
    return pytest.mark.parametrize("server", ["ch18"], indirect=True)(test)


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
    code = cli.main(["gc", "--zookeeper", target.zookeeper, "--zk-root",
                     target.options["zk_root"], "--url", target.url, "--grace", "0"])
    assert code == 0
    assert target.staging_left() == [], "staging tables left after txsink gc"
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


def test_a_double_beyond_float32s_range_is_refused_not_stored_as_infinity(spark, target):
    db = target.table.split(".")[0]
    sql(target.url, f"CREATE TABLE `{db}`.`f` (id UInt64, ratio Float32) ENGINE = MergeTree() "
                    "ORDER BY id")
    df = frame(spark, (1, 1.5), (2, 1e300), schema="id long, ratio double")
    assert names(r"column `ratio`: value out of range for Float32.*value 1e\+300",
                 rejected(target, df, table=f"{db}.f"))
    assert sql(target.url, f"SELECT count() FROM `{db}`.`f`") == "0\n"


def test_date_after_the_servers_last_day_is_refused_naming_its_range(spark, target, server):
    last = LAST_DAY[server]
    day = last + timedelta(days=1)
    df = frame(spark, GOOD_ROW, (11, day, "qrst", 8, "eleven"))
    assert names(rf"column `day`: date outside the range of Date on ClickHouse "
                 rf"[\d.]+ \(1970-01-01 \.\. {last}\).*value {re.escape(repr(day))}",
                 rejected(target, df))


def test_a_day_after_2105_is_refused_by_18_16_and_written_to_26(spark, target, server):
    row = (11, date(2120, 1, 1), "qrst", 8, "eleven")
    if server == "ch18":  # 18.16 would read it back as another day
        assert names(r"column `day`: date outside .*2105-12-31", rejected(target, frame(
            spark, GOOD_ROW, row)))
        return
    (frame(spark, row).write.format("clickhouse_tx").options(**target.options)
        .mode("append").save())
    assert target.rows() == target.before + "11\t2120-01-01\tqrst\t8\televen\n"


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


def test_a_user_variable_set_after_the_session_started_reaches_the_write_once_registered(
        spark, target, monkeypatch):
    """The session's workers started before the variable was set; ``register`` hands
    them the variable, so the write runs as that (read-only) user and is refused."""
    monkeypatch.setenv("TXSINK_CLICKHOUSE_USER", READONLY_USER)
    try:
        txsink.register(spark)
        message = rejected(target, frame(spark, GOOD_ROW))
    finally:
        monkeypatch.delenv("TXSINK_CLICKHOUSE_USER")
        txsink.register(spark)  # later writes of this session run as before
    assert names(r"(?i)read-?only", message)


@on_18_16_only
@pytest.mark.timeout(120)
def test_a_sink_node_left_without_children_is_refused_naming_its_path(spark, target):
    """A sink node with no record and no children (made by hand, or by anyone: the
    shared ancestors are open) is refused, instead of hanging the writer."""
    from kazoo.client import KazooClient

    node = f"{target.options['zk_root']}/sinks/{target.options['sink_id']}"
    zk = KazooClient(hosts=target.zookeeper)
    zk.start(timeout=15)
    try:
        zk.create(node, b"", makepath=True)
        message = rejected(target, frame(spark, GOOD_ROW))
        assert zk.get_children(node) == []
    finally:
        zk.delete(target.options["zk_root"], recursive=True)
        zk.stop()
        zk.close()
    assert names(rf"{re.escape(node)} exists but does not hold", message), message[-500:]


MALFORMED_OPTIONS = {
    "unknown_option": ({"tabel": "x"}, r"unknown option\(s\): tabel"),
    "url_without_scheme": ({"url": "127.0.0.1:8123"}, r"url must start with http"),
    "url_with_credentials": ({"url": "http://bob:hunter2@127.0.0.1:8123"},
                             r"option url: 'http://\*\*\*@127.0.0.1:8123' carries credentials"),
    "timeout_not_a_number": ({"timeout": "soon"}, r"timeout='soon' is not a number"),
    "negative_retries": ({"retries": "-1"}, r"retries='-1' must be at least 0"),
    "session_timeout_below_two_seconds": ({"session_timeout": "0.5"},
                                          r"session_timeout='0.5' must be at least 2"),
    "zero_insert_block_rows": ({"insert_block_rows": "0"}, r"insert_block_rows='0'"),
    "timeout_nan": ({"timeout": "nan"}, r"timeout='nan' must be a finite number"),
    "timeout_infinite": ({"timeout": "inf"}, r"timeout='inf' must be a finite number"),
    "retries_beyond_range": ({"retries": "99999999"}, r"retries='99999999' must be at most"),
    "negative_max_partitions_per_job": ({"max_partitions_per_job": "-1"},
                                        r"max_partitions_per_job='-1' must be at least 0"),
    "root_zk_root": ({"zk_root": "/"}, r"zk_root='/' must be an absolute .* other than '/'"),
    "zk_root_under_zookeeper": ({"zk_root": "/zookeeper/x"},
                                r"zk_root='/zookeeper/x' must not be under /zookeeper"),
    "zk_root_with_a_control_character": ({"zk_root": "/tx\x01sink"},
                                         r"zk_root='/tx\\x01sink' must consist of printable"),
    "url_with_password_in_query": ({"url": "http://127.0.0.1:8123/?password=hunter2"},
                                   r"option url: 'http://127.0.0.1:8123/\?\*\*\*' must not"),
    "unknown_strategy": ({"strategy": "teleport"}, r"strategy='teleport' is not one of"),
    "relative_zk_root": ({"zk_root": "txsink"}, r"zk_root='txsink' must be an absolute"),
    "recover_on_start_not_boolean": ({"recover_on_start": "maybe"},
                                     r"recover_on_start='maybe' must be true or false"),
    "empty_table": ({"table": ""}, r"missing required option\(s\): table"),
    "empty_zookeeper": ({"zookeeper": ""}, r"missing required option\(s\): zookeeper"),
    "password_with_a_line_break": ({"password": "hunter2\nx"},
                                   r"option password .* cannot be used: .*line break"),
    "password_outside_latin1": ({"password": "hunter2\u20ac"},
                                r"option password .* cannot be used: .*outside Latin-1"),
    "txn_version_without_sink_id": ({"txn_version": "3", "sink_id": ""},
                                    r"txn_version needs sink_id"),
}


@on_18_16_only
@pytest.mark.parametrize("case", MALFORMED_OPTIONS, ids=list(MALFORMED_OPTIONS))
def test_malformed_option_is_rejected_naming_it(spark, target, case):
    options, expected = MALFORMED_OPTIONS[case]
    message = rejected(target, frame(spark, GOOD_ROW), **options)
    assert names(expected, message), message[-500:]
    assert "hunter2" not in message


# -- column types only the modern server has, that the writer does not write ---------------
# column -> (its ClickHouse type, a Spark expression of the natural Spark type for it). Each
# must be refused by name before anything is staged. (DateTime64, Date32, Bool, Map, JSON,
# IPv4/6, wide integers, Decimal256, Variant and Dynamic are written:
# tests/server_ext/test_column_types.py.)
MODERN_ONLY_TYPES = {
    "half": ("BFloat16", "CAST(0.5 AS FLOAT)"),
    "halves": ("Array(BFloat16)", "array(CAST(0.5 AS FLOAT))"),
}


@pytest.mark.parametrize("server", ["ch26"], indirect=True)
def test_modern_types_the_writer_lacks_are_refused_by_name_before_staging(spark, target):
    db = target.table.split(".")[0]
    columns = ", ".join(f"`{name}` {ch_type}" for name, (ch_type, _) in MODERN_ONLY_TYPES.items())
    sql(target.url, f"CREATE TABLE `{db}`.`modern` (id UInt64, {columns}) "
                    "ENGINE = MergeTree() ORDER BY id")
    df = spark.range(1).selectExpr(
        "id", *(f"{value} AS `{name}`" for name, (_, value) in MODERN_ONLY_TYPES.items()))
    message = rejected(target, df, table=f"{db}.modern")
    for name, (ch_type, _) in MODERN_ONLY_TYPES.items():
        element = "element: " if ch_type.startswith("Array(") else ""
        shown = ch_type.removeprefix("Array(")[:-1] if element else ch_type
        assert f"column `{name}`: {element}type {shown} is not supported by the writer" \
            in message, name
    assert sql(target.url, f"SELECT count() FROM `{db}`.`modern`").strip() == "0"
    # Not even created and swept: the query log shows no statement naming this root's staging.
    tag = root_tag(root_identity(target.zookeeper, target.options["zk_root"]))
    sql(target.url, "SYSTEM FLUSH LOGS")
    staged = sql(target.url, "SELECT count() FROM system.query_log WHERE "
                             f"position(query, '_r{tag}') > 0 AND position(query, 'system.') = 0")
    assert staged.strip() == "0"


@pytest.mark.parametrize("server", ["ch26"], indirect=True)
def test_a_read_only_replicated_target_is_refused_before_anything_is_decided(spark, target):
    """The modern server here has no Keeper for its Replicated tables: they are read-only,
    and a plain INSERT fails. Found only at publish, the xid would stay Committing."""
    db = target.table.split(".")[0]
    sql(target.url, f"CREATE TABLE `{db}`.`replicated` (id UInt64, day Date) ENGINE = "
                    f"ReplicatedMergeTree('/clickhouse/{db}/replicated', 'r1') "
                    "PARTITION BY toYYYYMM(day) ORDER BY id")
    df = frame(spark, (1, date(2026, 3, 1)), schema="id LONG, day DATE")
    message = rejected(target, df, table=f"{db}.replicated")
    assert names(r"replicated.*replica is read-only on this server.*Nothing was staged",
                 message), message
    done = cli.main(["status", "--zookeeper", target.zookeeper, "--zk-root",
                     target.options["zk_root"]])
    assert done == 0  # no xid left in doubt
