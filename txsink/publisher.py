"""Publish and roll back branches from their ZooKeeper records alone.

The coordinator decides; this module is the callback that turns a decision into
ClickHouse statements. It needs nothing but the branch record (manifest, strategy,
staging name), so a restarted driver, ``txsink recover`` or another sink's recovery can
finish a commit that a crashed process decided. Both callbacks are idempotent: the
coordinator may call them again after any crash.
"""

from __future__ import annotations

import logging

import server_ext
from coordinator import BranchRecord, Coordinator
from server_ext.client import ClickHouseClient
from txsink import crashpoints

log = logging.getLogger("txsink.publish")


class BranchPublisher:
    """Callbacks for :meth:`Coordinator.commit`, ``abort`` and ``recover``.

    Usage::

        publisher = BranchPublisher(clickhouse_client, coord)
        coord.commit(epoch, generation, winners, publish=publisher.publish,
                     rollback=publisher.rollback)
    """

    def __init__(self, client: ClickHouseClient, coord: Coordinator) -> None:
        self.client = client
        self.coord = coord

    def publish(self, record: BranchRecord) -> None:
        payload = record.manifest or {}
        ledger = self.coord.ledger(record.epoch, record.branch_id)
        if payload.get("overwrite_of"):
            manifests = [server_ext.Manifest.from_dict(m) for m in payload["overwrite_of"]]
            server_ext.publish_overwrite(
                self.client, manifests, payload["staging"], ledger, on_step=crashpoints.hit
            )
        else:
            manifest = server_ext.Manifest.from_dict(payload["manifest"])
            if manifest.partitions:
                server_ext.publish(
                    self.client, manifest, payload["strategy"], ledger,
                    on_step=crashpoints.hit,
                )
        self.rollback(record)

    def rollback(self, record: BranchRecord) -> None:
        staging = (record.manifest or {}).get("staging") or (record.owner or {}).get("staging")
        if staging:
            server_ext.rollback(self.client, staging)
