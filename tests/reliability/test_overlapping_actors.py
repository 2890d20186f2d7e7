"""Overlapping actors on one sink: every row once, or a clear refusal with nothing lost.

A batch job of the sink runs through the real data source (``ClickHouseTxDataSource``:
driver plan with fence and recovery, task writes, commit) against a real server and
ZooKeeper; Spark's scheduling is left out so that the interleaving is exact. The job
is held at a named step of its commit while another actor runs in its own ZooKeeper
session: ``txsink recover``, a second driver of the same sink (fence + recovery, as at job
start), or the job's own session expires and someone else takes over. Then the job goes
on. An independent checker counts every id in the target, and in the table a materialized
view of the target fills, over HTTP.

The free-running race at the end lets a recover loop and repeated second drivers hammer
the sink while jobs commit, and judges each job by the outcome of its xid.

Every test runs once per publish strategy and store (fixture ``sink``, ids such as
``[ch18-attach_marked-...]``): on ClickHouse 18.16 with a plain target (``attach_marked``)
and a Replicated one (``attach_replicated``), the coordinator's records in ZooKeeper; and
on the modern server with a plain target (``move``), the records in KeeperMap tables of
that server (``[km26-move]``, ``coordinator=keepermap``: the sink is given no ZooKeeper; a
session "expires" when its process stops refreshing it). Replicated tables stay read-only
on the modern server, so no Replicated target there.

``move`` with its records in ZooKeeper has no run of its own, as in the crash-point
suites (``tests/crashcases.py``): the store and the strategy are separate layers. The
actors meet in the store (fence, leases, session expiry, recovery's decisions), which the
two 18.16 runs try over ZooKeeper at every step; ``move`` decides a repeat on its own
evidence, the staging partitions on the server, whatever store holds the intent, and
``[km26-move]`` tries it at every step.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace

import pyarrow as pa
import pytest
from kazoo.client import KazooClient
from pyspark.sql.types import DateType, DoubleType, LongType, StringType, StructField, StructType

import txsink
import txsink.core.crashpoints
from coordinator import Coordinator, Fenced, SinkTakenOver, XidDecided, XidState
from coordinator.formats.steps import RETAIN_STEPS
from coordinator.plumbing.keepermap import CLOCK_MARGIN
from coordinator.plumbing.nodes import NodeStore
from tests.conftest import RECORDS_DATABASE, kazoo_client, run_sql
from tests.coordinator.test_coordinator_session import expire_session
from tests.harness.chaos.pipeline import create_fed_view, fed_table
from tests.sinkutil import SHORT_SESSION, assert_exactly_once, id_counts, staging_tables
from txsink.core import connections, driver
from txsink.core.attempt import write_branch
from txsink.core.plan_checks import check_target
from txsink.ops.commands import Operations
from txsink.options import parse_options
from txsink.spark.datasource import ClickHouseTxDataSource, StreamWriter

SCHEMA = StructType([StructField("id", LongType()), StructField("day", DateType()),
                     StructField("name", StringType()), StructField("value", DoubleType())])
TASKS = 3
ROWS_PER_TASK = 400
ENGINES = {
    "attach_marked": "MergeTree()",
    "attach_replicated": "ReplicatedMergeTree('/clickhouse/tables/{db}/events', '{{replica}}')",
    "move": "MergeTree()",
}
# (server, strategy the sink picks there): what ``sink`` runs each test with; ``km26``: the
# modern server with the coordinator's records in KeeperMap (``coordinator=keepermap``);
# no ``("ch26", "move")``: ``move`` over ZooKeeper adds no step (the module docstring)
SERVER_STRATEGIES = [("ch18", "attach_marked"), ("ch18", "attach_replicated"), ("km26", "move")]



def task_batch(start: int, count: int) -> pa.RecordBatch:
    """What Spark hands one task: rows with ids from ``start`` over three months."""
    ids = list(range(start, start + count))
    days = pa.array([20454 + i % 90 for i in ids], pa.int32()).cast(pa.date32())
    return pa.RecordBatch.from_arrays(
        [pa.array(ids, pa.int64()), days, pa.array([f"e{i}" for i in ids]),
         pa.array([i * 0.5 for i in ids], pa.float64())],
        names=["id", "day", "name", "value"])


class Sink:
    """One sink of the target table, and the ways actors reach it."""

    def __init__(self, url: str, zk_hosts: str, table: str, keepermap: bool = False) -> None:
        self.url = url
        self.zk_hosts = zk_hosts
        self.keepermap = keepermap  # records in KeeperMap: the sink is given no ZooKeeper
        # KeeperMap: a session that a test freezes past its expiry expires 4 s later
        store = ({"coordinator": "keepermap", "records_table": f"{RECORDS_DATABASE}.records",
                  **SHORT_SESSION} if keepermap else {"zookeeper": zk_hosts})
        self.options = {"url": url, "table": table, **store,
                        "sink_id": f"race-{uuid.uuid4().hex[:8]}",
                        "zk_root": f"/txsink-race-{uuid.uuid4().hex[:8]}"}
        self.table = table

    def store_args(self) -> dict[str, str]:
        """The operator's arguments for the sink's store."""
        return ({"coordinator": "keepermap", "records_table": self.options["records_table"]}
                if self.keepermap else {})

    def session(self) -> NodeStore:
        """A session of the sink's store of its own (a process of another actor)."""
        if self.keepermap:
            return connections.records(parse_options(self.options), shared=False)
        return started_client(self.zk_hosts)

    def run_job(self, first_id: int) -> int:
        """One batch job: plan (fence + recovery), TASKS task attempts, commit. Its epoch."""
        writer = ClickHouseTxDataSource(self.options).writer(SCHEMA, False)
        messages = [writer.write(iter([task_batch(first_id + t * ROWS_PER_TASK,
                                                  ROWS_PER_TASK)]))
                    for t in range(TASKS)]
        writer.commit(messages)
        return writer.plan.epoch

    def stream_writer(self) -> StreamWriter:
        """A streaming query's writer of the sink with ``publish=pipelined`` (its plan:
        fence + recovery, as at query start)."""
        options = {**self.options, "publish": "pipelined"}
        writer = ClickHouseTxDataSource(options).streamWriter(SCHEMA, False)
        writer.plan = replace(writer.plan, stream_query=f"query-{self.options['sink_id']}")
        return writer

    def run_micro_batch(self, writer: StreamWriter, epoch: int, first_id: int) -> None:
        """One micro-batch: TASKS task attempts, then the commit, which returns after the
        decision and leaves the publish to the background."""
        messages = [write_branch(writer.plan, epoch,
                                 iter([task_batch(first_id + t * ROWS_PER_TASK,
                                                  ROWS_PER_TASK)]))
                    for t in range(TASKS)]
        driver.commit_epoch(writer.plan, epoch, messages, publish="pipelined")

    def wait_published(self) -> None:
        txsink.wait_published(self.options)

    def expire_then_recover(self) -> dict:
        """The writer's session expires (KeeperMap: its process freezes past the expiry),
        then ``txsink recover`` runs."""
        if self.keepermap:
            store = connections.records(parse_options(self.options))
            store.suspend_heartbeat()
            time.sleep(store.session_timeout + CLOCK_MARGIN + 0.5)
        else:
            expire_session(connections.zookeeper(self.zk_hosts), self.zk_hosts)
        return self.recover()

    def resume_session(self) -> None:
        """After :meth:`expire_then_recover`: the writer's process refreshes again."""
        if self.keepermap:
            connections.records(parse_options(self.options)).resume_heartbeat()

    def recover(self) -> dict:
        """``txsink recover --sink S``: its own ZooKeeper session, as the command has."""
        ops = Operations(self.zk_hosts, zk_root=self.options["zk_root"], url=self.url,
                         **self.store_args())
        try:
            return ops.recover(self.options["sink_id"])
        finally:
            ops.close()

    def prune(self) -> dict:
        """``txsink gc --prune-older-than 1``: its own session, as the command has."""
        ops = Operations(self.zk_hosts, zk_root=self.options["zk_root"], url=self.url,
                         **self.store_args())
        try:
            return ops.gc(grace_seconds=3600, prune_older_than=1.0)
        finally:
            ops.close()

    def second_driver(self) -> list[str]:
        """A second driver of the sink starting: fence, then recover (own session).

        It waits 1 s for a lease holder instead of the driver's 15 s: the holder here is
        alive and held until this actor returns."""
        client = self.session()
        try:
            coord = Coordinator(client, self.options["sink_id"], root=self.options["zk_root"],
                                role="second driver")
            coord.fence()
            publisher = driver.publisher_for(parse_options(self.options), coord)
            report = coord.recover(publish=publisher.publish, rollback=publisher.rollback,
                                   wait_for_holders=1.0)
            return [a.action for a in report.actions]
        finally:
            client.stop()
            client.close()

    def assert_exactly_once(self, ids: range) -> None:
        """Every id once in the target and in the table its materialized view fills."""
        for table in (self.table, fed_table(self.table)):
            assert_exactly_once(self.url, table, ids)

    def coordinator(self, client: NodeStore) -> Coordinator:
        return Coordinator(client, self.options["sink_id"], root=self.options["zk_root"])


