"""Process faults: kill -9 a Spark driver, a Python worker, ClickHouse or ZooKeeper; restart.

Everything here is a real ``SIGKILL`` of a real process, the crash a machine failure
causes, never a polite shutdown:

- :func:`kill_driver` kills a driver's whole session (the driver process, its JVM and
  every Python worker: the pipeline is started in its own session).
- :func:`kill_python_worker` kills one Python worker of a running driver; Spark sees a
  failed task (or a failed commit) and retries or fails the micro-batch.
- :func:`kill_server` / :func:`restart_server` use :mod:`tests.harness.services` (``kill()``
  then ``start()``); ZooKeeper is started before a ClickHouse that uses it when both are
  down.
- :class:`CrashArming` arms the named crash points of :mod:`txsink.core.crashpoints` in a
  driver that is already running: the driver starts with every point armed and each
  point's "already fired" marker present; deleting a marker arms that point.
- :func:`private_services` gives a ClickHouse + ZooKeeper pair on their own ports and
  data directory, so a fault run may kill servers nobody else is using.
"""

from __future__ import annotations

import os
import random
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from tests.harness.crash_arming import arm_env
from tests.harness.services import ClickHouse, Services, ZooKeeper, port_open
from txsink.core.crashpoints import ALL_POINTS

SERVER_KINDS = ("clickhouse", "zookeeper")
DISARMED = "disarmed"  # marker content written by CrashArming; a fired point's is empty


def session_members(sid: int) -> list[int]:
    """Pids of every live process in session ``sid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _session_of(int(entry.name)) == sid:
            members.append(int(entry.name))
    return members


def kill_session(sid: int) -> int:
    """SIGKILL every process of session ``sid``; returns how many were signalled.

    A session, not a process group: PySpark's daemon moves itself and its Python workers
    into a process group of their own (``os.setpgid(0, 0)`` in ``pyspark/daemon.py``),
    so only the session holds the whole driver: driver process, JVM and every worker.
    """
    me = os.getpid()
    members = session_members(sid)
    for pid in sorted(members, key=lambda p: p == me):  # ourselves last
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(members)


def kill_driver(pid: int) -> bool:
    """Kill a pipeline driver started with ``start_new_session=True``, workers included."""
    return kill_session(pid) > 0


def _session_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[3])  # state ppid pgrp session ...


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def python_workers(driver_pid: int) -> list[int]:
    """Pids of the PySpark worker processes that belong to the driver's session."""
    workers = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == driver_pid:
            continue
        pid = int(entry.name)
        argv = _cmdline(pid).split()
        if (_session_of(pid) == driver_pid and argv and "python" in Path(argv[0]).name
                and any("pyspark" in arg for arg in argv)):
            workers.append(pid)
    return sorted(workers)


def kill_python_worker(driver_pid: int, rng: random.Random | None = None) -> int | None:
    """SIGKILL one Python worker of the driver (random if ``rng``); returns its pid."""
    workers = python_workers(driver_pid)
    if not workers:
        return None
    pid = (rng or random.Random()).choice(workers)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return None
    return pid


def kill_server(services: Services, kind: str, timeout: float = 10.0) -> bool:
    """SIGKILL ClickHouse (18.16 or the modern one) or ZooKeeper of ``services``; True if
    it was running.

    Returns once the server's ports are closed: a dying JVM can look gone (its command
    line is emptied first) while its listening socket is still open, and a restart in
    that moment would find the port taken.
    """
    service = getattr(services, kind)  # ClickHouse, ModernClickHouse or ZooKeeper
    was_running = service.process.kill()
    ports = ([service.port] if isinstance(service, ZooKeeper)
             else [service.http_port, service.tcp_port])
    deadline = time.monotonic() + timeout
    while any(port_open(port) for port in ports) and time.monotonic() < deadline:
        time.sleep(0.05)
    return was_running


def discard(services: Services) -> None:
    """The end of a private pair whose data nobody reads again (a test's): its ClickHouse
    killed rather than shut down, then :meth:`Services.down` for the rest. An 18.16
    server's shutdown may wait ~10 s, for its ZooKeeper session (after a restart of that
    ZooKeeper) or its Replicated tables."""
    kill_server(services, "clickhouse")
    services.down()


def uses_zookeeper(services: Services) -> bool:
    """Whether the ClickHouse of ``services`` needs their ZooKeeper to start: an 18.16
    server always (its config names it), a modern one given it as its Keeper."""
    clickhouse = services.clickhouse
    return isinstance(clickhouse, ClickHouse) or getattr(clickhouse, "zookeeper", None) is not None


