"""The operators' front of one sink: status reads, verdicts, repairs, reset and retention.

What ``txsink status``, ``recover``, ``gc`` and ``reset`` do to a sink besides acting as a
writer would: list the sinks and their xids, judge undecided xids, report lost records,
put the open index back, reset a stream's epochs, prune finished xids, forget a one-off
sink. Writers never call it (they use :class:`~coordinator.coordinator.Coordinator`).

A :class:`SinkAdmin` works on the node store of the :class:`Coordinator` it is made from
(one session: the operator's recover and resolve go through that coordinator, and its
publish leases). Reads only read; every write is one multi-op checked against what was
read, so an operator command may run next to live writers and next to another operator,
and may be repeated after a crash.

Usage::

    admin = SinkAdmin(Coordinator(kazoo_client, "orders-stream", role="txsink operator"))
    for verdict in admin.verdicts():
        ...
    admin.prune(7 * 86400)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from coordinator.coordinator import Coordinator
from coordinator.errors import SinkTreeDamaged
from coordinator.formats.records import XidRecord
from coordinator.formats.states import XidState
from coordinator.plumbing.multi import Multi, MultiFailed
from coordinator.plumbing.nodes import NodeStore
from coordinator.plumbing.paths import DEFAULT_ROOT
from coordinator.plumbing.store import list_sinks
from coordinator.protocol.epochs import LastCommitted, TxnVersion
from coordinator.protocol.fencing import Generation
from coordinator.protocol.liveness import Liveness, Verdict, judge
from coordinator.protocol.stream import ResetOutcome, StreamReset
from coordinator.upkeep.retention import Fold, Retention, Summary

log = logging.getLogger(__name__)


class SinkAdmin:
    """Operators' reads and repairs of one sink, over a coordinator's store."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator
        self.client = coordinator.client
        self.sink_id = coordinator.sink_id
        self.layout = coordinator.layout
        self.store = coordinator.store

    @staticmethod
    def sinks(client: NodeStore, root: str = DEFAULT_ROOT) -> list[str]:
        """Every sink id with a tree under ``root``."""
        return list_sinks(client, root)

    def last_committed(self) -> int | None:
        """The highest committed epoch (None before the first commit); never decreases."""
        return self.store.run(LastCommitted(self.store).read)[0]

    def xids(self, states: Iterable[XidState] | None = None) -> list[XidRecord]:
        """Xid records in epoch order, optionally only those in ``states`` (open states
        are answered from the open index, without listing every xid)."""
        wanted = set(states) if states is not None else None
        open_only = wanted is not None and all(s.is_open for s in wanted)
        epochs = self.store.run(self.store.epochs, open_only)
        records = self.store.run(self.store.read_xids, epochs)
        return [r for r in records if wanted is None or r.state in wanted]

    def verdicts(self, unwatched_after: float | None = None) -> list[Verdict]:
        """The verdict on every ``Initialized`` xid: abandoned (and why) or left (and
        why); see ``coordinator/protocol/liveness.py``."""
        generation = Generation(self.store).current()
        records = self.xids(states=(XidState.INITIALIZED,))
        holders = Liveness(self.store).holders()  # after the records: see Coordinator._judge
        now = time.time()
        return [judge(r, generation, holders.get(r.epoch, []), now, unwatched_after)
                for r in records]

    def damage(self) -> list[str]:
        """Why writers of this sink are refused for lost records (``SinkTreeDamaged``'s
        messages: a record of the tree, the ``txn_version`` node), only reading; empty
        when nothing is lost. For operators' checks (``txsink status``)."""
        found = [self.store.run(self.layout.damage, self.client)]
        try:
            if TxnVersion(self.store).read()[0] is None:
                TxnVersion(self.store).require_not_lost()
        except SinkTreeDamaged as exc:
            found.append(str(exc))
        return [problem for problem in found if problem]

    def restore_open_index(self) -> list[int]:
        """Put every open xid missing from the open index back into it; the epochs put back.

        The index is derived from the xid records, and everything that finishes xids
        (recovery, status, gc) reads it: an entry lost hides a ``Committing`` xid, whose
        unpublished rows then never arrive. Reads every xid record, so operators' commands
        call it, not writers. An entry is created only while the record is still the one
        read (a version check in the same multi-op): an xid finished meanwhile is left.
        """
        indexed = set(self.store.run(self.store.epochs, True))
        restored = []
        for record in self.xids():
            if not record.state.is_open or record.epoch in indexed:
                continue
            multi = Multi(self.client).check(self.layout.xid(record.epoch), record.version,
                                             label="xid")
            multi.create(self.layout.open_marker(record.epoch), label="open")
            try:
                multi.commit()
            except MultiFailed:
                continue  # changed or indexed meanwhile: its actor keeps the index
            restored.append(record.epoch)
        if restored:
            log.warning("sink %s: the open index had lost xid(s) %s (%s); put back",
                        self.sink_id, restored, self.layout.open)
        return restored

    def reset_stream(self, forget_epochs: bool = False, committed_through: int | None = None,
                     by: str | None = None) -> ResetOutcome:
        """The operator's way out of a :class:`StreamStateMismatch` (``txsink reset``):
        forget the sink's epochs and/or record micro-batches ``0..committed_through`` as
        committed, then leave the sink to the next query that writes. Fences every older
        writer; :class:`ResetRefused` while xids are open."""
        return StreamReset(self.store, Generation(self.store)).run(forget_epochs,
                                                                   committed_through, by)

    def prune(self, max_age_seconds: float, fold: Fold | None = None) -> list[int]:
        """Remove finished xids last updated more than ``max_age_seconds`` ago; returns
        their epochs. ``last_committed``, the epoch counter and ``is_committed`` answers
        survive (pruned epochs are remembered as ranges), and with ``fold`` what the
        committed ones wrote (the sink's summary, ``coordinator/upkeep/retention.py``)."""
        return Retention(self.store, fold, self.coordinator.on_step).prune(max_age_seconds)

    def summary(self) -> Summary:
        """What retention folded of the pruned committed xids (``Summary``)."""
        return Retention(self.store).summary()

    def forget_sink(self, max_age_seconds: float) -> float | None:
        """Delete this whole sink when nothing is open and nothing changed for
        ``max_age_seconds`` (returns that age; None: kept). For one-off sinks only:
        a sink written again afterwards would start from scratch."""
        return Retention(self.store).forget_sink(max_age_seconds)
