"""Writers killed between begin and decision are rolled back without a rerun; a live
writer's open xid is never touched.

Each killed writer is a driver of its own (``tests/jobs/abandoned_writer.py``) that a
crash point kills whole (driver, JVM, Python workers) at a step between its xid's begin
and its decision; nothing ever reruns it. Then the operator's ``txsink gc`` or
``txsink recover`` runs once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import txsink
from coordinator import Coordinator, XidState
from coordinator.sink_admin import SinkAdmin
from tests.conftest import RECORDS_DATABASE, run_sql
from tests.harness.crash_arming import arm_env
from tests.sinkutil import (
    SHORT_SESSION,
    assert_exactly_once,
    create_events,
    driver_env,
    events_df,
    id_counts,
    staging_tables,
)
from txsink.core import crashpoints
from txsink.ops import cli

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def zookeeper(zk_hosts: str, zk_chroot: str) -> str:
    return zk_hosts + zk_chroot


def killed_writer(kind: str, url: str, zookeeper: str, table: str, point: str,
                  once_dir: Path, options: dict[str, str] | None = None
                  ) -> subprocess.CompletedProcess:
    env = driver_env(**arm_env([point], "group", once_dir))
    return subprocess.run(
        [sys.executable, "-m", "tests.jobs.abandoned_writer", kind, url, zookeeper, table,
         "400", json.dumps({**SHORT_SESSION, **(options or {})})], cwd=ROOT,
        capture_output=True, text=True, timeout=240, env=env, start_new_session=True)


def operator(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    code = cli.main([*args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def abandoned_status(capsys, zookeeper: str, timeout: float = 30.0,
                     store: tuple[str, ...] = ()) -> list[dict]:
    """The open xids ``status`` marks abandoned, once there are any (the killed driver's
    keeper notices the driver's death within a second). ``store``: the operator's store
    arguments, instead of ``--zookeeper``."""
    deadline = time.monotonic() + timeout
    while True:
        _, status = operator(capsys, "status", *(store or ("--zookeeper", zookeeper)))
        found = [x for s in status["sinks"] for x in s["open"] if x.get("abandoned")]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def xid_states(zookeeper_client, sink_id: str) -> list[XidState]:
    return [x.state for x in SinkAdmin(Coordinator(zookeeper_client, sink_id)).xids()]


def test_batch_job_killed_after_staging_its_rows_is_rolled_back_by_gc(
        clickhouse_url, ch_db, zookeeper, zk, tmp_path, capsys):
    """Driver host killed at ``branch.after_staging_write``: a batch job with a generated
    sink id leaves an ``Initialized`` xid and its staging; one ``gc`` (with the default
    grace, so the sweep drops nothing young) rolls it back: staging dropped, ``Aborted``."""
    table = create_events(clickhouse_url, ch_db)
    options = {"zookeeper": zookeeper}
    killed = killed_writer("batch", clickhouse_url, zookeeper, table,
                           "branch.after_staging_write", tmp_path)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert staging_tables(clickhouse_url, options), "the killed job staged nothing"
    [xid] = abandoned_status(capsys, zookeeper)
    assert xid["state"] == "Initialized" and xid["liveness"] == "writer_gone"
    assert xid["staging"] and xid["age_s"] >= 0

    code, result = operator(capsys, "gc", "--zookeeper", zookeeper, "--url", clickhouse_url)

    assert code == 0
    [rolled] = result["abandoned"]["rolled_back"]
    assert rolled["reason"] == "writer_gone" and rolled["staging"] == xid["staging"]
    assert staging_tables(clickhouse_url, options) == []
    [sink_id] = SinkAdmin.sinks(zk)
    assert xid_states(zk, sink_id) == [XidState.ABORTED]
    assert id_counts(clickhouse_url, table) == {}


def test_transaction_killed_before_its_commit_is_rolled_back_by_recover(
        clickhouse_url, ch_db, zookeeper, zk, tmp_path, capsys):
    """Driver killed at ``branch.after_prepare`` inside ``txsink.transaction()``: its
    branches are prepared, the xid undecided; ``recover`` rolls it back."""
    table = create_events(clickhouse_url, ch_db)
    options = {"zookeeper": zookeeper}
    killed = killed_writer("transaction", clickhouse_url, zookeeper, table,
                           "branch.after_prepare", tmp_path)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert abandoned_status(capsys, zookeeper), "status shows no abandoned xid"

    code, result = operator(capsys, "recover", "--zookeeper", zookeeper, "--url",
                            clickhouse_url)

    assert code == 0
    [sink] = result["sinks"]
    assert len(sink["actions"]) == 1 and "rolled_back" in sink["actions"][0]
    assert staging_tables(clickhouse_url, options) == []
    assert xid_states(zk, "tx-abandoned") == [XidState.ABORTED]
    assert id_counts(clickhouse_url, table) == {}


def test_live_writers_open_xid_is_left_by_gc_and_commits(
        spark, clickhouse_url, ch_db, zookeeper, capsys):
    """A transaction with a staged write, undecided while ``gc --grace 0`` runs: gc
    leaves it and its staging (its writer's session lives), and it commits afterwards."""
    table = create_events(clickhouse_url, ch_db)
    options = {"zookeeper": zookeeper}
    with txsink.transaction(spark, url=clickhouse_url, zookeeper=zookeeper,
                            sink_id="live") as tx:
        tx.write(events_df(spark, 0, 200), table)
        staged = staging_tables(clickhouse_url, options)
        assert staged

        code, result = operator(capsys, "gc", "--zookeeper", zookeeper, "--url",
                                clickhouse_url, "--grace", "0")

        assert code == 0 and result["abandoned"]["rolled_back"] == []
        [left] = result["abandoned"]["left"]
        assert left["reason"] == "alive" and left["sink_id"] == "live"
        assert set(staged) <= set(staging_tables(clickhouse_url, options))
    assert_exactly_once(clickhouse_url, table, range(200))


def live_xid(zk, url: str, zookeeper: str, table: str) -> tuple[Coordinator, int, str]:
    """A live writer's undecided xid with a staged branch: begun watched by this test's
    ZooKeeper session (as a writer holds its xid), its staging table made."""
    import server_ext
    from server_ext.client.http_client import ClickHouseClient
    from txsink.options import root_identity

    coord = Coordinator(zk, "live")
    generation = coord.fence()
    epoch = coord.allocate_epoch()
    coord.begin(epoch, generation, hold="live test writer")
    staging = server_ext.staging_table_name("live", epoch, "p0-a0-s0-0000live",
                                            root=root_identity(zookeeper, "/txsink"))
    coord.register_branch(epoch, "p0-a0-s0-0000live", generation,
                          owner={"staging": staging, "server": url, "shard": 0})
    client = ClickHouseClient(url)
    server_ext.create_staging_table(client, server_ext.describe_table(client, table), staging)
    return coord, epoch, staging


# Steps a task passes between its xid's begin and the decision, killing the whole driver
# (JVM and Python workers) there, one per kind of leftover: a branch registered and
# nothing staged; an empty staging table; rows in the xid's pre-combined table too; a
# Prepared branch. The steps between (rows staged, sealed but not recorded) leave what
# ``branch.after_staging_write`` leaves, tested above. Each kind is tried once: 26.x
# the step that leaves the most, 18.16 the others (the code is the same on both
# servers; a kill costs a Spark driver start).
BETWEEN_BEGIN_AND_DECISION = [
    pytest.param("ch18", point, id=f"ch18-{point}") for point in (
        crashpoints.BRANCH_AFTER_REGISTER, crashpoints.BRANCH_AFTER_VIEWS,
        crashpoints.BRANCH_AFTER_PREPARE)
] + [pytest.param("ch26", crashpoints.BRANCH_AFTER_CONTRIBUTE,
                  id=f"ch26-{crashpoints.BRANCH_AFTER_CONTRIBUTE}")]


@pytest.mark.parametrize(("server", "point"), BETWEEN_BEGIN_AND_DECISION, indirect=["server"])
def test_batch_job_killed_between_begin_and_decision_leaves_nothing_after_gc(
        point, server_url, server_db, zookeeper, zk, tmp_path, capsys):
    """Driver host killed at ``point`` of a batch job with a generated sink id, while
    another writer's xid is open and staged: one ``gc --grace 0`` rolls the killed job
    back (no staging of it left, its xid ``Aborted``, no row visible) and leaves the live
    writer's xid and staging alone."""
    table = create_events(server_url, server_db)
    options = {"zookeeper": zookeeper}
    live, live_epoch, live_staging = live_xid(zk, server_url, zookeeper, table)
    try:
        killed = killed_writer("batch", server_url, zookeeper, table, point, tmp_path)
        assert killed.returncode == -9, killed.stderr[-3000:]
        assert abandoned_status(capsys, zookeeper), "status shows no abandoned xid"

        code, result = operator(capsys, "gc", "--zookeeper", zookeeper, "--url", server_url,
                                "--grace", "0")

        assert code == 0, result
        [rolled] = result["abandoned"]["rolled_back"]
        assert rolled["sink_id"] != "live"
        assert staging_tables(server_url, options) == [live_staging]
        assert xid_states(zk, rolled["sink_id"]) == [XidState.ABORTED]
        assert live.xid(live_epoch).state is XidState.INITIALIZED
        assert id_counts(server_url, table) == {}
    finally:
        live.abort(live_epoch, live.generation(), rollback=lambda branch: run_sql(
            server_url, f"DROP TABLE IF EXISTS txsink_staging.`{branch.owner['staging']}`"))


def test_batch_job_killed_with_its_records_in_keepermap_is_rolled_back_by_gc(
        keepermap_url, records_table, tmp_path, capsys):
    """The same kill (``branch.after_staging_write``) on the KeeperMap store: the writer's
    session is judged gone once its expiry passes, and one ``gc`` over that store rolls
    the xid back: its staging dropped, ``Aborted``, no row visible."""
    db = f"t_{uuid.uuid4().hex[:10]}"
    run_sql(keepermap_url, f"CREATE DATABASE `{db}`")
    try:
        table = create_events(keepermap_url, db)
        root = f"/tests/{uuid.uuid4().hex[:10]}"
        options = {"coordinator": "keepermap", "records_table": f"{RECORDS_DATABASE}.records",
                   "zk_root": root}
        store = ("--coordinator", "keepermap", "--records-url", keepermap_url,
                 "--records-table", options["records_table"], "--zk-root", root)
        killed = killed_writer("batch", keepermap_url, "", table,
                               "branch.after_staging_write", tmp_path, options)
        assert killed.returncode == -9, killed.stderr[-3000:]
        [xid] = abandoned_status(capsys, "", timeout=60.0, store=store)
        assert xid["state"] == "Initialized" and xid["staging"]

        code, result = operator(capsys, "gc", *store, "--url", keepermap_url)

        assert code == 0, result
        [rolled] = result["abandoned"]["rolled_back"]
        assert rolled["staging"] == xid["staging"]
        _, status = operator(capsys, "status", *store)
        assert [s["open"] for s in status["sinks"]] == [[]]
        staged = run_sql(keepermap_url, "SELECT name FROM system.tables WHERE database = "
                                        "'txsink_staging'").split()
        assert not set(xid["staging"]) & set(staged)
        assert id_counts(keepermap_url, table) == {}
    finally:
        run_sql(keepermap_url, f"DROP DATABASE IF EXISTS `{db}`")


def test_a_task_broken_by_a_rollback_of_its_xid_says_the_xid_was_rolled_back(zk) -> None:
    """Interleaving: the task registers and stages; an operator's recover (or another
    writer's) rolls the xid back and drops the staging; the task's next step fails. Its
    error says the xid was rolled back, not only that staging lost its rows."""
    from types import SimpleNamespace

    from coordinator import XidAborted
    from server_ext.staging.seal import StagedRowsMismatch
    from txsink.core.attempt import _rolled_back

    coord = Coordinator(zk, "rolled-back")
    generation = coord.fence()
    epoch = coord.allocate_epoch()
    coord.begin(epoch, generation)
    plan = SimpleNamespace(sink_id="rolled-back")
    broken = StagedRowsMismatch("txsink_staging.t", 1800, 0)
    assert _rolled_back(plan, coord, epoch, broken) is None  # undecided: the error stands
    coord.abort(epoch, generation, rollback=lambda branch: None)
    said = _rolled_back(plan, coord, epoch, broken)
    assert isinstance(said, XidAborted), said
    assert f"xid rolled-back/{epoch} was rolled back while this task attempt wrote it" in str(
        said) and "StagedRowsMismatch: staging table txsink_staging.t holds 0 rows" in str(said)
