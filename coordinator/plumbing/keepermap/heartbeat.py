"""The thread that keeps a KeeperMap store's session alive.

A daemon thread calls ``beat`` every ``interval`` seconds until :meth:`Heartbeat.stop`;
``start`` is idempotent (one thread per store) and does nothing once stopped. ``beat``
must not raise for a transient failure: the next beat tries again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class Heartbeat:
    """One daemon thread calling ``beat`` every ``interval`` seconds."""

    def __init__(self, interval: float, beat: Callable[[], None]) -> None:
        self.interval = interval
        self.beat = beat
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            if self.stopping.is_set():
                return
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name="txsink-keepermap-session")
            self._thread.start()

    def stop(self) -> None:
        self.stopping.set()

    def _run(self) -> None:
        while not self.stopping.wait(self.interval):
            self.beat()
