"""Options a server must honour are checked against it before anything is staged; a
``Committing`` xid whose publish can never succeed has a documented, recorded way out.

Against the real ClickHouse 18.16 (no ``MOVE PARTITION``), ZooKeeper and Spark. Each test
has its own database and ZooKeeper chroot; "nothing staged" is judged by the sink's own
staging tables (``txs_<sink key>_...``), so other tests' staging never matters here.

A stuck xid is made the way an older release made it: a transaction stages its rows, its
branch records are rewritten to a strategy the server cannot run (as if the driver had not
checked it), and the real commit decides and then fails to publish.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import pytest

import txsink
from coordinator import Coordinator, PublishFailed, XidState
from coordinator.sink_admin import SinkAdmin
from server_ext.capabilities import Capabilities, detect_capabilities
from server_ext.client.http_client import ClickHouseClient
from server_ext.publish.strategy_choice import (
    strategy_problem,
    supported_strategies,
    target_engine_problem,
)
from server_ext.sql import qualified_name
from server_ext.staging.staging_tables import sink_key
from tests.conftest import run_sql
from tests.sinkutil import assert_exactly_once, create_events, events_df, id_counts
from txsink.core.operator_records import GIVEN_UP_KEY, SWITCH_KEY
from txsink.core.payload import CombinedBranch, from_record
from txsink.core.publisher import publish_manifest
from txsink.ops import cli
from txsink.options import OptionError
from txsink.spark.transaction import Transaction

ROWS = 600  # events_df: 4 Spark partitions of 150 ids, days 2026-01-01 + id % 90
TASK_IDS = 150  # the ids of task partition p: range(150 p, 150 (p + 1))


@pytest.fixture(autouse=True)
def _registered(request) -> None:
    if "spark" in request.fixturenames:
        txsink.register(request.getfixturevalue("spark"))


@dataclass
class Sink:
    url: str
    zookeeper: str  # hosts + the test's chroot
    table: str
    sink_id: str

    @property
    def options(self) -> dict[str, str]:
        return {"url": self.url, "zookeeper": self.zookeeper, "table": self.table,
                "sink_id": self.sink_id}

    def cli(self, command: str, *args: str) -> int:
        url = [] if command == "status" else ["--url", self.url]
        return cli.main([command, "--zookeeper", self.zookeeper, *url, *args])

    def staging(self) -> list[str]:
        body = run_sql(self.url, "SELECT name FROM system.tables WHERE database = "
                                 "'txsink_staging' FORMAT TSV")
        return [n for n in body.split() if n.startswith(f"txs_{sink_key(self.sink_id)}_")]

    def coordinator(self, zk) -> Coordinator:
        return Coordinator(zk, self.sink_id)


@pytest.fixture
def sink(clickhouse_url, zk_hosts, zk_chroot, ch_db) -> Sink:
    return Sink(clickhouse_url, zk_hosts + zk_chroot, create_events(clickhouse_url, ch_db),
                f"checks-{uuid.uuid4().hex[:8]}")


def refused(sink: Sink, zk, df, **options: str) -> str:
    """Write ``df``; return the error text after checking that nothing was left behind:
    the target unchanged, no staging of the sink, no record of the sink at all."""
    with pytest.raises(Exception) as info:
        df.write.format("clickhouse_tx").options(**{**sink.options, **options}) \
            .mode("append").save()
    assert id_counts(sink.url, sink.table) == {}, "the target changed"
    assert sink.staging() == [], "staging left behind"
    assert sink.sink_id not in SinkAdmin.sinks(zk), "the sink was opened"
    return str(info.value)


# -- the driver checks options against the server ---------------------------------------

def test_move_on_a_server_without_move_partition_is_refused_before_anything_is_staged(
    spark, sink, zk
):
    message = refused(sink, zk, events_df(spark, 0, ROWS), strategy="move")
    assert "strategy='move'" in message
    assert "has no ALTER TABLE ... MOVE PARTITION ... TO TABLE" in message
    assert "use strategy='attach_marked'" in message


def test_sink_refused_an_option_writes_normally_afterwards(spark, sink, zk):
    refused(sink, zk, events_df(spark, 0, ROWS), strategy="move")
    events_df(spark, 0, ROWS).write.format("clickhouse_tx").options(**sink.options) \
        .mode("append").save()
    assert_exactly_once(sink.url, sink.table, range(ROWS))


def test_attach_replicated_into_a_plain_table_is_refused_naming_what_to_use(spark, sink, zk):
    message = refused(sink, zk, events_df(spark, 0, ROWS), strategy="attach_replicated")
    assert "strategy='attach_replicated'" in message
    assert "the target is not Replicated (MergeTree)" in message
    assert "use strategy='attach_marked'" in message


def test_attach_marked_into_a_replicated_table_is_refused(spark, sink, zk, ch_db):
    table = create_events(sink.url, ch_db, "replicated", engine=(
        f"ReplicatedMergeTree('/clickhouse/tables/{ch_db}/replicated', '{{replica}}')"))
    sink.table = table
    message = refused(sink, zk, events_df(spark, 0, ROWS), strategy="attach_marked")
    assert "strategy='attach_marked'" in message
    assert "the target is Replicated (ReplicatedMergeTree)" in message
    assert "use strategy='attach_replicated'" in message


def test_table_that_cannot_take_partitions_is_refused_naming_its_engine(spark, sink, zk, ch_db):
    run_sql(sink.url, f"CREATE TABLE `{ch_db}`.`log` (id UInt64, day Date, name String, "
                      "value Float64) ENGINE = Log")
    sink.table = f"{ch_db}.log"
    message = refused(sink, zk, events_df(spark, 0, ROWS))
    assert "its engine is Log" in message
    assert "MergeTree-family" in message


def test_transaction_with_a_strategy_the_server_lacks_is_refused_before_its_xid_begins(
    spark, sink, zk
):
    with pytest.raises(OptionError, match=r"strategy='move'.*MOVE PARTITION"):
        with txsink.transaction(spark, url=sink.url, zookeeper=sink.zookeeper,
                                sink_id=sink.sink_id, strategy="move"):
            pytest.fail("the block must not run")
    assert sink.sink_id not in SinkAdmin.sinks(zk)


def test_transaction_write_refused_for_its_table_aborts_without_staging(spark, sink, zk):
    with pytest.raises(Exception, match="the target is not Replicated"):
        with txsink.transaction(spark, url=sink.url, zookeeper=sink.zookeeper,
                                sink_id=sink.sink_id, strategy="attach_replicated") as tx:
            tx.write(events_df(spark, 0, ROWS), sink.table)
    [record] = SinkAdmin(sink.coordinator(zk)).xids()
    assert record.state is XidState.ABORTED
    assert sink.staging() == []
    assert id_counts(sink.url, sink.table) == {}


# -- the rules, as pure logic ----------------------------------------------------------

@dataclass(frozen=True)
class Target:
    replicated: bool
    engine: str = "MergeTree"
    engine_full: str = "MergeTree PARTITION BY d ORDER BY id SETTINGS index_granularity = 8192"


@pytest.fixture(scope="module")
def detected(clickhouse_url) -> Capabilities:
    return detect_capabilities(ClickHouseClient(clickhouse_url))


@pytest.fixture
def caps(detected) -> Callable[..., Capabilities]:
    """The real server's capabilities with MOVE PARTITION / a keeper forced on or off."""
    return lambda move, keeper=True: detected.with_overrides(move_partition=move,
                                                             keeper=keeper)