def started_client(hosts: str) -> KazooClient:
    client = kazoo_client(hosts)
    client.start(timeout=15)
    return client


def run_in_other_thread(action: Callable[[], object], timeout: float = 120) -> object:
    """Run ``action`` to its end in another thread (its own actor) and return its result."""
    result: list[object] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            result.append(action())
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "the other actor did not finish"
    if errors:
        raise errors[0]
    return result[0]


@pytest.fixture
def hold_at(monkeypatch: pytest.MonkeyPatch) -> Callable[[str, Callable[[], object]], list]:
    """``hold_at(step, action)``: when the commit first reaches ``step`` (in this thread, or
    in one of the threads publishing its winners of different tables), ``action`` runs to
    its end in another actor, then the commit goes on. Returns the results.

    Only the first arrival holds: the other actor starts after it, so none of its own
    steps can be the first."""
    results: list[object] = []

    def arm(step: str, action: Callable[[], object]) -> list:
        first = threading.Lock()
        original = txsink.core.crashpoints.hit

        def hit(name: str) -> None:
            if name == step and first.acquire(blocking=False):  # never released: once
                results.append(run_in_other_thread(action))
            original(name)

        monkeypatch.setattr(txsink.core.crashpoints, "hit", hit)
        return results

    return arm


@pytest.fixture(params=SERVER_STRATEGIES, ids=[f"{s}-{e}" for s, e in SERVER_STRATEGIES])
def sink(request, zk_hosts: str) -> Iterator[Sink]:
    server, strategy = request.param
    url = request.getfixturevalue({"ch18": "clickhouse_url", "km26": "keepermap_url"}[server])
    if server == "km26":
        request.getfixturevalue("records_table")
    db = f"t_{uuid.uuid4().hex[:10]}"
    run_sql(url, f"CREATE DATABASE `{db}`")
    run_sql(url, f"CREATE TABLE `{db}`.`events` (id UInt64, day Date, name String, "
                 f"value Float64) ENGINE = {ENGINES[strategy].format(db=db)} "
                 "PARTITION BY toYYYYMM(day) ORDER BY id")
    create_fed_view(url, f"{db}.events")  # every row must reach the view's table too
    sink = Sink(url, zk_hosts, f"{db}.events", keepermap=server == "km26")
    assert check_target(parse_options(sink.options), SCHEMA).strategy == strategy  # the id's
    yield sink
    run_sql(url, f"DROP DATABASE IF EXISTS `{db}`")


