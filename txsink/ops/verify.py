"""``txsink verify``: audit each sink's history and compare its target partitions with
what its committed xids put there (:mod:`txsink.ops.verify_target`)."""

from __future__ import annotations

from typing import Any

from coordinator import (
    audit,
)
from txsink.ops.session import NO_SINKS, Session, protected_lines
from txsink.ops.verify_target import Writers, check_targets


class VerifyCommand(Session):
    def verify(self, sink: str | None = None, committing_older_than: float = 300.0,
               target: bool = True, writers: Writers = "unknown") -> dict[str, Any]:
        """Audit each sink's history and, with ``target``, compare its target partitions
        with what its committed xids put there (``txsink.ops.verify_target``).

        ``anomalies`` lists every finding as a sentence (history and target alike: any
        makes the command fail); ``target`` has the target findings as data, the
        partitions it could not judge and why, and how many matched.
        """
        sinks = self._sinks(sink, must_exist=True)
        reports = (check_targets(self.zk, self.root, sinks, self.client_for, self.url, writers)
                   if target and sinks else {})
        result = []
        for sink_id in sinks:
            anomalies = [str(a) for a in audit(self.zk, self.root, sink_id,
                                               committing_older_than=committing_older_than)]
            report = reports.get(sink_id)
            if report is not None:
                anomalies += [a["detail"] for a in report["anomalies"]]
            result.append({"sink_id": sink_id, "anomalies": anomalies,
                           "target": report or {"checked": False}})
        return {"sinks": result}


def render(result: dict[str, Any]) -> str:
    """Human-readable text of ``verify``'s result."""
    lines = protected_lines(result)
    if not result["sinks"]:
        return "\n".join([*lines, NO_SINKS])
    for sink in result["sinks"]:
        lines += _render_verify(sink)
    return "\n".join(lines)


def _render_verify(sink: dict[str, Any]) -> list[str]:
    """``ok`` only when nothing is anomalous *and* nothing went unjudged."""
    found, target = sink["anomalies"], sink.get("target") or {"checked": False}
    unjudged, unknown = target.get("not_judged", []), target.get("unknown_history", [])
    spans = [f"{u['first']}..{u['last']}" if u["first"] != u["last"] else str(u["first"])
             for u in unknown]
    epochs = ", ".join(spans)
    if found:
        verdict = f"{len(found)} anomalies"
    elif unjudged:
        verdict = f"no anomaly found, but {len(unjudged)} target partition(s) not judged"
    elif unknown:
        verdict = f"no anomaly found, but what committed epochs {epochs} wrote is not checked"
    else:
        verdict = "ok" if target["checked"] else "ok (history only; target not checked)"
    lines = [f"{sink['sink_id']}: {verdict}"] + [f"  {a}" for a in found]
    if target["checked"]:
        lines.append(f"  target ({target['writers']} writers): {target['partitions_ok']} "
                     f"partition(s) match, {len(target['anomalies'])} anomalous, "
                     f"{len(unjudged)} not judged")
        lines += [f"    not judged: {n['detail']}" for n in unjudged]
        lines += [f"    not checked: decided epoch(s) {span}: {u['reason']}; what they "
                  "wrote is unknown" for span, u in zip(spans, unknown, strict=True)]
    return lines
