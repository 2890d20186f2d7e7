"""The figures an alert on one sink needs, as ``txsink status --json`` carries them.

Why a record of its own: monitoring reads it from a scheduled ``txsink status --json``
and alerts on its fields, possibly across releases, so it is typed and versioned with
one serializer (:meth:`SinkHealth.to_json` / :meth:`SinkHealth.from_json`; a reader
ignores keys it does not know, and a field a newer format adds reads as absent in an
older one). ``docs/operations.md`` ("Monitoring") says which field to alert on and why.

What it counts, per sink:
- open xids by state (``Initialized``, ``Committing``, ``Aborting``): how many and the
  age of the oldest, from the open index;
- abandoned xids (``coordinator/protocol/liveness.py``: their writer is gone) and the oldest's age;
- staging tables of the sink on the ClickHouse servers it could read (those its open
  xids' branches recorded, and ``--url``): how many, their bytes on disk, and how many of
  them belong to no open xid (``txsink gc`` drops those);
- the last committed epoch and how long ago it was committed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from coordinator import BranchRecord, XidRecord, XidState
from coordinator.formats.states import OPEN_STATES
from coordinator.protocol.liveness import Verdict
from server_ext.client import SqlClient
from server_ext.errors import ClickHouseError
from server_ext.sql import sql_string
from server_ext.staging import (
    STAGING_DATABASE,
    parse_staging_table_name,
    root_tag,
    sink_key,
    staging_tables,
)

FORMAT = 1


@dataclass(frozen=True)
class OpenCount:
    """How many open xids are in one state, and the age of the oldest."""

    count: int = 0
    oldest_age_s: float | None = None


@dataclass(frozen=True)
class StagingUse:
    """A sink's staging tables on the servers that could be read."""

    tables: int = 0
    bytes: int = 0
    leftover_tables: int = 0  # of no open xid: what txsink gc drops
    servers_read: tuple[str, ...] = ()
    servers_unread: tuple[str, ...] = ()  # could not be read: the figures miss them


@dataclass(frozen=True)
class SinkHealth:
    """The counts an alert on one sink needs (see the module docstring)."""

    open: dict[str, OpenCount] = field(default_factory=dict)  # by state name
    abandoned: OpenCount = OpenCount()
    staging: StagingUse | None = None  # None: no server to read
    last_committed_epoch: int | None = None
    last_committed_age_s: float | None = None  # None: never, or its record is pruned

    def to_json(self) -> dict[str, Any]:
        def count(c: OpenCount) -> dict[str, Any]:
            return {"count": c.count, "oldest_age_s": c.oldest_age_s}

        staging = None if self.staging is None else {
            "tables": self.staging.tables, "bytes": self.staging.bytes,
            "leftover_tables": self.staging.leftover_tables,
            "servers_read": list(self.staging.servers_read),
            "servers_unread": list(self.staging.servers_unread)}
        return {"format": FORMAT,
                "open": {state: count(c) for state, c in sorted(self.open.items())},
                "abandoned": count(self.abandoned), "staging": staging,
                "last_committed_epoch": self.last_committed_epoch,
                "last_committed_age_s": self.last_committed_age_s}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> SinkHealth:
        if int(raw.get("format", 1)) > FORMAT:
            raise ValueError(f"sink health format {raw['format']} is newer than this "
                             f"release reads ({FORMAT})")

        def count(c: dict[str, Any]) -> OpenCount:
            return OpenCount(int(c["count"]), c.get("oldest_age_s"))

        staging = raw.get("staging")
        return cls(
            open={state: count(c) for state, c in raw.get("open", {}).items()},
            abandoned=count(raw.get("abandoned", {"count": 0})),
            staging=None if staging is None else StagingUse(
                int(staging["tables"]), int(staging["bytes"]),
                int(staging.get("leftover_tables", 0)),
                tuple(staging.get("servers_read", ())),
                tuple(staging.get("servers_unread", ()))),
            last_committed_epoch=raw.get("last_committed_epoch"),
            last_committed_age_s=raw.get("last_committed_age_s"))


def sink_health(sink_id: str, root: str, open_xids: list[XidRecord],
                verdicts: Iterable[Verdict], last_committed: XidRecord | None,
                last_committed_epoch: int | None,
                branches: Callable[[int], list[BranchRecord]],
                client_for: Callable[[str], SqlClient], default_url: str | None,
                now: float | None = None) -> SinkHealth:
    """The health of one sink from records ``status`` has read; ``branches(epoch)`` gives
    an open xid's branches (their servers are where its staging lives)."""
    now = time.time() if now is None else now
    by_state = {}
    for state in OPEN_STATES:
        ages = [now - x.created for x in open_xids if x.state is state]
        by_state[state.value] = OpenCount(len(ages), round(max(ages), 1) if ages else None)
    abandoned = [v.age_s for v in verdicts if v.abandoned]
    servers = {default_url} if default_url else set()
    for x in open_xids:
        servers |= {b.owner.get("server") for b in branches(x.epoch) if b.owner.get("server")}
    staging = (_staging_use(sink_id, root, {x.epoch for x in open_xids}, sorted(servers),
                            client_for) if servers else None)
    return SinkHealth(
        open=by_state,
        abandoned=OpenCount(len(abandoned), round(max(abandoned), 1) if abandoned else None),
        staging=staging, last_committed_epoch=last_committed_epoch,
        last_committed_age_s=(round(now - _committed_at(last_committed), 1)
                              if last_committed is not None else None))


def _committed_at(record: XidRecord) -> float:
    """When the xid became ``Committed`` (its history says; else its last update)."""
    for entry in reversed(record.history):
        if entry.get("state") == XidState.COMMITTED.value and entry.get("at"):
            return float(entry["at"])
    return record.updated


def _staging_use(sink_id: str, root: str, open_epochs: set[int], servers: list[str],
                 client_for: Callable[[str], SqlClient]) -> StagingUse:
    """The sink's staging tables on ``servers``, recognised by their names (sink, root)."""
    key, tag = sink_key(sink_id), root_tag(root)
    tables = size = leftover = 0
    read, unread = [], []
    for server in servers:
        try:
            client = client_for(server)
            names = [name for name, _, _ in staging_tables(client)]
            parts = {r["table"]: int(r["bytes"]) for r in client.query_rows(
                "SELECT table, toString(sum(bytes_on_disk)) AS bytes FROM system.parts "
                f"WHERE database = {sql_string(STAGING_DATABASE)} AND active GROUP BY table",
                purpose="measure staging tables")}
        except ClickHouseError:
            unread.append(server)
            continue
        read.append(server)
        for name in names:
            owner = parse_staging_table_name(name)
            if owner is None or owner.sink_key != key or owner.root_tag != tag:
                continue
            tables += 1
            size += parts.get(name, 0)
            leftover += owner.epoch not in open_epochs
    return StagingUse(tables, size, leftover, tuple(read), tuple(unread))
