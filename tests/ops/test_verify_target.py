"""``txsink verify`` compares what the targets hold with what committed xids put there.

Every xid here goes through the real protocol on ClickHouse 18.16 and ZooKeeper: a
branch is registered, staged, sealed into a manifest, recorded ``Prepared`` in the
branch record format of ``txsink/core/attempt.py`` and published by ``BranchPublisher``. The
anomalies are then made behind the sink's back with plain SQL, as a race or an operator
would.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

import server_ext
from coordinator import Coordinator
from coordinator.formats.steps import RETAIN_AFTER_FOLD
from coordinator.sink_admin import SinkAdmin
from server_ext.client.http_client import ClickHouseClient
from server_ext.staging import staging_qualified
from server_ext.target_rows import table_rows
from tests.conftest import run_sql
from tests.coordinator.test_coordinator_support import Crash, crash_at
from tests.harness.services import SECRET_USER
from txsink.core.history_summary import fold_into
from txsink.core.publisher import BranchPublisher
from txsink.ops import cli
from txsink.ops.commands import Operations, render

ROOT = "/txsink-verify"
SINK = "verify-sink"


class Writer:
    """One sink writing ``table`` the way a batch job does, one branch per xid."""

    def __init__(self, zk: KazooClient, url: str, table: str, sink: str = SINK,
                 **coordinator_options: object) -> None:
        self.url = url
        self.sink = sink
        self.client = ClickHouseClient(url)
        self.coord = Coordinator(zk, sink, root=ROOT, **coordinator_options)  # type: ignore[arg-type]
        self.generation = self.coord.fence()
        self.target = server_ext.describe_table(self.client, table)
        self.strategy = server_ext.choose_strategy(
            server_ext.detect_capabilities(self.client), self.target)
        self.publisher = BranchPublisher(lambda u: ClickHouseClient(u or url), self.coord)

    def commit(self, rows: dict[str, range], overwrite: bool = False) -> int:
        """Commit one xid putting ``rows[month]`` (ids) into each month's partition."""
        epoch = self.coord.allocate_epoch()
        self.coord.begin(epoch, self.generation)
        branch_id, payload = self._stage(epoch, rows)
        winner = branch_id
        if overwrite:  # as txsink/core/driver.py: a synthetic branch replaces the partitions
            winner = f"overwrite-{uuid.uuid4().hex[:8]}"
            staging = server_ext.staging_table_name(self.sink, epoch, winner)
            self.coord.register_branch(epoch, winner, self.generation,
                                       owner={"staging": staging, "server": self.url})
            self.coord.prepare_branch(epoch, winner, {
                "overwrite_of": [payload["manifest"]], "staging": staging,
                "strategy": self.strategy, "server": self.url, "rows": payload["rows"]})
        self.coord.commit(epoch, self.generation, [winner], publish=self.publisher.publish,
                          rollback=self.publisher.rollback)
        return epoch

    def abort_after_leak(self, rows: dict[str, range]) -> tuple[int, str]:
        """Stage one xid, copy its staged rows into the target behind the sink's back (as
        an ATTACH by hand would), then roll the xid back: (epoch, branch id)."""
        epoch = self.coord.allocate_epoch()
        self.coord.begin(epoch, self.generation)
        branch_id, payload = self._stage(epoch, rows)
        staging = staging_qualified(payload["staging"])
        run_sql(self.url, f"INSERT INTO {self.target.qualified} SELECT * FROM {staging}")
        self.coord.abort(epoch, self.generation, rollback=self.publisher.rollback)
        return epoch, branch_id

    def _stage(self, epoch: int, rows: dict[str, range]) -> tuple[str, dict]:
        branch_id = f"p0-a0-s0-{uuid.uuid4().hex[:8]}"
        staging = server_ext.staging_table_name(self.sink, epoch, branch_id)
        self.coord.register_branch(epoch, branch_id, self.generation,
                                   owner={"staging": staging, "server": self.url, "shard": 0})
        qualified = server_ext.create_staging_table(self.client, self.target, staging)
        for month, ids in rows.items():
            run_sql(self.url, f"INSERT INTO {qualified} SELECT number, toDate('{month}-15'), "
                              f"'x' FROM system.numbers WHERE number >= {ids.start} "
                              f"LIMIT {len(ids)}")
        total = sum(len(ids) for ids in rows.values())
        manifest = server_ext.digested(
            server_ext.seal(self.client, self.target, qualified, expected_rows=total),
            server_ext.staged_digests(self.client, self.target, qualified))
        payload = {"manifest": manifest.to_dict(), "strategy": self.strategy,
                   "overwrite": False, "staging": staging, "server": self.url, "rows": total}
        self.coord.prepare_branch(epoch, branch_id, payload)
        return branch_id, payload


