"""Idempotent reruns of batch jobs: option ``txn_version`` with ``sink_id`` as the
application id (Delta's ``txnAppId`` + ``txnVersion``).

A job whose version the sink has committed (or a newer one) writes nothing and succeeds
with one log line; the case it exists for is an orchestrator retrying a job whose driver
died after its decision or after its commit, before anyone saw it succeed.

On 18.16 only (``on_18_16_only``; the dead drivers' retries there too): a covered version
is decided in the coordinator at the job's plan, before any server is asked, and a job
that does write publishes as any write does; the data source's publish on the modern
server is tried by ``tests/spark/test_sink_batch.py``, and a covered rerun through
``txsink.write`` on both servers by ``tests/spark/test_spark_ways_in.py``.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

import txsink
from coordinator import Coordinator
from coordinator.sink_admin import SinkAdmin
from tests.conftest import on_18_16_only
from tests.harness.crash_arming import arm_env
from tests.sinkutil import (
    SHORT_SESSION,
    assert_exactly_once,
    create_events,
    driver_env,
    events_df,
    staging_tables,
)
from txsink.options import OptionError, parse_options

ROOT = Path(__file__).resolve().parents[2]
SINK = "nightly-load"


def write(spark, url: str, zookeeper: str, table: str, version: int, first: int,
          count: int = 400) -> None:
    (events_df(spark, first, count).write.format("clickhouse_tx").option("url", url)
        .option("zookeeper", zookeeper).option("table", table).option("sink_id", SINK)
        .option("txn_version", str(version)).options(**SHORT_SESSION).mode("append").save())


@pytest.fixture(autouse=True)
def _registered(spark) -> None:
    txsink.register(spark)


@pytest.fixture
def target(server_url, server_db) -> str:
    return create_events(server_url, server_db)


@pytest.fixture
def zookeeper(zk_hosts, zk_chroot) -> str:
    return zk_hosts + zk_chroot


@on_18_16_only
def test_rerun_of_a_committed_txn_version_writes_nothing(spark, server_url, zookeeper, target):
    write(spark, server_url, zookeeper, target, version=1, first=0)
    write(spark, server_url, zookeeper, target, version=1, first=0)
    assert_exactly_once(server_url, target, range(400))


@on_18_16_only
def test_job_with_a_lower_txn_version_than_the_committed_one_writes_nothing(
        spark, server_url, zookeeper, target):
    write(spark, server_url, zookeeper, target, version=5, first=0)
    write(spark, server_url, zookeeper, target, version=3, first=1000)
    assert_exactly_once(server_url, target, range(400))


@on_18_16_only
def test_job_with_a_higher_txn_version_writes(spark, server_url, zookeeper, target, zk):
    write(spark, server_url, zookeeper, target, version=1, first=0)
    write(spark, server_url, zookeeper, target, version=2, first=1000)
    assert_exactly_once(server_url, target, [*range(400), *range(1000, 1400)])
    assert Coordinator(zk, SINK).txn_version() == 2


@on_18_16_only
def test_covered_job_leaves_no_staging_and_no_xid(spark, server_url, zookeeper, target, zk):
    write(spark, server_url, zookeeper, target, version=1, first=0)
    before = staging_tables(server_url, {"zookeeper": zookeeper})
    write(spark, server_url, zookeeper, target, version=1, first=0)
    assert len(SinkAdmin(Coordinator(zk, SINK)).xids()) == 1
    assert staging_tables(server_url, {"zookeeper": zookeeper}) == before


@on_18_16_only
def test_transaction_with_a_committed_txn_version_writes_nothing(
        spark, server_url, zookeeper, target):
    for _ in range(2):
        with txsink.transaction(spark, url=server_url, zookeeper=zookeeper, sink_id=SINK,
                                txn_version="4") as tx:
            tx.write(events_df(spark, 0, 300), target)
    assert_exactly_once(server_url, target, range(300))


def test_txn_version_needs_a_sink_id():
    with pytest.raises(OptionError, match="txn_version needs sink_id"):
        parse_options({"url": "http://h:8123", "zookeeper": "z:2181", "table": "t",
                       "txn_version": "1"})


def test_txn_version_must_be_a_non_negative_integer():
    with pytest.raises(OptionError, match="txn_version"):
        parse_options({"url": "http://h:8123", "zookeeper": "z:2181", "table": "t",
                       "sink_id": "s", "txn_version": "-1"})


def test_streaming_write_refuses_txn_version(spark, clickhouse_url, ch_db, zk_hosts,
                                             zk_chroot, tmp_path):
    table = create_events(clickhouse_url, ch_db)
    stream = (spark.readStream.format("rate").option("rowsPerSecond", 1).load()
              .selectExpr("value AS id", "DATE'2026-01-01' AS day", "'x' AS name",
                          "0.0 AS value"))
    with pytest.raises(Exception, match="txn_version is for batch jobs"):
        query = (stream.writeStream.format("clickhouse_tx").option("url", clickhouse_url)
                 .option("zookeeper", zk_hosts + zk_chroot).option("table", table)
                 .option("sink_id", "s").option("txn_version", "1")
                 .option("checkpointLocation", str(tmp_path / "cp")).start())
        try:
            query.processAllAvailable()
        finally:
            query.stop()


# -- the driver dies after its decision / after its commit; the orchestrator retries ------


def killed_job(url: str, zookeeper: str, table: str, crash_at: str,
               once_dir: Path) -> subprocess.CompletedProcess:
    """The job ``txn_version=7`` (ids 0 .. 599) in a driver of its own, killed whole at
    ``crash_at``."""
    env = driver_env(**arm_env([crash_at], "group", once_dir))
    return subprocess.run(
        [sys.executable, "-m", "tests.jobs.versioned_batch", url, zookeeper, table, SINK,
         "7", "0", "600"],
        cwd=ROOT, capture_output=True, text=True, timeout=240, env=env,
        start_new_session=True)


@pytest.mark.parametrize("point", ["commit.after_decision", "commit.after_committed"])
def test_retry_after_the_driver_died_at_point_writes_every_row_once(
        spark, clickhouse_url, ch_db, zookeeper, zk, tmp_path, point):
    """The orchestrator's retry (here in this test's driver) finishes or finds the dead
    driver's xid, then finds its version committed: no xid of its own, no row again."""
    table = create_events(clickhouse_url, ch_db)
    killed = killed_job(clickhouse_url, zookeeper, table, point, tmp_path)
    assert killed.returncode == -9, killed.stderr[-3000:]
    write(spark, clickhouse_url, zookeeper, table, version=7, first=0, count=600)
    assert_exactly_once(clickhouse_url, table, range(600))
    coord = Coordinator(zk, SINK)
    assert len(SinkAdmin(coord).xids()) == 1 and coord.txn_version() == 7


def test_covered_job_logs_one_line(spark, clickhouse_url, ch_db, zookeeper, caplog):
    table = create_events(clickhouse_url, ch_db)
    txsink_log = logging.getLogger("txsink")
    write(spark, clickhouse_url, zookeeper, table, version=1, first=0)
    with caplog.at_level(logging.WARNING, logger=txsink_log.name):
        with txsink.transaction(spark, url=clickhouse_url, zookeeper=zookeeper,
                                sink_id=SINK, txn_version="1") as tx:
            tx.write(events_df(spark, 0, 10), table)
    assert [r.getMessage() for r in caplog.records if "already committed" in r.getMessage()
            ] == [f"txsink sink={SINK} txn_version=1 already committed (the sink's "
                  "txn_version is 1): nothing written"]
