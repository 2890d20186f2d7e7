"""ClickHouse killed (kill -9) while an epoch prepares, commits or publishes, with a
materialized view in the target's tree: every row ends visible exactly once in the target
and in the view's table, and the xid never stays ``Committing`` (no operator action).

The job is held at a named step (``hold_at`` of
``tests/reliability/test_overlapping_actors.py``) while its private ClickHouse server is
killed; the server comes back a moment later, while the job goes on and meets it dead or
restarting. What an operator's supervisor does next is what a job does: ``txsink
recover`` (the next job's start), then a rerun if none of the job's rows is visible.
Strategies: ``move`` on the modern server (26.x), and ``attach_replicated`` on 18.16
with a Replicated target feeding a plain MergeTree view. With ``publish=pipelined`` the
server dies under the background publish of a decided micro-batch, which the next
micro-batch's commit then publishes: no rerun. The server's ZooKeeper down while a job
plans leaves a Replicated target read-only for a while: the plan waits for it.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from coordinator import PublishFailed, XidState
from coordinator.sink_admin import SinkAdmin
from server_ext.publish.publish_ledger import ledger_key
from tests.conftest import run_sql
from tests.harness.chaos.faults import (
    discard,
    kill_server,
    private_services,
    restart_server,
)
from tests.harness.chaos.pipeline import create_fed_view
from tests.harness.modern_server import chdb_version
from tests.harness.services import Services, port_open
from tests.reliability.test_overlapping_actors import (  # noqa: F401 - hold_at is a fixture
    ROWS_PER_TASK,
    TASKS,
    Sink,
    hold_at,
    started_client,
)
from txsink.core import pipeline
from txsink.core.publisher import publish_manifest
from txsink.ops.commands import Operations

PORT_BASE = 28600
# (server, strategy, engine of the target)
CASES = [("modern", "move", "MergeTree()"),
         ("18.16", "attach_replicated",
          "ReplicatedMergeTree('/clickhouse/tables/{db}/events', '{{replica}}')")]
STEPS = ["branch.after_seal", "commit.after_decision", "publish.after_intent",
         "publish.after_attach"]
DOWNTIME = 1.0  # seconds between the kill and the restart


def free_base(offset: int) -> int:
    for base in range(PORT_BASE + offset, PORT_BASE + offset + 200, 10):
        if not any(port_open(base + p) for p in range(1, 7)):
            return base
    raise RuntimeError("no free port range for a private server")


@pytest.fixture(scope="module", params=CASES, ids=[f"{s}-{st}" for s, st, _ in CASES])
def private(request, tmp_path_factory) -> Iterator[tuple[Services, str, str]]:
    server, strategy, engine = request.param
    if server == "modern" and chdb_version() is None:
        pytest.skip("needs the chdb package")
    services = private_services(tmp_path_factory.mktemp(f"kills-{server}"),
                                free_base(0 if server == "modern" else 300), server)
    try:
        services.up()
        yield services, strategy, engine
    finally:
        discard(services)


@pytest.fixture
def sink(private, zk_hosts: str) -> Iterator[tuple[Sink, Services]]:
    services, strategy, engine = private
    yield events_sink(services.clickhouse.url, zk_hosts, engine), services


def events_sink(url: str, zk_hosts: str, engine: str) -> Sink:
    """A sink of a new table ``events`` of ``engine`` (``{db}``: its database) that feeds
    a materialized view."""
    db = f"t_{uuid.uuid4().hex[:10]}"
    run_sql(url, f"CREATE DATABASE `{db}`")
    run_sql(url, f"CREATE TABLE `{db}`.`events` (id UInt64, day Date, name String, "
                 f"value Float64) ENGINE = {engine.format(db=db)} "
                 "PARTITION BY toYYYYMM(day) ORDER BY id")
    create_fed_view(url, f"{db}.events")
    return Sink(url, zk_hosts, f"{db}.events")


def kill_then_restart(services: Services) -> Callable[[], None]:
    """Kill ClickHouse now; bring it back after ``DOWNTIME`` in the background."""

    def action() -> None:
        assert kill_server(services, "clickhouse"), "the server was not running"
        threading.Timer(DOWNTIME, restart_server, (services, "clickhouse")).start()

    return action


def wait_ready(services: Services, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if services.clickhouse.ready():
            return
        time.sleep(0.2)
    raise AssertionError("the killed server did not come back")


def counts(sink: Sink) -> tuple[int, int, int]:
    """(rows, distinct ids) in the target, and rows in the view's table."""
    target = run_sql(sink.url, f"SELECT count(), uniqExact(id) FROM {sink.table}").split()
    fed = run_sql(sink.url, f"SELECT count() FROM {sink.table}_fed").strip()
    return int(target[0]), int(target[1]), int(fed)


