"""The orphan sweeper and ``txsink gc``. Real 18.16 server and ZooKeeper.

Other tests run concurrently and keep staging tables in the same database. Every sweep
here acts for a coordinator root of its own, so by the sweeper's contract it can only drop
this test's tables: everything else is another root's (or untagged) and only reported.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from kazoo.client import KazooClient

from coordinator import Coordinator
from server_ext.client.http_client import ClickHouseClient
from server_ext.staging.staging_tables import (
    STAGING_DATABASE,
    StagingName,
    branch_key,
    create_staging_table,
    parse_staging_table_name,
    root_tag,
    sink_key,
    staging_table_name,
)
from server_ext.staging.sweeper import OTHER_ROOT, UNPARSEABLE, UNTAGGED, sweep
from server_ext.types.target_table import TargetTable, describe_table
from tests.conftest import run_sql
from txsink.ops import cli
from txsink.ops.commands import Operations
from txsink.options import parse_options, root_identity

HOUR = 3600.0
BRANCH = "p0-a0-00000000"


@pytest.fixture
def sink() -> str:
    return f"sweeper-test-{uuid.uuid4().hex}"


@pytest.fixture
def root() -> str:
    """A coordinator root identity of this test's own (no znodes needed for sweep())."""
    return f"/sweeper-test-{uuid.uuid4().hex}"


@pytest.fixture
def target(client: ClickHouseClient, clickhouse_url: str, ch_db: str) -> TargetTable:
    run_sql(clickhouse_url, f"CREATE TABLE `{ch_db}`.t (k UInt64) ENGINE = MergeTree() "
                            "ORDER BY k")
    return describe_table(client, f"{ch_db}.t")


@pytest.fixture
def stage(client: ClickHouseClient, clickhouse_url: str,
          target: TargetTable) -> Iterator[Callable[[str], str]]:
    """stage(name): create a staging table of that name; all are dropped after the test."""
    names: list[str] = []

    def create(name: str) -> str:
        create_staging_table(client, target, name)
        names.append(name)
        return name

    yield create
    for name in names:
        run_sql(clickhouse_url, f"DROP TABLE IF EXISTS `{STAGING_DATABASE}`.`{name}`")


@pytest.fixture
def stagings(client: ClickHouseClient, clickhouse_url: str, target: TargetTable,
             sink: str, root: str) -> Iterator[dict[int, str]]:
    """Staging tables of epochs 1, 2 and 3 of this test's sink and root; dropped after."""
    names = {epoch: staging_table_name(sink, epoch, BRANCH, root=root) for epoch in (1, 2, 3)}
    for name in names.values():
        create_staging_table(client, target, name)
    yield names
    for name in names.values():
        run_sql(clickhouse_url, f"DROP TABLE IF EXISTS `{STAGING_DATABASE}`.`{name}`")


def exists(url: str, name: str) -> bool:
    return run_sql(url, f"EXISTS TABLE `{STAGING_DATABASE}`.`{name}`").strip() == "1"


def only_epochs_live(sink: str, *epochs: int) -> Callable[[StagingName], bool]:
    """is_live: this sink's given epochs; any other xid of the root is unknown."""
    return lambda owner: owner.sink_key == sink_key(sink) and owner.epoch in epochs


def never_live(owner: StagingName) -> bool:
    return False


def reported(foreign, reason: str) -> set[str]:
    return {f.table for f in foreign if f.reason == reason}


# -- names ---------------------------------------------------------------------------------


def test_staging_name_carries_the_tag_of_its_root() -> None:
    name = staging_table_name("orders", 4, BRANCH, root="/prod/txsink")
    assert parse_staging_table_name(name) == StagingName(
        sink_key("orders"), 4, branch_key(BRANCH), root_tag("/prod/txsink"))
    assert name.startswith(f"txs_{sink_key('orders')}_")


def test_one_branch_of_two_roots_gets_two_staging_names() -> None:
    assert (staging_table_name("orders", 4, BRANCH, root="/a/txsink")
            != staging_table_name("orders", 4, BRANCH, root="/b/txsink"))


def test_longest_staging_name_is_103_characters_and_a_usable_table(
        clickhouse_url, stage) -> None:
    name = staging_table_name("s" * 500, 10**20 - 1, "b" * 500, root="/r" * 500)
    assert len(name) == 103 and parse_staging_table_name(name) is not None
    stage(name)
    run_sql(clickhouse_url, f"INSERT INTO `{STAGING_DATABASE}`.`{name}` VALUES (1)")
    assert run_sql(clickhouse_url, f"SELECT count() FROM `{STAGING_DATABASE}`.`{name}`") == "1\n"


def test_root_identity_is_chroot_plus_zk_root_without_the_host_list() -> None:
    assert root_identity("zk1:2181,zk2:2181/prod", "/txsink") == "/prod/txsink"
    assert root_identity("zk2:2181/prod/", "/txsink") == "/prod/txsink"
    assert root_identity("zk1:2181", "/prod/txsink") == "/prod/txsink"
    assert root_identity("zk1:2181", "/txsink") == "/txsink"


