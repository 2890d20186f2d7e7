"""The writers' retention step: :func:`retain_after_commit`, called on the driver after
its own ``Committed`` write (a commit, a transaction's commit).

A bounded pass (``Coordinator.retain``, folding what each pruned xid wrote into the
sink's summary with ``txsink.core.history_summary.fold_into``) at most every
:func:`pass_interval` seconds per sink and process, at once again while a backlog is
left. It never fails the commit it follows (a failed pass is logged; the next one repeats
it). Any number of writers and operators may run it at once.
"""

from __future__ import annotations

import logging
import time

from coordinator import Coordinator
from txsink.core.history_summary import fold_into
from txsink.core.tuning import DEFAULT_TUNING, Tuning
from txsink.options import SinkOptions

log = logging.getLogger(__name__)

MAX_PASS_INTERVAL = 60.0  # seconds between two writers' passes of one sink, at most


def pass_interval(retention: float) -> float:
    """Seconds between a writer's retention passes of one sink: a twentieth of the
    retention (the retained window then swings by at most 5%), at most
    :data:`MAX_PASS_INTERVAL` (a pass that left a backlog is followed at once)."""
    return min(retention / 20, MAX_PASS_INTERVAL)


_next_pass: dict[tuple[object, ...], float] = {}  # (store, root, sink) -> monotonic time


def retain_after_commit(options: SinkOptions, coord: Coordinator,
                        tuning: Tuning = DEFAULT_TUNING) -> None:
    """The writers' retention step (module docstring); call after a ``Committed`` write;
    one pass removes at most ``tuning.retention_pass_xids`` xids."""
    if not options.transaction.retention:
        return
    key = (options.store.root_identity, options.store.zk_root, coord.sink_id)
    now = time.monotonic()
    if _next_pass.get(key, 0.0) > now:
        return
    _next_pass[key] = now + pass_interval(options.transaction.retention)
    try:
        done = coord.retain(options.transaction.retention, fold_into(options.connection.url),
                            limit=tuning.retention_pass_xids)
    except Exception as exc:  # noqa: BLE001 - the commit is done; the next pass repeats
        log.warning("txsink sink=%s retention pass failed (the next one repeats it): %s",
                    coord.sink_id, exc)
        return
    if done.more:
        _next_pass[key] = now
    if done.pruned:
        log.info("txsink sink=%s retention removed epochs %d..%d (%d xids)", coord.sink_id,
                 done.pruned[0], done.pruned[-1], len(done.pruned))
