"""``bad_rows=quarantine``: every bad row lands in the quarantine table exactly once,
beside the good rows in the target exactly once, under the same decision; nothing of a
write (good or bad) is visible before it; the bound and the refusals hold before
anything is staged.

Every input is ``coded_df`` (``tests/jobs/quarantine_batch.py``): rows whose
``id % 50 == 7`` carry ``code = 300`` into a ``UInt8`` column. Runs on 18.16 and 26.x
(fixture ``server``). Two run on one server, for CI's time: the stream on 26.x (a
micro-batch's shares are a batch job's, decided by the same ``commit_epoch``), the driver
kill on 18.16 (a subprocess driver costs ~60-90 s on the loaded CI machine, and recovery
publishes a quarantine share with the code every share goes through).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import txsink
from tests.conftest import run_sql
from tests.harness.crash_arming import arm_env
from tests.jobs.quarantine_batch import CODED_DDL, coded_df, is_bad
from tests.sinkutil import (
    assert_counts_exactly_once,
    assert_exactly_once,
    driver_env,
    save,
    staging_tables,
)
from txsink.ops import cli

ROOT = Path(__file__).resolve().parents[2]
ROWS = 1000


@pytest.fixture(autouse=True)
def _registered(spark) -> None:
    txsink.register(spark)


@pytest.fixture
def options(server_options: dict[str, str], server_db: str) -> dict[str, str]:
    return {**server_options, "sink_id": "quarantine", "bad_rows": "quarantine",
            "quarantine_table": f"{server_db}.bad_rows"}


@pytest.fixture
def target(server_url: str, server_db: str) -> str:
    run_sql(server_url, CODED_DDL.format(table=f"`{server_db}`.`coded`"))
    return f"{server_db}.coded"


def quarantined(url: str, table: str) -> list[dict]:
    """The quarantine table's rows, read by an independent query."""
    db, name = table.split(".")
    body = run_sql(url, f"SELECT * FROM `{db}`.`{name}` FORMAT JSONEachRow")
    return [json.loads(line) for line in body.splitlines()]


def quarantined_ids(url: str, table: str) -> dict[int, int]:
    counts: dict[int, int] = {}
    for row in quarantined(url, table):
        row_id = json.loads(row["row"])["id"]
        counts[row_id] = counts.get(row_id, 0) + 1
    return counts


def exists(url: str, table: str) -> bool:
    db, name = table.split(".")
    return run_sql(url, f"EXISTS TABLE `{db}`.`{name}`").strip() == "1"


def good(count: int) -> list[int]:
    return [i for i in range(count) if not is_bad(i)]


def bad(count: int) -> list[int]:
    return [i for i in range(count) if is_bad(i)]


def test_bad_rows_land_in_the_quarantine_table_once_and_good_rows_in_the_target_once(
        spark, server_url, options, target, capsys):
    assert not exists(server_url, options["quarantine_table"])  # the write creates it
    save(coded_df(spark, ROWS), options, target)
    assert_exactly_once(server_url, target, good(ROWS))
    assert_counts_exactly_once(quarantined_ids(server_url, options["quarantine_table"]),
                               bad(ROWS))
    first = min(quarantined(server_url, options["quarantine_table"]),
                key=lambda r: json.loads(r["row"])["id"])
    assert (first["sink_id"], int(first["epoch"]), first["column"], first["value"]) == (
        "quarantine", 0, "code", "300")
    assert "out of range for UInt8" in first["reason"]
    assert json.loads(first["row"]) == {"id": 7, "day": "2026-01-08", "code": 300,
                                        "name": "e-7"}
    assert first["task"].startswith("p0-a0-s0-")
    assert cli.main(["status", "--zookeeper", options["zookeeper"], "--json"]) == 0
    [sink] = json.loads(capsys.readouterr().out)["sinks"]
    assert [(m["epoch"], m["rows"], m["quarantined"]) for m in sink["recent"]] == [
        (0, len(good(ROWS)), len(bad(ROWS)))]


def test_a_write_past_max_bad_rows_fails_and_leaves_both_tables_without_its_rows(
        spark, server_url, options, target):
    bound = len(bad(ROWS)) - 1  # every task (a quarter of them) is under it, the sum not
    with pytest.raises(Exception, match=f"more than max_bad_rows={bound}"):
        save(coded_df(spark, ROWS), options, target, max_bad_rows=str(bound))
    assert_exactly_once(server_url, target, [])
    assert quarantined(server_url, options["quarantine_table"]) == []
    assert staging_tables(server_url, options) == []