@pytest.fixture
def zk_address(zk_hosts: str, zk_chroot: str) -> str:
    return zk_hosts + zk_chroot


@pytest.fixture
def ops(zk_address: str, clickhouse_url: str) -> Iterator[Operations]:
    operations = Operations(zk_address, zk_root=ROOT, url=clickhouse_url)
    yield operations
    operations.close()


def create_table(url: str, db: str, engine: str = "MergeTree()") -> str:
    run_sql(url, f"CREATE TABLE `{db}`.`events` (id UInt64, day Date, name String) "
                 f"ENGINE = {engine} PARTITION BY toYYYYMM(day) ORDER BY id")
    return f"{db}.events"


@pytest.fixture
def table(clickhouse_url: str, ch_db: str) -> str:
    return create_table(clickhouse_url, ch_db)


@pytest.fixture
def writer(zk: KazooClient, clickhouse_url: str, table: str) -> Writer:
    return Writer(zk, clickhouse_url, table)


def mutate(url: str, table: str, command: str) -> None:
    """``ALTER TABLE table <command>``, waiting until the mutation is done (18.16 has no
    ``mutations_sync``)."""
    database, name = table.split(".")
    run_sql(url, f"ALTER TABLE {table} {command}")
    pending = (f"SELECT count() FROM system.mutations WHERE database = '{database}' "
               f"AND table = '{name}' AND NOT is_done")
    deadline = time.monotonic() + 30
    while run_sql(url, pending).strip() != "0":
        assert time.monotonic() < deadline, f"mutation of {table} not done: {command}"
        time.sleep(0.1)


def target_report(ops: Operations, **options: object) -> dict:
    (sink,) = ops.verify(SINK, **options)["sinks"]  # type: ignore[arg-type]
    return sink


def run_cli(zk_address: str, url: str, capsys: pytest.CaptureFixture, *flags: str
            ) -> tuple[int, dict]:
    code = cli.main(["verify", "--zookeeper", zk_address, "--zk-root", ROOT, "--url", url,
                     "--json", *flags])
    return code, json.loads(capsys.readouterr().out)


def test_after_normal_jobs_verify_is_ok(ops: Operations, writer: Writer) -> None:
    writer.commit({"2026-01": range(0, 100), "2026-02": range(100, 150)})
    writer.commit({"2026-02": range(150, 180)})
    sink = target_report(ops)
    assert sink["anomalies"] == []
    assert (sink["target"]["partitions_ok"], sink["target"]["not_judged"]) == (2, [])
    assert render("verify", {"sinks": [sink]}).splitlines()[0] == f"{SINK}: ok"


def test_rows_duplicated_behind_the_sinks_back_are_a_duplicate_naming_partition_and_xid(
        ops: Operations, writer: Writer, table: str, clickhouse_url: str) -> None:
    writer.commit({"2026-01": range(0, 100), "2026-02": range(100, 150)})
    second = writer.commit({"2026-02": range(150, 180)})
    run_sql(clickhouse_url, f"INSERT INTO {table} SELECT * FROM {table} WHERE id >= 150")
    sink = target_report(ops, writers="exclusive")
    (finding,) = sink["target"]["anomalies"]
    assert (finding["kind"], finding["table"], finding["partition_id"]) == (
        "duplicate_rows", table, "202602")
    assert (finding["rows"], finding["expected"]) == (110, 80)
    assert f"exactly a second copy of what {SINK}/{second} put there" in finding["detail"]
    assert finding["judged_by"] == "content"
    assert sink["anomalies"] == [finding["detail"]]


