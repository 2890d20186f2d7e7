"""A modern ClickHouse server (26.x) on 127.0.0.1, run from the ``chdb`` wheel.

The ``chdb`` wheel carries ClickHouse's own HTTP and native TCP handlers. Its
module-level query function ``chdb._chdb.query(sql, format, path=DATA)`` runs the full
clickhouse-local server (``chdb.connect()``/``Session`` do not: their embedded server
never registers the listener callback), where ``SYSTEM START LISTEN HTTP`` and
``SYSTEM START LISTEN TCP`` open real listeners on the ports of the ``config.xml`` in
the working directory. The server lives while that one call runs, so the process runs a
keep-alive query after starting the listeners::

    INSERT INTO FUNCTION null('txsink_keepalive UInt8')
    SELECT sleepEachRow(1) FROM numbers(<forever>)
    SETTINGS max_block_size = 1, function_sleep_max_microseconds_per_block = 0

(an INSERT … SELECT sleeps at ~0 CPU; a plain ``SELECT … sleepEachRow`` busy-polls a
core). Only one such call works per process, hence one process per server.
``KILL QUERY`` on the keep-alive makes the call return (a clean stop, ~1–2 s); SIGTERM
also stops it. Data lives in ``<dir>/data`` and survives restarts.

The config mirrors the 18.16 test server where it matters to tests: the same three
users, UTC, ``TabSeparated`` as the HTTP default format (chdb otherwise answers in the
format of the starting call), plus ``system.query_log`` (tests check which statements
the sink ran there). Everything else keeps the server's own defaults.

With ``zookeeper`` (``host:port``) the config gets a ``<zookeeper>`` section rooted at
``zookeeper_root`` (created first: the server does not create its own root) and a
``<keeper_map_path_prefix>``, so ``KeeperMap`` tables work; that ZooKeeper is then the
server's own, which the ``keepermap`` coordinator store of the sink relies on without a
ZooKeeper connection of its own. Replicated tables stay read-only in this mode
(``is_readonly = 1`` in ``system.replicas``), and there is no ``system.zookeeper``.
Only HTTP and native TCP listeners.

This relies on chdb's internal entry point: :data:`TESTED_CHDB_VERSIONS` records the
versions it was tested with (``pyproject.toml`` pins the dev extra to them), another
version only gets a warning, and a server that exits or does not answer during start-up
raises :class:`ModernServerError` with the tail of its log.

Usage::

    server = Services.from_env().modern   # ModernClickHouse(home, 8124, 9001)
    server.start()             # idempotent; waits until it answers SELECT 1 over HTTP
    server.url                 # "http://127.0.0.1:8124"
    server.version()           # "26.9.2.1"
    server.stop()

The process itself is ``python -m tests.harness.modern_server <config.xml>``.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import requests

from tests.harness.processes import (
    READONLY_USER,
    SECRET_PASSWORD,
    SECRET_USER,
    ManagedProcess,
    ServiceError,
    _file_lock,
    _wait,
    checkout_env,
    port_open,
)

log = logging.getLogger("tests.harness.modern_server")

#: chdb versions this launcher was tested with (chdb 4.4.0 = ClickHouse 26.9.2.1).
TESTED_CHDB_VERSIONS = ("4.4.0",)
DEFAULT_HTTP_PORT = 8124
DEFAULT_TCP_PORT = 9001
NAME = "clickhouse-modern"
KEEPER_ROOT = "/clickhouse-modern"  # the server's chroot in its ZooKeeper
KEEPER_MAP_PREFIX = "/keeper_map"  # under the chroot: where KeeperMap tables keep rows
KEEPALIVE_MARKER = "txsink_keepalive"
KEEPALIVE = (
    f"INSERT INTO FUNCTION null('{KEEPALIVE_MARKER} UInt8') "
    "SELECT sleepEachRow(1) FROM numbers(1000000000000) "
    "SETTINGS max_block_size = 1, function_sleep_max_microseconds_per_block = 0"
)


class ModernServerError(ServiceError):
    """The modern (chdb) ClickHouse server could not be started or reached."""


def chdb_version() -> str | None:
    """The installed chdb version, without importing chdb (its import runs a query)."""
    try:
        return metadata.version("chdb")
    except metadata.PackageNotFoundError:
        return None


def _users_xml() -> str:
    """The same three users as the 18.16 server (see ``services.ClickHouse``)."""
    networks = "<networks><ip>127.0.0.1</ip><ip>::1</ip></networks>"

    def user(name: str, password: str, profile: str) -> str:
        return (f"        <{name}><password>{password}</password>{networks}"
                f"<profile>{profile}</profile><quota>default</quota></{name}>\n")

    return (
        '<?xml version="1.0"?>\n<clickhouse>\n'
        "    <profiles>\n"
        "        <default><default_format>TabSeparated</default_format></default>\n"
        "        <readonly><readonly>1</readonly>"
        "<default_format>TabSeparated</default_format></readonly>\n"
        "    </profiles>\n    <users>\n"
        + user("default", "", "default")
        + user(SECRET_USER, SECRET_PASSWORD, "default")
        + user(READONLY_USER, "", "readonly")
        + "    </users>\n    <quotas><default></default></quotas>\n</clickhouse>\n"
    )


@dataclass
class ModernClickHouse:
    """One modern ClickHouse server process (chdb), tracked by a pid file in ``home``.

    Files: ``<home>/clickhouse-modern/`` (``config.xml``, ``users.xml``, ``data/``,
    ``tmp/``), ``<home>/clickhouse-modern.log`` and ``.pid``.
    """

    home: Path
    http_port: int = DEFAULT_HTTP_PORT
    tcp_port: int = DEFAULT_TCP_PORT
    name: str = NAME
    zookeeper: str | None = None  # host:port of the server's ZooKeeper (KeeperMap tables)
    zookeeper_root: str = KEEPER_ROOT

    def __post_init__(self) -> None:
        self.dir = self.home / self.name
        self.process = ManagedProcess(self.name, self.home, str(self.config_file))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def config_file(self) -> Path:
        return self.dir / "config.xml"

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"

    def query(self, sql: str, timeout: float = 5.0) -> str:
        resp = requests.post(self.url, data=sql.encode(), timeout=timeout)
        if resp.status_code != 200:
            raise ModernServerError(
                f"ClickHouse {self.url} answered {resp.status_code}: {resp.text.strip()}")
        return resp.content.decode()

    def ready(self) -> bool:
        """Answers ``SELECT 1`` over HTTP, and the native port is open.

        The native listener starts after the HTTP one: a server that cannot open it
        answers over HTTP for a moment and then exits.
        """
        try:
            return (self.query("SELECT 1", timeout=1.0).strip() == "1"
                    and port_open(self.tcp_port))
        except (requests.RequestException, ServiceError):
            return False

    def version(self) -> str | None:
        """``SELECT version()``, or None when the server does not answer."""
        try:
            return self.query("SELECT version()", timeout=2.0).strip()
        except (requests.RequestException, ServiceError):
            return None

    def write_config(self) -> None:
        for sub in ("data", "tmp", "user_files"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        (self.dir / "users.xml").write_text(_users_xml())
        self.config_file.write_text(f"""<?xml version="1.0"?>
