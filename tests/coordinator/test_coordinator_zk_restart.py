"""ZooKeeper restarted in the middle of a commit: the commit completes after reconnect.

This test stops the shared ZooKeeper for about two seconds, so it lives alone in this
module, marked ``alone`` (``./run test`` runs it after the other tests, by itself), and
restores the server even when it fails.
"""

from __future__ import annotations

import threading
import time

import pytest
from kazoo.client import KazooClient
from kazoo.retry import KazooRetry

from coordinator import BranchRecord, Coordinator, XidState
from coordinator.sink_admin import SinkAdmin
from tests.coordinator.test_coordinator_support import Target, prepared_branches
from tests.harness.services import ServiceError, Services

pytestmark = pytest.mark.alone

OUTAGE_SECONDS = 2.0


def test_commit_completes_after_zookeeper_restarts_after_the_decision(
        services: Services, zk_hosts: str, zk_chroot: str) -> None:
    # Reconnect attempts at most 0.5 s apart, so the test waits for the outage, not for
    # kazoo's default back-off (which grows to minutes).
    client = KazooClient(hosts=zk_hosts + zk_chroot, timeout=10, connection_retry=KazooRetry(
        max_tries=-1, delay=0.1, backoff=2, max_delay=0.5))
    client.start(timeout=15)
    restarter: list[threading.Thread] = []
    outage: dict[str, float] = {}

    def restart() -> None:
        try:
            services.zookeeper.start()
        except ServiceError:
            pass  # checked again below, in the test's own thread

    def restart_at_decision(step: str) -> None:
        if step == "commit.after_decision":
            outage["stopped"] = time.monotonic()
            services.zookeeper.process.stop()
            thread = threading.Timer(OUTAGE_SECONDS, restart)
            thread.start()
            restarter.append(thread)

    target = Target()

    def publish_with_ledger(branch: BranchRecord) -> None:
        target.publish(branch)  # the target (ClickHouse) is up; only ZooKeeper is down
        coord.ledger(branch.epoch, branch.branch_id).put("all", {"published": True})

    try:
        coord = Coordinator(client, "orders", on_step=restart_at_decision)
        generation = coord.fence()
        coord.begin(1, generation)
        winners = prepared_branches(coord, 1, generation, 3)
        record = coord.commit(1, generation, winners, publish_with_ledger, target.rollback)
        finished = time.monotonic()
    finally:
        for thread in restarter:
            thread.join()
        services.zookeeper.start()  # idempotent: make sure the shared server is back
    assert finished - outage["stopped"] >= OUTAGE_SECONDS  # it really waited for ZooKeeper
    assert record.state is XidState.COMMITTED
    assert target.visible_in(1) == set(winners)
    assert coord.xid(1).state is XidState.COMMITTED and SinkAdmin(coord).last_committed() == 1
    client.stop()
    client.close()