def test_sink_options_name_their_root() -> None:
    options = parse_options({"url": "http://ch:8123", "table": "db.t", "zk_root": "/jobs",
                             "zookeeper": "zk1:2181,zk2:2181/prod"}, env={})
    assert options.store.root_identity == "/prod/jobs"


def test_old_staging_name_without_root_tag_parses_as_untagged() -> None:
    old = StagingName(sink_key("orders"), 4, branch_key(BRANCH), root_tag=None).table
    assert "_r" not in old.rsplit("_", 1)[-1]
    assert parse_staging_table_name(old).root_tag is None


# -- sweep() ---------------------------------------------------------------------------------


def test_sweep_drops_staging_of_xids_that_are_not_live(
        client, clickhouse_url, sink, root, stagings) -> None:
    result = sweep(client, root, only_epochs_live(sink, 2), grace_seconds=60,
                   now=time.time() + HOUR)
    assert sorted(result.dropped) == sorted([stagings[1], stagings[3]])
    assert [exists(clickhouse_url, stagings[e]) for e in (1, 2, 3)] == [False, True, False]


def test_sweep_keeps_staging_younger_than_the_grace_period(
        client, clickhouse_url, sink, root, stagings) -> None:
    assert sweep(client, root, never_live, grace_seconds=HOUR).dropped == []
    assert all(exists(clickhouse_url, name) for name in stagings.values())


def test_sweep_hands_is_live_the_owner_parsed_from_the_name(
        client, sink, root, stagings) -> None:
    seen: list[StagingName] = []

    def record(owner: StagingName) -> bool:
        seen.append(owner)
        return True

    sweep(client, root, record, grace_seconds=0, now=time.time() + HOUR)
    assert sorted(owner.epoch for owner in seen) == [1, 2, 3]
    assert {(owner.sink_key, owner.root_tag) for owner in seen} == {
        (sink_key(sink), root_tag(root))}


def test_sweep_reports_and_keeps_tables_whose_names_are_not_staging_names(
        client, clickhouse_url, root, stagings) -> None:
    other = f"not_staging_{uuid.uuid4().hex}"
    run_sql(clickhouse_url, f"CREATE TABLE `{STAGING_DATABASE}`.`{other}` (k UInt8) "
                            "ENGINE = MergeTree() ORDER BY k")
    try:
        result = sweep(client, root, never_live, grace_seconds=0, now=time.time() + HOUR)
        assert other in reported(result.foreign, UNPARSEABLE)
        assert exists(clickhouse_url, other)
    finally:
        run_sql(clickhouse_url, f"DROP TABLE `{STAGING_DATABASE}`.`{other}`")


def test_sweep_reports_and_keeps_staging_of_another_root(
        client, clickhouse_url, sink, root, stage) -> None:
    theirs = stage(staging_table_name(sink, 1, BRANCH, root=root + "-other"))
    result = sweep(client, root, never_live, grace_seconds=0, now=time.time() + HOUR)
    assert theirs in reported(result.foreign, OTHER_ROOT)
    assert {f.root_tag for f in result.foreign if f.table == theirs} == {
        root_tag(root + "-other")}
    assert exists(clickhouse_url, theirs)


def test_sweep_reports_and_keeps_untagged_staging(
        client, clickhouse_url, sink, root, stage) -> None:
    old = stage(StagingName(sink_key(sink), 1, branch_key(BRANCH), root_tag=None).table)
    result = sweep(client, root, never_live, grace_seconds=0, now=time.time() + HOUR)
    assert old in reported(result.foreign, UNTAGGED)
    assert exists(clickhouse_url, old)


def test_sweep_does_not_report_its_own_roots_tables(
        client, sink, root, stagings) -> None:
    result = sweep(client, root, only_epochs_live(sink, 1, 2, 3), grace_seconds=0,
                   now=time.time() + HOUR)
    assert result.dropped == []
    assert not set(stagings.values()) & {f.table for f in result.foreign}


def test_repeated_sweep_drops_nothing_more(client, root, stagings) -> None:
    first = sweep(client, root, never_live, grace_seconds=0, now=time.time() + HOUR)
    second = sweep(client, root, never_live, grace_seconds=0, now=time.time() + HOUR)
    assert len(first.dropped) == 3 and second.dropped == []


# -- txsink gc: two coordinator roots sharing the staging database --------------------------


