"""``txsink status``: each sink's generation, open xids (abandoned or live), recent
commits with their metrics, operators' decisions and the health figures alerts read."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any

from coordinator import (
    Coordinator,
    XidRecord,
    XidState,
)
from coordinator.formats.states import OPEN_STATES
from coordinator.protocol.liveness import Verdict
from coordinator.sink_admin import SinkAdmin
from txsink.core.metrics import UNKNOWN, WRITER, EpochMetrics
from txsink.core.payload import from_record, task_branches
from txsink.ops.session import (
    NO_SINKS,
    Session,
    protected_lines,
    shown_epoch,
    staging_of,
)
from txsink.ops.status_report import SinkHealth, sink_health


@dataclass(frozen=True)
class OpenXid:
    """An open xid as ``status`` shows it: its state and age, its winners, and for an
    undecided one whether its writer lives (``coordinator/protocol/liveness.py``) and, when it is
    abandoned, the staging a rollback will drop."""

    epoch: int
    state: XidState
    age_s: float
    winners: tuple[str, ...]
    verdict: Verdict | None = None
    staging: tuple[str, ...] = ()

    @classmethod
    def of(cls, coord: Coordinator, record: XidRecord, verdict: Verdict | None,
           now: float) -> OpenXid:
        staging = (tuple(staging_of(coord, record.epoch))
                   if verdict is not None and verdict.abandoned else ())
        return cls(record.epoch, record.state, round(now - record.created, 1),
                   tuple(record.winners), verdict, staging)

    def to_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {"epoch": self.epoch, "state": self.state.value,
                                 "age_s": self.age_s, "winners": list(self.winners)}
        if self.verdict is not None:
            found.update(abandoned=self.verdict.abandoned, liveness=self.verdict.reason,
                         liveness_detail=self.verdict.detail())
            if self.verdict.abandoned:
                found["staging"] = list(self.staging)
        return found


@dataclass(frozen=True)


class OperatorDecisions:
    """The decisions operators recorded on one xid (``txsink.core.operator_records``)."""

    epoch: int
    state: XidState
    metrics: EpochMetrics

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "state": self.state.value,
                "given_up": [g.to_dict() for g in self.metrics.given_up],
                "strategy_switches": self.metrics.strategy_switches}


class StatusCommand(Session):
    """``txsink status``."""

    def status(self, sink: str | None = None, recent: int = 5,
               unwatched_after: float | None = None) -> dict[str, Any]:
        now = time.time()
        sinks = []
        for sink_id in self._sinks(sink, must_exist=True):
            admin = self._admin(sink_id)
            coord = admin.coordinator
            records = admin.xids()  # every record: an open xid the open index lost shows
            open_xids = [x for x in records if x.state in OPEN_STATES]
            verdicts = {v.record.epoch: v for v in admin.verdicts(unwatched_after)}
            every_committed = [x for x in records if x.state is XidState.COMMITTED]
            committed = every_committed[-recent:]
            last = admin.last_committed()
            health = sink_health(
                sink_id, self.root_identity, open_xids, verdicts.values(),
                next((x for x in reversed(every_committed) if x.epoch == last), None), last,
                coord.branches, self.client_for, self.url, now)
            sinks.append({
                "sink_id": sink_id,
                "generation": coord.generation(),
                "last_committed": last,
                "health": health.to_json(),
                "open": [OpenXid.of(coord, x, verdicts.get(x.epoch), now).to_json()
                         for x in open_xids],
                "in_doubt": [x.epoch for x in open_xids if x.state == XidState.COMMITTING],
                "damaged": admin.damage(),
                "recent": [{"epoch": x.epoch, **_commit_metrics(coord, x)} for x in committed],
                "operator_decisions": _decisions(open_xids, every_committed),
                "retention": _retention(admin, records),
            })
        return {"sinks": sinks, **self._protected_note()}


def render(result: dict[str, Any]) -> str:
    """Human-readable text of ``status``'s result."""
    lines = protected_lines(result)
    if not result["sinks"]:
        return "\n".join([*lines, NO_SINKS])
    for sink in result["sinks"]:
        lines.append(f"{sink['sink_id']}: generation {sink['generation']}, "
                     f"last committed epoch {shown_epoch(sink['last_committed'])}")
        lines.append(f"  {_render_health(SinkHealth.from_json(sink['health']))}")
        if "retention" in sink:
            lines.append(f"  {_render_retention(sink['retention'])}")
        lines += [f"  DAMAGED (every writer is refused): {problem}"
                  for problem in sink.get("damaged", [])]
        for x in sink["open"]:
            flag = "  IN DOUBT: run txsink recover" if x["epoch"] in sink["in_doubt"] else ""
            if x.get("abandoned"):
                flag = (f"  ABANDONED ({x['liveness_detail']}): txsink recover or gc rolls "
                        f"it back; staging its branches recorded (a branch may not have "
                        f"made it yet): {', '.join(x['staging']) or 'none'}")
            elif x.get("liveness"):
                flag = f"  ({x['liveness_detail']})"
            lines.append(f"  epoch {x['epoch']}: {x['state']} for {x['age_s']}s{flag}")
        for m in sink["recent"]:
            timing = ("finished by recovery" if m.get("finished_by") == "recovery" else
                      "no timings recorded (finished by an unknown actor)"
                      if m.get("finished_by") == "unknown" else
                      f"commit {m.get('commit_ms', '?')} ms, "
                      f"latency {m.get('latency_ms', '?')} ms{_lag(m)}{_sent(m)}")
            kept = (f"{m['quarantined']} quarantined, " if m.get("quarantined") is not None
                    else "")
            lines.append(f"  epoch {m['epoch']}: {m.get('rows', '?')} rows, {kept}"
                         f"{m.get('branches', '?')} branches, {timing}")
        lags = sorted(m["visibility_lag_ms"] for m in sink["recent"]
                      if m.get("visibility_lag_ms") is not None)
        if lags:
            lines.append(f"  visibility lag over the last {len(lags)} epoch(s): "
                         f"p50 {_percentile(lags, 0.5):.0f} ms, p99 {_percentile(lags, 0.99):.0f}"
                         " ms (decision to rows visible)")
        lines += [f"  {line}" for line in _render_decisions(sink.get("operator_decisions", []))]
    return "\n".join(lines)


