"""A TCP proxy on 127.0.0.1 that turns the network bad on command.

Put it between the sink and ClickHouse (HTTP) or ZooKeeper and point the sink's ``url`` or
``zookeeper`` option at the proxy. Network faults then happen exactly when a test says,
without touching the shared servers::

    with TcpProxy("127.0.0.1", 8123) as proxy:
        url = f"http://127.0.0.1:{proxy.port}"
        proxy.delay(0.5)      # every forwarded chunk waits half a second
        proxy.cut()           # every open connection is closed now (both sides)
        proxy.blackhole()     # connections are accepted, nothing is forwarded either way
        proxy.restore()       # pass-through again; black-holed connections are closed

Contract: the mode applies to open and new connections alike, from the next chunk on.
``cut`` is one-shot (connections opened afterwards pass); ``blackhole`` lasts until
``restore``. Bytes dropped while black-holed are never delivered later, so ``restore``
closes those connections instead of resuming a corrupted stream. Standard library only;
one thread accepts, one thread per connection forwards both directions.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
from dataclasses import dataclass, field

log = logging.getLogger("tests.harness.chaos.proxy")

_CHUNK = 65536
_POLL = 0.05  # seconds a forwarding thread waits before re-reading the mode


@dataclass
class ProxyStats:
    """Counters a test can assert on."""

    accepted: int = 0
    cut: int = 0           # connections closed by cut()
    blackholed: int = 0    # connections that lost bytes to a black hole
    bytes_forwarded: int = 0


@dataclass(eq=False)  # identity equality: links live in a set
class _Link:
    """One client connection and (unless accepted into a black hole) its upstream."""

    client: socket.socket
    upstream: socket.socket | None
    closed: threading.Event = field(default_factory=threading.Event)
    holed: bool = False

    def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for sock in (self.client, self.upstream):
            if sock is None:
                continue
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


class TcpProxy:
    """Forward ``listen_port`` on 127.0.0.1 to ``target``; inject faults on command."""

    def __init__(self, target_host: str, target_port: int, listen_port: int = 0) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", listen_port))
        self._listener.settimeout(_POLL)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._links: set[_Link] = set()
        self._delay = 0.0
        self._blackhole = False
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name=f"proxy:{self.port}",
                                        daemon=True)
        self.stats = ProxyStats()

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> TcpProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting and close every connection; idempotent."""
        self._stopping.set()
        self._listener.close()
        self._close_links(lambda link: True)
        if self._thread.is_alive():
            self._thread.join(timeout=2)

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def open_connections(self) -> int:
        with self._lock:
            return sum(1 for link in self._links if not link.closed.is_set())

    # -- faults --------------------------------------------------------------------------
    def delay(self, seconds: float) -> None:
        """Hold every forwarded chunk ``seconds`` before sending it (0 = no delay)."""
        self._delay = max(0.0, seconds)

    def blackhole(self) -> None:
        """Accept connections but forward nothing, in either direction, until restore()."""
        self._blackhole = True

    def cut(self) -> int:
        """Close every open connection now; returns how many were closed."""
        closed = self._close_links(lambda link: True)
        self.stats.cut += closed
        return closed

    def restore(self) -> None:
        """Pass-through with no delay; connections that lost bytes are closed."""
        self._delay = 0.0
        self._blackhole = False
        self._close_links(lambda link: link.holed)

    # -- internals -----------------------------------------------------------------------
    def _close_links(self, which) -> int:
        with self._lock:
            chosen = [link for link in self._links if which(link)]
        for link in chosen:
            link.close()
        return len(chosen)

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.stats.accepted += 1
            upstream = None
            if not self._blackhole:
                try:
                    upstream = socket.create_connection(self.target, timeout=5)
                except OSError as exc:
                    log.info("proxy %s: upstream %s unreachable (%s)", self.port, self.target, exc)
                    client.close()
                    continue
            link = _Link(client, upstream, holed=upstream is None)
            if link.holed:
                self.stats.blackholed += 1
            with self._lock:
                self._links.add(link)
            threading.Thread(target=self._forward, args=(link,), daemon=True).start()

    def _forward(self, link: _Link) -> None:
        peers = [s for s in (link.client, link.upstream) if s is not None]
        try:
            while not link.closed.is_set():
                readable, _, _ = select.select(peers, [], [], _POLL)
                for source in readable:
                    data = source.recv(_CHUNK)
                    if not data:
                        return
                    if self._blackhole or link.upstream is None:
                        if not link.holed:
                            link.holed = True
                            self.stats.blackholed += 1
                        continue
                    if self._delay:
                        time.sleep(self._delay)
                    dest = link.upstream if source is link.client else link.client
                    dest.sendall(data)
                    self.stats.bytes_forwarded += len(data)
        except (OSError, ValueError):
            return  # closed under us by cut()/stop(), or the peer reset
        finally:
            link.close()
            with self._lock:
                self._links.discard(link)