def test_a_retried_task_quarantines_each_bad_row_once(spark, server_url, options, target):
    """Every even id is bad, so each first attempt sends a block of 50 bad rows into its
    quarantine staging (and one of good rows into its own) before it fails."""
    df = coded_df(spark, 400, partitions=2).selectExpr(
        "id", "day", "CAST(CASE WHEN id % 2 = 0 THEN 300 ELSE 1 END AS INT) AS code", "name")

    def fail_first_attempt_after_staging(batches):
        from pyspark import TaskContext

        attempt, sent = TaskContext.get().attemptNumber(), 0
        for batch in batches:
            if attempt == 0 and sent >= 100:
                raise RuntimeError("injected task failure after staging")
            sent += batch.num_rows
            yield batch

    flaky = df.mapInArrow(fail_first_attempt_after_staging, df.schema)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    try:  # blocks of 50 rows: the failed attempts sent bad rows to their staging
        save(flaky, options, target, insert_block_rows="50")
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert_exactly_once(server_url, target, range(1, 400, 2))
    assert_counts_exactly_once(quarantined_ids(server_url, options["quarantine_table"]),
                               range(0, 400, 2))
    assert {r["task"].split("-")[1] for r in quarantined(
        server_url, options["quarantine_table"])} == {"a1"}


def test_a_quarantine_table_of_another_schema_is_refused_by_name_before_staging(
        spark, server_url, server_db, options, target):
    run_sql(server_url, f"CREATE TABLE `{server_db}`.`bad_rows` (id UInt64) "
                        "ENGINE = MergeTree ORDER BY id")
    with pytest.raises(Exception, match=f"{server_db}.bad_rows.*a quarantine table has "
                                        "exactly the columns"):
        save(coded_df(spark, 100), options, target)
    assert staging_tables(server_url, options) == []


def test_a_quarantine_table_that_feeds_a_view_is_refused_by_name_before_staging(
        spark, server_url, server_db, options, target):
    save(coded_df(spark, 10), options, target)  # creates the quarantine table
    run_sql(server_url, f"CREATE MATERIALIZED VIEW `{server_db}`.`bad_count` ENGINE = "
                        f"SummingMergeTree ORDER BY sink_id AS SELECT sink_id, count() AS n "
                        f"FROM `{server_db}`.`bad_rows` GROUP BY sink_id")
    with pytest.raises(Exception, match=f"bad_rows`: it feeds materialized view "
                                        f"{server_db}.bad_count"):
        save(coded_df(spark, 100), options, target)
    assert staging_tables(server_url, options) == []


@pytest.mark.parametrize("server", ["ch26"], indirect=True)
def test_a_stream_quarantines_each_bad_row_once(spark, server, server_url, options, target,
                                                tmp_path):
    source = tmp_path / "in"
    coded_df(spark, 400, partitions=2).write.parquet(str(source))
    stream = spark.readStream.schema(coded_df(spark, 1).schema).parquet(str(source))
    query = (stream.writeStream.format("clickhouse_tx").options(**options)
             .option("table", target).option("checkpointLocation", str(tmp_path / "cp"))
             .start())
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert_exactly_once(server_url, target, good(400))
    assert_counts_exactly_once(quarantined_ids(server_url, options["quarantine_table"]),
                               bad(400))


@pytest.mark.parametrize("server", ["ch26"], indirect=True)
def test_a_transaction_publishes_the_bad_rows_of_its_writes_with_them(
        spark, server, server_url, server_db, options, target):
    run_sql(server_url, CODED_DDL.format(table=f"`{server_db}`.`other`"))
    given = {k: v for k, v in options.items() if k not in ("url", "zookeeper", "sink_id")}
    with txsink.transaction(spark, url=server_url, zookeeper=options["zookeeper"],
                            sink_id="quarantine-tx", **given) as tx:
        tx.write(coded_df(spark, 200, partitions=2), target)
        tx.write(coded_df(spark, 100, partitions=1), f"{server_db}.other")
        assert quarantined(server_url, options["quarantine_table"]) == []  # not yet
    assert_exactly_once(server_url, target, good(200))
    assert_exactly_once(server_url, f"{server_db}.other", good(100))
    kept = quarantined_ids(server_url, options["quarantine_table"])
    assert sorted(kept.items()) == sorted(
        {i: 2 if i < 100 else 1 for i in bad(200)}.items())  # ids 7..57 in both writes


@pytest.mark.parametrize("server", ["ch18"], indirect=True)
def test_a_driver_killed_after_its_decision_ends_with_each_bad_row_once_after_recovery(
        server, server_url, zk_hosts, zk_chroot, server_db, target, tmp_path):
    quarantine, zookeeper = f"{server_db}.bad_rows", zk_hosts + zk_chroot
    env = driver_env(**arm_env(["commit.after_decision"], "group", tmp_path))
    killed = subprocess.run(
        [sys.executable, "-m", "tests.jobs.quarantine_batch", server_url, zookeeper, target,
         quarantine, "killed", "1", str(ROWS)],
        cwd=ROOT, capture_output=True, text=True, timeout=240, env=env,
        start_new_session=True)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert quarantined(server_url, quarantine) == []  # decided, nothing published yet

    assert cli.main(["recover", "--zookeeper", zookeeper, "--url", server_url,
                     "--sink", "killed"]) == 0

    assert_exactly_once(server_url, target, good(ROWS))
    assert_counts_exactly_once(quarantined_ids(server_url, quarantine), bad(ROWS))
