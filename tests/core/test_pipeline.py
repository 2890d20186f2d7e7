"""The pipelined publish's pieces, over an in-memory records table (no servers).

The decision without the publish, the stream check that lets the next micro-batch's
tasks run while the previous epoch is decided, recovery leaving a pipelined writer's own
publish alone, one epoch in flight per sink, and the settle before the next decision.
"""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest

from coordinator import Coordinator, SinkStateLost, XidState
from coordinator.plumbing.keepermap import KeeperMapNodes
from coordinator.protocol.recovery import IN_PROGRESS
from tests.coordinator.test_keepermap_retention import MemoryTable
from txsink.core import pipeline
from txsink.core.metrics import EpochMetrics
from txsink.options import INLINE, PIPELINED, parse_options

OPTIONS = {"url": "http://ch:8123", "table": "db.t", "zookeeper": "zk:2181", "sink_id": "s"}


@pytest.fixture
def memory_store():
    store = KeeperMapNodes(MemoryTable())
    yield store
    store.stop()


def decided(coord: Coordinator, epoch: int, generation: int) -> None:
    coord.begin(epoch, generation)
    assert coord.decide(epoch, generation, []).state is XidState.COMMITTING


def test_decide_leaves_the_xid_committing_until_a_commit_finishes_it(memory_store):
    coord = Coordinator(memory_store, "s")
    generation = coord.fence()
    decided(coord, 0, generation)
    assert coord.xid(0).state is XidState.COMMITTING
    final = coord.commit(0, generation, None, publish=lambda r: None, rollback=lambda r: None)
    assert final.state is XidState.COMMITTED


def test_next_micro_batch_may_start_while_the_previous_epoch_is_decided(memory_store):
    coord = Coordinator(memory_store, "s")
    generation = coord.fence()
    coord.own_stream("q", 0)
    decided(coord, 0, generation)
    coord.own_stream("q", 1)  # epoch 0 is Committing: 1's tasks run meanwhile


def test_next_micro_batch_is_refused_while_the_previous_epoch_is_undecided(memory_store):
    coord = Coordinator(memory_store, "s")
    generation = coord.fence()
    coord.own_stream("q", 0)
    coord.begin(0, generation)
    with pytest.raises(SinkStateLost):
        coord.own_stream("q", 1)


def test_recovery_leaves_a_decided_xid_to_a_holder_it_is_told_to_leave(memory_store):
    writer = Coordinator(memory_store, "s", role="pipelined publisher test")
    generation = writer.fence()
    decided(writer, 0, generation)
    started = time.monotonic()
    with writer.publish_lease(0, generation):
        report = Coordinator(memory_store, "s").recover(
            publish=lambda r: None, rollback=lambda r: None, older_than_generation=0,
            wait_for_holders=30.0, leave_to=lambda holder: "pipelined" in holder)
    assert [a.action for a in report.actions] == [IN_PROGRESS]
    assert time.monotonic() - started < 5.0


def test_recovery_logs_an_xid_left_to_a_pipelined_writers_own_publish_as_no_warning(
        memory_store, caplog):
    """Every streamWriter() of a pipelined stream finds the previous epoch in its
    background publish: expected, so no warning per micro-batch."""
    writer = Coordinator(memory_store, "s", role="pipelined publisher test")
    generation = writer.fence()
    decided(writer, 0, generation)
    with writer.publish_lease(0, generation), caplog.at_level(logging.DEBUG):
        report = Coordinator(memory_store, "s").recover(
            publish=lambda r: None, rollback=lambda r: None, older_than_generation=0,
            wait_for_holders=30.0, leave_to=lambda holder: "pipelined" in holder)
    assert [a.expected for a in report.actions] == [True]
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_recovery_warns_of_an_xid_another_live_holder_keeps(memory_store, caplog):
    writer = Coordinator(memory_store, "s", role="driver elsewhere")
    generation = writer.fence()
    decided(writer, 0, generation)
    with writer.publish_lease(0, generation):
        report = Coordinator(memory_store, "s").recover(
            publish=lambda r: None, rollback=lambda r: None, older_than_generation=0,
            wait_for_holders=0.1, leave_to=lambda holder: "pipelined" in holder)
    assert [(a.action, a.expected) for a in report.actions] == [(IN_PROGRESS, False)]
    assert any("in_progress" in r.getMessage() for r in caplog.records
               if r.levelno == logging.WARNING)


def test_a_holder_is_own_only_with_this_drivers_pipelined_role():
    assert pipeline.is_own(json.dumps({"role": pipeline.role(), "pid": 1}))
    assert not pipeline.is_own(json.dumps({"role": "pipelined publisher elsewhere/1"}))
    assert not pipeline.is_own(json.dumps({"role": "driver"}))
    assert not pipeline.is_own("not json")


def test_a_lease_released_before_its_holder_was_read_is_nobodys():
    """Recovery saw the lease taken, then read no holder: it was released in between."""
    assert not pipeline.is_own(None)


def test_a_pipeline_publishes_one_epoch_at_a_time():
    line = pipeline.Pipeline("sink=t")
    release = threading.Event()
    line.start(1, release.wait)
    assert line.in_flight == 1
    with pytest.raises(RuntimeError, match="still being published"):
        line.start(2, lambda: None)
    release.set()
    assert line.wait(5.0)
    assert line.in_flight is None
    line.start(2, lambda: None)
    assert line.wait(5.0)


def test_a_failed_background_publish_is_left_for_the_next_decision(caplog):
    line = pipeline.Pipeline("sink=t")

    def fail() -> None:
        raise RuntimeError("server gone")

    line.start(3, fail)
    assert line.wait(5.0)
    assert "background publish failed" in caplog.text


def test_settle_finishes_a_previous_epoch_left_committing(memory_store):
    coord = Coordinator(memory_store, "s")
    generation = coord.fence()
    decided(coord, 0, generation)
    finished: list[int] = []
    pipeline.settle(parse_options(OPTIONS), coord, 1, finished.append)
    assert finished == [0]


def test_settle_does_nothing_after_a_committed_previous_epoch(memory_store):
    coord = Coordinator(memory_store, "s")
    generation = coord.fence()
    decided(coord, 0, generation)
    coord.commit(0, generation, None, publish=lambda r: None, rollback=lambda r: None)
    finished: list[int] = []
    pipeline.settle(parse_options(OPTIONS), coord, 1, finished.append)
    assert finished == []


def test_a_commit_worker_that_spark_does_not_reuse_publishes_inline(monkeypatch):
    options = parse_options({**OPTIONS, "publish": "pipelined"})
    monkeypatch.delenv(pipeline.REUSE_VARIABLE, raising=False)
    assert pipeline.worker_mode(options) == INLINE
    monkeypatch.setenv(pipeline.REUSE_VARIABLE, "1")
    assert pipeline.worker_mode(options) == PIPELINED


def test_publish_option_defaults_to_inline_and_refuses_other_values():
    assert parse_options(OPTIONS).publish.mode == INLINE
    assert parse_options({**OPTIONS, "publish": "PIPELINED"}).publish.mode == PIPELINED
    with pytest.raises(ValueError, match="publish='later'"):
        parse_options({**OPTIONS, "publish": "later"})


def test_visibility_lag_runs_from_the_decision_to_the_committed_write():
    metrics = EpochMetrics.timed(100.0, 100.9, began=99.0, decided_at=100.2)
    assert metrics.decide_ms == pytest.approx(200.0)
    assert metrics.visibility_lag_ms == pytest.approx(700.0)
    assert metrics.commit_ms == pytest.approx(900.0)
