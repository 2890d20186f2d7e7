"""``txsink gc``: roll back abandoned xids, drop staging no xid accounts for, prune
finished xids and forget idle one-off sinks."""

from __future__ import annotations

from typing import Any

from coordinator import (
    XidState,
)
from coordinator.formats.states import OPEN_STATES
from coordinator.protocol.recovery import ROLLED_BACK
from coordinator.sink_admin import SinkAdmin
from server_ext.staging import StagingName, root_tag, sink_key, sweep
from txsink.core.history_summary import fold_into
from txsink.core.publisher import (
    BranchPublisher,
)
from txsink.ops.session import Session, protected_lines, staging_of
from txsink.options import is_one_off

ONE_OFF_RETENTION = 7 * 24 * 3600.0  # gc forgets one-off sinks idle this long (default)


class GcCommand(Session):
    def _is_live(self, name: StagingName) -> bool:
        """A staging table is live while its xid may still publish or roll it back.

        Answers for this root only: an xid this root does not know (no such sink or
        epoch) is not live here. The sweeper asks only about this root's tables; a table
        of any other root is treated as live, so it can never be dropped from here.
        """
        if name.root_tag != root_tag(self.root_identity):
            return True
        for sink_id in SinkAdmin.sinks(self.zk, self.root):
            if sink_key(sink_id) != name.sink_key:
                continue
            if not self._readable(sink_id):
                return True  # its state is not ours to read: never drop its staging
            record = self._coordinator(sink_id).xid(name.epoch)
            if record is not None and record.state in OPEN_STATES:
                return True
        return False

    def gc(self, grace_seconds: float, prune_older_than: float | None,
           servers: list[str] | None = None,
           forget_one_off_after: float | None = ONE_OFF_RETENTION,
           unwatched_after: float | None = None) -> dict[str, Any]:
        """Roll back abandoned xids, then sweep ``servers`` (every server of a sharded
        target; default ``--url``).

        First every sink's abandoned xids are rolled back as ``recover`` does (their
        branches' staging and staging views dropped through ``BranchPublisher.rollback``,
        the xid ``Aborted``); ``abandoned`` lists them, and every undecided xid left
        with why. Then the sweep drops what no xid accounts for any more.

        Drops only this root's staging (see ``server_ext.staging.sweeper``); every table of the
        staging database that belongs to another root, has no root tag or is not a
        staging name is listed under ``foreign_staging`` and left alone. Then forgets the
        one-off sinks (batch jobs without ``sink_id``) idle for ``forget_one_off_after``
        seconds, after their staging was swept.
        """
        abandoned = self._roll_back_abandoned(unwatched_after)
        dropped: list[str] = []
        foreign: list[dict[str, Any]] = []
        for url in servers or [None]:
            result = sweep(self.client_for(url), self.root_identity, self._is_live,
                           grace_seconds)
            dropped += result.dropped
            foreign += [{"server": url or self.url, "table": f.table, "reason": f.reason,
                         "root_tag": f.root_tag, "age_s": round(f.age_seconds)}
                        for f in result.foreign]
        pruned: dict[str, list[int]] = {}
        if prune_older_than is not None:
            for sink_id in self._sinks(None):
                pruned[sink_id] = self._admin(sink_id).prune(prune_older_than,
                                                             fold_into(self.url))
        forgotten: dict[str, float] = {}
        if forget_one_off_after is not None:
            for sink_id in filter(is_one_off, self._sinks(None)):
                age = self._admin(sink_id).forget_sink(forget_one_off_after)
                if age is not None:
                    forgotten[sink_id] = round(age)
        return {"root": self.root_identity, "root_tag": root_tag(self.root_identity),
                "abandoned": abandoned,
                "dropped_staging": dropped, "foreign_staging": foreign, "pruned": pruned,
                "forgotten_sinks": forgotten, **self._protected_note()}

    def _roll_back_abandoned(self, unwatched_after: float | None) -> dict[str, Any]:
        """gc's first step: per sink, the xids rolled back as abandoned (with their
        staging), those that could not be, and every undecided xid left, with why."""
        rolled: list[dict[str, Any]] = []
        failed: list[dict[str, Any]] = []
        left: list[dict[str, Any]] = []
        for sink_id in self._sinks(None):
            admin = self._admin(sink_id)
            coord = admin.coordinator
            admin.restore_open_index()
            verdicts = {v.record.epoch: v for v in admin.verdicts(unwatched_after)}
            staging = {e: staging_of(coord, e) for e, v in verdicts.items() if v.abandoned}
            with BranchPublisher(self.client_for, coord) as publisher:
                report = coord.recover(publish=publisher.publish, rollback=publisher.rollback,
                                       raise_on_failure=False, abandoned=True,
                                       unwatched_after=unwatched_after)
            done = {a.epoch: a for a in report.actions
                    if a.from_state is XidState.INITIALIZED}
            for epoch, verdict in sorted(verdicts.items()):
                entry = {"sink_id": sink_id, "epoch": epoch, "reason": verdict.reason,
                         "detail": verdict.detail(), "age_s": verdict.age_s}
                action = done.get(epoch)
                if action is not None and action.action == ROLLED_BACK:
                    rolled.append({**entry, "staging": staging.get(epoch, [])})
                elif action is not None:
                    failed.append({**entry, "detail": str(action)})
                elif verdict.abandoned:
                    left.append({**entry, "detail": "changed since it was judged "
                                 "abandoned (adopted or decided meanwhile)"})
                else:
                    left.append(entry)
            # a decided xid that recovery could not finish: gc did not do all it should
            failed += [{"sink_id": sink_id, "epoch": a.epoch, "reason": "unfinished",
                        "detail": str(a), "age_s": None}
                       for a in report.failed if a.epoch not in verdicts]
        return {"rolled_back": rolled, "failed": failed, "left": left}


