"""Operators' decisions on a ``Committing`` xid, kept in a winner's ledger.

Next to publish records (keyed by staging table names, ``txs_...``, so these keys never
collide with them) a winner's ledger may hold an operator's decision: a strategy switch
(``txsink recover --strategy``), which every publisher honours, and partitions given up
(``txsink resolve --give-up``). Each is a typed record with its one serializer here; the
xid's metrics list the same decisions for ``status`` (:mod:`txsink.core.metrics`).

Format 1 (records of releases before the format key read the same).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Protocol

SWITCH_KEY = "operator.strategy_switch"
GIVEN_UP_KEY = "operator.given_up"


class LedgerEntries(Protocol):
    """The ledger's key/value surface (``coordinator.Ledger``)."""

    def get(self, key: str) -> dict[str, Any] | None: ...

    def put(self, key: str, value: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class SwitchStep:
    """One switch of a winner's strategy: why, by whom, and the intent it cleared."""

    old: str
    new: str
    why: str
    cleared_intent: tuple[str, ...]
    moved_before: tuple[str, ...]
    at: float
    by: str

    def to_dict(self) -> dict[str, Any]:
        return {"from": self.old, "to": self.new, "why": self.why,
                "cleared_intent": list(self.cleared_intent),
                "moved_before": list(self.moved_before), "at": self.at, "by": self.by}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> SwitchStep:
        return cls(old=raw["from"], new=raw["to"], why=raw.get("why", ""),
                   cleared_intent=tuple(raw.get("cleared_intent", ())),
                   moved_before=tuple(raw.get("moved_before", ())),
                   at=float(raw.get("at", 0.0)), by=raw.get("by", ""))


@dataclass(frozen=True)
class StrategySwitch:
    """The strategy a winner publishes with now (``to``) and every switch that led there."""

    to: str
    history: tuple[SwitchStep, ...] = ()

    def then(self, step: SwitchStep) -> StrategySwitch:
        return StrategySwitch(step.new, (*self.history, step))

    @classmethod
    def load(cls, ledger: LedgerEntries) -> StrategySwitch | None:
        raw = ledger.get(SWITCH_KEY)
        if not raw:
            return None
        return cls(raw["to"], tuple(SwitchStep.from_dict(s) for s in raw.get("history", ())))

    def store(self, ledger: LedgerEntries) -> None:
        ledger.put(SWITCH_KEY, {"format": 1, "to": self.to,
                                "history": [s.to_dict() for s in self.history]})


@dataclass(frozen=True)
class GivenUp:
    """One given-up partition: its rows are never published."""

    rows: int
    reason: str
    at: float
    by: str

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class GivenUpPartitions:
    """A winner's given-up partitions, by partition id."""

    partitions: dict[str, GivenUp] = field(default_factory=dict)

    def adding(self, given: dict[str, GivenUp]) -> GivenUpPartitions:
        return GivenUpPartitions({**self.partitions, **given})

    @classmethod
    def load(cls, ledger: LedgerEntries) -> GivenUpPartitions:
        raw = ledger.get(GIVEN_UP_KEY) or {}
        return cls({pid: GivenUp(rows=int(g["rows"]), reason=g.get("reason", ""),
                                 at=float(g.get("at", 0.0)), by=g.get("by", ""))
                    for pid, g in raw.get("partitions", {}).items()})

    def store(self, ledger: LedgerEntries) -> None:
        ledger.put(GIVEN_UP_KEY, {"format": 1, "partitions": {
            pid: g.to_dict() for pid, g in self.partitions.items()}})
