"""The sharded half of ``create_table=if_missing`` (a Distributed table created above the
shards' local tables) and of ``bad_rows=quarantine`` (each shard's quarantine table),
against the real 2 shards x 2 replicas cluster (18.16).

Rows are counted per shard straight from the servers over HTTP (never through the sink
nor the Distributed table), on both replicas of a shard after ``SYSTEM SYNC REPLICA``,
each id checked on the shard ``id % 2`` names (``test_sink_cluster``'s counter)."""

from __future__ import annotations

import json

import pytest

import txsink
from tests.conftest import run_sql
from tests.core.test_sink_cluster import assert_sharded_exactly_once, shards_option, staging_left
from tests.harness.services import Cluster
from tests.sinkutil import assert_counts_exactly_once, events_df, save

ROWS = 200
CODED_COLUMNS = "(id UInt64, day Date, code UInt8, name String)"


@pytest.fixture(autouse=True)
def _registered(spark) -> None:
    txsink.register(spark)


def replicated_engine(db: str, name: str) -> str:
    return f"ReplicatedMergeTree('/clickhouse/tables/{{shard}}/{db}/{name}', '{{replica}}')"


def creating_options(cluster: Cluster, db: str, zk: str) -> dict[str, str]:
    """Options creating `db`.events on every replica of every shard and `db`.events_all
    (Distributed over them) on the main server, rows routed by ``id``."""
    assert cluster.main is not None
    return {"url": cluster.main.url, "zookeeper": zk, "sink_id": "created",
            "shards": shards_option(cluster.shard_urls()), "create_table": "if_missing",
            "engine": replicated_engine(db, "events"), "order_by": "id",
            "distributed_table": f"{db}.events_all", "cluster": cluster.name,
            "sharding_key": "id"}


def exists(url: str, table: str) -> bool:
    db, name = table.split(".")
    return run_sql(url, f"EXISTS TABLE `{db}`.`{name}`").strip() == "1"


def engine_of(url: str, table: str) -> str:
    db, name = table.split(".")
    return run_sql(url, f"SELECT engine FROM system.tables WHERE database = '{db}' "
                        f"AND name = '{name}'").strip()


def nothing_created(cluster: Cluster, db: str) -> None:
    assert cluster.main is not None
    assert not exists(cluster.main.url, f"{db}.events_all")
    for server in cluster.servers:
        assert not exists(server.url, f"{db}.events"), server.url


def test_a_write_creating_its_distributed_table_lands_every_row_once_on_its_shard(
        spark, cluster: Cluster, cluster_db: str, zk_hosts: str, zk_chroot: str):
    options = creating_options(cluster, cluster_db, zk_hosts + zk_chroot)
    save(events_df(spark, 0, ROWS, partitions=2), options, f"{cluster_db}.events")
    assert cluster.main is not None
    assert engine_of(cluster.main.url, f"{cluster_db}.events_all") == "Distributed"
    for server in cluster.servers:
        assert engine_of(server.url, f"{cluster_db}.events") == "ReplicatedMergeTree"
    assert_sharded_exactly_once(cluster.shard_urls(), f"{cluster_db}.events", range(ROWS))
    assert staging_left(cluster, "created") == {}


def test_an_incomplete_option_set_is_refused_before_anything_is_created(
        spark, cluster: Cluster, cluster_db: str, zk_hosts: str, zk_chroot: str):
    options = creating_options(cluster, cluster_db, zk_hosts + zk_chroot)
    del options["cluster"]
    with pytest.raises(Exception, match="option distributed_table needs cluster"):
        save(events_df(spark, 0, 10, partitions=1), options, f"{cluster_db}.events")
    nothing_created(cluster, cluster_db)


def test_a_cluster_the_url_server_does_not_know_is_refused_before_anything_is_created(
        spark, cluster: Cluster, cluster_db: str, zk_hosts: str, zk_chroot: str):
    options = {**creating_options(cluster, cluster_db, zk_hosts + zk_chroot),
               "cluster": "no_such_cluster"}
    with pytest.raises(Exception, match="cluster='no_such_cluster': the url server"):
        save(events_df(spark, 0, 10, partitions=1), options, f"{cluster_db}.events")
    nothing_created(cluster, cluster_db)