@pytest.mark.parametrize("step", STEPS)
def test_clickhouse_killed_at_step_ends_exactly_once_and_never_stuck(
        sink, hold_at, step: str) -> None:  # noqa: F811 - the imported fixture
    sink, services = sink
    expected = TASKS * ROWS_PER_TASK
    hold_at(step, kill_then_restart(services))
    try:
        sink.run_job(0)
        first_run = "succeeded"
    except Exception as exc:  # noqa: BLE001 - the server was down: any refusal will do
        first_run = f"failed: {type(exc).__name__}"
    wait_ready(services)
    sink.recover()  # what the next job's start does
    rows, ids, fed = counts(sink)
    assert rows in (0, expected), f"half visible after recovery ({first_run}): {rows}"
    if rows == 0:
        sink.run_job(0)  # nothing visible: the operator reruns the job
    assert counts(sink) == (expected, expected, expected), first_run
    sink.assert_exactly_once(range(expected))
    assert_none_stuck(sink)


@pytest.mark.parametrize("step", ["pipeline.before_publish", "publish.after_intent",
                                  "publish.after_attach"])
def test_clickhouse_killed_while_a_pipelined_publish_is_at_step_publishes_it_once(
        sink, hold_at, step: str) -> None:  # noqa: F811 - the imported fixture
    """``publish=pipelined``: the micro-batch was decided before the kill, so its rows
    must appear without a rerun: the next micro-batch's commit finishes it first."""
    sink, services = sink
    expected = TASKS * ROWS_PER_TASK
    held = hold_at(step, kill_then_restart(services))
    writer = sink.stream_writer()
    sink.run_micro_batch(writer, 0, 0)  # returns after the decision
    pipeline.wait_all()  # the background publish met the dead server
    wait_ready(services)
    sink.run_micro_batch(writer, 1, expected)
    sink.wait_published()
    assert len(held) == 1, "the background publish never reached the step"
    assert counts(sink) == (2 * expected,) * 3
    sink.assert_exactly_once(range(2 * expected))
    assert_none_stuck(sink)


def assert_none_stuck(sink: Sink) -> None:
    """No xid of the sink left ``Initialized``, ``Committing`` or ``Aborting``."""
    client = started_client(sink.zk_hosts)
    try:
        states = {x.epoch: x.state for x in SinkAdmin(sink.coordinator(client)).xids()}
    finally:
        client.stop()
        client.close()
    stuck = {e: s for e, s in states.items()
             if s in (XidState.INITIALIZED, XidState.COMMITTING, XidState.ABORTING)}
    assert not stuck, states


# -- attach_marked: a restart inside its window, resolved by the operator ------------------


@pytest.fixture(scope="module")
def classic(tmp_path_factory) -> Iterator[Services]:
    services = private_services(tmp_path_factory.mktemp("kills-marked"), free_base(600))
    try:
        services.up()
        yield services
    finally:
        discard(services)


class CrashHere(RuntimeError):
    """The job's process dies at the held step."""


