"""Counting proxies: every ZooKeeper request and every ClickHouse HTTP request of a run.

A benchmark points the sink at a local port instead of the server; the proxy relays each
connection byte for byte and records what the client sent, with the time and the process
(read from ``/proc``) that opened the connection. Counts are exact and belong to the run
alone, whatever else the shared servers serve.

- :class:`ZooKeeperProxy` parses the client's frames (length-prefixed jute records): the
  connect request, then a header ``(xid, type)`` and the operation; for path operations
  the path, for ``multi`` each sub-operation and its path.
- :class:`ClickHouseProxy` parses HTTP/1.1 requests (``Content-Length`` or chunked
  bodies) so that it can add ``log_queries=1`` to each (18.16 logs no query by default)
  and records the local port of each upstream connection: ``system.query_log``'s
  ``port`` then names the run's statements.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

#: ZooKeeper operation codes (``ZooDefs.OpCode``) the sink and kazoo use.
ZK_OPS = {0: "notification", 1: "create", 2: "delete", 3: "exists", 4: "getData",
          5: "setData", 6: "getACL", 7: "setACL", 8: "getChildren", 9: "sync", 11: "ping",
          12: "getChildren2", 13: "check", 14: "multi", 15: "create2", 16: "reconfig",
          17: "checkWatches", 18: "removeWatches", 19: "createContainer",
          20: "deleteContainer", 21: "createTTL", 22: "multiRead", 100: "auth",
          101: "setWatches", 102: "sasl", 103: "getEphemerals", 104: "getAllChildrenNumber",
          105: "setWatches2", 106: "addWatch", 107: "whoAmI", -11: "closeSession"}
_PATH_OPS = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 15, 19, 20, 21, 103, 104, 106}
_CREATES = {1, 15, 19, 21}


#: How much of a ClickHouse statement :class:`ClickHouseProxy` keeps (its kind).
STATEMENT_HEAD = 300


@dataclass(frozen=True)
class Request:
    """One request a client sent: when, from which process and connection, what."""

    at: float
    pid: int | None
    connection: int
    kind: str  # ZooKeeper: op and path(s); ClickHouse: "http" and the statement's head


@dataclass
class _Log:
    requests: list[Request] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, request: Request) -> None:
        with self.lock:
            self.requests.append(request)

    def between(self, start: float, end: float) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if start <= r.at <= end]


def owner_pid(peer_port: int, server_port: int) -> int | None:
    """The process holding the local end ``127.0.0.1:peer_port`` of a connection to
    ``server_port`` (``/proc/net/tcp``, then the processes' open sockets)."""
    inode = None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cells = line.split()
            local, remote = cells[1].rsplit(":", 1)[1], cells[2].rsplit(":", 1)[1]
            if int(local, 16) == peer_port and int(remote, 16) == server_port:
                inode = cells[9]
                break
        if inode:
            break
    if not inode:
        return None
    target = f"socket:[{inode}]"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) == target:
                    return int(entry.name)
        except OSError:
            continue
    return None


#: What each process seen by a proxy is: ``driver`` (this process) or its Python module
#: (``-m``; a forked worker names its parent's, e.g. ``pyspark.daemon``).
PROCESSES: dict[int, str] = {}


def describe(pid: int | None) -> None:
    """Record what ``pid`` is in :data:`PROCESSES` (once, while it runs)."""
    if pid is None or pid in PROCESSES:
        return
    if pid == os.getpid():
        PROCESSES[pid] = "driver"
        return
    for candidate in (pid, _parent(pid)):
        try:
            words = Path(f"/proc/{candidate}/cmdline").read_bytes().split(b"\0")
        except (OSError, TypeError):
            continue
        if b"-m" in words[:-1]:
            PROCESSES[pid] = words[words.index(b"-m") + 1].decode()
            return
    PROCESSES[pid] = "other"


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


class _Reader:
    """Exact reads from a socket, everything read also kept for forwarding."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buffer = sock, b""

    def exactly(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError
            self.buffer += chunk
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def line(self, end: bytes = b"\r\n") -> bytes:
        while end not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError
            self.buffer += chunk
        at = self.buffer.index(end) + len(end)
        data, self.buffer = self.buffer[:at], self.buffer[at:]
        return data


class _Proxy:
    """Accepts on an ephemeral local port, relays each connection to ``upstream``."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.log = _Log()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._connections = 0
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closed = True
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, (_, peer_port) = self._listener.accept()
            except OSError:
                return
            self._connections += 1
            threading.Thread(target=self._serve, args=(client, peer_port, self._connections),
                             daemon=True).start()

    def _serve(self, client: socket.socket, peer_port: int, number: int) -> None:
        server = socket.create_connection(self.upstream)
        pid = owner_pid(peer_port, self.port)
        describe(pid)
        self.opened(number, pid, server.getsockname()[1])
        def answers() -> None:
            _pipe(server, client)
            self.closed(number)  # the server may close first (its keep-alive timeout)

        threading.Thread(target=answers, daemon=True).start()
        try:
            self.relay(_Reader(client), server, pid, number)
        except (EOFError, OSError):
            pass
        finally:
            for sock in (client, server):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()
            self.closed(number)

    def opened(self, number: int, pid: int | None, upstream_port: int) -> None:
        """A connection was opened (``upstream_port``: its local port toward the server)."""

    def closed(self, number: int) -> None:
        """A connection was closed."""

    def relay(self, reader: _Reader, server: socket.socket, pid: int | None,
              number: int) -> None:
        raise NotImplementedError


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class ZooKeeperProxy(_Proxy):
    """Relays ZooKeeper connections; one :class:`Request` per frame the client sent
    (``connect`` for the session's first, ``ping`` for heartbeats)."""

    def relay(self, reader: _Reader, server: socket.socket, pid: int | None,
              number: int) -> None:
        first = True
        while True:
            header = reader.exactly(4)
            frame = reader.exactly(struct.unpack(">i", header)[0])
            server.sendall(header + frame)
            kind = "connect" if first else _zk_kind(frame)
            first = False
            self.log.add(Request(time.time(), pid, number, kind))