def test_a_duplicate_makes_the_command_fail(
        writer: Writer, table: str, clickhouse_url: str, zk_address: str,
        capsys: pytest.CaptureFixture) -> None:
    writer.commit({"2026-01": range(0, 100)})
    assert run_cli(zk_address, clickhouse_url, capsys, "--exclusive-target")[0] == 0
    run_sql(clickhouse_url, f"INSERT INTO {table} SELECT * FROM {table}")
    code, result = run_cli(zk_address, clickhouse_url, capsys, "--exclusive-target")
    assert code == 1
    assert [a["kind"] for a in result["sinks"][0]["target"]["anomalies"]] == ["duplicate_rows"]


def test_extra_rows_without_a_writers_statement_are_unexplained_and_fail(
        writer: Writer, table: str, clickhouse_url: str, zk_address: str,
        capsys: pytest.CaptureFixture) -> None:
    writer.commit({"2026-01": range(0, 100)})
    run_sql(clickhouse_url, f"INSERT INTO {table} VALUES (1000, '2026-01-20', 'other')")
    code, result = run_cli(zk_address, clickhouse_url, capsys)
    (finding,) = result["sinks"][0]["target"]["anomalies"]
    assert (code, finding["kind"], finding["rows"], finding["expected"]) == (
        1, "unexplained_rows", 101, 100)


def test_a_partition_no_xid_wrote_holds_another_writers_rows_and_is_not_judged(
        writer: Writer, table: str, clickhouse_url: str, zk_address: str,
        capsys: pytest.CaptureFixture) -> None:
    """Rows the table held before the sink (or that a dynamic overwrite left alone) in a
    partition no xid wrote: a publish never lands there, so they are another writer's."""
    run_sql(clickhouse_url, f"INSERT INTO {table} VALUES (1000, '2025-12-20', 'before')")
    writer.commit({"2026-01": range(0, 100)})
    code, result = run_cli(zk_address, clickhouse_url, capsys)
    target = result["sinks"][0]["target"]
    assert (code, target["anomalies"], target["partitions_ok"]) == (0, [], 1)
    (other,) = target["not_judged"]
    assert (other["partition_id"], other["cause"]) == ("202512", "other_writer")
    assert "its 1 rows are another writer's" in other["reason"]


def test_a_partition_no_xid_wrote_is_extra_rows_in_an_exclusive_target(
        writer: Writer, table: str, clickhouse_url: str, zk_address: str,
        capsys: pytest.CaptureFixture) -> None:
    run_sql(clickhouse_url, f"INSERT INTO {table} VALUES (1000, '2025-12-20', 'before')")
    writer.commit({"2026-01": range(0, 100)})
    code, result = run_cli(zk_address, clickhouse_url, capsys, "--exclusive-target")
    (finding,) = result["sinks"][0]["target"]["anomalies"]
    assert (code, finding["kind"], finding["partition_id"]) == (1, "duplicate_rows", "202512")


def test_extra_rows_in_a_shared_target_are_not_judged(
        writer: Writer, table: str, clickhouse_url: str, zk_address: str,
        capsys: pytest.CaptureFixture) -> None:
    writer.commit({"2026-01": range(0, 100)})
    run_sql(clickhouse_url, f"INSERT INTO {table} VALUES (1000, '2026-01-20', 'other')")
    code, result = run_cli(zk_address, clickhouse_url, capsys, "--shared-target")
    target = result["sinks"][0]["target"]
    assert (code, target["anomalies"], len(target["not_judged"])) == (0, [], 1)
    assert "other writers" in target["not_judged"][0]["reason"]


