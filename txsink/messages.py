"""Commit messages: what a task attempt hands the driver about its branch."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql.datasource import WriterCommitMessage


@dataclass(frozen=True)
class BranchMessage(WriterCommitMessage):
    """A prepared branch: its manifest is in ZooKeeper, its rows are in staging."""

    epoch: int
    generation: int
    branch_id: str
    rows: int
    bytes: int
    partitions: int
    started_at: float  # epoch seconds of the branch's first write
    stage_ms: float
    seal_ms: float


@dataclass(frozen=True)
class SkippedMessage(WriterCommitMessage):
    """The xid was already committed: a replayed micro-batch writes nothing."""

    epoch: int
    generation: int
