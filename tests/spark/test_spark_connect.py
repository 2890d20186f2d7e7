"""Through a Spark Connect client, ``clickhouse_tx`` writes exactly once, as in classic Spark.

A Connect session cannot share a process with the suite's classic ``spark`` session, so
one job (``tests/jobs/connect_writes.py``) starts a local Spark Connect server in a fresh
process, connects to it as a Connect client, calls ``txsink.register`` and then runs a
batch write (on each server), a two-micro-batch stream and a two-table
``txsink.transaction()``; the tests read what it reports and what the tables hold.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import txsink
from tests.conftest import run_sql
from tests.sinkutil import assert_exactly_once, coordinator_root, driver_env
from txsink.options import CREDENTIAL_VARIABLES

REPO = Path(__file__).resolve().parents[2]
ROWS = 100
STREAM_FILES = 2  # one micro-batch each
ZK_PARENT = "/txsink-test-connect"


@pytest.fixture(scope="module")
def tables(clickhouse_url: str, modern_clickhouse_url: str) -> Iterator[dict[str, str]]:
    """One table per write: ``batch_modern`` on the modern server, the rest on 18.16."""
    db = f"t_{uuid.uuid4().hex[:10]}"
    servers = {"batch": clickhouse_url, "batch_modern": modern_clickhouse_url,
               "stream": clickhouse_url, "tx_first": clickhouse_url,
               "tx_second": clickhouse_url}
    for url in set(servers.values()):
        run_sql(url, f"CREATE DATABASE `{db}`")
    for key, url in servers.items():
        run_sql(url, f"CREATE TABLE `{db}`.`{key}` (id UInt64) ENGINE = MergeTree() "
                     "ORDER BY id")
    yield {key: f"{db}.{key}" for key in servers}
    for url in set(servers.values()):
        run_sql(url, f"DROP DATABASE IF EXISTS `{db}`")


@pytest.fixture(scope="module")
def zk_root(zk_hosts: str) -> Iterator[str]:
    """The coordinator root of the job, under ``/txsink-test-connect``; deleted after."""
    yield from coordinator_root(zk_hosts, ZK_PARENT)


@pytest.fixture(scope="module")
def job(tmp_path_factory, tables: dict[str, str], clickhouse_url: str,
        modern_clickhouse_url: str, zk_hosts: str, zk_root: str) -> dict[str, str]:
    """What the Connect job reports: ``"ok"`` or the error of each step."""
    folder = tmp_path_factory.mktemp("connect")
    source = folder / "in"
    source.mkdir()
    for index in range(STREAM_FILES):
        ids = range(index * ROWS, (index + 1) * ROWS)
        (source / f"part-{index}.json").write_text(
            "".join(json.dumps({"id": i}) + "\n" for i in ids))
    args = {"rows": ROWS, "tables": tables, "modern_url": modern_clickhouse_url,
            "stream_source": str(source), "checkpoint": str(folder / "ckpt"),
            "options": {"url": clickhouse_url, "zookeeper": zk_hosts, "zk_root": zk_root}}
    done = subprocess.run([sys.executable, "-m", "tests.jobs.connect_writes",
                           json.dumps(args)], cwd=REPO, capture_output=True, text=True,
                          timeout=280, env=_job_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def _job_env() -> dict[str, str]:
    """The job's environment: its driver starts as a fault run's does (``driver_env``)."""
    return driver_env(PYSPARK_DRIVER_PYTHON=sys.executable)


def test_the_job_writes_through_a_spark_connect_session(job):
    assert job["session"] == "pyspark.sql.connect.session.SparkSession"


def test_register_works_on_a_connect_session(job):
    assert job["register"] == "ok"


def test_a_batch_write_through_connect_commits_exactly_once(job, tables, clickhouse_url):
    assert job["batch"] == "ok"
    assert_exactly_once(clickhouse_url, tables["batch"], range(ROWS))


def test_a_batch_write_through_connect_commits_exactly_once_on_the_modern_server(
        job, tables, modern_clickhouse_url):
    assert job["batch_modern"] == "ok"
    assert_exactly_once(modern_clickhouse_url, tables["batch_modern"], range(ROWS))


def test_a_stream_through_connect_commits_each_micro_batch_exactly_once(
        job, tables, clickhouse_url):
    assert job["stream"] == "ok"
    assert json.loads(job["stream_batches"]) == list(range(STREAM_FILES))
    assert_exactly_once(clickhouse_url, tables["stream"], range(STREAM_FILES * ROWS))


def test_a_transaction_through_connect_commits_both_tables(job, tables, clickhouse_url):
    assert job["transaction"] == "ok"
    assert_exactly_once(clickhouse_url, tables["tx_first"], range(ROWS))
    assert_exactly_once(clickhouse_url, tables["tx_second"], range(ROWS, 2 * ROWS))


class FakeConnectSession:
    """What ``register`` sees of a Connect session: no JVM session, a ``dataSource``."""

    def __init__(self) -> None:
        self.registered: list[str] = []
        self.dataSource = self

    def register(self, source: type) -> None:
        self.registered.append(source.name())


def test_register_on_connect_warns_that_credential_variables_stay_in_the_client(
        monkeypatch, caplog):
    monkeypatch.setenv("TXSINK_CLICKHOUSE_USER", "writer")
    monkeypatch.setenv("TXSINK_CLICKHOUSE_PASSWORD", "s3cret-value")
    session = FakeConnectSession()
    with caplog.at_level(logging.WARNING, logger="txsink.spark.registration"):
        txsink.register(session)
    assert session.registered == ["clickhouse_tx", "clickhouse_plain"]
    assert ("TXSINK_CLICKHOUSE_USER, TXSINK_CLICKHOUSE_PASSWORD set in this client do not "
            "reach the Connect server") in caplog.text
    assert "s3cret-value" not in caplog.text and "writer" not in caplog.text


def test_register_on_connect_without_credential_variables_says_nothing(monkeypatch, caplog):
    for variable in CREDENTIAL_VARIABLES.values():
        monkeypatch.delenv(variable, raising=False)
    with caplog.at_level(logging.DEBUG, logger="txsink.spark.registration"):
        txsink.register(FakeConnectSession())
    assert caplog.records == []
