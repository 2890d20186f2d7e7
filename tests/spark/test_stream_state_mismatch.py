"""A streaming checkpoint and the sink's ZooKeeper state that no longer agree are refused.

The sink's epochs are one query's micro-batch ids (coordinator/protocol/stream.py). A deleted
checkpoint (its batches would be skipped as already committed) and a deleted sink state
(a replayed batch would be written again) both fail the query with a
``StreamStateMismatch`` until an operator runs ``txsink reset``; then the stream goes on
exactly once. The sink id here is derived from the checkpoint location, as it is when
the ``sink_id`` option is not set.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from kazoo.client import KazooClient

import txsink
from coordinator import Coordinator, ResetRefused, XidState
from coordinator.plumbing.paths import SinkLayout
from coordinator.sink_admin import SinkAdmin
from tests.sinkutil import assert_exactly_once, create_events
from tests.spark.test_sink_streaming import run_stream, write_input_file
from txsink.ops.cli import main as txsink_cli


@pytest.fixture(autouse=True)
def _registered(spark) -> None:
    txsink.register(spark)


@pytest.fixture
def setup(tmp_path, clickhouse_url, ch_db, zk_hosts, zk_chroot):
    table = create_events(clickhouse_url, ch_db)
    options = {"url": clickhouse_url, "zookeeper": zk_hosts + zk_chroot}  # no sink_id
    return tmp_path / "in", tmp_path / "ckpt", options, table


def only_sink(zk: KazooClient) -> str:
    (sink,) = SinkAdmin.sinks(zk)
    return sink


def reset(options: dict[str, str], sink: str, *flags: str) -> None:
    assert txsink_cli(["reset", "--zookeeper", options["zookeeper"], "--sink", sink,
                       *flags]) == 0


def failed_run(spark, source: Path, checkpoint: Path, options: dict[str, str],
               table: str) -> str:
    """Run the stream, which must fail: the error and all its causes as text (the task's
    Python error sits in a cause when the micro-batch's abort failed too)."""
    with pytest.raises(Exception) as failed:
        run_stream(spark, source, checkpoint, options, table)
    texts, error = [], failed.value
    while error is not None:
        texts.append(str(error))
        error = getattr(error, "_cause", None) or error.__cause__
    return "\n".join(texts)


def forget_commit(checkpoint: Path, batch: int) -> None:
    """As if the driver died after the sink committed ``batch``, before Spark logged it."""
    (checkpoint / "commits" / str(batch)).unlink()
    (checkpoint / "commits" / f".{batch}.crc").unlink(missing_ok=True)


def test_deleted_checkpoint_is_refused_then_reset_lets_the_new_query_write_once(
    spark, clickhouse_url, setup, zk
):
    source, checkpoint, options, table = setup
    for n in range(2):
        write_input_file(source, n, range(n * 100, n * 100 + 100))
    run_stream(spark, source, checkpoint, options, table)
    shutil.rmtree(checkpoint)  # same path, so the same derived sink id
    shutil.rmtree(source)  # the new query's source holds only new rows
    write_input_file(source, 2, range(200, 300))

    refusal = failed_run(spark, source, checkpoint, options, table)
    assert "CheckpointReplaced: stream state mismatch" in refusal
    assert "--forget-epochs" in refusal
    assert_exactly_once(clickhouse_url, table, range(200))  # nothing written, nothing skipped

    reset(options, only_sink(zk), "--forget-epochs")
    run_stream(spark, source, checkpoint, options, table)
    assert_exactly_once(clickhouse_url, table, range(300))


def test_lost_sink_state_is_refused_then_reset_continues_the_stream_once(
    spark, clickhouse_url, setup, zk
):
    source, checkpoint, options, table = setup
    for n in range(2):
        write_input_file(source, n, range(n * 100, n * 100 + 100))
    run_stream(spark, source, checkpoint, options, table)
    forget_commit(checkpoint, 1)  # so the restart replays micro-batch 1
    sink = only_sink(zk)
    zk.delete(SinkLayout("/txsink", sink).sink, recursive=True)

    refusal = failed_run(spark, source, checkpoint, options, table)
    assert "SinkStateLost: stream state mismatch" in refusal
    assert "--committed-through 1" in refusal
    assert_exactly_once(clickhouse_url, table, range(200))  # batch 1 not written again

    reset(options, sink, "--committed-through", "1")  # ids 100..199 are in the target
    write_input_file(source, 2, range(200, 300))
    run_stream(spark, source, checkpoint, options, table)
    assert_exactly_once(clickhouse_url, table, range(300))


def test_restart_of_the_same_checkpoint_is_not_refused(spark, clickhouse_url, setup, zk):
    source, checkpoint, options, table = setup
    for n in range(2):
        write_input_file(source, n, range(n * 100, n * 100 + 100))
    run_stream(spark, source, checkpoint, options, table)
    forget_commit(checkpoint, 1)  # a replay of the last committed batch, then a new one
    write_input_file(source, 2, range(200, 300))
    run_stream(spark, source, checkpoint, options, table)
    assert_exactly_once(clickhouse_url, table, range(300))
    record = json.loads(zk.get(SinkLayout("/txsink", only_sink(zk)).stream)[0])
    query_id = json.loads((checkpoint / "metadata").read_text())["id"]
    assert (record["query_id"], record["since_epoch"]) == (query_id, 0)  # one owner


def test_reset_is_refused_while_the_sink_has_open_xids(zk: KazooClient):
    coord = Coordinator(zk, "busy")
    coord.own_stream("query-1", 0)
    assert coord.begin(0, coord.claim("run-1")) is XidState.INITIALIZED
    with pytest.raises(ResetRefused, match="open xids"):
        SinkAdmin(coord).reset_stream(forget_epochs=True)
    assert coord.xid(0).state is XidState.INITIALIZED
