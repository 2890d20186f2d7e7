"""Spark finds ``clickhouse_tx`` by itself in a regular install, without ``txsink.register``.

Spark registers the ``DefaultSource`` of every installed top-level ``pyspark_*`` module
(txsink ships ``pyspark_txsink``), but the editable install of the test run is an import
hook that Spark does not see. So the sink is installed from this checkout into a
temporary directory, and one fresh Python process with only that directory on its path
starts local Spark and writes (``JOB``); the tests read what it reports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import run_sql
from tests.harness.chaos import jvm
from tests.harness.spark_versions import project_wheel
from tests.sinkutil import assert_exactly_once, coordinator_root, id_counts

ROWS = 1000
ZK_PARENT = "/txsink-test-discovery"

# Three writes, one table each. The new thread has no active session, which Spark needs
# even for a data source it registered by itself; register() gives it one.
JOB = r"""
import json, sys, threading
import pyspark_txsink, txsink
from pyspark.sql import SparkSession

args = json.loads(sys.argv[1])
spark = (SparkSession.builder.master("local[2]").appName("txsink-discovery")
         .config("spark.ui.enabled", "false").config("spark.driver.memory", "1g")
         .getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
result = {"txsink": txsink.__file__, "pyspark_txsink": pyspark_txsink.__file__}

def save(key, register=False):
    try:
        if register:
            txsink.register(spark)
        (spark.range(args["rows"], numPartitions=2).write.format("clickhouse_tx")
            .options(**args["options"]).option("table", args["tables"][key])
            .mode("append").save())
        result[key] = "ok"
    except Exception as exc:
        result[key] = f"{type(exc).__name__}: {exc}"[:500]

def in_new_thread(*call):
    thread = threading.Thread(target=save, args=call)
    thread.start()
    thread.join()

save("main")
in_new_thread("thread")
in_new_thread("registered", True)
spark.stop()
print(json.dumps(result))
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A regular (not editable) install of this checkout: the project's wheel, the one the
    older PySparks' virtualenvs install (``spark_versions.project_wheel``: built from a
    copy of the product's files, so setuptools' ``build/`` in the checkout cannot add
    modules deleted since, and cached by their content: ``./run test`` builds it for the
    virtualenvs while the suite runs, and a build here is the one they then find)."""
    target = tmp_path_factory.mktemp("discovery") / "site"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
         "--disable-pip-version-check", "--target", str(target), str(project_wheel())],
        capture_output=True, text=True, timeout=240, env=_env_without_pythonpath())
    assert done.returncode == 0, done.stderr[-3000:]
    return target


@pytest.fixture(scope="module")
def tables(clickhouse_url: str) -> Iterator[dict[str, str]]:
    db = f"t_{uuid.uuid4().hex[:10]}"
    run_sql(clickhouse_url, f"CREATE DATABASE `{db}`")
    names = {key: f"{db}.{key}" for key in ("main", "thread", "registered")}
    for name in names.values():
        run_sql(clickhouse_url, f"CREATE TABLE {name} (id UInt64) ENGINE = MergeTree() "
                                "ORDER BY id")
    yield names
    run_sql(clickhouse_url, f"DROP DATABASE IF EXISTS `{db}`")


@pytest.fixture(scope="module")
def zk_root(zk_hosts: str) -> Iterator[str]:
    """The coordinator root of this run, under ``/txsink-test-discovery``; deleted after."""
    yield from coordinator_root(zk_hosts, ZK_PARENT)


@pytest.fixture(scope="module")
def job(installed: Path, tables: dict[str, str], clickhouse_url: str, zk_hosts: str,
        zk_root: str) -> dict[str, str]:
    """What ``JOB`` reports: ``"ok"`` or the error of each write."""
    args = {"rows": ROWS, "tables": tables,
            "options": {"url": clickhouse_url, "zookeeper": zk_hosts, "zk_root": zk_root}}
    env = {**_env_without_pythonpath(), "PYTHONPATH": str(installed),
           "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           **jvm.java_env()}  # the fault runs' fast JVM start; the path stays the install's
    done = subprocess.run([sys.executable, "-c", JOB, json.dumps(args)], cwd=installed,
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    # the job ran the installed copy, not this checkout or its editable install
    assert result.pop("txsink").startswith(str(installed))
    assert result.pop("pyspark_txsink").startswith(str(installed))
    return result


def _env_without_pythonpath() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_a_fresh_session_writes_clickhouse_tx_without_register(job, tables, clickhouse_url):
    assert job["main"] == "ok"
    assert_exactly_once(clickhouse_url, tables["main"], range(ROWS))


def test_a_new_thread_without_register_does_not_find_it(job, tables, clickhouse_url):
    assert "DATA_SOURCE_NOT_FOUND" in job["thread"]
    assert id_counts(clickhouse_url, tables["thread"]) == {}


def test_register_after_discovery_still_writes(job, tables, clickhouse_url):
    assert job["registered"] == "ok"
    assert_exactly_once(clickhouse_url, tables["registered"], range(ROWS))


def test_importing_pyspark_txsink_loads_none_of_the_sink(installed):
    """Spark imports every ``pyspark_*`` module in every application: ours stays light."""
    probe = ("import sys, pyspark.sql.datasource; before = set(sys.modules); "
             "import pyspark_txsink; print(sorted(set(sys.modules) - before))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=installed, check=True,
                          env={**_env_without_pythonpath(), "PYTHONPATH": str(installed)},
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "['pyspark_txsink']"


def test_the_discovered_source_is_clickhouse_tx_with_every_method_of_it():
    """``DefaultSource`` hands each call on to the sink, so it has to offer all of them."""
    from pyspark.sql.datasource import DataSource

    from txsink.spark.datasource import ClickHouseTxDataSource
    from txsink.spark.pyspark_txsink import DefaultSource

    def spark_methods(cls: type) -> set[str]:
        return {name for name in vars(cls)
                if not name.startswith("_") and hasattr(DataSource, name)}

    assert DefaultSource.name() == ClickHouseTxDataSource.name()
    assert spark_methods(ClickHouseTxDataSource) <= spark_methods(DefaultSource)
