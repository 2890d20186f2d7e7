"""Publish and roll back branches from their ZooKeeper records alone.

The coordinator decides; this module is the callback that turns a decision into
ClickHouse statements. It needs nothing but the branch record (manifest, strategy,
staging name), so a restarted driver, ``txsink recover`` or another sink's recovery can
finish a commit that a crashed process decided. Both callbacks are idempotent: the
coordinator may call them again after any crash.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import server_ext
from coordinator import BranchRecord, Coordinator
from server_ext.client import ClickHouseClient
from txsink import crashpoints

log = logging.getLogger("txsink.publish")


class BranchPublisher:
    """Callbacks for :meth:`Coordinator.commit`, ``abort`` and ``recover``.

    Each branch is published on, and rolled back from, the server that holds its staging
    (recorded with the branch); ``client_for(None)`` serves records written before
    branches named their server.

    Usage::

        publisher = BranchPublisher(lambda url: ClickHouseClient(url or default_url), coord)
        coord.commit(epoch, generation, winners, publish=publisher.publish,
                     rollback=publisher.rollback)
    """

    def __init__(self, client_for: Callable[[str | None], ClickHouseClient],
                 coord: Coordinator,
                 strategy_for: Callable[[BranchRecord], str | None] | None = None) -> None:
        self.client_for = client_for
        self.coord = coord
        # An operator's override of a branch's recorded strategy (None: the recorded one);
        # see txsink.operations, "txsink recover --strategy", for when a switch is safe.
        self.strategy_for = strategy_for

    def publish(self, record: BranchRecord) -> None:
        payload = record.manifest or {}
        client = self.client_for(server_of(record))
        ledger = self.coord.ledger(record.epoch, record.branch_id)
        if payload.get("overwrite_of"):
            manifests = [server_ext.Manifest.from_dict(m) for m in payload["overwrite_of"]]
            server_ext.publish_overwrite(
                client, manifests, payload["staging"], ledger, on_step=crashpoints.hit
            )
        else:
            manifest = server_ext.Manifest.from_dict(payload["manifest"])
            if manifest.partitions:
                strategy = (self.strategy_for and self.strategy_for(record)) or payload["strategy"]
                server_ext.publish(
                    client, manifest, strategy, ledger, on_step=crashpoints.hit,
                )
        self.rollback(record)

    def rollback(self, record: BranchRecord) -> None:
        """Drop the branch's staging table; on an unreachable server, leave it.

        A branch that is rolled back is never published, so its staging table can never
        become visible: ``txsink gc`` drops it once the xid is finished. Failing instead
        would keep a decided xid ``Committing`` (and fail the job) for as long as one
        replica that a failed task attempt chose stays down.
        """
        staging = (record.manifest or {}).get("staging") or (record.owner or {}).get("staging")
        if staging:
            server = server_of(record)
            try:
                server_ext.rollback(self.client_for(server), staging)
            except server_ext.ServerUnreachable as exc:
                log.warning("xid %s: staging %s of branch %s left for txsink gc: %s",
                            record.xid, staging, record.branch_id, exc)


def server_of(record: BranchRecord) -> str | None:
    """The URL of the server holding the branch's staging (None: the default server)."""
    return (record.manifest or {}).get("server") or (record.owner or {}).get("server")
