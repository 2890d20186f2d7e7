"""Commit messages: what a task attempt hands the driver about its branch.

They are plain picklable records, independent of how Spark carries them: the data source
wraps each in its ``WriterCommitMessage`` (``txsink.spark.datasource``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BranchMessage:
    """A task attempt's prepared branches (one per shard it wrote to): their manifests
    are in ZooKeeper, their rows in staging. No branch: the task had no rows."""

    epoch: int
    generation: int
    branch_ids: tuple[str, ...]
    rows: int
    bytes: int
    partitions: int
    started_at: float  # epoch seconds of the branch's first write
    stage_ms: float
    seal_ms: float
    bad_rows: int = 0  # rows quarantined by its quarantine shares (bad_rows=quarantine)


@dataclass(frozen=True)
class SkippedMessage:
    """The xid was already committed: a replayed micro-batch writes nothing."""

    epoch: int
    generation: int


#: What an attempt returns to the driver.
TaskMessage = BranchMessage | SkippedMessage