# -- a second actor while the job is held at a step of its commit -------------------------

PUBLISH_STEPS = ["commit.after_decision", "publish.before_partition", "publish.after_intent",
                 "publish.after_attach", "commit.after_publish"]


@pytest.mark.parametrize("step", PUBLISH_STEPS)
def test_txsink_recover_while_the_job_is_at_step_leaves_every_row_once(
        sink: Sink, hold_at, step: str) -> None:
    reports = hold_at(step, sink.recover)
    sink.run_job(0)
    sink.assert_exactly_once(range(TASKS * ROWS_PER_TASK))
    (report,) = reports
    actions = report["sinks"][0]["actions"] if report["sinks"] else []
    if step != "commit.after_decision":  # the job holds the publish lease from then on
        assert actions and all("in_progress" in a for a in actions), actions


@pytest.mark.parametrize("step", PUBLISH_STEPS)
def test_second_driver_starting_while_the_job_is_at_step_leaves_every_row_once(
        sink: Sink, hold_at, step: str) -> None:
    hold_at(step, sink.second_driver)
    sink.run_job(0)  # decided before the fence: the job finishes it and succeeds
    sink.assert_exactly_once(range(TASKS * ROWS_PER_TASK))


@pytest.mark.parametrize("step", ["publish.after_intent", "publish.after_attach"])
def test_job_whose_session_expired_at_step_yields_to_recover_and_rows_appear_once(
        sink: Sink, hold_at, step: str) -> None:
    reports = hold_at(step, sink.expire_then_recover)
    try:
        epoch = sink.run_job(0)
    finally:
        sink.resume_session()
    sink.assert_exactly_once(range(TASKS * ROWS_PER_TASK))
    (report,) = reports
    assert any("rolled_forward" in a for a in report["sinks"][0]["actions"])
    client = sink.session()
    try:
        assert sink.coordinator(client).xid(epoch).state is XidState.COMMITTED
    finally:
        client.stop()
        client.close()


