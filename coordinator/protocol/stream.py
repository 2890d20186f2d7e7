"""The stream record: a streaming sink's epochs belong to one query's checkpoint.

A streaming sink takes its epochs from Spark (epoch = micro-batch id), and micro-batch ids
mean something only within the checkpoint that numbered them. If the checkpoint and the
sink stop describing the same history, the two-phase commit alone would go wrong
silently: a new checkpoint's batches 0..N would be taken for epochs the sink already
committed and skipped (rows lost), and a micro-batch replayed onto a sink that lost its
state would be written again (rows doubled). This module detects both and refuses.

What Spark guarantees, and what the check rests on: micro-batch ``n`` runs only after
``commits/n-1`` is in the checkpoint, which Spark writes only after the sink's commit of
``n-1`` returned; ``offsets/n`` is written before ``n`` runs, so a restart replays at most
the last planned batch. Hence, when batch ``n`` arrives, a sink that shares the
checkpoint's history has committed ``n-1`` and at most ``n`` itself (a replay):
``last_committed`` is ``n-1`` or ``n`` (None only for ``n == 0``). Spark also keeps a
query id in the checkpoint: the same on every restart of it, new for a new checkpoint.
Tasks see it as the local property ``sql.streaming.queryId``; the driver-side writer
does not, which is why the check runs in the tasks.

Contract of :meth:`StreamOwnership.check` (``query_id``, micro-batch ``n``), called by
every task of a micro-batch before it claims the generation, begins the xid or stages:

- the sink's epochs belong to another query and that query committed at least one of
  them → :class:`CheckpointReplaced` (the checkpoint was deleted or replaced);
- ``last_committed`` is None and ``n > 0``, or ``n > last_committed + 1`` →
  :class:`SinkStateLost` (the sink's state in the store was deleted or is an older copy);
- ``n < last_committed`` → :class:`CheckpointReplaced` (the checkpoint is older than the
  sink: restored from a copy);
- otherwise it passes. A sink owned by nobody (first write, after ``txsink reset``, or a
  sink written before stream records existed) or by a query that never committed is
  adopted by ``query_id`` with one compare-and-set; a refused micro-batch writes nothing.

The refusals cannot see two cases: a sink whose whole state was lost while its query
replays micro-batch 0 (nothing tells a replay of batch 0 from a first batch 0), and a
micro-batch that has no task at all (nothing but the commit side sees it, and it writes
no rows).

:class:`StreamReset` is the explicit way out (``txsink reset``): it forgets the sink's
epochs (``forget_epochs``), records micro-batches ``0..N`` as committed
(``committed_through``), or both, and leaves the sink to the next query that writes.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from coordinator.errors import CheckpointReplaced, ResetRefused, SinkStateLost
from coordinator.formats.records import StreamRecord, XidRecord, decode, encode
from coordinator.formats.states import XidState
from coordinator.plumbing.multi import Multi, MultiFailed, tries
from coordinator.plumbing.paths import DEFAULT_ROOT
from coordinator.plumbing.store import SinkStore
from coordinator.protocol.epochs import LAST_COMMITTED, LastCommitted
from coordinator.protocol.fencing import FENCE, Generation
from coordinator.upkeep.retention import add_to_ranges

STREAM = "stream"  # label of the stream record's write in a multi-op


def read_stream(store: SinkStore) -> StreamRecord | None:
    """The stream record as stored now (None: absent); call inside ``store.run``."""
    try:
        data, stat = store.client.get(store.layout.stream)
    except NoNodeError:
        return None
    return StreamRecord.from_bytes(store.sink_id, data, stat.version)


def reset_command(store: SinkStore, flags: str) -> str:
    """The ``txsink reset`` command line for this sink, as an operator would type it.

    The store's address is the client's own, so the command reaches the same records:
    ZooKeeper's hosts and chroot (authentication is not part of it), or a KeeperMap
    store's ``--coordinator keepermap`` flags (its ``operator_flags``).
    """
    client = store.client
    parts = ["txsink reset"]
    operator_flags = getattr(client, "operator_flags", None)
    if operator_flags is not None:
        parts.append(operator_flags())
    elif hosts := ",".join(f"{host}:{port}" for host, port in getattr(client, "hosts", [])):
        parts.append(f"--zookeeper {hosts}{getattr(client, 'chroot', '') or ''}")
    root = store.layout.root or "/"
    if root != DEFAULT_ROOT:
        parts.append(f"--zk-root {root}")
    parts += [f"--sink {store.sink_id}", flags]
    return " ".join(parts)


class StreamOwnership:
    """Check that a micro-batch of a streaming query may write to the sink; adopt it.

    Usage (every task of a micro-batch, before ``claim``)::

        StreamOwnership(store).check(query_id, batch_id)   # raises StreamStateMismatch

    Cost: one pipelined read of the stream record and ``last_committed`` (one round trip)
    per task; one more write when a query adopts the sink.
    """

    def __init__(self, store: SinkStore) -> None:
        self.store = store
        self.path = store.layout.stream

    def read(self) -> StreamRecord | None:
        """The stream record (None: no streaming query has written since it existed)."""
        return self.store.run(read_stream, self.store)

    def check(self, query_id: str, epoch: int) -> StreamRecord:
        if not query_id:
            raise ValueError("query_id must be a non-empty string")
        if epoch < 0:
            raise ValueError(f"a micro-batch id is non-negative, got {epoch}")
        return self.store.run(self._check, query_id, epoch)

    def _read_both(self) -> tuple[StreamRecord | None, int | None]:
        client, layout = self.store.client, self.store.layout
        stream = client.get_async(layout.stream)
        last = client.get_async(layout.last_committed)
        try:
            data, stat = stream.get()
            record = StreamRecord.from_bytes(self.store.sink_id, data, stat.version)
        except NoNodeError:
            record = None
        try:
            raw, _ = last.get()
            epoch = decode(raw, layout.last_committed).get("epoch")
        except NoNodeError:  # a sink not created yet, or a damaged one: refused here
            layout.check(client)
            epoch = None
        return record, int(epoch) if epoch is not None else None

    def _check(self, query_id: str, epoch: int) -> StreamRecord:
        for _ in tries(f"to hand {self.path} to query {query_id}: it changed each time"):
            record, last = self._read_both()
            owner = record.query_id if record is not None else None
            if owner is not None and owner != query_id and last is not None:
                raise self._replaced_by_other(query_id, epoch, owner, last)
            if not self._in_flight(epoch, last):
                self._require_next(query_id, epoch, owner, last)
            if owner == query_id:
                assert record is not None
                return record
            adopted = self._adopt(record, query_id, epoch, last)
            if adopted is not None:
                return adopted  # else someone wrote the record meanwhile: decide again
        raise AssertionError("unreachable: tries() raises when spent")

    def _adopt(self, record: StreamRecord | None, query_id: str, epoch: int,
               last: int | None) -> StreamRecord | None:
        if record is None:
            why = "first write" if last is None else "sink written before stream records"
            record = StreamRecord(self.store.sink_id, None)
        elif record.query_id is None:
            why = "adopted after reset"
        else:
            why = "replaced a query that committed no epoch"
        new = record.handed_to(query_id, epoch, {"event": why, "last_committed": last})
        client = self.store.client
        try:
            if record.version < 0:
                client.create(self.path, new.to_bytes())
                return StreamRecord.from_bytes(self.store.sink_id, new.to_bytes(), 0)
            stat = client.set(self.path, new.to_bytes(), version=record.version)
            return StreamRecord.from_bytes(self.store.sink_id, new.to_bytes(), stat.version)
        except NoNodeError:
            if record.version >= 0:
                return None  # deleted meanwhile (a reset or a hand edit): read again
            self.store.layout.ensure(client)  # the sink's tree does not exist yet
            return None
        except (NodeExistsError, BadVersionError):
            return None

    def _in_flight(self, epoch: int, last: int | None) -> bool:
        """Whether ``epoch`` follows an epoch that is decided but not yet ``Committed``
        (a pipelined writer publishes it while this one's tasks run): then the sink's
        state is one epoch ahead of ``last_committed``, which the next decision waits
        for."""
        previous = 0 if last is None else last + 1
        if epoch != previous + 1:
            return False
        record = self.store.read_xid(previous)
        return record is not None and record.state in (XidState.COMMITTING,
                                                       XidState.COMMITTED)

    def _require_next(self, query_id: str, epoch: int, owner: str | None,
                      last: int | None) -> None:
        """Refuse unless ``epoch`` is ``last_committed`` (a replay) or the one after."""
        sink_id = self.store.sink_id
        if (last is None and epoch > 0) or (last is not None and epoch > last + 1):
            known = ("has no committed epoch" if last is None
                     else f"has committed epochs only up to {last}")
            raise SinkStateLost(
                f"stream state mismatch on sink {sink_id}: streaming query {query_id} is "
                f"at micro-batch {epoch}, so its checkpoint says micro-batches up to "
                f"{epoch - 1} were committed, but the sink {known}: the sink's ZooKeeper "
                f"state was deleted or restored from an older copy. Micro-batch {epoch} "
                "may be a replay of a batch whose rows are already in the target, so "
                "nothing was written. Stop the query and look at the target: if the rows "
                f"of micro-batch {epoch} are there, run `"
                f"{reset_command(self.store, f'--committed-through {epoch}')}`; "
                f"if they are not, run `"
                f"{reset_command(self.store, f'--committed-through {epoch - 1}')}"
                "`; then start the query again.",
                sink_id=sink_id, query_id=query_id, epoch=epoch, owner=owner,
                last_committed=last)
        if last is not None and epoch < last:
            raise CheckpointReplaced(
                f"stream state mismatch on sink {sink_id}: streaming query {query_id} is "
                f"at micro-batch {epoch}, but the sink already committed epochs up to "
                f"{last} (owner {owner or 'not recorded'}): the checkpoint is older than the sink "
                f"(two runs of this query writing the same checkpoint at once, a checkpoint "
                f"restored from a copy, or a new checkpoint on a sink written before "
                f"stream records existed). Its micro-batches {epoch}..{last} would be "
                "taken for committed epochs and skipped, so nothing was written. If another "
                "run of this query is alive, stop all but one and start it again from its "
                "checkpoint first. Otherwise restore "
                "the query's newest checkpoint; or, if this checkpoint must go on, run `"
                f"{reset_command(self.store, '--forget-epochs')}` (add "
                "--committed-through K when micro-batches 0..K of this checkpoint are "
                "already in the target) and start the query again.",
                sink_id=sink_id, query_id=query_id, epoch=epoch, owner=owner,
                last_committed=last)

    def _replaced_by_other(self, query_id: str, epoch: int, owner: str,
                           last: int) -> CheckpointReplaced:
        sink_id = self.store.sink_id
        return CheckpointReplaced(
            f"stream state mismatch on sink {sink_id}: its epochs belong to streaming "
            f"query {owner} (committed up to epoch {last}), but query {query_id} is "
            f"writing micro-batch {epoch} to it: the query's checkpoint was deleted or "
            "replaced (the sink id is derived from the checkpoint location unless "
            "sink_id is set). Its micro-batches would be taken for epochs the sink "
            "already committed and skipped, so nothing was written. Restore the original "
            "checkpoint; or give this query its own sink_id; or let it take the sink over "
            "with its micro-batches counted from 0: stop it, run `"
            f"{reset_command(self.store, '--forget-epochs')}` and start it again "
            "(a new checkpoint re-reads its source from the start unless the source is "
            "told otherwise).",
            sink_id=sink_id, query_id=query_id, epoch=epoch, owner=owner,
            last_committed=last)


@dataclass(frozen=True)
class ResetOutcome:
    """What a reset found and did (plain data for ``txsink reset --json``)."""

    sink_id: str
    previous_owner: str | None
    last_committed_before: int | None
    forget_epochs: bool
    forgotten_epochs: int
    committed_through: int | None
    generation: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class StreamReset:
    """Rewrite a streaming sink's history on an operator's word (``txsink reset``).

    - ``forget_epochs``: delete every xid, empty ``pruned``, ``last_committed`` None:
      for a new query (new or deleted checkpoint) that takes the sink over, its
      micro-batches counted from 0.
    - ``committed_through=N``: micro-batches ``0..N`` count as committed (their rows are
      in the target): ``last_committed`` N, epochs ``0..N-1`` in ``pruned`` and a
      ``Committed`` xid for ``N`` without branches, so a replay of ``N`` writes nothing
      and the query goes on at ``N+1``. For a sink whose state was lost.
    - Both: forget, then record ``0..N``.

    Either way the stream record is left to the next query that writes, and the
    generation is bumped (every older writer is fenced). Refused with
    :class:`ResetRefused` while the sink has open xids, and when ``committed_through`` is
    below an epoch the sink committed (without ``forget_epochs``). The query must be
    stopped: a writer that claims the sink during the reset makes it fail (run it again).
    The order (fence, delete xids, then one multi-op for ``last_committed``, ``pruned``,
    the marker xid and the stream record) keeps every intermediate state refused by
    :class:`StreamOwnership` for a query other than the sink's owner, and a reset that
    stopped half-way is finished by running it again.
    """

    def __init__(self, store: SinkStore, sink_generation: Generation) -> None:
        self.store = store
        self.sink_generation = sink_generation

    def run(self, forget_epochs: bool, committed_through: int | None,
            by: str | None = None) -> ResetOutcome:
        if not forget_epochs and committed_through is None:
            raise ValueError("reset needs forget_epochs, committed_through or both")
        if committed_through is not None and committed_through < 0:
            raise ValueError(f"committed_through must be >= 0, got {committed_through}")
        by = by or f"{socket.gethostname()}:{os.getpid()}"
        last_before = self._refuse_if_busy(forget_epochs, committed_through)
        generation = self.sink_generation.bump()
        self._refuse_if_busy(forget_epochs, committed_through, during=True)
        store = self.store
        record = store.run(read_stream, store)
        forgotten = store.run(self._forget) if forget_epochs else 0
        store.run(self._finish, generation, forget_epochs, committed_through, record, last_before,
                  by)
        return ResetOutcome(store.sink_id, record.query_id if record else None, last_before,
                            forget_epochs, forgotten, committed_through, generation)

    def _refuse_if_busy(self, forget_epochs: bool, committed_through: int | None,
                        during: bool = False) -> int | None:
        sink_id = self.store.sink_id
        open_epochs = self.store.run(self.store.epochs, True)
        if open_epochs:
            when = ("a writer began them during the reset: stop the query, then run the "
                    "reset again" if during else
                    "a writer is running or recovery is needed: stop the query, run "
                    f"`txsink recover --sink {sink_id}`, then reset")
            raise ResetRefused(f"sink {sink_id} has open xids {open_epochs}; {when}")
        last = self.store.run(LastCommitted(self.store).read)[0]
        if not forget_epochs and committed_through is not None and last is not None \
                and last > committed_through:
            raise ResetRefused(
                f"sink {sink_id} has committed epochs up to {last}, after "
                f"--committed-through {committed_through}; add --forget-epochs to forget "
                "them first (only if micro-batches after it are not in the target)")
        return last

    def _forget(self) -> int:
        """Delete every xid's subtree (all finished: the open index is empty)."""
        epochs = self.store.epochs(False)
        for epoch in reversed(epochs):
            try:
                self.store.client.delete(self.store.layout.xid(epoch), recursive=True)
            except NoNodeError:
                pass
        return len(epochs)

    def _finish(self, generation: int, forget_epochs: bool, committed_through: int | None,
                record: StreamRecord | None, last_before: int | None, by: str) -> None:
        store, layout = self.store, self.store.layout
        client = store.client
        last, last_version = LastCommitted(store).read()
        pruned_found = store.read_json(layout.pruned)
        pruned = pruned_found[0] if pruned_found else {}
        pruned_version = pruned_found[1] if pruned_found else -1
        committed = [] if forget_epochs else list(pruned.get("committed", []))
        aborted = [] if forget_epochs else list(pruned.get("aborted", []))
        new_last = None if forget_epochs else last
        multi = Multi(client)
        multi.check(layout.generation, generation, label=FENCE)
        if committed_through is not None:
            new_last = committed_through
            if committed_through > 0:
                committed = add_to_ranges(committed + [[0, committed_through - 1]], [])
            self._mark_committed(multi, committed_through, generation, by)
        multi.set_data(layout.last_committed,
                       encode({"epoch": new_last, "at": time.time()}, LAST_COMMITTED),
                       last_version, label=LAST_COMMITTED)
        multi.set_data(layout.pruned, encode({"committed": committed, "aborted": aborted},
                                             "pruned"), pruned_version, label="pruned")
        summary = store.read_json(layout.summary) if forget_epochs else None
        if summary is not None:  # what forgotten epochs wrote is forgotten with them
            multi.delete(layout.summary, summary[1], label="summary")
        current = read_stream(store)
        base = current or StreamRecord(store.sink_id, None)
        new = base.handed_to(None, None, {
            "event": "reset", "forget_epochs": forget_epochs,
            "committed_through": committed_through, "last_committed": last_before,
            "by": by})
        multi.write(layout.stream, new.to_bytes(), current and current.version, label=STREAM)
        try:
            multi.commit()
        except MultiFailed as failed:
            if failed.label == FENCE:
                raise ResetRefused(
                    f"sink {store.sink_id}: a writer claimed the sink during the reset; stop "
                    "the query and run the reset again") from None
            if failed.conflict:
                raise ResetRefused(
                    f"sink {store.sink_id} changed during the reset ({failed.label}); stop "
                    "the query and run the reset again") from None
            raise failed.error from None

    def _mark_committed(self, multi: Multi, epoch: int, generation: int, by: str) -> None:
        """A ``Committed`` xid without branches for ``epoch``: its replay writes nothing
        (the table's ``Unknown → Committed`` move ``reset``)."""
        existing = self.store.read_xid(epoch)
        if existing is not None and existing.state is XidState.COMMITTED:
            return
        if existing is not None:  # finished but not committed: replaced by the marker
            self.store.client.delete(self.store.layout.xid(epoch), recursive=True)
        now = time.time()
        marker = XidRecord(
            sink_id=self.store.sink_id, epoch=epoch, state=XidState.UNKNOWN,
            generation=generation, created=now, updated=now,
        ).moved_to(XidState.COMMITTED, generation, event="reset", decided_at=now,
                   metrics={"reset": f"marked committed by txsink reset ({by})"})
        multi.create(self.store.layout.xid(epoch), marker.to_bytes(), label="xid")
        multi.create(self.store.layout.branches(epoch), label="xid")
