"""Publish: make one sealed branch's staged rows visible in the target, exactly once.

Publish runs after the xid's decision and may be interrupted anywhere; whoever recovers
the xid runs it again with the same manifest and ledger. The contract: ``publish`` may be
repeated any number of times; a repeat never makes a row visible twice nor loses one, and
where the server leaves that undecidable it raises ``InDoubtPublish`` and attaches
nothing. Before any statement touches the target it checks that staging still holds
exactly the sealed parts (``StagingChanged`` otherwise). Each partition becomes visible
at once, the partitions of a manifest one after another. ``on_step(name)`` is called at
each crash point of ``PUBLISH_STEPS[strategy]``. One strategy module each (``move``,
``attach_replicated``, ``attach_marked``) over the shared run (``strategy_run``); the
reasons are in ``docs/design.md``, "Publish strategies".
"""

from __future__ import annotations

import logging

from server_ext.client.client_protocol import SqlClient
from server_ext.old_server.attach_marked import AttachMarkedRun
from server_ext.publish.attach_replicated import AttachReplicatedRun
from server_ext.publish.move import MoveRun
from server_ext.publish.overwrite import publish_overwrite
from server_ext.publish.publish_ledger import PublishLedger
from server_ext.publish.publish_steps import PublishReport, StepHook, no_step
from server_ext.publish.strategy_choice import STRATEGIES
from server_ext.staging.manifest import Manifest

log = logging.getLogger(__name__)


def publish(
    client: SqlClient,
    manifest: Manifest,
    strategy: str,
    ledger: PublishLedger,
    *,
    overwrite: bool = False,
    on_step: StepHook | None = None,
) -> PublishReport:
    """Publish one sealed staging table (see the module contract). Re-runnable.

    ``overwrite=True`` replaces each partition present in the manifest (dynamic partition
    overwrite) whatever the strategy; with several branches use ``publish_overwrite``.
    """
    if overwrite:
        return publish_overwrite(client, [manifest], None, ledger, on_step=on_step)
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown publish strategy {strategy!r}; expected one of "
                         f"{', '.join(STRATEGIES)}")
    publisher_class = {run.strategy: run
                       for run in (MoveRun, AttachReplicatedRun, AttachMarkedRun)}[strategy]
    return publisher_class(client, manifest, ledger, on_step or no_step).run()
