"""Streaming writes: each micro-batch is one xid whose epoch is the batch id.

Every test runs on ClickHouse 18.16 and on the modern server (``[ch18]`` / ``[ch26]``,
fixture ``server``): the driver dying between the sink's commit and Spark's commit log
(the replay test) must be harmless with either publish strategy (``attach_marked`` on
18.16, ``move`` on 26.x). Kills at every named crash point are in
``test_crash_points_streaming.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from pyspark.errors import StreamingQueryException

import txsink
from coordinator import Coordinator
from coordinator.sink_admin import SinkAdmin
from tests.conftest import run_sql
from tests.sinkutil import assert_exactly_once, create_events, staging_tables

SCHEMA = "id LONG, day DATE, name STRING, value DOUBLE"


@pytest.fixture(autouse=True)
def _registered(spark) -> None:
    txsink.register(spark)


def write_input_file(folder: Path, index: int, ids: range) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps({"id": i, "day": f"2026-0{1 + i % 3}-15", "name": f"e{i}", "value": i / 2})
        for i in ids
    ]
    (folder / f"part-{index:04d}.json").write_text("\n".join(lines) + "\n")


def run_stream(spark, source: Path, checkpoint: Path, options: dict[str, str], table: str):
    """Process every file present now, one file per micro-batch, then stop."""
    query = (
        spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(source))
        .writeStream.format("clickhouse_tx").options(**options).option("table", table)
        .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    )
    query.awaitTermination(180)
    if query.exception():
        raise query.exception()


@pytest.fixture
def stream_setup(tmp_path, server_url, server_db, server_options):
    table = create_events(server_url, server_db)
    options = {**server_options, "sink_id": "events"}
    return tmp_path / "in", tmp_path / "ckpt", options, table


def test_each_micro_batch_commits_its_rows_exactly_once(spark, server_url, stream_setup, zk):
    source, checkpoint, options, table = stream_setup
    for n in range(3):
        write_input_file(source, n, range(n * 100, n * 100 + 100))
    run_stream(spark, source, checkpoint, options, table)
    assert_exactly_once(server_url, table, range(300))
    assert SinkAdmin(Coordinator(zk, "events")).last_committed() == 2


def test_pipelined_micro_batches_are_exactly_once_and_visible_after_waiting(
        spark, server_url, stream_setup, zk):
    """``publish=pipelined``: each commit returns after its decision and the next
    decision waits for the previous publish; the last epoch is visible once
    ``txsink.wait_published`` returns, and each epoch records its visibility lag."""
    source, checkpoint, options, table = stream_setup
    options = {**options, "publish": "pipelined"}
    for n in range(3):
        write_input_file(source, n, range(n * 100, n * 100 + 100))
    run_stream(spark, source, checkpoint, options, table)
    txsink.wait_published(options)
    assert_exactly_once(server_url, table, range(300))
    coord = Coordinator(zk, "events")
    assert SinkAdmin(coord).last_committed() == 2
    metrics = [coord.xid(epoch).metrics for epoch in range(3)]
    assert {m.get("publish") for m in metrics} == {"pipelined"}
    assert all(m["visibility_lag_ms"] >= 0 for m in metrics)


def test_restarted_query_continues_without_duplicates(spark, server_url, stream_setup):
    source, checkpoint, options, table = stream_setup
    write_input_file(source, 0, range(0, 100))
    run_stream(spark, source, checkpoint, options, table)
    write_input_file(source, 1, range(100, 250))
    run_stream(spark, source, checkpoint, options, table)
    assert_exactly_once(server_url, table, range(250))


def test_a_running_query_fenced_by_a_newer_run_writes_nothing_more(
        spark, server_url, stream_setup, zk):
    """The run's tasks claimed its generation at its first micro-batch and do not claim
    again (``attempt.JoinedRuns``): a newer run's claim still refuses the next one, at
    its first step, before anything is staged."""
    source, checkpoint, options, table = stream_setup
    write_input_file(source, 0, range(0, 100))
    query = (spark.readStream.schema(SCHEMA).json(str(source)).writeStream
             .format("clickhouse_tx").options(**options).option("table", table)
             .option("checkpointLocation", str(checkpoint)).start())
    try:
        query.processAllAvailable()
        Coordinator(zk, "events").claim("a newer run")
        write_input_file(source, 1, range(100, 200))
        with pytest.raises(StreamingQueryException, match="SinkTakenOver"):
            query.processAllAvailable()
    finally:
        query.stop()
    assert_exactly_once(server_url, table, range(100))
    assert staging_tables(server_url, options) == []


def test_replayed_committed_micro_batch_writes_nothing(
    spark, server_url, stream_setup, zk: KazooClient
):
    source, checkpoint, options, table = stream_setup
    for n in range(2):
        write_input_file(source, n, range(n * 100, n * 100 + 100))
    run_stream(spark, source, checkpoint, options, table)
    # As if the driver died after the sink committed but before Spark wrote commits/1.
    (checkpoint / "commits" / "1").unlink()
    (checkpoint / "commits" / ".1.crc").unlink(missing_ok=True)
    run_stream(spark, source, checkpoint, options, table)
    assert_exactly_once(server_url, table, range(200))
    assert SinkAdmin(Coordinator(zk, "events")).last_committed() == 1


def run_counts(spark, source: Path, checkpoint: Path, mode: str, clickhouse_url: str,
               zk_hosts: str, table: str) -> None:
    """A running count per id in ``mode``, until the input is processed; raises the
    query's failure. The refusals below run on 18.16 only: they come before any server
    is asked."""
    query = (
        spark.readStream.schema(SCHEMA).json(str(source)).groupBy("id").count()
        .selectExpr("id", "DATE'2026-01-01' AS day", "'n' AS name",
                    "CAST(count AS DOUBLE) AS value")
        .writeStream.format("clickhouse_tx").outputMode(mode)
        .option("url", clickhouse_url).option("zookeeper", zk_hosts).option("table", table)
        .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    )
    query.awaitTermination(180)


def test_complete_mode_is_refused_saying_the_sink_appends(
    spark, tmp_path, clickhouse_url, ch_db, zk_hosts
):
    table = create_events(clickhouse_url, ch_db)
    write_input_file(tmp_path / "in", 0, range(10))
    with pytest.raises(StreamingQueryException) as failure:
        run_counts(spark, tmp_path / "in", tmp_path / "ckpt", "complete", clickhouse_url,
                   zk_hosts, table)
    assert "cannot run outputMode('complete')" in str(failure.value)
    assert "clickhouse_tx appends each micro-batch's rows" in str(failure.value)
    assert run_sql(clickhouse_url, f"SELECT count() FROM {table}").strip() == "0"


def test_update_mode_is_refused_by_spark_for_a_python_data_source(
    spark, tmp_path, clickhouse_url, ch_db, zk_hosts
):
    """Measured with PySpark 4.3; docs/usage.md says so."""
    table = create_events(clickhouse_url, ch_db)
    write_input_file(tmp_path / "in", 0, range(10))
    with pytest.raises(StreamingQueryException,
                       match="clickhouse_tx does not support Update mode"):
        run_counts(spark, tmp_path / "in", tmp_path / "ckpt", "update", clickhouse_url,
                   zk_hosts, table)
    assert run_sql(clickhouse_url, f"SELECT count() FROM {table}").strip() == "0"