def test_a_restart_inside_the_attach_marked_window_is_resolved_with_txsink_resolve_without_loss(
        classic, zk_hosts, hold_at) -> None:  # noqa: F811 - the imported fixture
    url = classic.clickhouse.url
    sink = events_sink(url, zk_hosts, "MergeTree()")
    db = sink.table.split(".")[0]

    def restart_then_die() -> None:
        # the restart forgets the publish's STOP MERGES: the server merges the attached
        # parts (OPTIMIZE stands for its background merges), so a repeat cannot tell
        kill_server(classic, "clickhouse")
        restart_server(classic, "clickhouse")
        wait_ready(classic)
        for table in ("events", "events_fed"):
            run_sql(url, f"OPTIMIZE TABLE `{db}`.`{table}` FINAL")
        raise CrashHere("the driver died after its ATTACH")

    hold_at("publish.after_attach", restart_then_die)
    with pytest.raises(PublishFailed):
        sink.run_job(0)
    sink.recover()
    client = started_client(sink.zk_hosts)
    try:
        coord = sink.coordinator(client)
        (xid,) = SinkAdmin(coord).xids([XidState.COMMITTING])  # in doubt: recovery did not guess
        doubts = []
        for branch in coord.branches(xid.epoch, xid.winners):
            manifest = publish_manifest(coord, branch)
            entry = coord.ledger(xid.epoch, branch.branch_id).get(
                ledger_key(manifest.staging_table)) if manifest else None
            if entry and entry.get("attaching"):
                doubts += [(branch.branch_id, manifest, pid) for pid in entry["attaching"]]
    finally:
        client.stop()
        client.close()
    assert doubts, "nothing in doubt: the repeat decided on its own"
    # The operator looks before deciding: the tables were empty before the job, so a
    # partition's rows are in its table iff its ATTACH ran (the held one, or the other
    # table's, which the kill may have cut short).
    decisions: dict[tuple[str, bool], list[str]] = {}
    for branch_id, manifest, pid in doubts:
        visible = int(run_sql(url, f"SELECT count() FROM `{manifest.target_database}`."
                                   f"`{manifest.target_table}` WHERE _partition_id = '{pid}'"))
        decisions.setdefault((branch_id, visible > 0), []).append(pid)
    ops = Operations(sink.zk_hosts, zk_root=sink.options["zk_root"], url=url)
    try:
        for (branch_id, attached), partitions in decisions.items():
            ops.resolve(sink.options["sink_id"], xid.epoch, branch_id, partitions,
                        attached=attached)
    finally:
        ops.close()
    sink.assert_exactly_once(range(TASKS * ROWS_PER_TASK))


# -- ZooKeeper restarting while a job plans ---------------------------------------------


def test_a_job_planned_while_zookeeper_restarts_waits_for_its_replica_then_writes_once(
        classic, zk_hosts) -> None:
    """The private server's ZooKeeper (not the sink's) is down when the job plans: the
    Replicated target's replica is read-only, as it is while a session is re-established.
    The plan waits for it instead of refusing; the job's rows are visible once."""
    url = classic.clickhouse.url
    sink = events_sink(url, zk_hosts, "ReplicatedMergeTree('/clickhouse/tables/{db}/events', 'r1')")
    db = sink.table.split(".")[0]
    kill_server(classic, "zookeeper")
    # the replica turns read-only once it notices its session is gone, a moment later
    readonly = f"SELECT is_readonly FROM system.replicas WHERE database = '{db}'"
    deadline = time.monotonic() + 30.0
    while run_sql(url, readonly).strip() != "1":
        assert time.monotonic() < deadline, "the replica never turned read-only"
        time.sleep(0.1)
    # the plan meets the read-only replica at once (waited for just above) and waits
    # from then on, however long ZooKeeper stays down: 3 s of it prove the wait
    later = threading.Timer(3.0, restart_server, (classic, "zookeeper"))
    later.start()
    try:
        sink.run_job(0)
    finally:
        later.join()
    sink.assert_exactly_once(range(TASKS * ROWS_PER_TASK))
