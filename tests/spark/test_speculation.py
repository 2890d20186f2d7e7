"""Speculative execution on a real standalone cluster: two workers, 127.0.0.2 and .3.

Spark never speculates in local mode, so this test starts a standalone master and two
workers (one core each) on their own loopback addresses, and runs the driver as its own
process. Partition 0's first attempt stalls; Spark launches a speculative copy on the
other worker, which finishes and is authorised to commit. The stalled attempt then
writes its rows too. Only the authorised attempt may become visible, and after
``txsink gc`` no staging of the job may remain. The same through ``txsink.write``
(``mapInArrow``: Spark keeps one attempt's result per partition, and only its message
reaches the commit). Not an ``every_spark`` test: under PySpark 3.5 the stalled attempt
never registered a branch (measured: only the winning copy's branch of partition 0
exists, also with the stall after the rows and small insert blocks), so the test would
prove nothing there.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pyspark
import pytest

from coordinator import Coordinator
from coordinator.sink_admin import SinkAdmin
from tests.conftest import free_port, run_sql
from tests.harness.chaos import jvm
from tests.sinkutil import assert_exactly_once, create_events, driver_env

# Alone (``./run test`` runs it after the other tests): a second test process on the same
# cores changes the task durations Spark's speculation decides on.
pytestmark = pytest.mark.alone

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
ROOT = Path(__file__).resolve().parents[2]


def wait_for_log(path: Path, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise AssertionError(f"{path.name} never logged {text!r}:\n{path.read_text()[-2000:]}")


@pytest.fixture(scope="module")
def standalone_cluster(tmp_path_factory):
    logs = tmp_path_factory.mktemp("cluster")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_NO_DAEMONIZE": "1",
           "PYTHONPATH": jvm.worker_pythonpath(),  # the executors' Python workers start faster
           "SPARK_DAEMON_JAVA_OPTS": jvm.fast_java_options()}
    port = free_port()
    master_url = f"spark://127.0.0.1:{port}"
    procs = []

    def start(name: str, host: str, *args: str) -> Path:
        log = logs / f"{name}.log"
        procs.append(subprocess.Popen(
            [str(SPARK_CLASS), *args], stdout=log.open("wb"), stderr=subprocess.STDOUT,
            env={**env, "SPARK_LOCAL_IP": host}, start_new_session=True,
        ))
        return log

    try:
        master_log = start("master", "127.0.0.1", "org.apache.spark.deploy.master.Master",
                           "--host", "127.0.0.1", "--port", str(port),
                           "--webui-port", str(free_port()))
        wait_for_log(master_log, "I have been elected leader")
        for index, host in enumerate(("127.0.0.2", "127.0.0.3")):
            log = start(f"worker{index}", host, "org.apache.spark.deploy.worker.Worker",
                        "--host", host, "--cores", "1", "--memory", "1g",
                        "--webui-port", str(free_port()), master_url)
            wait_for_log(log, "Successfully registered with master")
        yield master_url
    finally:
        for proc in procs:
            os.killpg(proc.pid, 9)
            proc.wait()


@pytest.mark.parametrize("way", ["datasource", "write"])
def test_speculative_loser_is_never_published(
    standalone_cluster, clickhouse_url, ch_db, zk_hosts, zk_chroot, zk, way
):
    table = create_events(clickhouse_url, ch_db)
    zookeeper = zk_hosts + zk_chroot
    job = subprocess.run(
        [sys.executable, "-m", "tests.jobs.speculative_batch", standalone_cluster,
         clickhouse_url, zookeeper, table, way],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=driver_env(**jvm.java_env(executors=True)),
    )
    assert job.returncode == 0, job.stderr[-3000:]
    (xid,) = SinkAdmin(Coordinator(zk, "speculation")).xids()
    partition0 = [b for b in Coordinator(zk, "speculation").branches(xid.epoch)
                  if b.branch_id.startswith("p0-")]
    assert len(partition0) >= 2, "Spark did not speculate; the test proves nothing"
    assert_exactly_once(clickhouse_url, table, range(4000))
    time.sleep(8)  # the stalled attempt finishes staging after the commit
    gc = subprocess.run(
        [sys.executable, "-m", "txsink", "gc", "--zookeeper", zookeeper,
         "--url", clickhouse_url, "--grace", "0"],
        capture_output=True, text=True, timeout=60,
    )
    assert gc.returncode == 0, gc.stderr
    assert_exactly_once(clickhouse_url, table, range(4000))
    left = run_sql(clickhouse_url, "SELECT name FROM system.tables "
                   "WHERE database = 'txsink_staging' AND name LIKE 'txs_speculation%'")
    assert left.strip() == ""