def is_bad(row_id: int) -> bool:
    """Whether :func:`coded_df` gives row ``row_id`` a code UInt8 cannot hold: ids of
    both parities, so both shards (``id % 2``) get bad rows."""
    return row_id % 25 == 7


def coded_df(spark, count: int, partitions: int = 2):
    return spark.range(0, count, numPartitions=partitions).selectExpr(
        "id", "date_add(DATE'2026-01-01', CAST(id % 90 AS INT)) AS day",
        "CAST(CASE WHEN id % 25 = 7 THEN 300 ELSE id % 200 END AS INT) AS code",
        "concat('e-', CAST(id AS STRING)) AS name")


def quarantined_ids(url: str, table: str) -> dict[int, int]:
    body = run_sql(url, f"SELECT row FROM {table} FORMAT JSONEachRow")
    counts: dict[int, int] = {}
    for line in body.splitlines():
        row_id = json.loads(json.loads(line)["row"])["id"]
        counts[row_id] = counts.get(row_id, 0) + 1
    return counts


def test_a_sharded_write_quarantines_each_bad_row_once_on_the_shard_its_branch_wrote_to(
        spark, cluster: Cluster, cluster_db: str, zk_hosts: str, zk_chroot: str):
    """Bad rows (``code`` out of UInt8) go to a quarantine table the sink creates on
    every replica of every shard, replicated within the shard."""
    for server in cluster.servers:
        run_sql(server.url, f"CREATE TABLE `{cluster_db}`.`coded` {CODED_COLUMNS} ENGINE = "
                            f"{replicated_engine(cluster_db, 'coded')} ORDER BY id")
    quarantine = f"{cluster_db}.bad_rows"
    options = {"url": cluster.shard_urls()[0][0], "zookeeper": zk_hosts + zk_chroot,
               "sink_id": "sharded-bad", "shards": shards_option(cluster.shard_urls()),
               "sharding_key": "id", "bad_rows": "quarantine", "quarantine_table": quarantine}
    save(coded_df(spark, ROWS, partitions=2), options, f"{cluster_db}.coded")
    good = [i for i in range(ROWS) if not is_bad(i)]
    assert_sharded_exactly_once(cluster.shard_urls(), f"{cluster_db}.coded", good)
    total: dict[int, int] = {}
    for index, replicas in enumerate(cluster.shard_urls()):
        per_replica = []
        for url in replicas:
            assert engine_of(url, quarantine) == "ReplicatedMergeTree"
            run_sql(url, f"SYSTEM SYNC REPLICA {quarantine}")
            per_replica.append(quarantined_ids(url, quarantine))
        assert per_replica[0] == per_replica[1], f"shard {index + 1}'s replicas differ"
        assert per_replica[0], f"shard {index + 1} kept no bad row"
        assert all(i % 2 == index for i in per_replica[0]), f"shard {index + 1} got another's"
        for row_id, count in per_replica[0].items():
            total[row_id] = total.get(row_id, 0) + count
    assert_counts_exactly_once(total, [i for i in range(ROWS) if is_bad(i)])
    assert staging_left(cluster, "sharded-bad") == {}


def test_a_quarantine_table_of_another_schema_on_one_shard_is_refused_before_any_is_created(
        spark, cluster: Cluster, cluster_db: str, zk_hosts: str, zk_chroot: str):
    """Every replica is checked before the table is created on any."""
    shards = [[replicas[0]] for replicas in cluster.shard_urls()]  # one replica per shard
    for (url,) in shards:
        run_sql(url, f"CREATE TABLE `{cluster_db}`.`coded` {CODED_COLUMNS} "
                     "ENGINE = MergeTree ORDER BY id")
    quarantine = f"{cluster_db}.bad_rows"
    run_sql(shards[1][0], f"CREATE TABLE {quarantine} (id UInt64) ENGINE = MergeTree ORDER BY id")
    options = {"url": shards[0][0], "zookeeper": zk_hosts + zk_chroot, "sink_id": "refused",
               "shards": shards_option(shards), "sharding_key": "id",
               "bad_rows": "quarantine", "quarantine_table": quarantine}
    with pytest.raises(Exception, match=f"{quarantine}.*a quarantine table has exactly"):
        save(coded_df(spark, 10, partitions=1), options, f"{cluster_db}.coded")
    assert not exists(shards[0][0], quarantine)
    assert staging_left(cluster, "refused") == {}
