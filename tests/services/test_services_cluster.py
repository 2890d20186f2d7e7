"""The sharded + replicated test topology (``./run services up --shards 2 --replicas 2``).

These pin what later sharding work relies on: every server is up with its own macros,
ReplicatedMergeTree copies between the replicas of a shard, a Distributed table on the
main server routes by the sharding key, and a SIGKILLed replica comes back and catches up.
"""

from __future__ import annotations

import socket
import time

import pytest
import requests

from tests.conftest import run_sql
from tests.harness import cli
from tests.harness.services import Cluster, Services, cluster_ports, port_open


def replicated_table(cluster: Cluster, db: str, table: str = "t",
                     shards: list[int] | None = None) -> None:
    """`db`.`table` (id UInt64, v String) as ReplicatedMergeTree on the shards' servers."""
    for index, shard in enumerate(cluster.shards):
        if shards is not None and index not in shards:
            continue
        for server in shard:
            run_sql(server.url, f"""
                CREATE TABLE `{db}`.`{table}` (id UInt64, v String)
                ENGINE = ReplicatedMergeTree('/clickhouse/tables/{{shard}}/{db}/{table}',
                                             '{{replica}}')
                ORDER BY id""")


def insert(url: str, sql: str, rows: list[tuple[int, str]], **params: str) -> None:
    body = "".join(f"{i}\t{v}\n" for i, v in rows).encode()
    resp = requests.post(url, params={"query": sql, **params}, data=body, timeout=30)
    assert resp.status_code == 200, resp.text


def ids(url: str, db: str, table: str = "t") -> list[int]:
    out = run_sql(url, f"SELECT id FROM `{db}`.`{table}` ORDER BY id")
    return [int(line) for line in out.split()]


def test_every_cluster_server_answers_with_its_own_macros(cluster: Cluster) -> None:
    for shard_index, shard in enumerate(cluster.shards, start=1):
        for replica_index, server in enumerate(shard, start=1):
            assert server.ready()
            macros = run_sql(server.url, "SELECT macro, substitution FROM system.macros "
                                         "ORDER BY macro")
            assert macros == f"replica\tr{replica_index}\nshard\t{shard_index:02d}\n"
            assert (server.shard, server.replica) == (shard_index, replica_index)


def test_main_and_cluster_servers_all_know_the_cluster_layout(cluster: Cluster) -> None:
    assert cluster.name == "txsink_cluster"
    assert cluster.main is not None
    for server in [cluster.main, *cluster.servers]:
        assert cluster.seen_by(server), server.name
    assert cluster.shard_urls() == [
        ["http://127.0.0.1:28511", "http://127.0.0.1:28512"],
        ["http://127.0.0.1:28521", "http://127.0.0.1:28522"],
    ]
    assert cluster.shards[1][0].tcp_port == cluster_ports(2, 1)[1] == 28621


def test_replicated_table_copies_an_insert_to_the_other_replica(
    cluster: Cluster, cluster_db: str
) -> None:
    replicated_table(cluster, cluster_db, shards=[0])
    first, second = cluster.shards[0]
    insert(first.url, f"INSERT INTO `{cluster_db}`.`t` FORMAT TabSeparated",
           [(1, "a"), (2, "b"), (3, "c")])
    run_sql(second.url, f"SYSTEM SYNC REPLICA `{cluster_db}`.`t`")
    assert ids(second.url, cluster_db) == [1, 2, 3]