@pytest.mark.parametrize(("move", "replicated", "expected"), [
    (False, False, ["attach_marked"]),
    (True, False, ["move", "attach_marked"]),
    (False, True, ["attach_replicated"]),
    (True, True, ["attach_replicated"]),
])
def test_supported_strategies_follow_the_server_and_the_target(caps, move, replicated,
                                                              expected):
    target = Target(replicated, "ReplicatedMergeTree" if replicated else "MergeTree")
    assert supported_strategies(caps(move), target) == expected


def test_only_attach_marked_on_a_replicated_target_would_still_run_its_statement(caps):
    runs = {(s, r): strategy_problem(caps(False), Target(r), s)
            for s in ("move", "attach_replicated", "attach_marked") for r in (False, True)}
    assert {k: p.statement_runs for k, p in runs.items() if p} == {
        ("move", False): False, ("move", True): False,
        ("attach_replicated", False): False, ("attach_marked", True): True}


def test_server_without_keeper_refuses_attach_replicated_for_any_table(caps):
    problem = strategy_problem(caps(False, keeper=False), None, "attach_replicated")
    assert problem is not None and problem.instead == "attach_marked"


def test_deprecated_merge_tree_syntax_is_refused():
    old = Target(False, "MergeTree", "MergeTree(d, id, 8192)")
    assert "deprecated" in (target_engine_problem(old) or "")


