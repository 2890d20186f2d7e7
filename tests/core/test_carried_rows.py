"""Carried rows (option ``carry_max_bytes``): a task's few rows ride its commit message,
the driver stages them as one attempt, and every row is visible exactly once.

The first tests are pure logic (the bound, the message's text form); the others write
through every way in on both servers. Crashes of the driver while it stages them are in
``tests/reliability/test_crash_points_carried.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest

import txsink
from coordinator import Coordinator
from tests.conftest import on_18_16_only
from tests.sinkutil import assert_exactly_once, create_events, events_df, save, staging_tables
from txsink.core.carried_rows import CARRY_MAX_TASKS, carried_batches, carry
from txsink.core.messages import CarriedMessage, from_text, to_text
from txsink.core.payload import BranchOwner
from txsink.options import OptionError, parse_options


def _plan(bound: int) -> SimpleNamespace:
    return SimpleNamespace(options=SimpleNamespace(publish=SimpleNamespace(carry_max_bytes=bound)))


def _batches(count: int, rows: int = 100) -> list[pa.RecordBatch]:
    return [pa.record_batch({"id": pa.array(range(i * rows, (i + 1) * rows), pa.int64())})
            for i in range(count)]


def test_rows_within_the_bound_become_one_carried_message_with_every_row():
    message = carry(_plan(1 << 20), 7, iter(_batches(3)), partition=0, stream=("q", "r"))
    assert isinstance(message, CarriedMessage)
    assert (message.epoch, message.rows, message.query_id, message.run_id) == (7, 300, "q", "r")
    rows = [v for b in carried_batches([message]) for v in b.column("id").to_pylist()]
    assert rows == list(range(300))


def test_rows_beyond_the_bound_are_all_handed_back_in_order_for_the_task_to_stage():
    batches = _batches(5)
    handed = carry(_plan(batches[0].nbytes + 1), 7, iter(batches), partition=0)
    assert not isinstance(handed, CarriedMessage)
    assert [b.column("id")[0].as_py() for b in handed] == [0, 100, 200, 300, 400]


def test_a_task_beyond_the_first_partitions_stages_its_rows_to_bound_the_drivers_memory():
    handed = carry(_plan(1 << 20), 7, iter(_batches(1)), partition=CARRY_MAX_TASKS)
    assert not isinstance(handed, CarriedMessage)


def test_a_task_without_rows_carries_an_empty_message():
    message = carry(_plan(1 << 20), 7, iter([]), partition=0)
    assert isinstance(message, CarriedMessage) and message.rows == 0
    assert list(carried_batches([message])) == []


def test_a_carried_message_keeps_its_rows_through_its_text_form():
    message = carry(_plan(1 << 20), 3, iter(_batches(2)), partition=1, stream=("q", "r"))
    assert isinstance(message, CarriedMessage)
    text = to_text(message)
    assert json.loads(text)["kind"] == "carried"
    assert from_text(text) == message


def test_carry_max_bytes_is_off_by_default_and_refused_out_of_range():
    given = {"url": "http://127.0.0.1:8123", "table": "db.t", "zookeeper": "127.0.0.1:2181"}
    assert parse_options(given).publish.carry_max_bytes == 0
    with pytest.raises(OptionError, match="carry_max_bytes"):
        parse_options({**given, "carry_max_bytes": "-1"})


# -- against the servers ------------------------------------------------------------------

CARRY = {"carry_max_bytes": str(8 << 20)}


@pytest.fixture(autouse=True)
def _registered(request) -> None:
    if "spark" in request.fixturenames:
        txsink.register(request.getfixturevalue("spark"))


def _winner_owners(zk, sink_id: str, epoch: int) -> list[dict]:
    coord = Coordinator(zk, sink_id)
    record = coord.xid(epoch)
    return [BranchOwner.from_record(b.owner).task for b in coord.branches(epoch, record.winners)]


def test_a_batch_write_of_carried_rows_is_exactly_once_with_one_branch_staged_by_the_driver(
        spark, server_url, server_db, server_options, zk):
    table = create_events(server_url, server_db)
    before = staging_tables(server_url, server_options)
    save(events_df(spark, 0, 4000), {**server_options, **CARRY, "sink_id": "carried"}, table)
    assert_exactly_once(server_url, table, range(4000))
    owners = _winner_owners(zk, "carried", 0)
    assert len(owners) == 1 and "stage" not in owners[0], owners  # no task's: the driver's
    assert staging_tables(server_url, server_options) == before


def test_tasks_over_the_bound_stage_themselves_beside_the_carried_rows(
        spark, server_url, server_db, server_options):
    """One partition of many rows, three of few: the big one stages in its task, the
    others ride their messages; every row once."""
    table = create_events(server_url, server_db)
    small = events_df(spark, 0, 30, partitions=3)
    big = events_df(spark, 1000, 20_000, partitions=1)
    save(small.union(big), {**server_options, "carry_max_bytes": "4096"}, table)
    assert_exactly_once(server_url, table, [*range(30), *range(1000, 21_000)])


def test_txsink_write_carries_rows_through_its_text_messages(
        spark, server_url, server_db, server_options):
    table = create_events(server_url, server_db)
    txsink.write(events_df(spark, 0, 3000), table=table, **server_options, **CARRY)
    assert_exactly_once(server_url, table, range(3000))


def test_a_stream_of_carried_micro_batches_is_exactly_once(
        spark, tmp_path: Path, server_url, server_db, server_options, zk):
    from tests.spark.test_sink_streaming import run_stream, write_input_file

    table = create_events(server_url, server_db)
    source = tmp_path / "in"
    for n in range(3):
        write_input_file(source, n, range(n * 100, n * 100 + 100))
    options = {**server_options, **CARRY, "sink_id": "carried-stream"}
    run_stream(spark, source, tmp_path / "ckpt", options, table)
    assert_exactly_once(server_url, table, range(300))
    assert all(len(_winner_owners(zk, "carried-stream", e)) == 1 for e in range(3))


@on_18_16_only
def test_a_replayed_carried_micro_batch_writes_nothing_again(
        spark, tmp_path: Path, server, server_url, server_db, server_options):
    """The driver died after the sink's commit, before Spark's commit log: the replay's
    messages carry the rows again, and the commit finds the xid ``Committed`` (decided
    before any server is asked: one server suffices)."""
    from tests.spark.test_sink_streaming import run_stream, write_input_file

    table = create_events(server_url, server_db)
    source, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    write_input_file(source, 0, range(100))
    options = {**server_options, **CARRY, "sink_id": "carried-replay"}
    run_stream(spark, source, checkpoint, options, table)
    for name in ("commits/0", "commits/.0.crc"):  # as if the commit log was never written
        (checkpoint / name).unlink(missing_ok=True)
    run_stream(spark, source, checkpoint, options, table)
    assert_exactly_once(server_url, table, range(100))
