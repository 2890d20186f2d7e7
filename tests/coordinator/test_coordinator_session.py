"""Session expiry: every record is a persistent node; the one thing a session holds is an
xid's publish lease. An expired session in the middle of a commit costs a reconnect and,
inside a publish, taking the lease again; nothing is lost and nothing is done twice.

The session is expired the reliable way: a second client attaches to the same session
id and password and closes it, which the server treats as the session's end.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from coordinator import BranchRecord, Coordinator, XidState
from coordinator.protocol.publish_lease import PublishLease
from tests.coordinator.test_coordinator_support import Target, prepared_branches


def expire_session(client: KazooClient, hosts: str) -> None:
    session_id, password = client.client_id
    thief = KazooClient(hosts=hosts, client_id=(session_id, password))
    thief.start(timeout=15)
    thief.stop()
    thief.close()


@pytest.fixture
def own_session(zk_hosts: str, zk_chroot: str) -> Iterator[KazooClient]:
    client = KazooClient(hosts=zk_hosts + zk_chroot, timeout=5)
    client.start(timeout=15)
    yield client
    client.stop()
    client.close()


def test_commit_completes_when_the_session_expires_after_the_decision(
        own_session: KazooClient, zk_hosts: str) -> None:
    sessions = [own_session.client_id[0]]

    def expire_at_decision(step: str) -> None:
        if step == "commit.after_decision":
            expire_session(own_session, zk_hosts)

    driver = Coordinator(own_session, "orders", on_step=expire_at_decision)
    generation = driver.fence()
    driver.begin(1, generation)
    winners = prepared_branches(driver, 1, generation, 2)
    target = Target()
    record = driver.commit(1, generation, winners, target.publish, target.rollback)
    sessions.append(own_session.client_id[0])
    assert record.state is XidState.COMMITTED
    assert target.visible_in(1) == set(winners)
    assert sessions[0] != sessions[1]  # the commit really ran on a new session


def test_commit_completes_when_the_session_expires_inside_a_publish(
        own_session: KazooClient, zk_hosts: str) -> None:
    driver = Coordinator(own_session, "orders")
    generation = driver.fence()
    driver.begin(1, generation)
    winners = prepared_branches(driver, 1, generation, 2)
    target = Target()

    def publish_then_lose_session(branch: BranchRecord) -> None:
        driver.ledger(branch.epoch, branch.branch_id).put("all", {"published": True})
        target.publish(branch)
        if sum(target.publish_calls.values()) == 1:
            expire_session(own_session, zk_hosts)

    record = driver.commit(1, generation, winners, publish_then_lose_session,
                           target.rollback)
    assert record.state is XidState.COMMITTED
    assert driver.ledger(1, winners[1]).get("all") == {"published": True}


def test_the_generation_survives_session_expiry(own_session: KazooClient,
                                                zk_hosts: str) -> None:
    driver = Coordinator(own_session, "orders")
    generation = driver.fence()
    expire_session(own_session, zk_hosts)
    assert driver.generation() == generation
    driver.begin(2, generation)
    assert driver.xid(2).state is XidState.INITIALIZED


def test_a_holder_whose_session_expired_cannot_release_its_successors_lease(
        own_session: KazooClient, zk: KazooClient, zk_hosts: str) -> None:
    first = Coordinator(own_session, "orders")
    generation = first.fence()
    first.begin(3, generation)
    old = PublishLease(first.store, 3, "old holder")
    assert old.acquire()
    expire_session(own_session, zk_hosts)  # its two nodes go with the session
    new = PublishLease(Coordinator(zk, "orders").store, 3, "new holder")
    assert new.acquire()
    old.release()  # the delete of its own node, gone, fails the whole multi-op
    assert new.holder() == "new holder"
    new.check()
