"""Whether an open xid's writer is still alive, from the coordinator's records alone.

An undecided (``Initialized``) xid is live work while its writer may still decide it, and
left behind for good when that writer is gone: a batch job killed while writing leaves
its xid and staging forever, because nothing reruns a job without ``sink_id``. This
module tells the two apart, so that ``txsink recover`` and ``txsink gc`` can roll the
abandoned ones back without a rerun and never touch a live writer's xid.

How a writer says it lives: ``begin`` of a new xid may create, in the same multi-op as
the xid, an ephemeral *holder* node ``<sink>/live/<epoch>.<holder>`` owned by the
writer's session of the store, and records ``liveness = "session"`` in the xid. More holders
may join while one exists (``hold``: a batch job's keeper process, which outlives the
Spark planner worker that began the xid); each dies with its session. Who holds:

- a batch job: the planner that began the xid, then its keeper (``txsink/core/xid_keeper.py``),
  which lives as long as the Spark driver process and until the xid is decided;
- ``txsink.transaction()``: the caller's own process, until its commit or abort;
- a streaming query: nobody. Its tasks begin the xids and another process decides, so no
  session lives exactly as long as the query; its micro-batch's xid is adopted by the
  replay when the query restarts (adoption clears ``liveness``).

The verdict on one ``Initialized`` xid (:func:`judge`), in order:

1. ``superseded``: its generation is older than the sink's. Its writer can no longer
   decide it (every decision checks the generation), so rolling it back loses nothing.
2. ``writer_gone``: it is watched and no holder exists: every session that held it
   ended (process killed, host lost, session expired) before the decision.
3. ``unwatched_old``: not watched (a streaming xid, or one begun before holders
   existed) and not updated for ``unwatched_after`` seconds, only when an operator asks
   for this age rule explicitly: nothing proves its writer gone.
4. otherwise it is left, and the verdict says why (``alive``, ``unwatched``).

Contract: the rollback of an abandoned xid is an abort compare-and-set on the xid's
version as read when it was judged, so an xid adopted or decided meanwhile is left
alone; once ``Aborting``, every registration, prepare and decision of that attempt is
refused (the xid is fenced), and its writer's ``begin`` gets ``XidAborted``. A holder
joins only atomically with ``begin`` or while another holder exists, so an xid judged
``writer_gone`` gains no holder before its rollback; a keeper whose own session expired
does not re-join (a session that expired is not alive: the publish lease's rule). The
sink's generation is not bumped: it may belong to a live stream or job writing other
xids. Misjudging costs at most a failed job: the abort and
the decision are exclusive compare-and-sets, so no row is lost or duplicated.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from dataclasses import dataclass

from kazoo.exceptions import NoNodeError

from coordinator.formats.records import XidRecord
from coordinator.formats.states import XidState
from coordinator.plumbing.multi import Multi, MultiFailed
from coordinator.plumbing.paths import EPOCH_DIGITS, unescape
from coordinator.plumbing.store import SinkStore

WATCHED = "session"  # XidRecord.liveness of an xid whose writer holds a live node

SUPERSEDED = "superseded"
WRITER_GONE = "writer_gone"
UNWATCHED_OLD = "unwatched_old"
ALIVE = "alive"
UNWATCHED = "unwatched"
ABANDONED = (SUPERSEDED, WRITER_GONE, UNWATCHED_OLD)


def holder_identity(role: str) -> tuple[str, bytes]:
    """(unique holder name, its data) for a holder node: who holds, shown to operators."""
    name = f"{role}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    data = json.dumps({"role": role, "host": socket.gethostname(), "pid": os.getpid(),
                       "since": round(time.time(), 3)}, sort_keys=True,
                      separators=(",", ":")).encode()
    return name, data


@dataclass(frozen=True)
class Verdict:
    """What :func:`judge` found for one ``Initialized`` xid."""

    record: XidRecord
    reason: str  # one of ABANDONED, or ALIVE / UNWATCHED
    age_s: float
    holders: tuple[str, ...] = ()

    @property
    def abandoned(self) -> bool:
        return self.reason in ABANDONED

    def detail(self) -> str:
        """One sentence for operators: why the xid is rolled back or left."""
        record = self.record
        return {
            SUPERSEDED: f"abandoned: generation {record.generation} was superseded",
            WRITER_GONE: "abandoned: its writer's ZooKeeper session ended before the decision",
            UNWATCHED_OLD: f"abandoned: not updated for {self.age_s:.0f} s and not watched",
            ALIVE: f"writer alive ({', '.join(self.holders)})",
            UNWATCHED: "not watched (a streaming xid, or begun before liveness was "
                       "recorded): a restart of its query replays it; "
                       "--abandoned-after SECONDS rolls back such xids by age",
        }[self.reason]


def judge(record: XidRecord, sink_generation: int, holders: list[str], now: float,
          unwatched_after: float | None = None) -> Verdict:
    """The verdict on an ``Initialized`` xid (see the module docstring for the rules)."""
    age = max(0.0, now - (record.updated or record.created))
    if record.generation < sink_generation:
        reason = SUPERSEDED
    elif record.liveness == WATCHED:
        reason = ALIVE if holders else WRITER_GONE
    elif unwatched_after is not None and age >= unwatched_after:
        reason = UNWATCHED_OLD
    else:
        reason = UNWATCHED
    return Verdict(record, reason, round(age, 1), tuple(holders))


class Liveness:
    """The holder nodes of a sink's open xids.

    Usage::

        live = Liveness(store)
        live.ensure()                                   # before a begin that holds
        live.add_to(multi, epoch, name, data)           # atomically with the xid
        live.hold(epoch, name, data)                    # join while the xid is open
        live.holders()                                  # {epoch: [holder, ...]}
        live.release(epoch, name)
    """

    def __init__(self, store: SinkStore) -> None:
        self.store = store
        self.layout = store.layout

    def ensure(self) -> None:
        """Create ``<sink>/live`` once (trees made before holders existed lack it)."""
        if self.store.run(self.store.client.exists, self.layout.live) is None:
            self.store.run(self.store.client.ensure_path, self.layout.live)

    def add_to(self, multi: Multi, epoch: int, name: str, data: bytes) -> Multi:
        """Add the creation of this session's holder of ``epoch`` to ``multi``."""
        return multi.create(self.layout.live_holder(epoch, name), data, label="live",
                            ephemeral=True)

    def hold(self, epoch: int, name: str, data: bytes) -> bool:
        """Join the holders of ``epoch`` while it is ``Initialized`` and held by someone
        (the one who hands it over); False: it was decided, or nobody holds it any more
        (then its writer is gone, and joining would hide that)."""
        record = self.store.run(self.store.read_xid, epoch)
        if record is None or record.state is not XidState.INITIALIZED:
            return False
        if name in self.holders().get(epoch, []):
            return True
        if not self.holders().get(epoch):
            return False
        multi = Multi(self.store.client)
        multi.check(self.layout.xid(epoch), record.version, label="xid")
        self.add_to(multi, epoch, name, data)
        try:
            multi.commit()
        except MultiFailed:  # decided or changed meanwhile
            return False
        return True

    def release(self, epoch: int, name: str) -> None:
        """Delete this holder (idempotent)."""
        try:
            self.store.run(self.store.client.delete, self.layout.live_holder(epoch, name))
        except NoNodeError:
            pass

    def holders(self) -> dict[int, list[str]]:
        """Holder names by epoch; one read."""
        try:
            names = self.store.run(self.store.client.get_children, self.layout.live)
        except NoNodeError:
            return {}
        found: dict[int, list[str]] = {}
        for name in sorted(names):
            epoch, _, holder = name.partition(".")
            if len(epoch) == EPOCH_DIGITS and epoch.isdigit() and holder:
                found.setdefault(int(epoch), []).append(unescape(holder))
        return found