def restart_server(services: Services, kind: str) -> None:
    """Start a killed server again and wait until it is usable.

    ZooKeeper first when a ClickHouse that uses it restarts (:func:`uses_zookeeper`); a
    modern server without a Keeper starts on its own.
    """
    if kind == "clickhouse" and uses_zookeeper(services) and not services.zookeeper.ready():
        services.zookeeper.start()
    getattr(services, kind).start()


def private_services(home: Path, port_base: int, server: str = "18.16",
                     keeper: bool = False) -> Services:
    """A ClickHouse + ZooKeeper pair of our own, on ports from ``port_base``.

    ``server="18.16"``: ZooKeeper on ``port_base+1``, ClickHouse 18.16 on ``+2`` (HTTP),
    ``+3`` (native) and ``+4`` (interserver). ``server="modern"``: the same ZooKeeper and,
    as ``services.clickhouse``, a modern ClickHouse 26.x (chdb) on ``+5`` (HTTP) and
    ``+6`` (native); with ``keeper`` that ZooKeeper is the modern server's Keeper (its
    config gets a ``<zookeeper>`` section), so it has KeeperMap tables (the
    ``coordinator=keepermap`` store); without, it uses no ZooKeeper. The 18.16 server
    always uses the ZooKeeper. A fault run kills these freely without disturbing anyone
    using the shared servers. Call ``up()`` to start and ``down()`` to stop them.
    """
    zk = ZooKeeper(home, port=port_base + 1)
    if server == "modern":
        from tests.harness.modern_server import ModernClickHouse

        http, tcp = port_base + 5, port_base + 6
        # modern_*_port too: ``Services.modern`` (which ``down()`` stops) must be this
        # server, never one on the shared default ports.
        modern = ModernClickHouse(home, http_port=http, tcp_port=tcp,
                                  zookeeper=zk.hosts if keeper else None)
        return Services(home, zk, modern,  # type: ignore[arg-type]
                        modern_http_port=http, modern_tcp_port=tcp)
    if server != "18.16":
        raise ValueError(f"unknown server {server!r} (18.16 or modern)")
    ch = ClickHouse(home, zk, http_port=port_base + 2, tcp_port=port_base + 3,
                    interserver_port=port_base + 4)
    return Services(home, zk, ch)


@dataclass
class CrashArming:
    """Arm crash points one at a time in a driver that was started with :meth:`env`.

    The driver runs with every point armed; a point whose marker file exists does not
    fire (``TXSINK_CRASH_ONCE_DIR``). :meth:`disarm` writes a marker saying "disarmed";
    :meth:`arm` deletes it; the crash point itself creates an *empty* marker when it
    fires. Contract: a point fires at most once per :meth:`arm`, and :meth:`fired` tells
    whether it has.
    """

    once_dir: Path

    def env(self) -> dict[str, str]:
        """Environment for a driver that may be crashed at any named point."""
        return arm_env(ALL_POINTS, "group", self.once_dir)

    def _marker(self, name: str) -> Path:
        if name not in ALL_POINTS:
            raise ValueError(f"unknown crash point {name!r}")
        return self.once_dir / f"{name}.fired"

    def disarm_all(self) -> None:
        self.once_dir.mkdir(parents=True, exist_ok=True)
        for name in ALL_POINTS:
            self.disarm(name)

    def arm(self, name: str) -> None:
        """The next time any process of the driver reaches ``name``, the driver dies."""
        self._marker(name).unlink(missing_ok=True)

    def disarm(self, name: str) -> None:
        """Mark ``name`` as not armed, without it counting as fired."""
        marker = self._marker(name)
        tmp = marker.with_name(f".{marker.name}.tmp")
        tmp.write_text(DISARMED)
        os.replace(tmp, marker)

    def fired(self, name: str) -> bool:
        """True once ``name`` has fired since it was armed (its marker is empty)."""
        return name in fired_markers(self.once_dir)

    def armed(self) -> list[str]:
        """Points armed and not yet fired (no marker)."""
        return [n for n in ALL_POINTS if not self._marker(n).exists()]


def fired_markers(once_dir: Path) -> set[str]:
    """Names of the crash points whose marker says they fired (empty marker file)."""
    fired = set()
    for marker in once_dir.glob("*.fired"):
        try:
            if marker.stat().st_size == 0:
                fired.add(marker.name[: -len(".fired")])
        except FileNotFoundError:
            pass
    return fired
