"""The sinks whose open xids this process knows: no other actor left one to finish.

A writer rolls decided xids forward before it writes: a stream before each micro-batch
(``driver.open_stream``, and Spark plans a micro-batch twice), a batch job at its start
(``driver.open_sink``); one listing of the sink's open index each. Under generation G no
other actor can open or decide an xid (every begin and decision of another writer
carries its own, newer generation, which fences this one's next begin or decision; an
older one is fenced). So once this process has rolled forward under G, what another
actor left is finished, and it stays so while G stands:

- a stream's micro-batch under G skips the listing where this process's last
  micro-batch of the sink began or committed under G without failing; under another G'
  (a new run of the query, claimed after another process may have left a decided xid)
  or after a commit that raised, it rolls forward before it begins (``foreachBatch``) or
  decides. The plan's own listing is skipped wherever the sink is known at all: the
  begin or the commit checks the generation;
- a batch job skips it where its fence moved the generation from the G of this
  process's last batch commit of the sink (nobody fenced in between): that commit left
  nothing of its own open either.

Contract: ``forget(sink)`` returns what was known and clears it, at the start of each
step that checks; ``settled(sink, G, batch)`` records it once the step ended normally
(a ``foreachBatch`` begin, any commit). Per process, by (store root, sink id);
thread-safe.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

Sink = tuple[str, str]  # store root identity, sink id


@dataclass(frozen=True)
class Settled:
    generation: int
    batch: bool  # by a batch commit (nothing of this process's is open either)


class SettledSinks:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: dict[Sink, Settled] = {}

    def known(self, sink: Sink) -> Settled | None:
        with self._lock:
            return self._known.get(sink)

    def forget(self, sink: Sink) -> Settled | None:
        with self._lock:
            return self._known.pop(sink, None)

    def settled(self, sink: Sink, generation: int, batch: bool = False) -> None:
        with self._lock:
            self._known[sink] = Settled(generation, batch)


SETTLED = SettledSinks()
