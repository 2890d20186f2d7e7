"""The ways in of every PySpark (``txsink.foreach_batch``, ``txsink.write``) under the
driver kills the data source is proven under: still exactly once.

The faults are those of the crash-point suites
(``tests/reliability/test_crash_points_streaming.py``,
``tests/spark/test_txn_version.py``): the driver, its JVM and its Python workers SIGKILLed
together at a named step of the protocol, then restarted from the same checkpoint (a
stream) or rerun with the same ``sink_id`` and ``txn_version`` (a batch job, as an
orchestrator retries it). The targets feed a materialized view, counted like them.

What these ways add to the data source's path is who runs the commit: the caller's
process (``txsink.spark.job``), after one ``mapInArrow`` job, inside ``foreachBatch``
for a stream, whose driver also begins each micro-batch's xid before its job. So the
points tried are one per state a dead driver leaves its xid in: begun by the
``foreachBatch`` driver, no task run (``driver.after_begin``), before the decision
(``branch.after_prepare``: every branch
prepared, no message collected), right after it (``commit.after_decision``) and inside
publish (``publish.after_attach``: rows visible, not marked published). The steps
between are the same code for every way (``tests/crashcases.py``).

The stream runs on 18.16 with its records in ZooKeeper (``[ch18]``). The modern server's
``move`` and the KeeperMap store are layers below the way in, tried under the same kills
where they differ: by the crash-point suites' ``[km26]`` runs (``move``'s evidence points,
and the dead driver's KeeperMap session expiring, batch, streaming and pipelined), through
the same coordinator and publish calls the caller's commit makes here
(``tests/crashcases.py`` gives that layering). What the way adds, who commits and how the
stream repeats its micro-batch, is the same over any store and strategy.

Marked ``every_spark``: no ``pyspark.sql.datasource`` here nor in the pipeline's
``foreach_batch`` way, so these run under PySpark 3.5 and 4.0 too.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import txsink
from coordinator.formats.steps import COMMIT_AFTER_DECISION
from server_ext.publish.publish_steps import STEP_AFTER_ATTACH
from tests.conftest import run_sql
from tests.crashcases import assert_exactly_once_after, crash_point_run
from tests.harness.chaos.crashrun import CrashPointRun
from tests.harness.chaos.pipeline import check_with_view, create_events_table, create_fed_view
from tests.harness.crash_arming import arm_env
from tests.sinkutil import SHORT_SESSION, driver_env, events_df
from txsink.core.crashpoints import BRANCH_AFTER_PREPARE, DRIVER_AFTER_BEGIN

every_spark = pytest.mark.every_spark

ROOT = Path(__file__).resolve().parents[2]
#: One point per state around the caller's commit (see the module docstring).
STREAM_POINTS = (DRIVER_AFTER_BEGIN, BRANCH_AFTER_PREPARE, COMMIT_AFTER_DECISION,
                 STEP_AFTER_ATTACH)
SINK = "nightly-write"
ROWS = 600


@pytest.fixture(scope="module", params=["ch18"])
def foreach_batch_run(request, tmp_path_factory, zk_hosts: str) -> Iterator[CrashPointRun]:
    """One foreach_batch stream through which the points are tried one by one."""
    yield from crash_point_run(request, tmp_path_factory, zk_hosts, "stream",
                               way="foreach_batch", points=len(STREAM_POINTS))


@every_spark
@pytest.mark.parametrize("point", STREAM_POINTS)
def test_foreach_batch_stream_killed_at_point_is_exactly_once_after_restart(
        foreach_batch_run, point):
    assert_exactly_once_after(foreach_batch_run.run_point(point), point, "the micro-batch")


@pytest.fixture
def viewed_target(clickhouse_url: str) -> Iterator[str]:
    """A target ``db.events`` feeding a materialized view, in a database of its own."""
    db = f"t_{uuid.uuid4().hex[:10]}"
    table = f"{db}.events"
    create_events_table(clickhouse_url, table)
    create_fed_view(clickhouse_url, table)
    yield table
    run_sql(clickhouse_url, f"DROP DATABASE IF EXISTS `{db}`")


def killed_write(url: str, zookeeper: str, table: str, point: str,
                 once_dir: Path) -> subprocess.CompletedProcess:
    """``txsink.write`` of ids 0 .. ROWS-1 with ``txn_version=7`` in a driver of its own,
    killed whole at ``point``."""
    return subprocess.run(
        [sys.executable, "-m", "tests.jobs.versioned_batch", url, zookeeper, table, SINK,
         "7", "0", str(ROWS), "write"],
        cwd=ROOT, capture_output=True, text=True, timeout=240, start_new_session=True,
        env=driver_env(**arm_env([point], "group", once_dir)))


@every_spark
@pytest.mark.parametrize("point", [COMMIT_AFTER_DECISION, STEP_AFTER_ATTACH])
def test_write_killed_at_point_and_rerun_with_its_txn_version_is_exactly_once(
        spark, clickhouse_url, zk_hosts, zk_chroot, viewed_target, tmp_path, point):
    """The orchestrator's rerun finishes the dead driver's xid (its decision stands),
    then finds its version committed and writes nothing again."""
    zookeeper = zk_hosts + zk_chroot
    killed = killed_write(clickhouse_url, zookeeper, viewed_target, point, tmp_path)
    assert killed.returncode == -9, killed.stderr[-3000:]
    txsink.write(events_df(spark, 0, ROWS), table=viewed_target, url=clickhouse_url,
                 zookeeper=zookeeper, sink_id=SINK, txn_version=7, **SHORT_SESSION)
    result = check_with_view(clickhouse_url, viewed_target, range(ROWS))
    assert result.exactly_once, result.summary()
