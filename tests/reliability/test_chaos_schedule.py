"""Seeded random fault schedules: reproducible plans, and a short run that ends exactly once.

The run uses a private ClickHouse + ZooKeeper pair (ports 28201..28204, or
``$TXSINK_CHAOS_TEST_PORT_BASE`` + 1..4), because it kills and restarts both servers, and
a ReplicatedMergeTree target and view table: on a plain MergeTree table a ClickHouse
restart inside a publish may leave it in doubt for an operator (docs/reliability.md,
"Limits"), which a random schedule would hit now and then. Besides the process and
network faults, the short run has the overlapping actors of
``tests.harness.chaos.actors``: an operator's ``txsink recover`` loop, a second driver of
the same query, and a zombie task of a stale generation, each while the pipeline
commits. The soak (``python -m tests.harness.chaos.schedule --minutes 30``) is the same
code with more faults.
"""

from __future__ import annotations

import os

import pytest

from tests.harness.chaos.actors import KILLED, classify_failure, recover_reason
from tests.harness.chaos.faults import discard, private_services
from tests.harness.chaos.schedule import (
    FAULT_KINDS,
    REPLICATED,
    ChaosRun,
    plan_every_kind,
    plan_faults,
    render,
    run_schedule,
)

SEED = 20261188  # its every-kind plan starts the second driver 4th, the zombie task 5th
PORT_BASE = int(os.environ.get("TXSINK_CHAOS_TEST_PORT_BASE", "28200"))  # servers on +1 .. +4
#: What the older of two overlapping drivers may end with: refused by the sink or by Spark,
#: killed by another fault, failed by a fault of the servers or their connections inside
#: the overlap (``FAULT_FAILURES``), or killed because it still ran when the overlap ended. A sink
#: refusal is SinkTakenOver (also when its next task claims with a superseded run id;
#: "Fenced (run superseded)" is what releases before that said), or
#: CheckpointReplaced (the stream check, before the claim, finds the newer run committed
#: past the older one's micro-batch: seen in the soak).
REFUSALS = ("SinkTakenOver", "Fenced (run superseded)", "CheckpointReplaced",
            "concurrent checkpoint")
OLD_DRIVER_ENDINGS = (*(f"exit 1: {r}" for r in REFUSALS), KILLED,
                      "still running when the overlap ended: killed",
                      *(f"refused ({r}), still failing when the overlap ended: killed"
                        for r in REFUSALS))
FAULT_FAILURES = ("CONNECTION_LOST", "SERVER_UNREACHABLE", "ZooKeeperUnreachable")


def expected_old_ending(ending: str) -> bool:
    return ending in OLD_DRIVER_ENDINGS or (
        ending.startswith("exit 1: other: ") and any(f in ending for f in FAULT_FAILURES))


def test_same_seed_draws_the_same_fault_sequence():
    assert plan_faults(SEED, 50) == plan_faults(SEED, 50)
    assert plan_faults(SEED, 50) != plan_faults(SEED + 1, 50)


def test_every_kind_plan_has_each_fault_kind_once():
    assert sorted(f.kind for f in plan_every_kind(SEED)) == sorted(FAULT_KINDS)
    assert {"operator_recover", "second_driver", "zombie_task"} <= set(FAULT_KINDS)


def test_a_superseded_driver_failure_is_named_takeover_or_concurrent_checkpoint():
    assert classify_failure("pipeline failed: StreamingQueryException: [STREAM_FAILED] ... "
                            "coordinator.errors.SinkTakenOver: sink s was taken over by "
                            "another writer (generation 5, ...)") == "SinkTakenOver"
    assert classify_failure("pipeline failed: StreamingQueryException: "
                            "[CONCURRENT_STREAM_LOG_UPDATE] Concurrent update to the log. "
                            "Multiple streaming jobs detected for 7.") == "concurrent checkpoint"
    assert classify_failure("pipeline failed: ValueError: x").startswith("other: ValueError")


def test_a_server_failure_deep_in_sparks_wrapping_is_named_by_its_code():
    line = ("pipeline failed: StreamingQueryException: [STREAM_FAILED] Query [id = q, runId "
            "= r] terminated with exception: [PYTHON_DATA_SOURCE_ERROR] Failed to initialize "
            "Python data source writer: server_ext.errors.ClickHouseError: describe table "
            "chaos.events failed: CONNECTION_LOST: no answer from <server>")
    assert expected_old_ending(f"exit 1: {classify_failure(line)}")


def test_a_failed_recover_run_is_counted_with_its_reason():
    assert recover_reason(2, "txsink recover: ZooKeeperUnreachable: no answer", []) == \
        "ZooKeeperUnreachable"
    assert recover_reason(3, "", ["s/4 Committing -> failed (PublishFailed: x: y)"]) == \
        "failed action: PublishFailed"


@pytest.mark.servers  # starts servers of its own
def test_every_fault_kind_once_with_recover_loop_second_driver_and_zombie_task_over_commits(
        tmp_path):
    """Each fault kind once (seeded order); the second driver overlaps the first for ~23 s
    with the zombie task and later faults inside that window; the recover loop runs while
    the pipeline drains. Every id once; every actor's ending explained."""
    services = private_services(tmp_path / "servers", PORT_BASE)
    run = ChaosRun(tmp_path / "run", services, rows_per_epoch=500, stall_timeout=60.0,
                   seed=SEED, engine=REPLICATED)
    try:
        report = run_schedule(run, plan_every_kind(SEED, gap=(2.0, 4.0)), drain_timeout=120)
    finally:
        discard(services)
    table = render(report)
    print(table)
    assert sum(report.injected.values()) == len(FAULT_KINDS), table
    assert report.drained, table
    assert report.result is not None and report.result.exactly_once, table
    assert report.staging_left == 0, table
    actors = report.actors
    # the operator: every run counted, every non-zero exit with its reason
    assert actors.recover_runs >= 1 and sum(actors.recover_exits.values()) == \
        actors.recover_runs, table
    failed_runs = sum(n for code, n in actors.recover_exits.items() if code != 0)
    assert sum(actors.recover_reasons.values()) == failed_runs, table
    # the second driver: never two drivers left, the older one refused or killed
    assert actors.overlaps == 1 and 2 not in actors.drivers_left, table
    assert all(expected_old_ending(ending) for ending in actors.old_driver), table
    # the zombie task: answered, nothing of it accepted
    assert actors.zombie_runs == 1 and actors.zombie_accepted == 0, table