def test_a_target_verify_cannot_read_fails_the_command_as_not_judged(
        writer: Writer, clickhouse_url: str, zk_address: str,
        capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    writer.commit({"2026-01": range(0, 100)})
    monkeypatch.setenv("TXSINK_CLICKHOUSE_USER", SECRET_USER)
    monkeypatch.setenv("TXSINK_CLICKHOUSE_PASSWORD", "not-the-password")
    code, result = run_cli(zk_address, clickhouse_url, capsys)
    (unjudged,) = result["sinks"][0]["target"]["not_judged"]
    assert (code, unjudged["cause"]) == (4, "unreadable")
    assert "cannot read the target" in unjudged["reason"]
    assert "not-the-password" not in json.dumps(result)


def test_a_dropped_partition_is_a_loss_that_fails_the_command(
        writer: Writer, table: str, clickhouse_url: str, zk_address: str,
        capsys: pytest.CaptureFixture) -> None:
    writer.commit({"2026-01": range(0, 100), "2026-02": range(100, 150)})
    run_sql(clickhouse_url, f"ALTER TABLE {table} DROP PARTITION 202601")
    code, result = run_cli(zk_address, clickhouse_url, capsys, "--exclusive-target")
    (finding,) = result["sinks"][0]["target"]["anomalies"]
    assert (code, finding["kind"], finding["partition_id"]) == (1, "missing_rows", "202601")
    assert (finding["rows"], finding["expected"]) == (0, 100)
    assert result["sinks"][0]["target"]["partitions_ok"] == 1


def test_a_partition_pruned_without_a_summary_is_not_judged(
        ops: Operations, writer: Writer, table: str, clickhouse_url: str) -> None:
    writer.commit({"2026-01": range(0, 100), "2026-02": range(100, 150)})
    time.sleep(0.3)
    assert SinkAdmin(writer.coord).prune(0.2) == [0]
    writer.commit({"2026-02": range(150, 180)})
    run_sql(clickhouse_url, f"INSERT INTO {table} SELECT * FROM {table} WHERE id >= 150")
    sink = target_report(ops, writers="exclusive")
    assert sink["anomalies"] == []
    unjudged = {n["partition_id"]: n["reason"] for n in sink["target"]["not_judged"]}
    assert sorted(unjudged) == ["202601", "202602"]
    no_record = ("no record: pruned without a summary (by an older release, or its record "
                 "was unreadable), or declared committed by txsink reset")
    assert f"{SINK} epochs 0 ({no_record})" in unjudged["202602"]
    assert sink["target"]["unknown_history"] == [
        {"first": 0, "last": 0, "reason": no_record}]
    text = render("verify", {"sinks": [sink]})
    assert text.splitlines()[0] == f"{SINK}: no anomaly found, but 2 target partition(s) not judged"


def prune_with_summary(writer: Writer) -> list[int]:
    """Retention as the writers run it: what the pruned xids wrote folded into the summary."""
    time.sleep(0.3)
    return SinkAdmin(writer.coord).prune(0.2, fold_into(writer.url))


def test_after_retention_every_partition_is_judged_by_content(
        ops: Operations, writer: Writer) -> None:
    writer.commit({"2026-01": range(0, 100), "2026-02": range(100, 150)})
    writer.commit({"2026-02": range(150, 180)})
    assert prune_with_summary(writer) == [0, 1]
    writer.commit({"2026-02": range(180, 200)})
    sink = target_report(ops, writers="exclusive")
    assert sink["anomalies"] == []
    assert (sink["target"]["partitions_ok"], sink["target"]["partitions_ok_by_count"],
            sink["target"]["not_judged"], sink["target"]["unknown_history"]) == (2, 0, [], [])


def test_a_duplicate_of_a_summarized_xid_is_found_by_content(
        ops: Operations, writer: Writer, table: str, clickhouse_url: str) -> None:
    writer.commit({"2026-01": range(0, 100)})
    prune_with_summary(writer)
    run_sql(clickhouse_url, f"INSERT INTO {table} SELECT * FROM {table}")
    (finding,) = target_report(ops, writers="exclusive")["target"]["anomalies"]
    assert (finding["kind"], finding["rows"], finding["expected"], finding["judged_by"]) == (
        "duplicate_rows", 200, 100, "content")
    assert f"{SINK}/0..0 (pruned, summarized)" in finding["detail"]


def test_rows_changed_in_a_summarized_partition_are_altered_rows(
        ops: Operations, writer: Writer, table: str, clickhouse_url: str) -> None:
    writer.commit({"2026-01": range(0, 100)})
    prune_with_summary(writer)
    mutate(clickhouse_url, table, "UPDATE name = 'changed' WHERE id = 7")
    (finding,) = target_report(ops, writers="exclusive")["target"]["anomalies"]
    assert (finding["kind"], finding["partition_id"]) == ("altered_rows", "202601")


def test_an_overwrite_folded_into_the_summary_replaces_what_came_before(
        ops: Operations, writer: Writer) -> None:
    writer.commit({"2026-01": range(0, 100)})
    writer.commit({"2026-01": range(500, 540)}, overwrite=True)
    writer.commit({"2026-01": range(600, 610)})
    prune_with_summary(writer)
    target = target_report(ops, writers="exclusive")["target"]
    assert (target["partitions_ok"], target["not_judged"]) == (1, [])


def test_an_xid_read_while_retention_folds_it_is_counted_once(
        ops: Operations, writer: Writer, zk: KazooClient) -> None:
    """The summary holds the epoch and its record is still there (a pass crashed between
    its fold and its delete, or a reader read the record before the fold)."""
    writer.commit({"2026-01": range(0, 100)})
    time.sleep(0.3)
    crashing = Coordinator(zk, SINK, root=ROOT, on_step=crash_at(RETAIN_AFTER_FOLD))
    with pytest.raises(Crash):
        crashing.retain(0.2, fold_into(writer.url))
    assert writer.coord.xid(0) is not None
    target = target_report(ops, writers="exclusive")["target"]
    assert (target["anomalies"], target["partitions_ok"]) == ([], 1)


def test_status_shows_the_retained_window_and_the_summary(
        ops: Operations, writer: Writer) -> None:
    writer.commit({"2026-01": range(0, 100), "2026-02": range(100, 150)})
    prune_with_summary(writer)
    writer.commit({"2026-02": range(150, 180)})
    (sink,) = ops.status(SINK)["sinks"]
    assert sink["retention"] == {
        "retained_xids": 1, "oldest_retained": 1, "pruned_committed": [[0, 0]],
        "pruned_aborted": [], "summary_partitions": 2, "summary_folded": [[0, 0]]}
    assert "history: 1 xid(s) retained (oldest epoch 1); 1 committed epoch(s) pruned, 1 of " \
        "them in the summary (2 partition(s))" in render("status", {"sinks": [sink]})


def test_a_lost_winner_record_fails_the_command_naming_the_xid(
        writer: Writer, zk: KazooClient, clickhouse_url: str, zk_address: str,
        capsys: pytest.CaptureFixture) -> None:
    """Pruned history is normal (exit 0); a winner's record lost is damage, and the
    partitions it could reach go unjudged: exit 4, not a quiet "no anomaly"."""
    epoch = writer.commit({"2026-01": range(0, 100)})
    writer.commit({"2026-01": range(100, 150)})
    (winner,) = writer.coord.xid(epoch).winners
    zk.delete(f"{writer.coord.layout.branch(epoch, winner)}", recursive=True)
    code, result = run_cli(zk_address, clickhouse_url, capsys, "--exclusive-target")
    (unjudged,) = result["sinks"][0]["target"]["not_judged"]
    assert (code, unjudged["cause"]) == (4, "lost_record")
    assert f"winner {winner} has no record" in unjudged["detail"]
    assert len(result["sinks"][0]["target"]["unknown_history"]) == 1


def test_a_sink_whose_whole_history_is_pruned_without_a_summary_is_not_reported_ok(
        ops: Operations, writer: Writer) -> None:
    writer.commit({"2026-01": range(0, 100)})
    writer.commit({"2026-02": range(100, 150)})
    time.sleep(0.3)
    SinkAdmin(writer.coord).prune(0.2)
    text = render("verify", {"sinks": [target_report(ops)]})
    assert text.splitlines()[0] == (
        f"{SINK}: no anomaly found, but what committed epochs 0..1 wrote is not checked")


def test_a_loss_below_what_retained_xids_put_there_is_reported_despite_pruning(
        ops: Operations, writer: Writer, table: str, clickhouse_url: str) -> None:
    writer.commit({"2026-01": range(0, 100)})
    time.sleep(0.3)
    SinkAdmin(writer.coord).prune(0.2)
    writer.commit({"2026-02": range(100, 150)})
    run_sql(clickhouse_url, f"ALTER TABLE {table} DROP PARTITION 202602")
    (finding,) = target_report(ops)["target"]["anomalies"]
    assert (finding["kind"], finding["partition_id"], finding["rows"]) == (
        "missing_rows", "202602", 0)


def test_an_overwrite_resets_what_the_partition_should_hold(
        ops: Operations, writer: Writer) -> None:
    writer.commit({"2026-01": range(0, 100), "2026-02": range(100, 150)})
    writer.commit({"2026-01": range(500, 540)}, overwrite=True)
    writer.commit({"2026-01": range(600, 610)})
    sink = target_report(ops, writers="exclusive")
    assert (sink["anomalies"], sink["target"]["partitions_ok"]) == ([], 2)


def test_an_overwrite_after_the_pruned_epochs_makes_the_partition_judgeable(
        ops: Operations, writer: Writer) -> None:
    writer.commit({"2026-01": range(0, 100), "2026-02": range(100, 150)})
    time.sleep(0.3)
    SinkAdmin(writer.coord).prune(0.2)
    writer.commit({"2026-01": range(500, 540)}, overwrite=True)
    target = target_report(ops, writers="exclusive")["target"]
    assert target["partitions_ok"] == 1
    assert [n["partition_id"] for n in target["not_judged"]] == ["202602"]


def test_another_sinks_commits_into_the_same_partition_are_expected_rows(
        ops: Operations, zk: KazooClient, writer: Writer, table: str,
        clickhouse_url: str) -> None:
    writer.commit({"2026-01": range(0, 100)})
    Writer(zk, clickhouse_url, table, sink="other-sink").commit({"2026-01": range(100, 130)})
    sink = target_report(ops, writers="exclusive")
    assert (sink["anomalies"], sink["target"]["partitions_ok"]) == ([], 1)


def test_a_partition_an_xid_is_still_publishing_is_not_judged(
        ops: Operations, zk: KazooClient, clickhouse_url: str, table: str) -> None:
    class Crash(Exception):
        pass

    def crash(step: str) -> None:
        if step == "commit.after_decision":
            raise Crash(step)

    stuck = Writer(zk, clickhouse_url, table, on_step=crash)
    with pytest.raises(Crash):
        stuck.commit({"2026-01": range(0, 100)})
    (unjudged,) = target_report(ops, writers="exclusive")["target"]["not_judged"]
    assert "being published" in unjudged["reason"]


def test_an_engine_that_merges_rows_is_judged_before_its_merges(
        ops: Operations, zk: KazooClient, clickhouse_url: str, ch_db: str) -> None:
    table = create_table(clickhouse_url, ch_db, "ReplacingMergeTree()")
    writer = Writer(zk, clickhouse_url, table)
    writer.commit({"2026-01": range(0, 100)})
    writer.commit({"2026-01": range(50, 150)})
    target = target_report(ops, writers="exclusive")["target"]
    assert (target["partitions_ok"], target["not_judged"]) == (1, [])


def test_rows_an_engine_merged_away_are_not_judged_and_fail_the_command(
        zk: KazooClient, clickhouse_url: str, ch_db: str, zk_address: str,
        capsys: pytest.CaptureFixture) -> None:
    table = create_table(clickhouse_url, ch_db, "ReplacingMergeTree()")
    writer = Writer(zk, clickhouse_url, table)
    writer.commit({"2026-01": range(0, 100)})
    writer.commit({"2026-01": range(50, 150)})
    run_sql(clickhouse_url, f"OPTIMIZE TABLE {table} FINAL")
    code, result = run_cli(zk_address, clickhouse_url, capsys, "--exclusive-target")
    (unjudged,) = result["sinks"][0]["target"]["not_judged"]
    assert (code, unjudged["cause"], unjudged["rows"], unjudged["expected"]) == (
        4, "merges", 150, 200)
    assert "ReplacingMergeTree" in unjudged["reason"]


def test_a_dropped_table_is_a_loss(
        ops: Operations, writer: Writer, table: str, clickhouse_url: str) -> None:
    writer.commit({"2026-01": range(0, 100)})
    run_sql(clickhouse_url, f"DROP TABLE {table}")
    (finding,) = target_report(ops)["target"]["anomalies"]
    assert (finding["kind"], finding["rows"], finding["expected"]) == ("missing_rows", 0, 100)
    assert "the table does not exist" in finding["detail"]


def test_replicas_of_one_replicated_table_share_an_identity(
        client: ClickHouseClient, ch_db: str) -> None:
    for name in ("a", "b"):
        run_sql(client.url, f"CREATE TABLE `{ch_db}`.`{name}` (id UInt64) ENGINE = "
                            f"ReplicatedMergeTree('/clickhouse/tables/{ch_db}/t', '{name}') "
                            "ORDER BY id")
    run_sql(client.url, f"INSERT INTO `{ch_db}`.`a` VALUES (1), (2)")
    a, b = (table_rows(client, ch_db, name) for name in ("a", "b"))
    assert a.identity == b.identity == f"replicated:/clickhouse/tables/{ch_db}/t"
    assert a.partitions == {"all": 2}


def test_rows_masked_by_a_lightweight_delete_are_not_counted_on_a_modern_server() -> None:
    chdb = server_ext.ChdbClient.for_process()
    db = f"t_{uuid.uuid4().hex[:10]}"
    chdb.execute(f"CREATE DATABASE `{db}`", purpose="test setup")
    try:
        chdb.execute(f"CREATE TABLE `{db}`.`e` (id UInt64) ENGINE = MergeTree ORDER BY id",
                     purpose="test setup")
        chdb.execute(f"INSERT INTO `{db}`.`e` SELECT number FROM numbers(100)",
                     purpose="test setup")
        chdb.execute(f"DELETE FROM `{db}`.`e` WHERE id < 10", purpose="test setup")
        assert table_rows(chdb, db, "e").partitions == {"all": 90}
    finally:
        chdb.execute(f"DROP DATABASE `{db}`", purpose="test cleanup")


def test_no_target_audits_the_history_only(
        writer: Writer, table: str, clickhouse_url: str, zk_address: str,
        capsys: pytest.CaptureFixture) -> None:
    writer.commit({"2026-01": range(0, 100)})
    run_sql(clickhouse_url, f"INSERT INTO {table} SELECT * FROM {table}")
    code, result = run_cli(zk_address, clickhouse_url, capsys, "--no-target")
    assert (code, result["sinks"][0]["target"]) == (0, {"checked": False})


def test_a_spark_batch_job_verifies_ok_until_its_rows_are_duplicated(
        spark, zk_address: str, clickhouse_url: str, ch_db: str) -> None:
    import txsink
    from tests.sinkutil import create_events, events_df

    txsink.register(spark)
    table = create_events(clickhouse_url, ch_db)
    (events_df(spark, 0, 3000).write.format("clickhouse_tx").mode("append")
        .option("url", clickhouse_url).option("zookeeper", zk_address)
        .option("zk_root", ROOT).option("sink_id", SINK).option("table", table).save())
    operations = Operations(zk_address, zk_root=ROOT, url=clickhouse_url)
    try:
        sink = target_report(operations, writers="exclusive")
        # judged by content: the tasks' seals recorded digests, the combined branch their sum
        assert (sink["anomalies"], sink["target"]["partitions_ok"],
                sink["target"]["partitions_ok_by_count"]) == ([], 3, 0)
        run_sql(clickhouse_url, f"INSERT INTO {table} SELECT * FROM {table} "
                                "WHERE toYYYYMM(day) = 202602")
        (finding,) = target_report(operations, writers="exclusive")["target"]["anomalies"]
        assert (finding["kind"], finding["partition_id"]) == ("duplicate_rows", "202602")
    finally:
        operations.close()


# -- content: what a row count cannot see (both servers) --------------------------------


@pytest.fixture
def server_ops(zk_address: str, server_url: str) -> Iterator[Operations]:
    operations = Operations(zk_address, zk_root=ROOT, url=server_url)
    yield operations
    operations.close()


@pytest.fixture
def server_writer(zk: KazooClient, server_url: str, server_db: str) -> Writer:
    return Writer(zk, server_url, create_table(server_url, server_db))


def test_deleted_rows_are_missing_rows_naming_the_xid_that_wrote_them(
        server_ops: Operations, server_writer: Writer, server_url: str) -> None:
    server_writer.commit({"2026-01": range(0, 100)})
    second = server_writer.commit({"2026-01": range(100, 130)})
    mutate(server_url, server_writer.target.qualified.replace("`", ""), "DELETE WHERE id >= 100")
    (finding,) = target_report(server_ops)["target"]["anomalies"]
    assert (finding["kind"], finding["rows"], finding["expected"], finding["judged_by"]) == (
        "missing_rows", 100, 130, "content")
    assert f"the missing rows are exactly what {SINK}/{second} put there" in finding["detail"]


def test_as_many_rows_deleted_as_duplicated_in_one_partition_are_altered_rows(
        server_writer: Writer, server_url: str, zk_address: str,
        capsys: pytest.CaptureFixture) -> None:
    server_writer.commit({"2026-01": range(0, 100)})
    table = server_writer.target.qualified.replace("`", "")
    mutate(server_url, table, "DELETE WHERE id < 7")
    run_sql(server_url, f"INSERT INTO {table} SELECT * FROM {table} WHERE id >= 50 AND id < 57")
    code, result = run_cli(zk_address, server_url, capsys, "--exclusive-target")
    (finding,) = result["sinks"][0]["target"]["anomalies"]
    assert (code, finding["kind"], finding["rows"], finding["expected"]) == (
        1, "altered_rows", 100, 100)
    assert "as many rows lost as duplicated" in finding["detail"]


def test_a_row_changed_in_place_is_altered_rows(
        server_ops: Operations, server_writer: Writer, server_url: str) -> None:
    server_writer.commit({"2026-01": range(0, 100), "2026-02": range(100, 150)})
    mutate(server_url, server_writer.target.qualified.replace("`", ""),
           "UPDATE name = 'changed' WHERE id = 5")
    target = target_report(server_ops, writers="exclusive")["target"]
    (finding,) = target["anomalies"]
    assert (finding["kind"], finding["partition_id"], target["partitions_ok"]) == (
        "altered_rows", "202601", 1)


def test_rows_of_an_aborted_xid_that_appeared_are_named_with_their_branch(
        server_ops: Operations, server_writer: Writer) -> None:
    server_writer.commit({"2026-01": range(0, 100)})
    aborted, branch = server_writer.abort_after_leak({"2026-01": range(100, 120)})
    (finding,) = target_report(server_ops)["target"]["anomalies"]
    assert (finding["kind"], finding["rows"], finding["expected"]) == ("aborted_rows", 120, 100)
    assert f"branch {branch} of {SINK}/{aborted} (Aborted)" in finding["detail"]


def test_a_partition_judged_by_content_counts_as_such(
        server_ops: Operations, server_writer: Writer) -> None:
    server_writer.commit({"2026-01": range(0, 100)})
    target = target_report(server_ops)["target"]
    assert (target["partitions_ok"], target["partitions_ok_by_count"]) == (1, 0)