<clickhouse>
    <listen_host>127.0.0.1</listen_host>
    <http_port>{self.http_port}</http_port>
    <tcp_port>{self.tcp_port}</tcp_port>
    <tmp_path>{self.dir}/tmp/</tmp_path>
    <user_files_path>{self.dir}/user_files/</user_files_path>
    <users_config>{self.dir}/users.xml</users_config>
    <timezone>UTC</timezone>
    <query_log>
        <database>system</database><table>query_log</table>
        <flush_interval_milliseconds>1000</flush_interval_milliseconds>
        <ttl>event_date + INTERVAL 3 DAY DELETE</ttl>
    </query_log>{self._keeper_section()}
</clickhouse>
""")

    def _keeper_section(self) -> str:
        if self.zookeeper is None:
            return ""
        host, _, port = self.zookeeper.rpartition(":")
        return f"""
    <zookeeper>
        <node><host>{host}</host><port>{port}</port></node>
        <root>{self.zookeeper_root}</root>
    </zookeeper>
    <keeper_map_path_prefix>{KEEPER_MAP_PREFIX}</keeper_map_path_prefix>"""

    def ensure_keeper_root(self) -> None:
        """Create the server's ZooKeeper root (the server refuses a missing one)."""
        if self.zookeeper is None:
            return
        from kazoo.client import KazooClient

        client = KazooClient(hosts=self.zookeeper)
        try:
            client.start(timeout=15)
            client.ensure_path(self.zookeeper_root)
        except Exception as exc:  # noqa: BLE001 - any failure: name the address
            raise ModernServerError(
                f"cannot create the modern server's ZooKeeper root {self.zookeeper_root} "
                f"at {self.zookeeper}: {type(exc).__name__}: {exc}") from None
        finally:
            client.stop()
            client.close()

    def launch(self) -> None:
        """Spawn the server unless ours already runs; returns without waiting."""
        if self.process.pid() is not None:
            return
        version = chdb_version()
        if version is None:
            raise ModernServerError(
                "the modern ClickHouse server runs from the chdb package, which is not "
                f"installed: pip install 'chdb=={TESTED_CHDB_VERSIONS[-1]}' "
                "(or pip install -e '.[dev]')")
        if version not in TESTED_CHDB_VERSIONS:
            log.warning("chdb %s is installed; the modern server was tested with chdb %s "
                        "(it uses chdb's internal entry point)",
                        version, ", ".join(TESTED_CHDB_VERSIONS))
        for port, env in ((self.http_port, "TXSINK_MODERN_HTTP_PORT"),
                          (self.tcp_port, "TXSINK_MODERN_TCP_PORT")):
            if port_open(port):
                raise ModernServerError(
                    f"port {port} is taken by a process not started by txsink; stop it or "
                    f"choose another port for the modern ClickHouse ({env}, "
                    f"--modern-{'http' if env.endswith('HTTP_PORT') else 'tcp'}-port)")
        self.ensure_keeper_root()
        self.write_config()
        self.process.spawn(
            [sys.executable, "-m", "tests.harness.modern_server", str(self.config_file)],
            cwd=self.dir, env=checkout_env(),
        )

    def wait_ready(self, timeout: float = 60.0) -> None:
        try:
            _wait(self.ready, self.process, f"modern ClickHouse ({self.url})", timeout)
        except ModernServerError:
            raise
        except ServiceError as exc:
            raise ModernServerError(
                f"{exc}\n(the server runs on chdb {chdb_version()}'s internal entry point, "
                f"tested with chdb {', '.join(TESTED_CHDB_VERSIONS)}; full log: "
                f"{self.process.log_file})") from None

    def start(self, timeout: float = 60.0) -> None:
        """Start unless running, and wait until it answers; idempotent across processes."""
        self.home.mkdir(parents=True, exist_ok=True)
        with _file_lock(self.home / f".{self.name}.lock"):
            self.launch()
            self.wait_ready(timeout)

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop the recorded server; True if it was running.

        Cleanly first (``KILL QUERY`` on the keep-alive, so the chdb call returns), then
        SIGTERM (and SIGKILL) through the pid file. Returns once the ports are closed.
        """
        pid = self.process.pid()
        if pid is None:
            return self.process.stop()
        try:
            self.query(
                f"KILL QUERY WHERE query LIKE 'INSERT INTO FUNCTION null(''{KEEPALIVE_MARKER}%' "
                "ASYNC", timeout=2.0)
        except (requests.RequestException, ServiceError):
            pass
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.process.exited():
            time.sleep(0.05)
        self.process.stop()
        return self._ports_closed(True)

    def kill(self) -> bool:
        """SIGKILL (a crash, for fault tests); True if it was running."""
        return self._ports_closed(self.process.kill())

    def _ports_closed(self, was_running: bool, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and (port_open(self.http_port)
                                               or port_open(self.tcp_port)):
            time.sleep(0.05)
        return was_running

    def status(self) -> dict[str, object]:
        ready = self.ready()
        return {"pid": self.process.pid(), "ready": ready, "address": self.url,
                "version": self.version() if ready else None}


def serve(config_file: Path) -> int:
    """The server process: listeners on, then the keep-alive until stopped."""
    os.chdir(config_file.parent)  # clickhouse-local reads ./config.xml
    version = chdb_version()
    print(f"modern ClickHouse: chdb {version} (tested: {', '.join(TESTED_CHDB_VERSIONS)}), "
          f"config {config_file}, pid {os.getpid()}", flush=True)
    try:
        from chdb import _chdb

        query = _chdb.query
    except (ImportError, AttributeError) as exc:
        print(f"modern ClickHouse: cannot load chdb's server entry point "
              f"chdb._chdb.query ({type(exc).__name__}: {exc}); this launcher was tested "
              f"with chdb {', '.join(TESTED_CHDB_VERSIONS)}", flush=True)
        return 3
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    started = time.monotonic()
    result = query(f"SYSTEM START LISTEN HTTP; SYSTEM START LISTEN TCP; {KEEPALIVE}",
                   "TabSeparated", path=str(config_file.parent / "data"))
    # The call returns when the keep-alive is killed (a stop) or when a statement fails;
    # chdb prints the error (e.g. "Address already in use") to stderr, i.e. to the log.
    error = result.error_message() if result.has_error() else ""
    print(f"modern ClickHouse: stopped after {time.monotonic() - started:.1f}s"
          + (f": {error}" if error else " (after a stop, 'Query was cancelled' above is "
             "the keep-alive's end; any other error above is why it ended)"),
          flush=True)
    return 1 if error else 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tests.harness.modern_server <config.xml>", file=sys.stderr)
        return 2
    return serve(Path(args[0]).resolve())


if __name__ == "__main__":
    sys.exit(main())
