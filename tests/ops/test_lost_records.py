"""One record of progress lost: the sink refuses, naming the record, before anything more
is written, and never writes an epoch or a job a second time.

Each test deletes one znode of a sink that has history, as a botched restore or a hand
edit would, then lets the next actor run: a job of the same process, a rerun, a replay,
the commit of an xid already decided, ``txsink gc``.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from kazoo.client import KazooClient

import txsink
from coordinator import Coordinator, SinkTreeDamaged, XidState
from coordinator.plumbing.paths import SinkLayout
from coordinator.sink_admin import SinkAdmin
from server_ext.staging.manifest import Manifest, PartitionManifest, StagedPart
from tests.conftest import run_sql
from tests.coordinator.test_coordinator_support import new_coordinator, prepared_branches
from tests.sinkutil import (
    SHORT_SESSION,
    assert_exactly_once,
    create_events,
    events_df,
    staging_tables,
)
from txsink.core import payload

SINK = "lost-records"


def layout() -> SinkLayout:
    return SinkLayout("/txsink", SINK)


@pytest.fixture
def zookeeper(zk_hosts, zk_chroot) -> str:
    return zk_hosts + zk_chroot


@pytest.fixture
def target(server_url, server_db) -> str:
    return create_events(server_url, server_db)


def write(spark, url: str, zookeeper: str, table: str, first: int, **options: str) -> None:
    txsink.register(spark)
    (events_df(spark, first, 400).write.format("clickhouse_tx").option("url", url)
        .option("zookeeper", zookeeper).option("table", table).option("sink_id", SINK)
        .options(**SHORT_SESSION, **options).mode("append").save())


def test_a_job_after_last_committed_was_lost_is_refused_before_anything_is_staged(
        spark, server_url, zookeeper, target, zk):
    """The lost node in between two jobs of one process (whose first job checked the
    tree): the second job is refused at its start, not after its rows are published."""
    write(spark, server_url, zookeeper, target, first=0)
    zk.delete(layout().last_committed)
    with pytest.raises(Exception, match="last_committed"):
        write(spark, server_url, zookeeper, target, first=1000)
    assert_exactly_once(server_url, target, range(400))
    assert staging_tables(server_url, {"zookeeper": zookeeper}) == []


def test_a_rerun_after_the_txn_version_record_was_lost_is_refused_and_writes_nothing(
        spark, server_url, zookeeper, target, zk):
    write(spark, server_url, zookeeper, target, first=0, txn_version="5")
    zk.delete(layout().txn_version)
    with pytest.raises(Exception, match="txn_version is missing although xid .* committed "
                                        "txn_version 5"):
        write(spark, server_url, zookeeper, target, first=0, txn_version="5")
    assert_exactly_once(server_url, target, range(400))


def test_the_commit_of_a_decided_xid_whose_last_committed_was_lost_names_the_record(
        zk: KazooClient) -> None:
    """Step: between the decision and the ``Committed`` write. The xid stays
    ``Committing`` and every later attempt says which record is missing."""
    coord, generation = new_coordinator(zk, SINK)
    coord.begin(0, generation)
    winners = prepared_branches(coord, 0, generation, 2)

    def lose_last_committed(_branch: object) -> None:
        if zk.exists(layout().last_committed):
            zk.delete(layout().last_committed)

    with pytest.raises(SinkTreeDamaged, match="last_committed is missing"):
        coord.commit(0, generation, winners, publish=lose_last_committed,
                     rollback=lambda b: None)
    assert coord.xid(0).state is XidState.COMMITTING


def test_beginning_a_committed_epoch_whose_xid_record_was_lost_is_refused(
        zk: KazooClient) -> None:
    """A streaming replay of micro-batch 1 after its xid record was lost: a new xid
    would write the batch a second time."""
    coord, generation = new_coordinator(zk, SINK)
    for epoch in (0, 1):
        coord.begin(epoch, generation)
        coord.commit(epoch, generation, prepared_branches(coord, epoch, generation, 1),
                     publish=lambda b: None, rollback=lambda b: None)
    zk.delete(layout().xid(1), recursive=True)
    with pytest.raises(SinkTreeDamaged, match="record of epoch 1 was lost.*"
                                              "--committed-through 1"):
        coord.begin(1, generation)
    assert coord.xid(1) is None


def committed_epoch_0(zk: KazooClient, **commit: object) -> tuple[Coordinator, int]:
    """A sink whose epoch 0 committed (no branch): (coordinator, generation)."""
    coord, generation = new_coordinator(zk, SINK)
    coord.begin(0, generation)
    coord.commit(0, generation, [], publish=lambda b: None, rollback=lambda b: None,
                 **commit)  # type: ignore[arg-type]
    return coord, generation


def test_beginning_the_next_epoch_after_a_lost_xid_record_is_not_refused(
        zk: KazooClient) -> None:
    coord, generation = committed_epoch_0(zk)
    zk.delete(layout().xid(0), recursive=True)
    assert coord.begin(1, generation) is XidState.INITIALIZED


def test_reset_committed_through_lets_a_replay_of_the_lost_epoch_write_nothing(
        zk: KazooClient) -> None:
    committed_epoch_0(zk)
    zk.delete(layout().xid(0), recursive=True)
    SinkAdmin(Coordinator(zk, SINK)).reset_stream(committed_through=0)
    coord, generation = new_coordinator(zk, SINK)
    assert coord.begin(0, generation) is XidState.COMMITTED


def decided_xid_whose_driver_died(zk: KazooClient) -> None:
    """Xid 0 decided with one (empty) winner; the driver died before publishing it."""
    coord, generation = new_coordinator(zk, SINK)
    coord.begin(0, generation)

    def dies(_branch: object) -> None:
        raise KeyboardInterrupt("the driver dies")

    coord.register_branch(0, "p0-a0-1", generation, owner={})
    coord.prepare_branch(0, "p0-a0-1", payload.to_record(payload.StagedBranch(
        manifest=Manifest("db", "t", "txsink_staging", "s_p0", ()), strategy="move",
        staging="s_p0", server=None, rows=0)))
    with pytest.raises(KeyboardInterrupt):
        coord.commit(0, generation, ["p0-a0-1"], publish=dies, rollback=lambda b: None)


def operator(zk_hosts: str, zk_chroot: str, url: str, command: str
             ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "txsink", command, "--zookeeper",
                           zk_hosts + zk_chroot, "--url", url],
                          capture_output=True, text=True, timeout=120)


def test_a_committing_xid_whose_open_index_entry_was_lost_is_shown_and_finished_by_recover(
        zk, zk_hosts, zk_chroot, clickhouse_url):
    decided_xid_whose_driver_died(zk)
    zk.delete(layout().open_marker(0))
    status = operator(zk_hosts, zk_chroot, clickhouse_url, "status")
    assert status.returncode == 3 and "epoch 0: Committing" in status.stdout, status.stdout
    done = operator(zk_hosts, zk_chroot, clickhouse_url, "recover")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "open index had lost xid(s) [0]" in done.stderr
    assert Coordinator(zk, SINK).xid(0).state is XidState.COMMITTED
    assert zk.get_children(layout().open) == []


def test_gc_exits_3_naming_a_decided_xid_it_could_not_finish(zk, zk_hosts, zk_chroot,
                                                            clickhouse_url):
    """The driver died after the decision; then ``last_committed`` was lost. gc's
    recovery cannot mark the xid ``Committed``: gc says so and fails."""
    decided_xid_whose_driver_died(zk)
    zk.delete(layout().last_committed)
    done = operator(zk_hosts, zk_chroot, clickhouse_url, "gc")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "NOT finished" in done.stdout and "last_committed is missing" in done.stdout


def test_recover_of_a_decided_xid_whose_winner_record_was_lost_says_what_is_lost(
        zk, zk_hosts, zk_chroot, clickhouse_url):
    decided_xid_whose_driver_died(zk)
    zk.delete(layout().branch(0, "p0-a0-1"), recursive=True)
    done = operator(zk_hosts, zk_chroot, clickhouse_url, "recover")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "winner(s) p0-a0-1 of xid lost-records/0 have no record" in done.stdout
    assert "--branch B" not in done.stdout  # resolve cannot act on a branch it cannot read


def test_recover_of_a_published_xid_whose_last_committed_was_lost_offers_no_copy_or_give_up(
        zk, zk_hosts, zk_chroot, clickhouse_url):
    """Its rows are published: only the record is missing. Copying staged rows out or
    giving partitions up would be wrong."""
    decided_xid_whose_driver_died(zk)
    zk.delete(layout().last_committed)
    done = operator(zk_hosts, zk_chroot, clickhouse_url, "recover")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "rows are published" in done.stdout and "--give-up" not in done.stdout, done.stdout


@pytest.mark.parametrize("record", ["last_committed", "txn_version"])
def test_status_names_a_lost_record_that_refuses_every_writer_and_exits_3(
        zk, zk_hosts, zk_chroot, clickhouse_url, record):
    committed_epoch_0(zk, txn_version=4)
    zk.delete(getattr(layout(), record))
    done = operator(zk_hosts, zk_chroot, clickhouse_url, "status")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "DAMAGED (every writer is refused): " in done.stdout
    assert record in done.stdout.split("DAMAGED", 1)[1]


@pytest.mark.parametrize("server", ["ch26"], indirect=True)
def test_recover_of_moved_partitions_whose_intent_was_lost_first_offers_attached_yes(
        zk, zk_hosts, zk_chroot, server_url, server_db):
    """``move``: the partition left staging and no intent names it: a refusal, with the
    rows possibly in the target. Giving them up would record published rows as lost."""
    run_sql(server_url, f"CREATE TABLE `{server_db}`.`t` (id UInt64) "
                                   "ENGINE = MergeTree() ORDER BY id")
    coord, generation = new_coordinator(zk, SINK)
    coord.begin(0, generation)
    moved = PartitionManifest("all", "tuple()", (StagedPart("all_1_1_0", 10, 100),))
    coord.register_branch(0, "p0-a0-1", generation, owner={})
    coord.prepare_branch(0, "p0-a0-1", payload.to_record(payload.StagedBranch(
        manifest=Manifest(server_db, "t", "txsink_staging", "s_moved", (moved,)),
        strategy="move", staging="s_moved", server=server_url, rows=10)))

    def dies(_branch: object) -> None:
        raise KeyboardInterrupt("the driver dies after the MOVE")

    with pytest.raises(KeyboardInterrupt):
        coord.commit(0, generation, ["p0-a0-1"], publish=dies, rollback=lambda b: None)
    done = operator(zk_hosts, zk_chroot, server_url, "recover")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "StagingChanged" in done.stdout
    first = done.stdout.split("WHAT TO DO", 1)[-1]
    assert first.index("--attached yes") < first.index("--give-up"), done.stdout
