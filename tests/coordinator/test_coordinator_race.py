"""Concurrent coordinators on one sink: the compare-and-set lets exactly one decide.

Every contender runs in its own thread with its own session (ZooKeeper, or a KeeperMap
store instance), released at the same instant by a barrier; on both node stores.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from coordinator import Coordinator, XidDecided, XidState
from coordinator.plumbing.nodes import NodeStore
from tests.coordinator.test_coordinator_support import (
    SINK,
    Target,
    new_coordinator,
    prepared_branches,
)

CONTENDERS = 6


@pytest.fixture
def zk(nodes: Callable[[], NodeStore]) -> NodeStore:
    return nodes()


@pytest.fixture
def sessions(nodes: Callable[[], NodeStore]) -> list[NodeStore]:
    return [nodes() for _ in range(CONTENDERS)]


class LockedTarget(Target):
    """The target, shared by threads."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()

    def publish(self, branch) -> None:  # type: ignore[no-untyped-def]
        with self._lock:
            super().publish(branch)

    def rollback(self, branch) -> None:  # type: ignore[no-untyped-def]
        with self._lock:
            super().rollback(branch)


def race(calls: list[Callable[[], object]]) -> list[object]:
    """Run the calls at the same instant; each result is a value or the raised error."""
    barrier = threading.Barrier(len(calls))

    def run(call: Callable[[], object]) -> object:
        barrier.wait()
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - the outcome under test
            return exc

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def test_concurrent_commits_with_different_winners_record_exactly_one_decision(
        zk: NodeStore, sessions: list[NodeStore]) -> None:
    driver, generation = new_coordinator(zk)
    driver.begin(1, generation)
    branches = prepared_branches(driver, 1, generation, CONTENDERS)
    target = LockedTarget()
    contenders = [Coordinator(client, SINK) for client in sessions]
    results = race([
        lambda c=c, b=b: c.commit(1, generation, [b], target.publish, target.rollback)
        for c, b in zip(contenders, branches, strict=True)])
    decisions = {r.winners for r in results}  # type: ignore[union-attr]
    assert len(decisions) == 1 and all(r.state is XidState.COMMITTED for r in results)
    (winners,) = decisions
    assert len(winners) == 1 and target.visible_in(1) == set(winners)
    history = [h["state"] for h in driver.xid(1).history]
    assert history.count("Committing") == 1 and history.count("Committed") == 1


@pytest.mark.parametrize("round_", range(4))
def test_concurrent_commit_and_abort_exactly_one_succeeds(
        zk: NodeStore, sessions: list[NodeStore], round_: int) -> None:
    driver, generation = new_coordinator(zk)
    driver.begin(round_, generation)
    winners = prepared_branches(driver, round_, generation, 2)
    target = LockedTarget()
    committer, aborter = (Coordinator(client, SINK) for client in sessions[:2])
    committed, aborted = race([
        lambda: committer.commit(round_, generation, winners, target.publish, target.rollback),
        lambda: aborter.abort(round_, generation, target.rollback)])
    failures = [r for r in (committed, aborted) if isinstance(r, Exception)]
    assert len(failures) == 1 and isinstance(failures[0], XidDecided)
    final = driver.xid(round_).state
    if final is XidState.COMMITTED:
        assert target.visible_in(round_) == set(winners)
    else:
        assert final is XidState.ABORTED and not target.visible


def test_concurrent_fences_hand_out_distinct_generations(
        zk: NodeStore, sessions: list[NodeStore]) -> None:
    results = race([Coordinator(client, SINK).fence for client in sessions])
    assert sorted(results) == list(range(1, CONTENDERS + 1))  # type: ignore[type-var]


def test_concurrent_epoch_allocations_never_hand_out_an_epoch_twice(
        zk: NodeStore, sessions: list[NodeStore]) -> None:
    def allocate_five(client: NodeStore) -> list[int]:
        coord = Coordinator(client, SINK)
        return [coord.allocate_epoch() for _ in range(5)]

    results = race([lambda c=c: allocate_five(c) for c in sessions])
    epochs = [e for batch in results for e in batch]  # type: ignore[attr-defined]
    assert sorted(epochs) == list(range(5 * CONTENDERS))


def test_concurrent_branch_registrations_all_land(
        zk: NodeStore, sessions: list[NodeStore]) -> None:
    driver, generation = new_coordinator(zk)
    driver.begin(1, generation)
    tasks = [Coordinator(client, SINK) for client in sessions]
    race([lambda t=t, i=i: t.register_branch(1, f"p{i}-a0-race0000", generation, owner={})
          for i, t in enumerate(tasks)])
    assert len(driver.branches(1)) == CONTENDERS


def test_concurrent_claims_by_the_tasks_of_one_run_share_one_generation(
        zk: NodeStore, sessions: list[NodeStore]) -> None:
    results = race([lambda c=c: Coordinator(c, SINK).claim("run-a") for c in sessions])
    assert set(results) == {1}  # type: ignore[arg-type]