def _sent(metrics: dict) -> str:
    """An epoch's messages as ``status`` shows them ("" when not recorded)."""
    if metrics.get("store_requests") is None:
        return ""
    return (f", {metrics['store_requests']} store requests and "
            f"{metrics.get('statements', '?')} statements")


def _lag(metrics: dict) -> str:
    """An epoch's visibility lag as ``status`` shows it ("" when not recorded)."""
    lag = metrics.get("visibility_lag_ms")
    if lag is None:
        return ""
    return f", visible {lag} ms after its decision ({metrics.get('publish', 'inline')})"


def _percentile(sorted_values: list[float], q: float) -> float:
    """The nearest-rank percentile ``q`` of ascending values."""
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


def _retention(admin: SinkAdmin, records: list[XidRecord]) -> dict[str, Any]:
    """What the sink's store holds of its history: the retained xids, the pruned epochs'
    ranges and the summary's partitions (``coordinator/upkeep/retention.py``)."""
    pruned = admin.store.run(admin.store.read_json, admin.layout.pruned)
    ranges = pruned[0] if pruned else {}
    summary = admin.summary()
    return {"retained_xids": len(records),
            "oldest_retained": records[0].epoch if records else None,
            "pruned_committed": ranges.get("committed", []),
            "pruned_aborted": ranges.get("aborted", []),
            "summary_partitions": len(summary.partitions),
            "summary_folded": summary.folded}


