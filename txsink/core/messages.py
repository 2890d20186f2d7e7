"""Commit messages: what a task attempt hands the driver about its branch.

They are plain picklable records, independent of how Spark carries them: the data source
wraps each in its ``WriterCommitMessage`` (``txsink.spark.datasource``); the ``mapInArrow``
ways in (``txsink.spark.job``) carry each as one string column of one row, written and
read only here (:func:`to_text` / :func:`from_text`): JSON with a ``format`` and a
``kind``. A task and its driver run the same release, but a text of an unknown format or
kind is refused by name, never guessed at.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields

from coordinator import BranchRecord, XidRecord


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
    store_requests: int = 0  # the messages the attempt sent (txsink.core.message_count)
    statements: int = 0
    # the branches' records as its prepare wrote them, (branch id, version, stored text):
    # the commit decides with them instead of reading them (Coordinator.winner_records)
    prepared: tuple[tuple[str, int, str], ...] = ()
    # the xid's record as the attempt's begin left it, (version, stored text): the commit
    # takes the newest of them where the plan did not begin the xid (writeStream)
    begun: tuple[int, str] | None = None

    def handed_records(self, sink_id: str) -> list[BranchRecord]:
        """The prepared branches' records this message carries."""
        return [BranchRecord.from_bytes(sink_id, self.epoch, branch_id, text.encode(), version)
                for branch_id, version, text in self.prepared]


def handed_xid(messages: Iterable[BranchMessage], sink_id: str) -> XidRecord | None:
    """The newest xid record the messages carry (None: none carries one)."""
    found = [(m.begun, m.epoch) for m in messages if m.begun is not None]
    if not found:
        return None
    (version, text), epoch = max(found, key=lambda begun_epoch: begun_epoch[0][0])
    return XidRecord.from_bytes(sink_id, epoch, text.encode(), version)


def handed_begun(record: XidRecord | None) -> tuple[int, str] | None:
    """``BranchMessage.begun`` of ``record``."""
    return None if record is None else (record.version, record.to_bytes().decode())


def handed_over(records: Iterable[BranchRecord]) -> tuple[tuple[str, int, str], ...]:
    """``BranchMessage.prepared`` of ``records``, each in its stored form."""
    return tuple((r.branch_id, r.version, r.to_bytes().decode()) for r in records)


@dataclass(frozen=True)
class SkippedMessage:
    """The xid was already committed: a replayed micro-batch writes nothing."""

    epoch: int
    generation: int


@dataclass(frozen=True)
class CarriedMessage:
    """A task attempt's rows themselves, few enough to ride its message
    (``txsink.core.carried_rows``): nothing of them is staged or recorded yet. ``arrow``:
    one Arrow IPC stream of the task's batches (b"" for none); ``query_id`` and ``run_id``:
    the streaming query and run the task belongs to ("" outside a stream)."""

    epoch: int
    rows: int
    arrow: bytes
    started_at: float
    query_id: str = ""
    run_id: str = ""


#: What an attempt returns to the driver.
TaskMessage = BranchMessage | SkippedMessage | CarriedMessage


#: The format :func:`to_text` writes.
FORMAT = 1


class UnknownMessage(ValueError):
    """A task's message this release cannot read."""


_KINDS: dict[str, type[BranchMessage] | type[SkippedMessage] | type[CarriedMessage]] = {
    "branch": BranchMessage, "skipped": SkippedMessage, "carried": CarriedMessage}


def to_text(message: TaskMessage) -> str:
    """One task message as the text a ``mapInArrow`` task returns."""
    kind = next(k for k, cls in _KINDS.items() if isinstance(message, cls))
    values = asdict(message)
    if isinstance(message, CarriedMessage):
        values["arrow"] = base64.b64encode(message.arrow).decode("ascii")
    return json.dumps({"format": FORMAT, "kind": kind, **values})


def from_text(text: str) -> TaskMessage:
    """The message :func:`to_text` wrote; :class:`UnknownMessage` for any other text."""
    try:
        data = json.loads(text)
        found = data.get("format"), data.get("kind")
    except (ValueError, AttributeError):
        raise UnknownMessage(f"not a task message: {text[:80]!r}") from None
    if found[0] != FORMAT or found[1] not in _KINDS:
        raise UnknownMessage(f"task message of format {found[0]!r}, kind {found[1]!r}: this "
                             f"release reads format {FORMAT} ({', '.join(_KINDS)})")
    cls = _KINDS[found[1]]
    values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
    if "branch_ids" in values:
        values["branch_ids"] = tuple(values["branch_ids"])
    if "prepared" in values:
        values["prepared"] = tuple((str(b), int(v), str(t)) for b, v, t in values["prepared"])
    if values.get("begun") is not None:
        version, text = values["begun"]
        values["begun"] = (int(version), str(text))
    if cls is CarriedMessage:
        values["arrow"] = base64.b64decode(values["arrow"])
    return cls(**values)
