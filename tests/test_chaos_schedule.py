"""Seeded random fault schedules: reproducible plans, and a short run that ends exactly once.

The run uses a private ClickHouse + ZooKeeper pair (ports 28201..28204), because it
kills and restarts both servers, and a ReplicatedMergeTree target: on a plain MergeTree
target a ClickHouse restart inside a publish may leave it in doubt for an operator
(docs/reliability.md, "Limits"), which a random schedule would hit now and then.
The soak (``python -m txsink.harness.chaos.schedule --minutes 30``) is the same code with more
faults.
"""

from __future__ import annotations

from txsink.harness.chaos.faults import private_services
from txsink.harness.chaos.schedule import (
    FAULT_KINDS,
    REPLICATED,
    ChaosRun,
    plan_every_kind,
    plan_faults,
    render,
    run_schedule,
)

SEED = 20261122
PORT_BASE = 28200


def test_same_seed_draws_the_same_fault_sequence():
    assert plan_faults(SEED, 50) == plan_faults(SEED, 50)
    assert plan_faults(SEED, 50) != plan_faults(SEED + 1, 50)


def test_every_kind_plan_has_each_fault_kind_once():
    assert sorted(f.kind for f in plan_every_kind(SEED)) == sorted(FAULT_KINDS)


def test_short_schedule_of_every_fault_kind_ends_exactly_once(tmp_path):
    services = private_services(tmp_path / "servers", PORT_BASE)
    run = ChaosRun(tmp_path / "run", services, rows_per_epoch=500, stall_timeout=60.0,
                   seed=SEED, engine=REPLICATED)
    try:
        report = run_schedule(run, plan_every_kind(SEED, gap=(2.0, 4.0)), drain_timeout=120)
    finally:
        services.down()
    table = render(report)
    print(table)
    assert sum(report.injected.values()) == len(FAULT_KINDS), table
    assert report.drained, table
    assert report.result is not None and report.result.exactly_once, table