class Root:
    """A coordinator root as its writers and its ``txsink gc`` name it."""

    def __init__(self, zk: KazooClient, zookeeper: str, zk_root: str, zk_path: str) -> None:
        self.zk, self.zookeeper, self.zk_root = zk, zookeeper, zk_root
        self.zk_path = zk_path  # the same root, as seen through the test's chrooted client
        self.identity = root_identity(zookeeper, zk_root)

    def staging(self, sink: str, epoch: int) -> str:
        return staging_table_name(sink, epoch, BRANCH, root=self.identity)

    def xids(self, sink: str, **states: list[int]) -> None:
        """Create ``open`` (Initialized), ``aborted`` and ``committed`` xids of ``sink``."""
        coord = Coordinator(self.zk, sink, root=self.zk_path)
        generation = coord.fence()
        for epoch in [e for epochs in states.values() for e in epochs]:
            coord.begin(epoch, generation)
        for epoch in states.get("aborted", []):
            coord.abort(epoch, generation, rollback=lambda branch: None)
        for epoch in states.get("committed", []):
            coord.commit(epoch, generation, [], publish=lambda branch: None,
                         rollback=lambda branch: None)

    def gc(self, clickhouse_url: str) -> dict:
        """``txsink gc --grace 0`` of this root: every table is past the grace period."""
        ops = Operations(self.zookeeper, self.zk_root, url=clickhouse_url)
        try:
            return ops.gc(grace_seconds=0, prune_older_than=None)
        finally:
            ops.close()

    def cli_gc(self, clickhouse_url: str, *flags: str) -> list[str]:
        return ["gc", "--zookeeper", self.zookeeper, "--zk-root", self.zk_root,
                "--url", clickhouse_url, "--grace", "0", *flags]


@pytest.fixture
def root_a(zk: KazooClient, zk_hosts: str, zk_chroot: str) -> Root:
    """Root A: a chroot in the connection string, plus zk_root ``/a``."""
    return Root(zk, zk_hosts + zk_chroot, "/a", "/a")


@pytest.fixture
def root_b(zk: KazooClient, zk_hosts: str, zk_chroot: str) -> Root:
    """Root B: no chroot, the whole path in zk_root (``<test chroot>/b``)."""
    return Root(zk, zk_hosts, zk_chroot + "/b", "/b")


def foreign_entry(result: dict, table: str) -> dict | None:
    return next((f for f in result["foreign_staging"] if f["table"] == table), None)


def test_gc_keeps_and_reports_live_staging_of_another_root(
        clickhouse_url, sink, stage, root_a, root_b) -> None:
    root_b.xids(sink, open=[1])
    root_a.xids(sink, aborted=[1])  # the same sink id and epoch, finished under root A
    theirs = stage(root_b.staging(sink, 1))
    result = root_a.gc(clickhouse_url)
    assert exists(clickhouse_url, theirs)
    entry = foreign_entry(result, theirs)
    assert theirs not in result["dropped_staging"] and entry is not None
    assert (entry["server"], entry["reason"], entry["root_tag"]) == (
        clickhouse_url, OTHER_ROOT, root_tag(root_b.identity))


def test_gc_drops_its_own_roots_staging_of_finished_and_unknown_xids(
        clickhouse_url, sink, stage, root_a) -> None:
    root_a.xids(sink, aborted=[1], committed=[2], open=[3])
    aborted, committed, live, unknown_epoch, unknown_sink = (
        stage(root_a.staging(sink, 1)), stage(root_a.staging(sink, 2)),
        stage(root_a.staging(sink, 3)), stage(root_a.staging(sink, 4)),
        stage(root_a.staging(sink + "-never-registered", 1)))
    result = root_a.gc(clickhouse_url)
    assert sorted(result["dropped_staging"]) == sorted(
        [aborted, committed, unknown_epoch, unknown_sink])
    assert exists(clickhouse_url, live) and foreign_entry(result, live) is None


def test_gc_reports_and_keeps_untagged_staging(clickhouse_url, sink, stage, root_a) -> None:
    old = stage(StagingName(sink_key(sink), 1, branch_key(BRANCH), root_tag=None).table)
    result = root_a.gc(clickhouse_url)  # its xid is unknown to root A: the old gc dropped it
    assert exists(clickhouse_url, old)
    assert foreign_entry(result, old)["reason"] == UNTAGGED


def test_gc_json_lists_the_staging_it_left_and_why(
        capsys, clickhouse_url, sink, stage, root_a, root_b) -> None:
    theirs = stage(root_b.staging(sink, 1))
    old = stage(StagingName(sink_key(sink), 2, branch_key(BRANCH), root_tag=None).table)
    assert cli.main(root_a.cli_gc(clickhouse_url, "--json")) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["root"] == root_a.identity and result["root_tag"] == root_tag(root_a.identity)
    assert foreign_entry(result, theirs)["reason"] == OTHER_ROOT
    assert foreign_entry(result, old)["reason"] == UNTAGGED


def test_gc_text_lists_the_staging_it_left_and_why(
        capsys, clickhouse_url, sink, stage, root_a, root_b) -> None:
    theirs = stage(root_b.staging(sink, 1))
    old = stage(StagingName(sink_key(sink), 2, branch_key(BRANCH), root_tag=None).table)
    assert cli.main(root_a.cli_gc(clickhouse_url)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"root {root_a.identity} (staging tag r{root_tag(root_a.identity)})")
    assert any(theirs in line and f"another root's (tag r{root_tag(root_b.identity)})" in line
               for line in lines)
    assert any(old in line and "no root tag" in line for line in lines)