def _zk_kind(frame: bytes) -> str:
    _, op = struct.unpack_from(">ii", frame)
    name = ZK_OPS.get(op, f"op{op}")
    try:
        if op in _PATH_OPS:
            return f"{name} {_string(frame, 8)[0]}"
        if op == 14:
            return f"{name} [{'; '.join(_multi(frame, 8))}]"
    except (struct.error, UnicodeDecodeError):
        pass
    return name


def _string(data: bytes, at: int) -> tuple[str, int]:
    (length,) = struct.unpack_from(">i", data, at)
    at += 4
    if length < 0:
        return "", at
    return data[at:at + length].decode(), at + length


def _skip_buffer(data: bytes, at: int) -> int:
    (length,) = struct.unpack_from(">i", data, at)
    return at + 4 + max(length, 0)


def _multi(frame: bytes, at: int) -> list[str]:
    """The sub-operations of a ``multi``: ``op path`` each."""
    ops = []
    while True:
        op, done, _ = struct.unpack_from(">i?i", frame, at)
        at += 9
        if done or op == -1:
            return ops
        path, at = _string(frame, at)
        ops.append(f"{ZK_OPS.get(op, f'op{op}')} {path}")
        if op in _CREATES:
            at = _skip_buffer(frame, at)
            (acls,) = struct.unpack_from(">i", frame, at)
            at += 4
            for _ in range(acls):
                at += 4
                _, at = _string(frame, at)
                _, at = _string(frame, at)
            at += 4  # flags
            if op == 21:
                at += 8  # ttl
        elif op == 5:
            at = _skip_buffer(frame, at) + 4
        elif op in (2, 13):
            at += 4
        else:
            raise struct.error(f"unknown sub-operation {op}")


@dataclass(frozen=True)
class Connection:
    """An upstream connection of :class:`ClickHouseProxy`: its port as the server sees it."""

    number: int
    pid: int | None
    port: int
    opened: float
    closed: float | None = None


class ClickHouseProxy(_Proxy):
    """Relays HTTP connections to ClickHouse; one :class:`Request` per HTTP request, each
    sent on with ``log_queries=1``."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.connections: dict[int, Connection] = {}
        super().__init__(upstream)

    def opened(self, number: int, pid: int | None, upstream_port: int) -> None:
        self.connections[number] = Connection(number, pid, upstream_port, time.time())

    def closed(self, number: int) -> None:
        old = self.connections[number]
        if old.closed is None:
            self.connections[number] = Connection(old.number, old.pid, old.port, old.opened,
                                                  time.time())

    def relay(self, reader: _Reader, server: socket.socket, pid: int | None,
              number: int) -> None:
        while True:
            head = reader.line(b"\r\n\r\n")
            sent = time.time()  # the statement starts with its head, before any body
            request_line, rest = head.split(b"\r\n", 1)
            server.sendall(_log_queries(request_line) + b"\r\n" + rest)
            headers = {k.strip().lower(): v.strip() for k, _, v in
                       (h.partition(b":") for h in rest.split(b"\r\n") if h)}
            head = b""
            if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
                while True:
                    size_line = reader.line()
                    size = int(size_line.split(b";")[0], 16)
                    chunk = reader.exactly(size + 2)
                    head = head or chunk[:STATEMENT_HEAD]
                    server.sendall(size_line + chunk)
                    if size == 0:
                        break
            elif length := int(headers.get(b"content-length", b"0")):
                body = reader.exactly(length)
                head = body[:STATEMENT_HEAD]
                server.sendall(body)
            compressed = b"content-encoding" in headers
            statement = "" if compressed else head.decode("utf-8", "replace")
            self.log.add(Request(sent, pid, number, f"http {statement}".rstrip()))


def _log_queries(request_line: bytes) -> bytes:
    method, target, version = request_line.split(b" ", 2)
    if b"log_queries=" in target:
        return request_line
    joiner = b"&" if b"?" in target else b"?"
    return b" ".join((method, target + joiner + b"log_queries=1", version))