_FOREIGN_REASONS = {
    "other_root": "another root's (tag r{tag}): run gc with that root",
    "untagged": "no root tag (older name format): check its xid, then drop it by hand",
    "unparseable": "not a staging table name",
}


def render(result: dict[str, Any]) -> str:
    """Human-readable text of ``gc``'s result."""
    lines = protected_lines(result)
    abandoned = result.get("abandoned", {})
    for a in abandoned.get("rolled_back", []):
        lines.append(f"rolled back abandoned xid {a['sink_id']}/{a['epoch']} ({a['detail']}, "
                     f"{a['age_s']:.0f} s old); its branches' staging, dropped where it "
                     f"existed: {', '.join(a['staging']) or 'none'}")
    for a in abandoned.get("failed", []):
        verb = "finished" if a["reason"] == "unfinished" else "rolled back"
        lines.append(f"NOT {verb}: {a['detail']}")
    for a in abandoned.get("left", []):
        lines.append(f"left undecided xid {a['sink_id']}/{a['epoch']}: {a['detail']}")
    lines.append(f"root {result['root']} (staging tag r{result['root_tag']}): "
                 f"swept {len(result['dropped_staging'])} more staging table(s) that no "
                 "xid accounts for")
    lines += [f"  {name}" for name in result["dropped_staging"]]
    if result["foreign_staging"]:
        lines.append(f"left {len(result['foreign_staging'])} table(s) of the staging "
                     "database that this root does not own (not dropped):")
        lines += [f"  {f['server']}  {f['table']}  "
                  + _FOREIGN_REASONS[f["reason"]].format(tag=f["root_tag"])
                  for f in result["foreign_staging"]]
    for sink_id, epochs in result["pruned"].items():
        lines.append(f"pruned {len(epochs)} finished xid(s) of {sink_id}")
    for sink_id, age in result.get("forgotten_sinks", {}).items():
        lines.append(f"forgot one-off sink {sink_id} (idle {age / 86400:.1f} days)")
    return "\n".join(lines)
