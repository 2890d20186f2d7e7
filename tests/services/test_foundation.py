"""The ground every other test stands on: both real servers and Spark are usable."""

from __future__ import annotations

from kazoo.client import KazooClient

from tests.conftest import run_sql
from tests.harness.services import Services


def test_clickhouse_answers_over_http_and_sees_zookeeper(clickhouse_url: str) -> None:
    assert run_sql(clickhouse_url, "SELECT 1").strip() == "1"
    assert int(run_sql(clickhouse_url, "SELECT count() FROM system.zookeeper WHERE path = '/'"))


def test_each_test_gets_its_own_empty_database(clickhouse_url: str, ch_db: str) -> None:
    sql = f"SELECT count() FROM system.tables WHERE database = '{ch_db}'"
    tables = run_sql(clickhouse_url, sql)
    assert tables.strip() == "0"


def test_zookeeper_chroot_isolates_a_test(zk: KazooClient, zk_hosts: str, zk_chroot: str) -> None:
    zk.create("/marker", b"x")
    outside = KazooClient(hosts=zk_hosts)
    outside.start(timeout=15)
    try:
        assert outside.exists(f"{zk_chroot}/marker")
        assert not outside.exists("/marker")
    finally:
        outside.stop()


def test_up_is_idempotent_when_services_run(services: Services) -> None:
    pids = (services.zookeeper.process.pid(), services.clickhouse.process.pid())
    services.up()
    assert (services.zookeeper.process.pid(), services.clickhouse.process.pid()) == pids


def test_spark_local_mode_runs_a_job(spark) -> None:
    assert spark.range(1000).selectExpr("sum(id)").first()[0] == 499500