# -- the way out of a stuck Committing xid --------------------------------------------

def rewrite_strategy(coord: Coordinator, epoch: int, strategy: str) -> None:
    """Give every branch of the xid ``strategy``, as a driver that did not check wrote."""
    for branch in coord.branches(epoch):
        path = coord.layout.branch(epoch, branch.branch_id)
        data, stat = coord.client.get(path)
        record = json.loads(data)
        if not record.get("manifest"):
            continue  # never prepared (the pre-combined table's branch)
        record["manifest"]["strategy"] = strategy
        coord.client.set(path, json.dumps(record, sort_keys=True, separators=(",", ":"))
                         .encode(), version=stat.version)


def stuck(spark, sink: Sink, strategy: str = "move", publish: bool = True) -> int:
    """A ``Committing`` xid whose branches record ``strategy``; returns its epoch.

    ``publish``: the real commit decides and its publish fails; otherwise the driver is
    as good as killed right after the decision (nothing published, nothing in the ledger).
    """
    tx = Transaction(spark, {"url": sink.url, "zookeeper": sink.zookeeper}, sink.sink_id)
    tx.write(events_df(spark, 0, ROWS), sink.table)
    rewrite_strategy(tx.coord, tx.epoch, strategy)
    if publish:
        with pytest.raises(PublishFailed):
            tx.commit()
    else:
        def killed(_record) -> None:
            raise RuntimeError("driver killed after the decision")
        with pytest.raises(PublishFailed):
            tx.coord.commit(tx.epoch, tx.generation, None, publish=killed, rollback=killed)
    assert tx.coord.xid(tx.epoch).state is XidState.COMMITTING
    return tx.epoch


def test_recover_of_an_unpublishable_xid_exits_3_and_names_the_strategy_to_use(
    spark, sink, capsys
):
    epoch = stuck(spark, sink)
    assert sink.cli("recover", "--sink", sink.sink_id) == 3
    out = capsys.readouterr().out
    assert "NOT FINISHED" in out
    assert (f"txsink recover --sink {sink.sink_id} --epoch {epoch} --strategy attach_marked"
            in out)
    assert "abort or" not in out and "never aborted" in out


def test_recover_with_a_supported_strategy_publishes_every_row_exactly_once(
    spark, sink, zk, capsys
):
    epoch = stuck(spark, sink)
    code = sink.cli("recover", "--sink", sink.sink_id, "--epoch", str(epoch),
                    "--strategy", "attach_marked")
    assert code == 0, capsys.readouterr()
    assert_exactly_once(sink.url, sink.table, range(ROWS))
    assert sink.coordinator(zk).xid(epoch).state is XidState.COMMITTED
    assert sink.staging() == []


def test_switch_clears_the_failed_move_intent_and_records_itself(spark, sink, zk):
    epoch = stuck(spark, sink)
    coord = sink.coordinator(zk)
    branch = coord.branches(epoch)[0]
    intent = {k: v for k, v in coord.ledger(epoch, branch.branch_id).items().items()
              if k.startswith("txs_") and not k.endswith(".combined")}
    assert [v["state"] for v in intent.values()] == ["attaching"]  # the failed move's
    assert sink.cli("recover", "--sink", sink.sink_id, "--epoch", str(epoch),
                    "--strategy", "attach_marked") == 0
    switch = coord.ledger(epoch, branch.branch_id).get(SWITCH_KEY)
    assert switch["to"] == "attach_marked"
    assert switch["history"][0]["from"] == "move"
    assert sorted(switch["history"][0]["cleared_intent"]) == sorted(
        next(iter(intent.values()))["attaching"])
    assert coord.xid(epoch).metrics["strategy_switches"][branch.branch_id] == {
        "from": "move", "to": "attach_marked"}


