"""Sweeper: drop staging tables that no transaction will publish or roll back any more.

Staging tables outlive their owners when a task, a driver or a whole cluster dies between
creating staging and finishing the xid. The coordinator's recovery rolls back the branches
it knows about; the sweeper catches the rest (branches that never got registered, xids
whose records were removed) so that the staging database does not grow without bound.

Every coordinator root (ZooKeeper chroot + ``zk_root``) writes into the same
``STAGING_DATABASE``, and only the root that owns an xid knows whether its staging is
still live: to any other root a live xid looks unknown. So a sweeper acts for one root and
never judges another root's tables.

Contract of ``sweep(client, root, is_live, grace_seconds)``:
- A table of ``STAGING_DATABASE`` is dropped only when all of these hold: its name parses
  as a staging table name; its root tag is ``root_tag(root)``; ``is_live`` is False for
  its ``StagingName``; its age is at least ``grace_seconds``.
- ``is_live`` answers for ``root`` only and must answer True for every xid that is not yet
  decided or is still publishing (Initialized, Committing, Aborting); finished
  (Committed, Aborted) and unknown xids are False.
- Every other table is **reported** in ``SweepResult.foreign`` and never dropped: a table
  of another root (``other_root``: only that root can judge it), a staging name without a
  root tag from before the tag existed (``untagged``: any root may own it), and any other
  name (``unparseable``). The root's own live or young tables are kept silently.
- The grace period covers a branch that has created its staging table but not yet
  registered itself, and clock differences; age is measured by the server's own clock
  unless ``now`` (a Unix time, for tests) is given. Age is ``metadata_modification_time``
  from ``system.tables``: the time the table's metadata file was written, i.e. its
  creation (inserts and STOP MERGES do not change it).
- Idempotent; safe to run from several processes and for several roots at once (drops
  are IF EXISTS, and a root only ever drops its own tables).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from server_ext.client.catalog import catalog_rows
from server_ext.client.client_protocol import SqlClient
from server_ext.sql import sql_string
from server_ext.staging.staging_tables import (
    STAGING_DATABASE,
    StagingName,
    parse_staging_table_name,
    rollback,
    root_tag,
)

log = logging.getLogger(__name__)

OTHER_ROOT = "other_root"
UNTAGGED = "untagged"
UNPARSEABLE = "unparseable"


@dataclass(frozen=True)
class ForeignStaging:
    """A table of the staging database that this sweeper may not judge, and why."""

    table: str
    reason: str  # OTHER_ROOT, UNTAGGED or UNPARSEABLE
    age_seconds: float
    root_tag: str | None = None  # the owning root's tag, for OTHER_ROOT


@dataclass
class SweepResult:
    """What one sweep did: tables dropped, and tables reported but left alone."""

    dropped: list[str] = field(default_factory=list)
    foreign: list[ForeignStaging] = field(default_factory=list)


def staging_tables(client: SqlClient) -> list[tuple[str, int, int]]:
    """(name, metadata time, server time) of every table in the staging database."""
    rows = catalog_rows(client,
        "SELECT name, toUInt32(metadata_modification_time) AS created, "
        "toUInt32(now()) AS server_now FROM system.tables "
        f"WHERE database = {sql_string(STAGING_DATABASE)} ORDER BY name",
        purpose="list staging tables",
    )
    return [(r["name"], int(r["created"]), int(r["server_now"])) for r in rows]


def sweep(
    client: SqlClient,
    root: str,
    is_live: Callable[[StagingName], bool],
    grace_seconds: float,
    now: float | None = None,
) -> SweepResult:
    """Drop ``root``'s staging tables of xids that are not live, older than the grace period.

    Reports (never drops) every table of the staging database that is not ``root``'s.
    """
    own = root_tag(root)
    result = SweepResult()
    for name, created, server_now in staging_tables(client):
        age = (server_now if now is None else now) - created
        owner = parse_staging_table_name(name)
        if owner is None:
            result.foreign.append(ForeignStaging(name, UNPARSEABLE, age))
            continue
        if owner.root_tag is None:
            result.foreign.append(ForeignStaging(name, UNTAGGED, age))
            continue
        if owner.root_tag != own:
            result.foreign.append(ForeignStaging(name, OTHER_ROOT, age, owner.root_tag))
            continue
        if age < grace_seconds or is_live(owner):
            continue
        rollback(client, name)
        log.info("swept staging table %s (epoch %d, %.0f s old)", name, owner.epoch, age)
        result.dropped.append(name)
    return result
