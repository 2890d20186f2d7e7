"""A writer that commits one epoch after another keeps ``last_committed`` as it wrote it
(``coordinator/protocol/epochs.py``): its next ``begin`` checks that version instead of
reading the node, and its next ``Committed`` write sets it by that version. Another
process moving the node in between must change nothing but the cost. On both node
stores."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from coordinator import Coordinator, SinkTreeDamaged, XidState
from coordinator.plumbing.nodes import NodeStore
from coordinator.protocol.epochs import LastCommitted
from coordinator.sink_admin import SinkAdmin
from tests.coordinator.test_coordinator_support import Target, new_coordinator


def commit_empty(coord: Coordinator, generation: int, epoch: int) -> None:
    coord.begin(epoch, generation)
    coord.commit(epoch, generation, [], Target().publish, Target().rollback)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths of every read of a ``last_committed`` node, in order."""
    seen: list[str] = []
    original = LastCommitted.read

    def counted(self: LastCommitted) -> tuple[int | None, int]:
        seen.append(self.path)
        return original(self)

    monkeypatch.setattr(LastCommitted, "read", counted)
    return seen


def test_a_writer_that_advanced_last_committed_begins_and_commits_its_next_epoch_without_reading_it(
        nodes: Callable[[], NodeStore], reads: list[str]) -> None:
    coord, generation = new_coordinator(nodes())
    commit_empty(coord, generation, 1)
    reads.clear()
    commit_empty(coord, generation, 2)
    assert reads == []
    assert SinkAdmin(coord).last_committed() == 2


def test_last_committed_moved_by_another_process_still_only_moves_forward(
        nodes: Callable[[], NodeStore]) -> None:
    first, generation = new_coordinator(nodes())
    other = Coordinator(nodes(), first.sink_id)
    commit_empty(first, generation, 1)  # remembered: epoch 1
    commit_empty(other, generation, 5)
    commit_empty(first, generation, 3)  # its memory is stale: read, and 5 stays
    assert SinkAdmin(first).last_committed() == 5
    commit_empty(first, generation, 7)
    assert SinkAdmin(first).last_committed() == 7


def test_an_epoch_another_process_committed_is_found_committed_by_a_new_begin(
        nodes: Callable[[], NodeStore]) -> None:
    first, generation = new_coordinator(nodes())
    other = Coordinator(nodes(), first.sink_id)
    commit_empty(first, generation, 1)
    commit_empty(other, generation, 2)
    assert first.begin(2, generation, new=True) is XidState.COMMITTED


def test_a_lost_record_above_a_remembered_last_committed_is_refused_not_begun_again(
        nodes: Callable[[], NodeStore]) -> None:
    first, generation = new_coordinator(nodes())
    other_client = nodes()
    other = Coordinator(other_client, first.sink_id)
    commit_empty(first, generation, 1)  # remembered: epoch 1, below epoch 2
    commit_empty(other, generation, 2)
    other_client.delete(other.layout.xid(2), recursive=True)  # the record of 2 is lost
    with pytest.raises(SinkTreeDamaged, match="was lost"):
        first.begin(2, generation, new=True)
    assert first.xid(2) is None


def test_a_begin_that_expects_a_new_xid_finds_the_epoch_this_process_just_committed(
        nodes: Callable[[], NodeStore]) -> None:
    coord, generation = new_coordinator(nodes())
    commit_empty(coord, generation, 1)  # remembered: epoch 1, not below epoch 1
    assert coord.begin(1, generation, new=True) is XidState.COMMITTED
