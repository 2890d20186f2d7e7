"""Date and DateTime values are checked against the ranges of the server being written to.

ClickHouse 18.16 stores any UInt16 day number in a Date but reads back only 1970-01-01 ..
2105-12-31 (a later day shows as 1970-01-01, or as text it cannot parse back); the 26.x
engine reads back the whole storage range. The sink measures the ranges on the server
(``Capabilities.value_ranges``) and refuses a value outside them before it is staged,
naming the column, the value and the server's range; the failed write leaves nothing
behind (target unchanged, no staging table, no open xid).
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from zoneinfo import ZoneInfo

import pyarrow as pa
import pytest

import txsink
from coordinator import Coordinator, XidState
from coordinator.sink_admin import SinkAdmin
from server_ext.capabilities import detect_capabilities
from server_ext.client.http_client import ClickHouseClient
from server_ext.errors import InvalidValue
from server_ext.staging.staging_tables import parse_staging_table_name, sink_key
from server_ext.staging.writer import BranchWriter
from server_ext.types.row_checks import check_batch
from server_ext.types.target_table import Column, describe_table
from tests.conftest import kazoo_client, run_sql

LAST_DAY_18_16 = dt.date(2105, 12, 31)
LAST_DAY_STORED = dt.date(2149, 6, 6)  # UInt16 days: the last day of every server's storage


@dataclass
class Sink:
    url: str
    table: str
    options: dict[str, str]
    zk_hosts: str

    def rows(self) -> str:
        db, name = self.table.split(".")
        return run_sql(self.url, f"SELECT id, toUInt16(day), toString(day) FROM `{db}`.`{name}` "
                                 "ORDER BY id FORMAT TSV")

    def write(self, spark, *rows: tuple[int, dt.date]) -> None:
        df = spark.createDataFrame(list(rows), "id LONG, day DATE").coalesce(1)
        df.write.format("clickhouse_tx").options(**self.options).mode("append").save()

    def staging_left(self) -> list[str]:
        names = run_sql(self.url, "SELECT name FROM system.tables "
                                  "WHERE database = 'txsink_staging'").split()
        key = sink_key(self.options["sink_id"])
        return [n for n in names if (p := parse_staging_table_name(n)) and p.sink_key == key]

    def open_xids(self) -> list[XidState]:
        """States of every xid of the sink (read from ZooKeeper, not through Spark)."""
        zk = kazoo_client(self.options["zookeeper"])
        zk.start(timeout=15)
        try:
            return [r.state for r in SinkAdmin(Coordinator(zk, self.options["sink_id"])).xids()]
        finally:
            zk.stop()
            zk.close()


@pytest.fixture(autouse=True)
def _registered(spark) -> None:
    txsink.register(spark)


@pytest.fixture
def sink(clickhouse_url: str, zk_hosts: str, zk_chroot: str, ch_db: str) -> Iterator[Sink]:
    """A Date-partitioned table on the 18.16 server holding one row, and a sink of its own."""
    run_sql(clickhouse_url, f"CREATE TABLE `{ch_db}`.`t` (id UInt64, day Date) "
                            "ENGINE = MergeTree() PARTITION BY toYYYYMM(day) ORDER BY id")
    run_sql(clickhouse_url, f"INSERT INTO `{ch_db}`.`t` VALUES (1, '2026-01-15')")
    options = {"url": clickhouse_url, "zookeeper": zk_hosts + zk_chroot,
               "table": f"{ch_db}.t", "sink_id": f"ranges-{uuid.uuid4().hex[:8]}"}
    yield Sink(clickhouse_url, f"{ch_db}.t", options, zk_hosts)


# -- through Spark, against the real 18.16 server ------------------------------------------


def test_date_after_the_last_day_of_18_16_is_refused_and_leaves_nothing_behind(spark, sink):
    before = sink.rows()
    with pytest.raises(Exception) as info:
        sink.write(spark, (10, dt.date(2026, 3, 1)), (11, dt.date(2106, 1, 1)))
    message = str(info.value)
    assert re.search(r"column `day`: date outside the range of Date on ClickHouse 18\.16\S* "
                     r"\(1970-01-01 \.\. 2105-12-31\) \(row 1 of the batch, value "
                     r"datetime\.date\(2106, 1, 1\)\)", message), message[-800:]
    assert sink.rows() == before, "the target changed"
    assert sink.staging_left() == [], "a staging table was left behind"
    assert sink.open_xids() == [XidState.ABORTED], "the xid was not rolled back"


def test_the_last_day_of_18_16_round_trips(spark, sink):
    sink.write(spark, (12, LAST_DAY_18_16))
    db, name = sink.table.split(".")
    found = run_sql(sink.url, f"SELECT toUInt16(day), toString(day) FROM `{db}`.`{name}` "
                              f"WHERE day = '{LAST_DAY_18_16}' FORMAT TSV")
    assert found == f"{(LAST_DAY_18_16 - dt.date(1970, 1, 1)).days}\t{LAST_DAY_18_16}\n"


# -- the ranges themselves (no Spark) ------------------------------------------------------


def test_18_16_ranges_are_measured_on_the_server(clickhouse_url):
    ranges = detect_capabilities(ClickHouseClient(clickhouse_url)).value_ranges
    assert ranges.date_days == (0, (LAST_DAY_18_16 - dt.date(1970, 1, 1)).days)
    last_second = dt.datetime(2105, 12, 31, 23, 59, 59, tzinfo=dt.UTC).timestamp()
    assert ranges.datetime_wall == (0, int(last_second))


def test_a_datetime_range_on_18_16_follows_the_column_time_zone(clickhouse_url, ch_db):
    """The calendar bounds local wall-clock time: 1970-01-01 00:00 .. 2105-12-31 23:59:59
    in New York are other instants than in UTC, and both ends read back in that zone."""
    client = ClickHouseClient(clickhouse_url)
    run_sql(clickhouse_url, f"CREATE TABLE `{ch_db}`.`ny` (n UInt8, "
                            "at DateTime('America/New_York')) ENGINE = MergeTree() ORDER BY n")
    target = describe_table(client, f"{ch_db}.ny")
    caps = detect_capabilities(client)
    low, high = caps.value_ranges.datetime_seconds(target.column("at").chtype)
    zone = ZoneInfo("America/New_York")
    assert dt.datetime.fromtimestamp(low, zone).isoformat(" ") == "1970-01-01 00:00:00-05:00"
    assert dt.datetime.fromtimestamp(high, zone).isoformat(" ") == "2105-12-31 23:59:59-05:00"

    writer = BranchWriter(client, target, target.qualified, caps)
    ends = pa.record_batch({"n": pa.array([0, 1], pa.uint8()),
                            "at": pa.array([low, high], pa.timestamp("s", "UTC"))})
    writer.write(ends)
    writer.flush()
    shown = run_sql(clickhouse_url, f"SELECT toUInt32(at), toString(at), "
                                    f"toUInt32(toDateTime(toString(at), 'America/New_York')) "
                                    f"FROM `{ch_db}`.`ny` ORDER BY n FORMAT TSV")
    assert shown == (f"{low}\t1970-01-01 00:00:00\t{low}\n"
                     f"{high}\t2105-12-31 23:59:59\t{high}\n")
    for outside in (low - 1, high + 1):
        with pytest.raises(InvalidValue, match=r"outside the range of DateTime\('America/New_Y"):
            writer.write(pa.record_batch({"n": pa.array([2], pa.uint8()), "at": pa.array(
                [outside], pa.timestamp("s", "UTC"))}))


# -- the 26.x engine (chdb, in-process): its wider range is accepted there --------------------


def test_chdb_reads_back_every_stored_date_and_the_sink_accepts_them(clickhouse_url):
    from server_ext.client.chdb_client import ChdbClient

    chdb = ChdbClient.for_process()
    caps = detect_capabilities(chdb)
    assert caps.value_ranges.date_days == (0, 2**16 - 1)
    assert caps.value_ranges.datetime_wall == (None, None)

    db = f"ranges_{uuid.uuid4().hex[:8]}"
    chdb.execute(f"CREATE DATABASE `{db}`", purpose="create test database")
    try:
        chdb.execute(f"CREATE TABLE `{db}`.`t` (id UInt64, day Date) ENGINE = MergeTree() "
                     "ORDER BY id", purpose="create test table")
        target = describe_table(chdb, f"{db}.t")
        late = pa.record_batch({"id": pa.array([1, 2], pa.uint64()),
                                "day": pa.array([dt.date(2106, 1, 1), LAST_DAY_STORED])})
        writer = BranchWriter(chdb, target, target.qualified, caps)
        writer.write(late)  # accepted: this server reads these days back
        writer.flush()
        shown = chdb.query_rows(f"SELECT toString(day) AS day FROM `{db}`.`t` ORDER BY id",
                                purpose="read back")
        assert [r["day"] for r in shown] == ["2106-01-01", "2149-06-06"]

        on_18_16 = detect_capabilities(ClickHouseClient(clickhouse_url)).value_ranges
        with pytest.raises(InvalidValue, match=r"on ClickHouse 18\.16.*2105-12-31"):
            check_batch([Column("id", "UInt64"), Column("day", "Date")], late, on_18_16)
    finally:
        chdb.execute(f"DROP DATABASE IF EXISTS `{db}`", purpose="drop test database")