def _render_retention(retention: dict[str, Any]) -> str:
    committed = sum(hi - lo + 1 for lo, hi in retention["pruned_committed"])
    folded = sum(hi - lo + 1 for lo, hi in retention["summary_folded"])
    return (f"history: {retention['retained_xids']} xid(s) retained (oldest epoch "
            f"{shown_epoch(retention['oldest_retained'])}); {committed} committed epoch(s) "
            f"pruned, {folded} of them in the summary ({retention['summary_partitions']} "
            "partition(s))")


def _render_health(health: SinkHealth) -> str:
    """``status``'s one line of the alert figures (``txsink/ops/status_report.py``)."""
    opened = ", ".join(f"{n.count} {state}" + (f" (oldest {n.oldest_age_s:.0f} s)"
                                                 if n.oldest_age_s is not None else "")
                       for state, n in health.open.items() if n.count) or "none"
    age = (f", {health.last_committed_age_s:.0f} s ago"
           if health.last_committed_age_s is not None else "")
    staging = "staging not measured (no server known: --url)"
    if health.staging is not None:
        s = health.staging
        staging = (f"staging {s.tables} table(s), {s.bytes} bytes, {s.leftover_tables} of no "
                   "open xid" + (f" (unread: {', '.join(s.servers_unread)})"
                                 if s.servers_unread else ""))
    return (f"health: open xids {opened}; abandoned {health.abandoned.count}; {staging}; "
            f"last commit epoch {health.last_committed_epoch}{age}")


def _commit_metrics(coord: Coordinator, record: XidRecord) -> dict[str, Any]:
    """A committed xid's figures as ``status`` shows them, and who finished it.

    The writer records its metrics (``finished_by: writer``) right after its commit;
    recovery marks the xids it published (``finished_by: recovery``). Where neither is
    recorded (a writer killed between its ``Committed`` write and its metrics, or a
    record older than these marks) nothing is claimed: ``finished_by`` is ``unknown``.
    Rows and branches come from the winners' records when the writer did not record
    them.
    """
    metrics = EpochMetrics.from_dict(record.metrics)
    if metrics.by_writer:
        return replace(metrics, finished_by=WRITER).shown()
    return _winners_metrics(coord, record, metrics)


def _winners_metrics(coord: Coordinator, record: XidRecord,
                     metrics: EpochMetrics) -> dict[str, Any]:
    """What the winners' records say of an xid whose writer recorded no metrics:
    rows and task branches, no timings."""
    payloads = [from_record(b.manifest) for b in coord.branches(record.epoch, record.winners)]
    return replace(metrics, finished_by=metrics.finished_by or UNKNOWN,
                   rows=sum(p.rows for p in payloads if p is not None),
                   branches=sum(task_branches(p) for p in payloads if p is not None)).shown()


def _decisions(*groups: list[XidRecord]) -> list[dict[str, Any]]:
    """Operators' recorded decisions (given-up partitions, strategy switches), per xid."""
    found = [OperatorDecisions(x.epoch, x.state, EpochMetrics.from_dict(x.metrics))
             for x in sorted((x for g in groups for x in g), key=lambda x: x.epoch)]
    return [d.to_json() for d in found if d.metrics.given_up or d.metrics.strategy_switches]


def _render_decisions(decisions: list[dict[str, Any]]) -> list[str]:
    lines = []
    for d in decisions:
        for g in d["given_up"]:
            why = f": {g['reason']}" if g.get("reason") else ""
            lines.append(f"epoch {d['epoch']} ({d['state']}): GIVEN UP partition "
                         f"{g['partition']} of branch {g['branch']}, {g['rows']} rows for "
                         f"{g['table']} never published{why}")
        for branch, switch in d["strategy_switches"].items():
            lines.append(f"epoch {d['epoch']} ({d['state']}): branch {branch} published with "
                         f"{switch['to']} instead of {switch['from']} (operator)")
    return lines