# -- a task attempt overlapping its xid's decision ---------------------------------------


def test_a_task_aborted_between_its_register_and_its_staging_drops_that_staging(
        sink: Sink, hold_at) -> None:
    # The abort rolls back the registered branch before its staging table exists; the
    # task then creates and fills it, and learns of the decision only at prepare.
    writer = ClickHouseTxDataSource(sink.options).writer(SCHEMA, False)
    hold_at("branch.after_register", lambda: writer.abort([]))
    with pytest.raises(XidDecided, match="Aborted"):
        writer.write(iter([task_batch(0, ROWS_PER_TASK)]))
    assert staging_tables(sink.url, sink.options) == []
    assert id_counts(sink.url, sink.table) == {} == id_counts(sink.url, fed_table(sink.table))


def test_a_task_taken_over_between_its_register_and_its_staging_drops_that_staging(
        sink: Sink, hold_at) -> None:
    # A second driver fences the sink and its recovery aborts the xid in that window.
    writer = ClickHouseTxDataSource(sink.options).writer(SCHEMA, False)
    hold_at("branch.after_register", sink.second_driver)
    with pytest.raises(SinkTakenOver):
        writer.write(iter([task_batch(0, ROWS_PER_TASK)]))
    assert staging_tables(sink.url, sink.options) == []
    assert id_counts(sink.url, sink.table) == {} == id_counts(sink.url, fed_table(sink.table))


# -- a second actor while a pipelined micro-batch is published in the background ---------

#: The background publish's own point, two steps of the publish it runs, and the next
#: micro-batch's commit before it waits for that publish.
PIPELINED_STEPS = ["pipeline.before_publish", "publish.after_attach", "pipeline.before_settle"]


@pytest.mark.parametrize("step", PIPELINED_STEPS)
def test_txsink_recover_while_a_pipelined_publish_is_at_step_leaves_every_row_once(
        sink: Sink, hold_at, step: str) -> None:
    reports = hold_at(step, sink.recover)
    writer = sink.stream_writer()
    sink.run_micro_batch(writer, 0, 0)
    sink.run_micro_batch(writer, 1, TASKS * ROWS_PER_TASK)
    sink.wait_published()
    sink.assert_exactly_once(range(2 * TASKS * ROWS_PER_TASK))
    assert len(reports) == 1, "the micro-batches never reached the step"


@pytest.mark.parametrize("step", PIPELINED_STEPS[:2])
def test_second_driver_starting_while_a_pipelined_publish_is_at_step_leaves_every_row_once(
        sink: Sink, hold_at, step: str) -> None:
    """The micro-batch was decided before the fence: it is published once (by its
    background publish or by the second driver's recovery); the fenced writer's next
    decision is refused."""
    held = hold_at(step, sink.second_driver)
    writer = sink.stream_writer()
    sink.run_micro_batch(writer, 0, 0)
    with pytest.raises(Fenced):
        sink.run_micro_batch(writer, 1, TASKS * ROWS_PER_TASK)
    sink.wait_published()
    sink.assert_exactly_once(range(TASKS * ROWS_PER_TASK))
    assert len(held) == 1, "the micro-batch never reached the step"


def test_pipelined_publish_whose_session_expired_yields_to_recover_and_rows_appear_once(
        sink: Sink, hold_at) -> None:
    """The background publish loses its session after its ``ATTACH``; ``txsink recover``
    rolls the epoch forward, the background publish stops at its lost lease, and the
    next micro-batch's commit finds the epoch ``Committed``."""
    reports = hold_at("publish.after_attach", sink.expire_then_recover)
    writer = sink.stream_writer()
    try:
        sink.run_micro_batch(writer, 0, 0)
        sink.run_micro_batch(writer, 1, TASKS * ROWS_PER_TASK)
    finally:
        sink.resume_session()
    sink.wait_published()
    sink.assert_exactly_once(range(2 * TASKS * ROWS_PER_TASK))
    (report,) = reports
    assert any("rolled_forward" in a for a in report["sinks"][0]["actions"])


