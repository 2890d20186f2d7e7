"""Shared pieces of the coordinator tests (no tests here).

``Target`` stands in for ClickHouse: it records publish and rollback callbacks and, like
the real publish, is idempotent per branch — publishing a branch twice makes it visible
once — so "published exactly once" means "in ``visible`` iff a winner of a committed xid".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from kazoo.client import KazooClient

from coordinator import BranchRecord, Coordinator

SINK = "orders"


class Crash(Exception):
    """A simulated process death at a named step."""


def crash_at(step: str) -> Callable[[str], None]:
    """An ``on_step`` hook that dies at ``step`` (once: the process is gone after that)."""
    def hook(name: str) -> None:
        if name == step:
            raise Crash(step)
    return hook


class Target:
    """Records the callbacks; ``visible`` is what a reader of the target would see."""

    def __init__(self) -> None:
        self.publish_calls: Counter[str] = Counter()
        self.rollback_calls: Counter[str] = Counter()
        self.visible: set[tuple[int, str]] = set()

    def publish(self, branch: BranchRecord) -> None:
        self.publish_calls[branch.branch_id] += 1
        self.visible.add((branch.epoch, branch.branch_id))

    def rollback(self, branch: BranchRecord) -> None:
        self.rollback_calls[branch.branch_id] += 1

    def visible_in(self, epoch: int) -> set[str]:
        return {b for e, b in self.visible if e == epoch}


def new_coordinator(client: KazooClient, sink: str = SINK, **kwargs: object
                    ) -> tuple[Coordinator, int]:
    """A coordinator that has fenced the sink (a new driver): (coordinator, generation)."""
    coord = Coordinator(client, sink, **kwargs)  # type: ignore[arg-type]
    return coord, coord.fence()


def prepared_branches(coord: Coordinator, epoch: int, generation: int, count: int,
                      prefix: str = "p", rows: int = 10) -> list[str]:
    """Register and prepare ``count`` branches of an xid that is already begun."""
    ids = []
    for i in range(count):
        branch_id = f"{prefix}{i}-a0-{epoch:04x}{i:04x}"
        coord.register_branch(epoch, branch_id, generation, owner={"staging": branch_id})
        coord.prepare_branch(epoch, branch_id, {"rows": rows, "staging": branch_id})
        ids.append(branch_id)
    return ids
