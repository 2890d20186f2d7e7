"""Install, start and stop a real local ClickHouse server and ZooKeeper.

The test suite, the demo and the benchmarks all run against real servers, started as
plain background processes on 127.0.0.1 with their own data directory (no systemd).
``up`` is idempotent: services that are already running (recorded pid alive and still
ours) are left alone, stale pid files from a killed run are discarded.  ``down`` stops
exactly the processes whose pids were recorded here.

Usage::

    services = Services.from_env()
    services.up()            # installs the Debian packages if missing, starts both
    services.clickhouse.url  # "http://127.0.0.1:8123"
    services.zookeeper.hosts # "127.0.0.1:2181"
    services.down()

The ClickHouse config enables ``<zookeeper>`` (for ReplicatedMergeTree targets) and
defines three users: ``default`` (no password), ``txsink_secret`` (password, to test
that credentials never leak) and ``reader`` (read-only).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

log = logging.getLogger("txsink.services")

CLICKHOUSE_BINARY = "/usr/sbin/clickhouse-server"
ZOOKEEPER_JAR = "/usr/share/java/zookeeper.jar"
APT_PACKAGES = ("clickhouse-server", "clickhouse-client", "zookeeper")
SECRET_USER = "txsink_secret"
SECRET_PASSWORD = "s3cr3t-Pa55"
READONLY_USER = "reader"


class ServiceError(RuntimeError):
    """A service could not be installed, started or reached."""


def default_home() -> Path:
    return Path(os.environ.get("TXSINK_SERVICES_DIR", "/tmp/txsink-services"))


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.3)
        return sock.connect_ex((host, port)) == 0


def ensure_installed() -> None:
    """Install the Debian packages if a binary is missing, without starting them.

    ``policy-rc.d`` exiting 101 keeps the packages' postinst from starting the
    servers on a systemd host (they would take our ports).
    """
    java_missing = shutil.which("java") is None
    if Path(CLICKHOUSE_BINARY).exists() and Path(ZOOKEEPER_JAR).exists() and not java_missing:
        return
    packages = [*APT_PACKAGES, *(["openjdk-17-jre-headless"] if java_missing else [])]
    if os.geteuid() != 0:
        raise ServiceError(
            f"{', '.join(packages)} are not installed and installing them needs root"
        )
    log.info("installing %s with apt-get", " ".join(packages))
    policy = Path("/usr/sbin/policy-rc.d")
    created_policy = not policy.exists()
    if created_policy:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", *packages],
            check=True, env=env, stdout=subprocess.DEVNULL,
        )
    finally:
        if created_policy:
            policy.unlink(missing_ok=True)


@dataclass
class ManagedProcess:
    """A background server process tracked by a pid file."""

    name: str
    home: Path
    marker: str  # a string that must appear in the process's command line

    @property
    def pid_file(self) -> Path:
        return self.home / f"{self.name}.pid"

    @property
    def log_file(self) -> Path:
        return self.home / f"{self.name}.log"

    def pid(self) -> int | None:
        """The recorded pid if that process is alive and still ours, else None."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except FileNotFoundError:
            return None
        if self.marker not in cmdline:
            return None
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except (FileNotFoundError, IndexError):
            return None
        return None if state == "Z" else pid

    def spawn(self, argv: list[str], cwd: Path) -> int:
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as out:
            proc = subprocess.Popen(
                argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        self.pid_file.write_text(str(proc.pid))
        return proc.pid

    def exited(self) -> bool:
        """True once the recorded process is gone (or a zombie).

        Unlike :meth:`pid` this ignores the command line: right after ``spawn`` the child
        may still show the parent's command line until it has exec'd the server.
        """
        try:
            pid = int(self.pid_file.read_text().strip())
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except (FileNotFoundError, ValueError, IndexError):
            return True
        if state == "Z":
            _reap(pid)
            return True
        return False

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> bool:
        """Stop the recorded process; returns True if one was running."""
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        _signal(pid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.pid() is not None:
            _reap(pid)
            time.sleep(0.05)
        if self.pid() is not None:
            _signal(pid, signal.SIGKILL)
            while self.pid() is not None:
                _reap(pid)
                time.sleep(0.05)
        self.pid_file.unlink(missing_ok=True)
        return True

    def kill(self) -> bool:
        """SIGKILL: the crash a fault test wants."""
        return self.stop(signal.SIGKILL, timeout=5.0)

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _wait(ready, proc: ManagedProcess, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.exited():
            raise ServiceError(f"{what} exited during start-up; last log lines:\n{proc.tail()}")
        if ready():
            return
        time.sleep(0.1)
    raise ServiceError(f"{what} not ready after {timeout:.0f}s; last log lines:\n{proc.tail()}")


@dataclass
class ZooKeeper:
    home: Path
    port: int = 2181

    def __post_init__(self) -> None:
        self.process = ManagedProcess("zookeeper", self.home, str(self.config_file))

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def config_file(self) -> Path:
        return self.home / "zoo.cfg"

    def four_letter(self, word: str) -> str:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as sock:
                sock.sendall(word.encode())
                chunks = []
                while chunk := sock.recv(4096):
                    chunks.append(chunk)
                return b"".join(chunks).decode(errors="replace")
        except OSError:
            return ""

    def ready(self) -> bool:
        # `ruok` answers before sessions are accepted; `srvr` prints Mode: only after.
        return "Mode:" in self.four_letter("srvr")

    def write_config(self) -> None:
        data = self.home / "zk-data"
        data.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(
            "\n".join([
                "tickTime=500",
                "initLimit=10",
                "syncLimit=5",
                f"dataDir={data}",
                f"clientPort={self.port}",
                "clientPortAddress=127.0.0.1",
                "maxClientCnxns=0",
                "admin.enableServer=false",
                "4lw.commands.whitelist=srvr,ruok,envi,stat,mntr",
                "minSessionTimeout=1000",
                "maxSessionTimeout=60000",
                "autopurge.purgeInterval=1",
                "",
            ])
        )

    def start(self, timeout: float = 30.0) -> None:
        if self.process.pid() is not None:
            _wait(self.ready, self.process, "ZooKeeper", timeout)
            return
        if port_open(self.port):
            raise ServiceError(
                f"port {self.port} is taken by a process not started by txsink; "
                "stop it or choose another port (TXSINK_ZK_PORT)"
            )
        self.write_config()
        java = shutil.which("java") or "java"
        classpath = ":".join(
            p for p in (ZOOKEEPER_JAR, "/usr/share/java/slf4j-simple.jar",
                        "/usr/share/java/slf4j-api.jar") if Path(p).exists()
        )
        self.process.spawn(
            [java, "-Xmx256m", "-Dzookeeper.jmx.log4j.disable=true", "-cp", classpath,
             "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(self.config_file)],
            cwd=self.home,
        )
        _wait(self.ready, self.process, "ZooKeeper", timeout)


@dataclass
class ClickHouse:
    home: Path
    zookeeper: ZooKeeper
    http_port: int = 8123
    tcp_port: int = 9000
    interserver_port: int = 9009
    name: str = "clickhouse"
    macros: dict[str, str] = field(default_factory=lambda: {"shard": "1", "replica": "r1"})

    def __post_init__(self) -> None:
        self.dir = self.home / self.name
        self.process = ManagedProcess(self.name, self.home, str(self.config_file))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def config_file(self) -> Path:
        return self.dir / "config.xml"

    def query(self, sql: str, timeout: float = 5.0) -> str:
        resp = requests.post(self.url, data=sql.encode(), timeout=timeout)
        if resp.status_code != 200:
            raise ServiceError(f"ClickHouse answered {resp.status_code}: {resp.text.strip()}")
        return resp.content.decode()

    def ready(self) -> bool:
        try:
            if requests.get(f"{self.url}/ping", timeout=1.0).content.strip() != b"Ok.":
                return False
            self.query("SELECT count() FROM system.zookeeper WHERE path = '/'")
            return True
        except (requests.RequestException, ServiceError):
            return False

    def write_config(self) -> None:
        for sub in ("data", "tmp", "user_files", "format_schemas"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        macros = "".join(f"<{k}>{v}</{k}>" for k, v in self.macros.items())
        self.config_file.write_text(f"""<?xml version="1.0"?>
<yandex>
    <logger><level>warning</level><console>1</console></logger>
    <listen_host>127.0.0.1</listen_host>
    <http_port>{self.http_port}</http_port>
    <tcp_port>{self.tcp_port}</tcp_port>
    <interserver_http_port>{self.interserver_port}</interserver_http_port>
    <interserver_http_host>127.0.0.1</interserver_http_host>
    <path>{self.dir}/data/</path>
    <tmp_path>{self.dir}/tmp/</tmp_path>
    <user_files_path>{self.dir}/user_files/</user_files_path>
    <format_schema_path>{self.dir}/format_schemas/</format_schema_path>
    <mark_cache_size>536870912</mark_cache_size>
    <max_concurrent_queries>200</max_concurrent_queries>
    <timezone>UTC</timezone>
    <max_table_size_to_drop>0</max_table_size_to_drop>
    <max_partition_size_to_drop>0</max_partition_size_to_drop>
    <zookeeper>
        <node><host>127.0.0.1</host><port>{self.zookeeper.port}</port></node>
        <session_timeout_ms>10000</session_timeout_ms>
    </zookeeper>
    <macros>{macros}</macros>
    <profiles>
        <default><max_memory_usage>4000000000</max_memory_usage></default>
        <readonly><readonly>1</readonly></readonly>
    </profiles>
    <users>
        <default>
            <password></password>
            <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
            <profile>default</profile><quota>default</quota>
        </default>
        <{SECRET_USER}>
            <password>{SECRET_PASSWORD}</password>
            <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
            <profile>default</profile><quota>default</quota>
        </{SECRET_USER}>
        <{READONLY_USER}>
            <password></password>
            <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
            <profile>readonly</profile><quota>default</quota>
        </{READONLY_USER}>
    </users>
    <quotas><default></default></quotas>
</yandex>
""")

    def start(self, timeout: float = 60.0) -> None:
        if self.process.pid() is not None:
            _wait(self.ready, self.process, "ClickHouse", timeout)
            return
        for port in (self.http_port, self.tcp_port, self.interserver_port):
            if port_open(port):
                raise ServiceError(
                    f"port {port} is taken by a process not started by txsink; "
                    "stop it or choose other ports (TXSINK_CH_HTTP_PORT, ...)"
                )
        if not self.zookeeper.ready():
            raise ServiceError("start ZooKeeper before ClickHouse (Replicated tables need it)")
        self.write_config()
        self.process.spawn(
            [CLICKHOUSE_BINARY, f"--config-file={self.config_file}"], cwd=self.dir
        )
        _wait(self.ready, self.process, "ClickHouse", timeout)


@dataclass
class Services:
    """The local ClickHouse + ZooKeeper pair used by tests, demo and benchmarks."""

    home: Path
    zookeeper: ZooKeeper
    clickhouse: ClickHouse

    @classmethod
    def from_env(cls) -> Services:
        home = default_home()
        zk = ZooKeeper(home, port=int(os.environ.get("TXSINK_ZK_PORT", "2181")))
        ch = ClickHouse(
            home, zk,
            http_port=int(os.environ.get("TXSINK_CH_HTTP_PORT", "8123")),
            tcp_port=int(os.environ.get("TXSINK_CH_TCP_PORT", "9000")),
            interserver_port=int(os.environ.get("TXSINK_CH_INTERSERVER_PORT", "9009")),
        )
        return cls(home, zk, ch)

    def up(self) -> None:
        ensure_installed()
        self.home.mkdir(parents=True, exist_ok=True)
        self.zookeeper.start()
        self.clickhouse.start()

    def down(self) -> list[str]:
        stopped = []
        # ClickHouse first: it would otherwise log ZooKeeper errors while stopping.
        for proc in (self.clickhouse.process, self.zookeeper.process):
            if proc.stop():
                stopped.append(proc.name)
        return stopped

    def status(self) -> dict[str, dict[str, object]]:
        return {
            "zookeeper": {"pid": self.zookeeper.process.pid(), "ready": self.zookeeper.ready(),
                          "address": self.zookeeper.hosts},
            "clickhouse": {"pid": self.clickhouse.process.pid(), "ready": self.clickhouse.ready(),
                           "address": self.clickhouse.url},
        }