def test_distributed_table_on_main_routes_rows_by_id_modulo_shard_count(
    cluster: Cluster, cluster_db: str
) -> None:
    replicated_table(cluster, cluster_db)
    assert cluster.main is not None
    run_sql(cluster.main.url, f"""
        CREATE TABLE `{cluster_db}`.`dist` (id UInt64, v String)
        ENGINE = Distributed(`{cluster.name}`, `{cluster_db}`, `t`, id)""")
    insert(cluster.main.url, f"INSERT INTO `{cluster_db}`.`dist` FORMAT TabSeparated",
           [(i, f"v{i}") for i in range(10)], insert_distributed_sync="1")
    # Weights 1 and 1: id % 2 == 0 goes to shard 1, id % 2 == 1 to shard 2, and each
    # shard's second replica gets its copy through ZooKeeper.
    for index, shard in enumerate(cluster.shards):
        for server in shard:
            run_sql(server.url, f"SYSTEM SYNC REPLICA `{cluster_db}`.`t`")
            assert ids(server.url, cluster_db) == list(range(index, 10, 2)), server.name
    assert ids(cluster.main.url, cluster_db, "dist") == list(range(10))


def test_killed_replica_restarts_and_catches_up(cluster: Cluster, cluster_db: str) -> None:
    replicated_table(cluster, cluster_db, shards=[1])
    survivor, victim = cluster.shards[1]
    assert victim.kill()
    assert not victim.ready()
    insert(survivor.url, f"INSERT INTO `{cluster_db}`.`t` FORMAT TabSeparated",
           [(7, "while down"), (8, "while down")])
    victim.start()
    # The restarted replica is read-only until its old ZooKeeper session expires
    # (session_timeout_ms), and only then pulls the missed part: poll.
    deadline = time.monotonic() + 30
    while ids(victim.url, cluster_db) != [7, 8]:
        assert time.monotonic() < deadline, "the restarted replica did not catch up"
        time.sleep(0.2)


def test_up_again_keeps_the_running_cluster_servers(cluster: Cluster) -> None:
    pids = [server.process.pid() for server in cluster.servers]
    assert None not in pids
    started = time.monotonic()
    cluster.up()
    assert time.monotonic() - started < 5
    assert [server.process.pid() for server in cluster.servers] == pids


def test_status_lists_every_cluster_server(services: Services, cluster: Cluster) -> None:
    view = Services(services.home, services.zookeeper, services.clickhouse,
                    shards=2, replicas=2)
    status = view.status()
    for server in cluster.servers:
        info = status[f"clickhouse-{server.name}"]
        assert info == {"pid": server.process.pid(), "ready": True, "address": server.url}


def test_down_stops_a_private_cluster_and_frees_its_ports(
    services: Services, tmp_path
) -> None:
    # A 1×1 cluster of its own (other home, other ports, no main server): stopping the
    # shared one would disturb other tests.
    base = next(b for b in range(30000, 40000, 300)
                if not any(port_open(p) for p in cluster_ports(1, 1, b)))
    private = Cluster(tmp_path / "cluster", services.zookeeper, None, 1, 1, port_base=base)
    private.up()
    server = private.servers[0]
    assert server.ready() and server.url == f"http://127.0.0.1:{base + 11}"
    assert private.down() == ["s1r1"]
    assert server.process.pid() is None
    assert not server.ready()


def test_cli_passes_shards_and_replicas_to_services(monkeypatch: pytest.MonkeyPatch) -> None:
    args = cli.build_parser().parse_args(["services", "up", "--shards", "2", "--replicas", "3"])
    assert (args.shards, args.replicas) == (2, 3)
    monkeypatch.setenv("TXSINK_SHARDS", "3")
    monkeypatch.delenv("TXSINK_REPLICAS", raising=False)
    topology = Services.from_env().cluster()
    assert (topology.shard_count, topology.replica_count) == (3, 1)
    assert topology.name == "txsink_cluster"


def test_stopping_a_server_that_is_not_running_does_not_wait_for_its_port(tmp_path) -> None:
    """A private pair's ``down()`` also stops a 1×1 cluster that was never started, whose
    ports are the shared cluster's: another's server listening there is not waited for."""
    from tests.harness.services import ClickHouse, ZooKeeper

    with socket.socket() as other:  # a server of someone else's on the port
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        server = ClickHouse(tmp_path, ZooKeeper(tmp_path), http_port=port)
        started = time.monotonic()
        assert server.stop() is False
        assert time.monotonic() - started < 1.0