def test_next_job_of_the_sink_publishes_with_the_strategy_an_operator_switched_to(
    spark, sink, zk
):
    """The switch is recorded (say ``recover --strategy`` died right after recording it):
    the next job's recovery at start honours it instead of failing on MOVE again."""
    epoch = stuck(spark, sink)
    coord = sink.coordinator(zk)
    with coord.publish_lease(epoch):
        for winner in coord.xid(epoch).winners:
            coord.ledger(epoch, winner).put(SWITCH_KEY, {"to": "attach_marked", "history": []})
    events_df(spark, ROWS, 100).write.format("clickhouse_tx").options(**sink.options) \
        .mode("append").save()
    assert coord.xid(epoch).state is XidState.COMMITTED
    assert_exactly_once(sink.url, sink.table, range(ROWS + 100))


def moved_by_hand(sink: Sink, coord: Coordinator, epoch: int, winner: str,
                  partition_id: str) -> None:
    """What MOVE PARTITION does where the server has it: the parts leave the winner's
    staging for the target (as if the move had run before the server lost MOVE
    PARTITION)."""
    staged = publish_manifest(coord, coord.branches(epoch, [winner])[0])
    staging = qualified_name(staged.staging_database, staged.staging_table)
    db, name = sink.table.split(".")
    run_sql(sink.url, f"ALTER TABLE `{db}`.`{name}` ATTACH PARTITION ID '{partition_id}' "
                      f"FROM {staging}")
    run_sql(sink.url, f"ALTER TABLE {staging} DROP PARTITION ID '{partition_id}'")


def test_partition_the_failed_move_had_moved_is_not_published_again(spark, sink, zk):
    epoch = stuck(spark, sink)
    coord = sink.coordinator(zk)
    winner = sorted(coord.xid(epoch).winners)[0]
    moved_by_hand(sink, coord, epoch, winner, "202601")
    assert sink.cli("recover", "--sink", sink.sink_id, "--epoch", str(epoch),
                    "--strategy", "attach_marked") == 0
    assert_exactly_once(sink.url, sink.table, range(ROWS))
    history = coord.ledger(epoch, winner).get(SWITCH_KEY)["history"]
    assert history[0]["moved_before"] == ["202601"]


def test_status_shows_a_switched_xid_after_it_is_finished(spark, sink, capsys):
    epoch = stuck(spark, sink)
    sink.cli("recover", "--sink", sink.sink_id, "--epoch", str(epoch),
             "--strategy", "attach_marked")
    capsys.readouterr()
    assert sink.cli("status", "--sink", sink.sink_id) == 0
    assert "published with attach_marked instead of move (operator)" in capsys.readouterr().out


def test_recover_refuses_a_strategy_the_server_cannot_run_and_changes_nothing(
    spark, sink, zk, capsys
):
    epoch = stuck(spark, sink)
    code = sink.cli("recover", "--sink", sink.sink_id, "--epoch", str(epoch),
                    "--strategy", "attach_replicated")
    assert code == 2
    err = capsys.readouterr().err
    assert "the target is not Replicated" in err and "use --strategy attach_marked" in err
    coord = sink.coordinator(zk)
    assert coord.xid(epoch).state is XidState.COMMITTING
    assert all(coord.ledger(epoch, b.branch_id).get(SWITCH_KEY) is None
               for b in coord.branches(epoch))


def test_recover_refuses_to_switch_a_branch_whose_strategy_the_server_runs(
    spark, sink, ch_db, capsys
):
    sink.table = create_events(sink.url, ch_db, "replicated", engine=(
        f"ReplicatedMergeTree('/clickhouse/tables/{ch_db}/replicated', '{{replica}}')"))
    epoch = stuck(spark, sink, strategy="attach_marked", publish=False)
    code = sink.cli("recover", "--sink", sink.sink_id, "--epoch", str(epoch),
                    "--strategy", "attach_replicated")
    assert code == 2
    err = capsys.readouterr().err
    assert "needs another strategy" in err and "a switch could publish rows twice" in err


def test_recover_strategy_on_a_committed_xid_is_refused(spark, sink, capsys):
    events_df(spark, 0, ROWS).write.format("clickhouse_tx").options(**sink.options) \
        .mode("append").save()
    assert sink.cli("recover", "--sink", sink.sink_id, "--epoch", "0",
                    "--strategy", "attach_marked") == 2
    assert "is Committed: --strategy is for a Committing xid" in capsys.readouterr().err


