"""An epoch's metrics: the figures its writer records on the xid, for ``txsink status``.

The writer (a job's driver, ``txsink.transaction()``) records them right after its commit;
recovery marks the xids it finished (``finished_by: recovery``, written by the
coordinator, which knows nothing of this type); operators add their decisions
(``given_up``, ``strategy_switches``, see :mod:`txsink.core.operator_records`). All of them are
merged into the one JSON object the xid record keeps under ``metrics``, and
:class:`EpochMetrics` is its only reader and writer in txsink.

Format 1. Records of releases before the format key read the same; keys a reader does not
know are ignored (a newer release may add figures), so nothing here is ever refused.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any

METRICS_FORMAT = 1
WRITER = "writer"
RECOVERY = "recovery"  # coordinator.Coordinator.recover writes this value itself
UNKNOWN = "unknown"


@dataclass(frozen=True)
class GivenUpPartition:
    """A partition an operator gave up (``txsink resolve --give-up``): never published."""

    branch: str
    partition: str
    table: str
    rows: int
    reason: str
    at: float

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> GivenUpPartition:
        return cls(branch=raw["branch"], partition=raw["partition"], table=raw["table"],
                   rows=int(raw["rows"]), reason=raw.get("reason", ""),
                   at=float(raw.get("at", 0.0)))


@dataclass(frozen=True)
class EpochMetrics:
    """What one xid cost and who finished it; a figure not recorded is None.

    ``commit_ms`` runs from the start of the commit to the xid's ``Committed`` write
    (rows visible, decision final); ``cleanup_ms`` is what the commit spent afterwards
    (recorded by a ``transaction()``; a stream's or job's metrics are written with the
    ``Committed`` record, before it, and its log line has it);
    ``latency_ms`` runs from the first row written (a batch job) or the xid's begin
    (``transaction()``) to the decision. ``decide_ms`` runs from the start of the commit
    to the decision, ``visibility_lag_ms`` from the decision to the ``Committed`` write
    (rows visible); ``publish`` says whether the commit returned after the decision
    (``pipelined``: the lag is after Spark went on) or after ``Committed`` (``inline``).
    ``store_requests`` and ``statements`` count the messages the writer's processes sent
    for the epoch up to that write (its own included); the clean-up after it is not in them.
    """

    rows: int | None = None
    bytes: int | None = None
    branches: int | None = None
    partitions: int | None = None
    tables: int | None = None
    quarantined: int | None = None  # rows kept in the quarantine table (bad_rows=quarantine)
    stage_ms: float | None = None
    seal_ms: float | None = None
    commit_ms: float | None = None
    cleanup_ms: float | None = None
    latency_ms: float | None = None
    decide_ms: float | None = None
    visibility_lag_ms: float | None = None
    publish: str | None = None  # inline | pipelined
    # messages up to and including the Committed write: the plan of the writer Spark
    # committed through, each chosen task attempt and the commit (txsink.core.message_count)
    store_requests: int | None = None  # ZooKeeper requests (KeeperMap statements)
    statements: int | None = None  # ClickHouse statements beside those
    committed_at: float | None = None
    finished_by: str | None = None
    recovered_at: float | None = None
    given_up: tuple[GivenUpPartition, ...] = ()
    strategy_switches: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def timed(cls, commit_started: float, committed_at: float, began: float,
              decided_at: float | None = None, **figures: Any) -> EpochMetrics:
        """A writer's metrics, timed now: ``committed_at`` is the xid's ``Committed``
        write (clamped to [commit_started, now] against clock skew), ``decided_at`` its
        decision (clamped to [commit_started, committed_at]), ``began`` where its
        latency starts."""
        now = time.time()
        committed_at = min(max(committed_at, commit_started), now)
        if decided_at is not None:
            decided_at = min(max(decided_at, commit_started), committed_at)
            figures |= {"decide_ms": round((decided_at - commit_started) * 1000, 1),
                        "visibility_lag_ms": round((committed_at - decided_at) * 1000, 1)}
        return cls(commit_ms=round((committed_at - commit_started) * 1000, 1),
                   cleanup_ms=round((now - committed_at) * 1000, 1),
                   latency_ms=round((committed_at - began) * 1000, 1),
                   committed_at=now, finished_by=WRITER, **figures)

    def to_dict(self) -> dict[str, Any]:
        """The keys to merge into the xid record's metrics (figures not recorded left out)."""
        raw: dict[str, Any] = {"metrics_format": METRICS_FORMAT}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "given_up":
                if value:
                    raw[f.name] = [g.to_dict() for g in value]
            elif f.name == "strategy_switches":
                if value:
                    raw[f.name] = value
            elif value is not None:
                raw[f.name] = value
        return raw

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> EpochMetrics:
        raw = raw or {}
        known = {f.name for f in fields(cls)} - {"given_up", "strategy_switches"}
        return cls(given_up=tuple(GivenUpPartition.from_dict(g) for g in raw.get("given_up", ())),
                   strategy_switches=dict(raw.get("strategy_switches") or {}),
                   **{k: v for k, v in raw.items() if k in known})

    @property
    def by_writer(self) -> bool:
        """The writer recorded its figures, and recovery did not finish the xid."""
        return self.rows is not None and self.finished_by != RECOVERY

    def shown(self) -> dict[str, Any]:
        """The figures ``status`` prints and ``--json`` carries."""
        raw = self.to_dict()
        raw.pop("metrics_format")
        return raw

