"""The audit verifier finds each kind of anomaly, and nothing in a clean history.

The coordinator cannot produce these anomalies itself, so each test forges one by
editing the records in ZooKeeper directly (as a bug or a hand edit would).
"""

from __future__ import annotations

import json
import time

import pytest
from kazoo.client import KazooClient

from coordinator import AnomalyKind, audit
from coordinator.plumbing.paths import SinkLayout
from coordinator.sink_admin import SinkAdmin
from tests.coordinator.test_coordinator_support import (
    SINK,
    Crash,
    Target,
    crash_at,
    new_coordinator,
    prepared_branches,
)

LAYOUT = SinkLayout("/txsink", SINK)


def commit(zk: KazooClient, epochs: list[int], branches: int = 2) -> dict[int, list[str]]:
    driver, generation = new_coordinator(zk)
    winners = {}
    for epoch in epochs:
        driver.begin(epoch, generation)
        winners[epoch] = prepared_branches(driver, epoch, generation, branches)
        driver.register_branch(epoch, f"p9-a1-lose{epoch:04d}", generation, owner={})
        driver.commit(epoch, generation, winners[epoch], Target().publish, Target().rollback)
    return winners


def edit(zk: KazooClient, path: str, change: dict) -> None:
    data = json.loads(zk.get(path)[0])
    data.update(change)
    zk.set(path, json.dumps(data).encode())


def kinds(zk: KazooClient, **kwargs: object) -> list[tuple[AnomalyKind, int]]:
    return [(a.kind, a.epoch) for a in audit(zk, "/txsink", SINK, **kwargs)]  # type: ignore[arg-type]


def test_a_clean_history_has_no_anomaly(zk: KazooClient) -> None:
    commit(zk, [0, 1, 2])
    driver, generation = new_coordinator(zk)
    driver.begin(3, generation)
    driver.abort(3, generation, Target().rollback)
    commit(zk, [4])
    assert kinds(zk, target_counts={0: 20, 1: 20, 2: 20, 3: 0, 4: 20}) == []


def test_a_missing_epoch_between_committed_epochs_is_a_gap(zk: KazooClient) -> None:
    commit(zk, [0, 1, 4])
    (anomaly,) = audit(zk, "/txsink", SINK)
    assert (anomaly.kind, anomaly.epoch) == (AnomalyKind.GAP, 2)
    assert "2..3" in anomaly.detail


def test_pruned_epochs_are_not_gaps(zk: KazooClient) -> None:
    commit(zk, [0, 1, 2])
    coord, _ = new_coordinator(zk)
    time.sleep(0.05)
    SinkAdmin(coord).prune(0.01)
    commit(zk, [3])
    assert kinds(zk) == []


def test_an_xid_committed_twice_is_reported(zk: KazooClient) -> None:
    commit(zk, [0])
    history = json.loads(zk.get(LAYOUT.xid(0))[0])["history"]
    edit(zk, LAYOUT.xid(0), {"history": history + history[1:]})
    assert kinds(zk) == [(AnomalyKind.DOUBLE_COMMIT, 0)]


def test_a_published_branch_that_did_not_win_is_reported(zk: KazooClient) -> None:
    commit(zk, [0])
    edit(zk, LAYOUT.branch(0, "p9-a1-lose0000"), {"state": "Committed"})
    (anomaly,) = audit(zk, "/txsink", SINK)
    assert (anomaly.kind, anomaly.branch_id) == (AnomalyKind.NON_WINNER_PUBLISHED,
                                                 "p9-a1-lose0000")


def test_a_published_branch_of_an_aborted_xid_is_reported(zk: KazooClient) -> None:
    driver, generation = new_coordinator(zk)
    driver.begin(0, generation)
    (branch,) = prepared_branches(driver, 0, generation, 1)
    driver.abort(0, generation, Target().rollback)
    edit(zk, LAYOUT.branch(0, branch), {"state": "Committed"})
    assert kinds(zk) == [(AnomalyKind.NON_WINNER_PUBLISHED, 0)]


def test_an_xid_committing_for_longer_than_the_threshold_is_reported(
        zk: KazooClient) -> None:
    driver, generation = new_coordinator(zk, on_step=crash_at("commit.after_decision"))
    driver.begin(0, generation)
    winners = prepared_branches(driver, 0, generation, 1)
    with pytest.raises(Crash):
        driver.commit(0, generation, winners, Target().publish, Target().rollback)
    assert kinds(zk, committing_older_than=300) == []
    time.sleep(0.05)
    assert kinds(zk, committing_older_than=0.01) == [(AnomalyKind.OLD_COMMITTING, 0)]


def test_rows_the_target_gained_that_differ_from_the_manifests_are_reported(
        zk: KazooClient) -> None:
    commit(zk, [0, 1])  # two winners of 10 rows each per epoch
    assert kinds(zk, target_counts={0: 20, 1: 25}) == [(AnomalyKind.ROW_COUNT_MISMATCH, 1)]


def test_rows_gained_by_an_aborted_epoch_are_reported(zk: KazooClient) -> None:
    driver, generation = new_coordinator(zk)
    driver.begin(0, generation)
    driver.abort(0, generation, Target().rollback)
    assert kinds(zk, target_counts={0: 5}) == [(AnomalyKind.ROW_COUNT_MISMATCH, 0)]