def test_writer_of_a_blocked_sink_is_told_what_to_run(spark, sink):
    epoch = stuck(spark, sink)
    with pytest.raises(Exception) as info:
        events_df(spark, ROWS, ROWS).write.format("clickhouse_tx").options(**sink.options) \
            .mode("append").save()
    assert f"txsink recover --sink {sink.sink_id} --epoch {epoch}" in str(info.value)


def month_of(event_id: int) -> str:
    """The partition id (toYYYYMM) of an ``events_df`` row."""
    day = event_id % 90
    return "202601" if day < 31 else "202602" if day < 59 else "202603"


def tasks_of(coord, epoch: int, winner: str) -> list[int]:
    """The Spark partitions whose rows a winner carries (a combined one: its sources')."""
    found = from_record(coord.branches(epoch, [winner])[0].manifest)
    branch_ids = found.sources if isinstance(found, CombinedBranch) else (winner,)
    return [int(b.split("-")[0][1:]) for b in branch_ids]  # p<partition>-a<attempt>-...


def test_given_up_partition_is_recorded_shown_and_the_rest_published_once(
    spark, sink, zk, capsys
):
    epoch = stuck(spark, sink)
    coord = sink.coordinator(zk)
    winner = sorted(coord.xid(epoch).winners)[0]
    code = sink.cli("resolve", "--sink", sink.sink_id, "--epoch", str(epoch), "--branch",
                    winner, "--partition", "202602", "--give-up", "--reason", "test")
    assert code == 3  # the other partitions still need a strategy the server runs
    assert sink.cli("recover", "--sink", sink.sink_id, "--epoch", str(epoch),
                    "--strategy", "attach_marked") == 0
    given_up = {i for task in tasks_of(coord, epoch, winner)
                for i in range(task * TASK_IDS, (task + 1) * TASK_IDS) if month_of(i) == "202602"}
    assert given_up
    assert_exactly_once(sink.url, sink.table, set(range(ROWS)) - given_up)
    entry = coord.ledger(epoch, winner).get(GIVEN_UP_KEY)["partitions"]["202602"]
    assert (entry["rows"], entry["reason"]) == (len(given_up), "test")
    capsys.readouterr()
    assert sink.cli("status", "--sink", sink.sink_id) == 0
    assert (f"GIVEN UP partition 202602 of branch {winner}, {len(given_up)} rows"
            in capsys.readouterr().out)


def test_give_up_is_refused_for_a_partition_its_move_intent_names_and_staging_left(
    spark, sink, zk, capsys
):
    epoch = stuck(spark, sink)
    coord = sink.coordinator(zk)
    winner = sorted(coord.xid(epoch).winners)[0]
    moved_by_hand(sink, coord, epoch, winner, "202601")
    assert sink.cli("resolve", "--sink", sink.sink_id, "--epoch", str(epoch), "--branch",
                    winner, "--partition", "202601", "--give-up") == 2
    assert "['202601'] of branch" in capsys.readouterr().err
    assert GIVEN_UP_KEY not in coord.ledger(epoch, winner).items()


def test_verify_does_not_count_given_up_rows_as_missing(spark, sink, zk, capsys):
    epoch = stuck(spark, sink)
    winner = sorted(sink.coordinator(zk).xid(epoch).winners)[0]
    sink.cli("resolve", "--sink", sink.sink_id, "--epoch", str(epoch), "--branch", winner,
             "--partition", "202602", "--give-up")
    assert sink.cli("recover", "--sink", sink.sink_id, "--epoch", str(epoch),
                    "--strategy", "attach_marked") == 0
    capsys.readouterr()
    assert sink.cli("verify", "--sink", sink.sink_id) == 0, capsys.readouterr().out


def test_give_up_is_refused_for_an_xid_that_is_not_committing(spark, sink, zk, capsys):
    events_df(spark, 0, ROWS).write.format("clickhouse_tx").options(**sink.options) \
        .mode("append").save()
    branch = sink.coordinator(zk).xid(0).winners[0]
    assert sink.cli("resolve", "--sink", sink.sink_id, "--epoch", "0", "--branch", branch,
                    "--partition", "202601", "--give-up") == 2
    assert "is Committed: only a Committing xid has partitions to give up" in \
        capsys.readouterr().err
