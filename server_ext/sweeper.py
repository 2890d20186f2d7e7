"""Sweeper: drop staging tables that no transaction will publish or roll back any more.

Staging tables outlive their owners when a task, a driver or a whole cluster dies between
creating staging and finishing the xid. The coordinator's recovery rolls back the branches
it knows about; the sweeper catches the rest (branches that never got registered, xids
whose records were removed) so that the staging database does not grow without bound.

Contract:
- Only tables in ``STAGING_DATABASE`` whose names parse as staging table names are
  considered; anything else there is left alone.
- A table is dropped only when ``is_live(name)`` is False for its ``StagingName`` **and** its
  metadata is older than ``grace_seconds``. ``is_live`` must answer True for every xid
  that is not yet decided or is still publishing (Initialized, Committing). The grace
  period covers a branch that has created its staging table but not yet registered
  itself, and clock differences; age is measured by the server's own clock unless ``now``
  (a Unix time, for tests) is given.
- Age is ``metadata_modification_time`` from ``system.tables``: the time the table's
  metadata file was written, i.e. its creation (inserts and STOP MERGES do not change it).
- Idempotent; safe to run from several processes at once (drops are IF EXISTS).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from server_ext.capabilities import SqlClient
from server_ext.seal import sql_string
from server_ext.staging import STAGING_DATABASE, StagingName, parse_staging_table_name, rollback

log = logging.getLogger(__name__)


def staging_tables(client: SqlClient) -> list[tuple[str, int, int]]:
    """(name, metadata time, server time) of every table in the staging database."""
    rows = client.query_rows(
        "SELECT name, toUInt32(metadata_modification_time) AS created, "
        "toUInt32(now()) AS server_now FROM system.tables "
        f"WHERE database = {sql_string(STAGING_DATABASE)} ORDER BY name",
        purpose="list staging tables",
    )
    return [(r["name"], int(r["created"]), int(r["server_now"])) for r in rows]


def sweep(
    client: SqlClient,
    is_live: Callable[[StagingName], bool],
    grace_seconds: float,
    now: float | None = None,
) -> list[str]:
    """Drop the staging tables of xids that are not live, older than the grace period.

    Returns the names of the tables dropped by this call.
    """
    dropped = []
    for name, created, server_now in staging_tables(client):
        owner = parse_staging_table_name(name)
        if owner is None:
            continue
        age = (server_now if now is None else now) - created
        if age < grace_seconds or is_live(owner):
            continue
        rollback(client, name)
        log.info("swept staging table %s (epoch %d, %.0f s old)", name, owner.epoch, age)
        dropped.append(name)
    return dropped
