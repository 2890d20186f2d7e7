"""Operator commands behind ``txsink status | recover | gc | verify``.

Each returns plain data (for ``--json``) and :func:`render` turns it into the text an
operator reads. None of them fences a sink: ``recover`` finishes ``Committing`` xids and
rolls back undecided xids of generations older than the sink's current one, so it is
safe while a writer runs; the writer's own in-flight xid is left alone.
"""

from __future__ import annotations

import time
from typing import Any

from kazoo.client import KazooClient

import server_ext
from coordinator import Coordinator, XidState, audit
from server_ext.client import ClickHouseClient
from txsink.publisher import BranchPublisher

OPEN_STATES = (XidState.INITIALIZED, XidState.COMMITTING, XidState.ABORTING)


class Operations:
    """One ZooKeeper session (and, when needed, one ClickHouse client) per command."""

    def __init__(self, zookeeper: str, zk_root: str = "/txsink", url: str | None = None,
                 user: str | None = None, password: str | None = None) -> None:
        self.root = zk_root
        self.zk = KazooClient(hosts=zookeeper)
        self.zk.start(timeout=15)
        self.url = url
        self._credentials = (user, password)
        self._clients: dict[str, ClickHouseClient] = {}

    def close(self) -> None:
        self.zk.stop()
        self.zk.close()

    def client_for(self, url: str | None = None) -> ClickHouseClient:
        """A client for ``url`` (a branch's server) or, for None, for ``--url``."""
        url = url or self.url
        if url is None:
            raise ValueError("this command needs --url")
        if url not in self._clients:
            user, password = self._credentials
            self._clients[url] = ClickHouseClient(url, user=user, password=password)
        return self._clients[url]

    def _sinks(self, only: str | None) -> list[str]:
        sinks = Coordinator.sinks(self.zk, self.root)
        return [s for s in sinks if only is None or s == only]

    def _coordinator(self, sink_id: str) -> Coordinator:
        return Coordinator(self.zk, sink_id, root=self.root)

    def status(self, sink: str | None = None, recent: int = 5) -> dict[str, Any]:
        now = time.time()
        sinks = []
        for sink_id in self._sinks(sink):
            coord = self._coordinator(sink_id)
            open_xids = coord.xids(states=OPEN_STATES)
            committed = coord.xids(states=(XidState.COMMITTED,))[-recent:]
            sinks.append({
                "sink_id": sink_id,
                "generation": coord.generation(),
                "last_committed": coord.last_committed(),
                "open": [
                    {"epoch": x.epoch, "state": x.state.value,
                     "age_s": round(now - x.created, 1), "winners": list(x.winners)}
                    for x in open_xids
                ],
                "in_doubt": [x.epoch for x in open_xids if x.state == XidState.COMMITTING],
                "recent": [{"epoch": x.epoch, **x.metrics} for x in committed],
            })
        return {"sinks": sinks}

    def recover(self, sink: str | None = None) -> dict[str, Any]:
        reports = []
        for sink_id in self._sinks(sink):
            coord = self._coordinator(sink_id)
            publisher = BranchPublisher(self.client_for, coord)
            report = coord.recover(publish=publisher.publish, rollback=publisher.rollback,
                                   raise_on_failure=False)
            reports.append({"sink_id": sink_id, "actions": [str(a) for a in report.actions],
                            "failed": [str(a) for a in report.failed]})
        return {"sinks": reports}

    def resolve(self, sink_id: str, epoch: int, branch_id: str, partition_id: str,
                attached: bool) -> dict[str, Any]:
        """Record an operator's decision on an in-doubt partition, then recover the sink.

        Only for what ``recover`` reported as in doubt: look at the target first.
        ``attached=True`` means the partition's rows are in the target; ``False`` that
        they are not and must be attached again.
        """
        coord = self._coordinator(sink_id)
        record = next((b for b in coord.branches(epoch) if b.branch_id == branch_id), None)
        if record is None or not record.manifest:
            raise ValueError(f"no prepared branch {branch_id} in xid {sink_id}/{epoch}")
        manifest = server_ext.Manifest.from_dict(record.manifest["manifest"])
        server_ext.resolve_partition(manifest, partition_id, coord.ledger(epoch, branch_id),
                                     attached=attached)
        return self.recover(sink_id)

    def _is_live(self, name: server_ext.StagingName) -> bool:
        """A staging table is live while its xid may still publish or roll it back."""
        for sink_id in Coordinator.sinks(self.zk, self.root):
            if server_ext.staging_sink_key(sink_id) != name.sink_key:
                continue
            record = self._coordinator(sink_id).xid(name.epoch)
            if record is not None and record.state in OPEN_STATES:
                return True
        return False

    def gc(self, grace_seconds: float, prune_older_than: float | None,
           servers: list[str] | None = None) -> dict[str, Any]:
        """Sweep ``servers`` (every server of a sharded target; default ``--url``)."""
        dropped = []
        for url in servers or [None]:
            dropped += server_ext.sweep(self.client_for(url), self._is_live, grace_seconds)
        pruned: dict[str, list[int]] = {}
        if prune_older_than is not None:
            for sink_id in self._sinks(None):
                pruned[sink_id] = self._coordinator(sink_id).prune(prune_older_than)
        return {"dropped_staging": dropped, "pruned": pruned}

    def verify(self, sink: str | None = None,
               committing_older_than: float = 300.0) -> dict[str, Any]:
        return {"sinks": [
            {"sink_id": sink_id, "anomalies": [
                str(a) for a in audit(self.zk, self.root, sink_id,
                                      committing_older_than=committing_older_than)
            ]}
            for sink_id in self._sinks(sink)
        ]}


def render(command: str, result: dict[str, Any]) -> str:
    """Human-readable text for one command's result."""
    lines: list[str] = []
    if command == "gc":
        lines.append(f"dropped {len(result['dropped_staging'])} staging table(s)")
        lines += [f"  {name}" for name in result["dropped_staging"]]
        for sink_id, epochs in result["pruned"].items():
            lines.append(f"pruned {len(epochs)} finished xid(s) of {sink_id}")
        return "\n".join(lines)
    if not result["sinks"]:
        return "no sinks"
    for sink in result["sinks"]:
        if command == "status":
            lines.append(f"{sink['sink_id']}: generation {sink['generation']}, "
                         f"last committed epoch {sink['last_committed']}")
            for x in sink["open"]:
                flag = "  IN DOUBT: run txsink recover" if x["epoch"] in sink["in_doubt"] else ""
                lines.append(f"  epoch {x['epoch']}: {x['state']} for {x['age_s']}s{flag}")
            for m in sink["recent"]:
                lines.append(
                    f"  epoch {m['epoch']}: {m.get('rows', '?')} rows, "
                    f"{m.get('branches', '?')} branches, commit {m.get('commit_ms', '?')} ms, "
                    f"latency {m.get('latency_ms', '?')} ms"
                )
        elif command in ("recover", "resolve"):
            lines.append(f"{sink['sink_id']}: " + ("; ".join(sink["actions"]) or "nothing to do"))
            lines += [f"  NOT FINISHED: {a}" for a in sink["failed"]]
        else:
            found = sink["anomalies"]
            verdict = f"{len(found)} anomalies" if found else "ok"
            lines.append(f"{sink['sink_id']}: {verdict}")
            lines += [f"  {a}" for a in found]
    return "\n".join(lines)