# -- free-running: recover loop and second drivers against committing jobs ----------------

@pytest.mark.parametrize("step", RETAIN_STEPS)
def test_an_operators_prune_while_a_jobs_retention_pass_is_at_step_keeps_rows_and_evidence(
        sink: Sink, hold_at, step: str) -> None:
    """The job's retention pass (after its ``Committed`` write) removes the first job's
    xid while ``txsink gc --prune-older-than`` prunes the same: every row once, and
    ``verify`` judges every partition by content, none left for pruned history."""
    sink.options["retention"] = "1"
    sink.run_job(0)
    time.sleep(1.5)
    pruned = hold_at(step, sink.prune)
    sink.run_job(TASKS * ROWS_PER_TASK)
    sink.assert_exactly_once(range(2 * TASKS * ROWS_PER_TASK))
    assert len(pruned) == 1, "the job's retention pass never reached the step"
    ops = Operations(sink.zk_hosts, zk_root=sink.options["zk_root"], url=sink.url,
                     **sink.store_args())
    try:
        (report,) = ops.verify(sink.options["sink_id"])["sinks"]
    finally:
        ops.close()
    assert (report["anomalies"], report["target"]["not_judged"]) == ([], [])
    assert report["target"]["partitions_ok_by_count"] == 0


RACE_JOBS = int(os.environ.get("TXSINK_RACE_JOBS", "4"))  # more for a long run by hand


def test_recover_loop_and_second_drivers_racing_committing_jobs_never_duplicate(
        sink: Sink) -> None:
    stop = threading.Event()
    rounds = {"recover": 0, "second_driver": 0, "fenced": 0}
    errors: list[BaseException] = []

    def loop(name: str, action: Callable[[], object], pause: float) -> None:
        try:
            while not stop.is_set():
                try:
                    action()
                    rounds[name] += 1
                except Fenced:  # another actor fenced the sink while this one ran: its refusal
                    rounds["fenced"] += 1
                time.sleep(pause)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    # a second driver often enough that some jobs are taken over, seldom enough that others
    # commit (a KeeperMap job's steps take longer)
    pause = 3.0 if sink.keepermap else 1.5
    actors = [threading.Thread(target=loop, args=("recover", sink.recover, 0.0), daemon=True),
              threading.Thread(target=loop, args=("second_driver", sink.second_driver, pause),
                               daemon=True)]
    for actor in actors:
        actor.start()
    outcomes: dict[int, str] = {}
    try:
        for job in range(RACE_JOBS):
            try:
                sink.run_job(job * 10_000)
                outcomes[job] = "succeeded"
            except SinkTakenOver as exc:  # a second driver took the sink before the decision
                assert sink.options["sink_id"] in str(exc)
                outcomes[job] = "taken over"
    finally:
        stop.set()
        for actor in actors:
            actor.join(timeout=120)
    assert not errors, errors
    sink.recover()  # what the last second driver left undecided is rolled back
    counts = id_counts(sink.url, sink.table)
    assert counts == id_counts(sink.url, fed_table(sink.table)), "the view's table differs"
    assert max(counts.values(), default=1) == 1, "an id is visible twice"
    for job, outcome in outcomes.items():
        ids = range(job * 10_000, job * 10_000 + TASKS * ROWS_PER_TASK)
        seen = sum(1 for i in ids if i in counts)
        if outcome == "succeeded":
            assert seen == len(ids), f"job {job} succeeded but lost rows"
        else:
            assert seen in (0, len(ids)), f"job {job} is half visible"
    assert rounds["recover"] > 0 and rounds["second_driver"] > 0
    assert "succeeded" in outcomes.values(), f"no job committed in the race: {outcomes}"
    print(f"race: {len(outcomes)} jobs ({sum(o == 'succeeded' for o in outcomes.values())} "
          f"succeeded, {sum(o == 'taken over' for o in outcomes.values())} taken over), "
          f"{rounds['recover']} recover runs, {rounds['second_driver']} second drivers, "
          f"{rounds['fenced']} refused as fenced, "
          f"{len(counts)} ids, none twice")
