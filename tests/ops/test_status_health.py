"""``txsink status --json`` carries, per sink, the counts an alert needs (``health``):
open xids by state and age, abandoned xids, the sink's staging tables and bytes, and the
last committed epoch and its age (``txsink/ops/status_report.py``)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

import server_ext
from coordinator import Coordinator
from server_ext.client.http_client import ClickHouseClient
from server_ext.staging import staging_qualified
from tests.conftest import run_sql
from txsink.ops import cli
from txsink.ops.status_report import OpenCount, SinkHealth, StagingUse
from txsink.options import root_identity

ROOT = "/txsink-health"
SINK = "health-sink"
HEALTH_FORMAT_1 = {
    "format": 1,
    "open": {"Aborting": {"count": 0, "oldest_age_s": None},
             "Committing": {"count": 1, "oldest_age_s": 12.5},
             "Initialized": {"count": 2, "oldest_age_s": 300.0}},
    "abandoned": {"count": 1, "oldest_age_s": 290.0},
    "staging": {"tables": 3, "bytes": 4096, "leftover_tables": 1,
                "servers_read": ["http://ch1:8123"], "servers_unread": []},
    "last_committed_epoch": 41, "last_committed_age_s": 8.0,
}


def test_a_format_1_health_record_reads_and_writes_back_unchanged() -> None:
    health = SinkHealth.from_json(HEALTH_FORMAT_1)
    assert health.open["Initialized"] == OpenCount(2, 300.0)
    assert health.staging == StagingUse(3, 4096, 1, ("http://ch1:8123",), ())
    assert health.to_json() == HEALTH_FORMAT_1


def test_a_health_record_of_a_newer_format_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="format 2 is newer"):
        SinkHealth.from_json({**HEALTH_FORMAT_1, "format": 2})


@pytest.fixture
def staged(clickhouse_url: str) -> Iterator[list[str]]:
    """Staging tables a test made; dropped after it (they are in the shared staging
    database, not in the test's own)."""
    names: list[str] = []
    yield names
    for name in names:
        qualified = staging_qualified(name)
        run_sql(clickhouse_url, f"DROP TABLE IF EXISTS {qualified}")


def stage(staged: list[str], coord: Coordinator | None, url: str, table: str, epoch: int,
          generation: int, root: str, branch_id: str) -> None:
    """A branch with 100 staged rows, named as a writer under ``root`` names it;
    registered with ``coord`` (None: a table no record names)."""
    client = ClickHouseClient(url)
    staging = server_ext.staging_table_name(SINK, epoch, branch_id, root=root)
    staged.append(staging)
    if coord is not None:
        coord.register_branch(epoch, branch_id, generation,
                              owner={"staging": staging, "server": url, "shard": 0})
    qualified = server_ext.create_staging_table(client, server_ext.describe_table(client, table),
                                                staging)
    run_sql(url, f"INSERT INTO {qualified} SELECT number FROM system.numbers LIMIT 100")


def test_status_json_counts_open_abandoned_and_staged_xids_and_the_last_commit(
        zk: KazooClient, zk_hosts: str, zk_chroot: str, clickhouse_url: str, ch_db: str,
        staged: list[str], capsys: pytest.CaptureFixture) -> None:
    zookeeper = zk_hosts + zk_chroot
    root = root_identity(zookeeper, ROOT)
    table = f"{ch_db}.t"
    run_sql(clickhouse_url, f"CREATE TABLE {table} (id UInt64) ENGINE = MergeTree ORDER BY id")
    old = Coordinator(zk, SINK, root=ROOT)
    generation = old.fence()
    committed = old.allocate_epoch()
    old.begin(committed, generation)
    old.commit(committed, generation, [], publish=lambda _: None, rollback=lambda _: None)
    superseded = old.allocate_epoch()  # its writer is fenced below: abandoned
    old.begin(superseded, generation)
    stage(staged, old, clickhouse_url, table, superseded, generation, root, "p0-a0-s0-00000001")
    new = Coordinator(zk, SINK, root=ROOT)
    current = new.fence()
    live = new.allocate_epoch()
    new.begin(live, current)
    stage(staged, new, clickhouse_url, table, live, current, root, "p0-a0-s0-00000002")
    # a committed xid's staging a crash left behind: txsink gc's
    stage(staged, None, clickhouse_url, table, committed, current, root, "p1-a0-s0-00000003")

    code = cli.main(["status", "--zookeeper", zookeeper, "--zk-root", ROOT, "--json"])
    (sink,) = json.loads(capsys.readouterr().out)["sinks"]
    health = SinkHealth.from_json(sink["health"])
    assert code == 0
    assert (health.open["Initialized"].count, health.open["Committing"].count) == (2, 0)
    assert health.abandoned.count == 1 and health.abandoned.oldest_age_s is not None
    assert health.staging is not None
    assert (health.staging.tables, health.staging.leftover_tables) == (3, 1)
    assert health.staging.bytes > 0 and health.staging.servers_unread == ()
    assert health.last_committed_epoch == committed
    assert health.last_committed_age_s is not None and health.last_committed_age_s >= 0
