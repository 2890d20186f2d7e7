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
    services.clickhouse.https_url  # "https://127.0.0.1:8443", verified with .ca_file
    services.zookeeper.hosts # "127.0.0.1:2181"
    services.zookeeper.secure_hosts  # "127.0.0.1:2281", TLS verified with .ca_file
    services.down()

The ClickHouse config enables ``<zookeeper>`` (for ReplicatedMergeTree targets) and
defines three users: ``default`` (no password), ``txsink_secret`` (password, to test
that credentials never leak) and ``reader`` (read-only).

The main 18.16 server also serves HTTPS (``<https_port>``, 8443) with a self-signed
certificate for 127.0.0.1 and localhost, made once with ``openssl`` and kept in
``<home>/tls/`` (:func:`ensure_certificate`): the certificate is its own CA, so it is the
``ca_file`` that clients verify the server with.  A server still running from a config
without it keeps serving plain HTTP only (``up`` never restarts a running server);
:meth:`ClickHouse.https_problem` says so and how to fix it.

ZooKeeper likewise serves TLS on a ``secureClientPort`` (2281) with the same certificate
(:class:`ZooKeeper`); :meth:`ZooKeeper.tls_problem` reports a server without it.

A sharded and replicated topology (for Distributed / ReplicatedMergeTree targets) runs
beside them on demand: N×M more ClickHouse servers sharing the same ZooKeeper, named
cluster ``txsink_cluster`` in their config and in the main server's::

    cluster = Services.from_env().cluster(shards=2, replicas=2)
    cluster.up()
    cluster.shard_urls()     # [["http://127.0.0.1:28511", "http://127.0.0.1:28512"], ...]
    cluster.shards[0][1].kill(); cluster.shards[0][1].start()

A modern ClickHouse (26.x, from the chdb wheel; ``tests/harness/modern_server.py``)
runs beside them on demand, on its own ports (HTTP 8124, native 9001)::

    services.up(modern=True)  # or modern_only=True: without ZooKeeper and 18.16
    services.modern.url       # "http://127.0.0.1:8124"
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import requests

from coordinator.plumbing.tls import ZooKeeperTLS, handshake_problem
from tests.harness.processes import (
    READONLY_USER,
    SECRET_PASSWORD,
    SECRET_USER,
    START_TIMEOUT,
    ManagedProcess,
    ServiceError,
    _file_lock,
    _wait,
    port_open,
)

if TYPE_CHECKING:
    from tests.harness.modern_server import ModernClickHouse

log = logging.getLogger("tests.harness.services")

CLICKHOUSE_BINARY = "/usr/sbin/clickhouse-server"
ZOOKEEPER_JAR = "/usr/share/java/zookeeper.jar"
# The Netty connection factory (the only one with TLS) needs these beside the jars named
# in zookeeper.jar's manifest (netty-buffer, -common, -handler, -transport, -epoll).
ZOOKEEPER_NETTY_JARS = tuple(f"/usr/share/java/netty-{name}.jar"
                             for name in ("codec", "resolver", "transport-native-unix-common"))
APT_PACKAGES = ("clickhouse-server", "clickhouse-client", "zookeeper")
OPENSSL_BINARY = "openssl"
CERTIFICATE_DAYS = 3650  # kept in the services home for as long as the home lives
CLUSTER_NAME = "txsink_cluster"
CLUSTER_PORT_BASE = 28500


def default_home() -> Path:
    return Path(os.environ.get("TXSINK_SERVICES_DIR", "/tmp/txsink-services"))


def ensure_installed() -> None:
    """Install the Debian packages if a binary is missing, without starting them.

    ``policy-rc.d`` exiting 101 keeps the packages' postinst from starting the
    servers on a systemd host (they would take our ports).
    """
    java_missing = shutil.which("java") is None
    openssl_missing = shutil.which(OPENSSL_BINARY) is None
    if (Path(CLICKHOUSE_BINARY).exists() and Path(ZOOKEEPER_JAR).exists()
            and not java_missing and not openssl_missing):
        return
    packages = [*APT_PACKAGES, *(["openjdk-17-jre-headless"] if java_missing else []),
                *(["openssl"] if openssl_missing else [])]
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


def tls_dir(home: Path) -> Path:
    """Where the services under ``home`` keep their one certificate (ClickHouse's HTTPS
    and ZooKeeper's TLS port share it)."""
    return home / "tls"


def certificate_paths(folder: Path) -> tuple[Path, Path]:
    """(certificate, key) as :func:`ensure_certificate` keeps them in ``folder``; the
    certificate is self-signed, so it is also the CA clients verify with."""
    return folder / "cert.pem", folder / "key.pem"


def ensure_certificate(folder: Path) -> tuple[Path, Path]:
    """(certificate, key) in ``folder``: a self-signed pair for 127.0.0.1 and localhost,
    made on first use and kept.

    Kept rather than remade so that a running server and a later ``up`` (or a test) agree
    on the CA.  Made in a private folder and renamed into place, so that two ``up`` runs
    at once never pair one's certificate with the other's key.
    """
    cert, key = certificate_paths(folder)
    if cert.exists() and key.exists():
        return cert, key
    if shutil.which(OPENSSL_BINARY) is None:
        raise ServiceError("openssl is needed to make the HTTPS certificate of ClickHouse")
    folder.parent.mkdir(parents=True, exist_ok=True)
    scratch = folder.with_name(f"{folder.name}.{os.getpid()}.tmp")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(mode=0o700)
    made = subprocess.run(
        [OPENSSL_BINARY, "req", "-x509", "-newkey", "rsa:2048", "-nodes",
         "-days", str(CERTIFICATE_DAYS), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
         "-keyout", str(scratch / key.name), "-out", str(scratch / cert.name)],
        capture_output=True, text=True, check=False,
    )
    if made.returncode != 0:
        shutil.rmtree(scratch, ignore_errors=True)
        raise ServiceError(f"openssl could not make the certificate: {made.stderr.strip()}")
    try:
        scratch.rename(folder)
    except OSError:  # another ``up`` got there first: use its pair
        shutil.rmtree(scratch, ignore_errors=True)
    return cert, key


RESTART = "restart the services (./run services down, then ./run services up)"


def _listener_problem(ca_file: Path, port: int, listener: str, plain_port: int,
                      server: str, what: str) -> str | None:
    """Why a TLS listener of the services cannot answer before any handshake (no
    certificate, or a server started from a config without it), or None."""
    if not ca_file.exists():
        return f"no certificate at {ca_file}: {RESTART}"
    if port_open(port):
        return None
    if not port_open(plain_port):
        return f"{server} is not running"
    return (f"nothing listens on {listener}: {server} was started from a config without "
            f"{what}; {RESTART}")


@dataclass
class ZooKeeper:
    """ZooKeeper 3.8, standalone: plain ``port`` and, unless ``secure_port`` is None, a
    TLS ``secureClientPort`` with the certificate of ``<home>/tls/`` (:func:`ensure_certificate`).

    3.8 serves TLS only with the Netty connection factory, which then serves the plain
    port too (``serverCnxnFactory``); its key store is a PEM file holding the key and
    the certificate (:meth:`write_keystore`). Clients show no certificate
    (``ssl.clientAuth=none``). Like ClickHouse's HTTPS, a server still running from a
    config without TLS keeps running without it: :meth:`tls_problem` says so.
    """

    home: Path
    port: int = 2181
    secure_port: int | None = None

    def __post_init__(self) -> None:
        self.process = ManagedProcess("zookeeper", self.home, str(self.config_file))

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def secure_hosts(self) -> str | None:
        """``host:port`` of the TLS port, for kazoo with ``use_ssl`` (the ``zookeeper``
        option with ``zookeeper_ca_file``)."""
        return None if self.secure_port is None else f"127.0.0.1:{self.secure_port}"

    @property
    def config_file(self) -> Path:
        return self.home / "zoo.cfg"

    @property
    def tls_dir(self) -> Path:
        return tls_dir(self.home)

    @property
    def ca_file(self) -> Path:
        """The self-signed certificate (shared with ClickHouse's HTTPS), its own CA."""
        return certificate_paths(self.tls_dir)[0]

    @property
    def keystore(self) -> Path:
        return self.tls_dir / "zookeeper-keystore.pem"

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

    def tls_problem(self) -> str | None:
        """Why the TLS port does not complete a verified handshake, or None if it does.

        A server started from a config without ``secureClientPort`` (an older ``up``)
        keeps running without it: the answer then says to restart the services.
        """
        if self.secure_port is None:
            return "ZooKeeper has no TLS port configured"
        problem = _listener_problem(self.ca_file, self.secure_port, str(self.secure_hosts),
                                    self.port, f"ZooKeeper at {self.hosts}", "TLS")
        if problem is not None:
            return problem
        problem = handshake_problem(ZooKeeperTLS(str(self.ca_file)).context(), "127.0.0.1",
                                    self.secure_port, timeout=2.0)
        if problem is not None:
            return f"TLS with ZooKeeper at {self.secure_hosts} fails ({problem}): {RESTART}"
        return None

    def write_keystore(self) -> Path:
        """The key store of the TLS port: 3.8 reads a PEM key store as one file holding
        the private key and the certificate. Written next to them, readable by us only."""
        cert, key = ensure_certificate(self.tls_dir)
        text = key.read_text() + cert.read_text()
        if not self.keystore.exists() or self.keystore.read_text() != text:
            tmp = self.keystore.with_name(f"{self.keystore.name}.{os.getpid()}.tmp")
            tmp.write_text(text)
            tmp.chmod(0o600)
            tmp.replace(self.keystore)
        return self.keystore

    def write_config(self) -> None:
        data = self.home / "zk-data"
        data.mkdir(parents=True, exist_ok=True)
        tls = [] if self.secure_port is None else [
            f"secureClientPort={self.secure_port}",
            "secureClientPortAddress=127.0.0.1",
            # keys zoo.cfg does not know become system properties "zookeeper.<key>"
            "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
            f"ssl.keyStore.location={self.write_keystore()}",
            "ssl.keyStore.type=PEM",
            "ssl.clientAuth=none",
        ]
        self.config_file.write_text(
            "\n".join([
                "tickTime=500",
                "initLimit=10",
                "syncLimit=5",
                f"dataDir={data}",
                f"clientPort={self.port}",
                "clientPortAddress=127.0.0.1",
                *tls,
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
        for port in (p for p in (self.port, self.secure_port) if p is not None):
            if port_open(port):
                raise ServiceError(
                    f"port {port} is taken by a process not started by txsink; "
                    "stop it or choose another port (TXSINK_ZK_PORT, TXSINK_ZK_SECURE_PORT)"
                )
        self.write_config()
        java = shutil.which("java") or "java"
        classpath = ":".join(
            p for p in (ZOOKEEPER_JAR, *ZOOKEEPER_NETTY_JARS,
                        "/usr/share/java/slf4j-simple.jar",
                        "/usr/share/java/slf4j-api.jar") if Path(p).exists()
        )
        self.process.spawn(
            [java, "-Xmx256m", "-Dzookeeper.jmx.log4j.disable=true", "-cp", classpath,
             "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(self.config_file)],
            cwd=self.home,
        )
        _wait(self.ready, self.process, "ZooKeeper", timeout)
        if self.secure_port is not None:
            _wait(lambda: port_open(self.secure_port), self.process,  # type: ignore[arg-type]
                  "ZooKeeper's TLS port", timeout)


@dataclass(frozen=True)
class Tuning:
    """Server-wide sizes written into a ClickHouse config.

    The main server keeps generous defaults; cluster servers use :data:`SMALL_TUNING` so
    that N×M of them fit next to Spark on a 2-core machine.  ``server`` entries are
    top-level elements, ``profile`` entries go into the ``default`` profile (18.16 reads
    the background pool sizes from there at start-up).
    """

    server: dict[str, int] = field(default_factory=lambda: {
        "mark_cache_size": 536870912,
        "max_concurrent_queries": 200,
    })
    profile: dict[str, int] = field(default_factory=lambda: {
        "max_memory_usage": 4000000000,
    })
    zk_session_timeout_ms: int = 10000


SMALL_TUNING = Tuning(
    server={
        "mark_cache_size": 67108864,
        "uncompressed_cache_size": 67108864,
        "max_concurrent_queries": 50,
    },
    profile={
        "max_memory_usage": 1000000000,
        "max_threads": 2,
        "background_pool_size": 2,
        "background_schedule_pool_size": 4,
    },
    # A SIGKILLed replica's `is_active` node lives until its session expires, and the
    # restarted replica stays read-only until then: keep that wait short.
    zk_session_timeout_ms=4000,
)


def _xml_elements(values: dict[str, int], indent: str) -> str:
    return "".join(f"{indent}<{k}>{v}</{k}>\n" for k, v in values.items())


@dataclass
class ClickHouse:
    """One ClickHouse server process: the main test server or one server of the cluster.

    ``remote_servers`` (XML inside ``<remote_servers>``) goes to ``config.d/`` rather than
    ``config.xml``: 18.16 reloads it from there while running (checked every ~2 s), so a
    running main server learns about the cluster without a restart.

    ``https_port`` (the main server only; None: no HTTPS listener) adds HTTPS with the
    certificate of ``<home>/tls/``.  18.16 reads ``<https_port>`` and ``<openSSL>`` only
    at start-up, unlike ``remote_servers``.
    """

    home: Path
    zookeeper: ZooKeeper
    http_port: int = 8123
    tcp_port: int = 9000
    interserver_port: int = 9009
    name: str = "clickhouse"
    macros: dict[str, str] = field(default_factory=lambda: {"shard": "1", "replica": "r1"})
    tuning: Tuning = field(default_factory=Tuning)
    remote_servers: str = ""
    https_port: int | None = None

    def __post_init__(self) -> None:
        self.dir = self.home / self.name
        self.process = ManagedProcess(self.name, self.home, str(self.config_file))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def https_url(self) -> str | None:
        return None if self.https_port is None else f"https://127.0.0.1:{self.https_port}"

    @property
    def tls_dir(self) -> Path:
        return tls_dir(self.home)

    @property
    def ca_file(self) -> Path:
        """The self-signed certificate, which is also the CA that verifies it."""
        return certificate_paths(self.tls_dir)[0]

    def https_problem(self) -> str | None:
        """Why ``https_url`` does not answer ``/ping`` over verified TLS, or None if it does.

        A server started from a config without ``<https_port>`` (an older ``up``) keeps
        running without it: the answer then says to restart the services.
        """
        if self.https_port is None:
            return f"ClickHouse {self.name} has no HTTPS port configured"
        problem = _listener_problem(self.ca_file, self.https_port, str(self.https_url),
                                    self.http_port, f"ClickHouse at {self.url}", "HTTPS")
        if problem is not None:
            return problem
        try:
            answer = requests.get(f"{self.https_url}/ping", verify=str(self.ca_file),
                                  timeout=2.0)
        except requests.exceptions.SSLError as exc:
            return (f"{self.https_url} does not present the certificate of {self.ca_file} "
                    f"({type(exc).__name__}): {RESTART}")
        except requests.RequestException as exc:
            return f"{self.https_url} does not answer ({type(exc).__name__})"
        if answer.content.strip() != b"Ok.":
            return f"{self.https_url}/ping answered {answer.status_code}, not Ok."
        return None

    @property
    def config_file(self) -> Path:
        return self.dir / "config.xml"

    @property
    def remote_servers_file(self) -> Path:
        return self.dir / "config.d" / "remote_servers.xml"

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
        server = _xml_elements(self.tuning.server, "    ")
        profile = _xml_elements(self.tuning.profile, "            ")
        https = self._https_config()
        self.config_file.write_text(f"""<?xml version="1.0"?>
<yandex>
    <logger><level>warning</level><console>1</console></logger>
    <listen_host>127.0.0.1</listen_host>
    <http_port>{self.http_port}</http_port>
    <tcp_port>{self.tcp_port}</tcp_port>
    <interserver_http_port>{self.interserver_port}</interserver_http_port>
    <interserver_http_host>127.0.0.1</interserver_http_host>
{https}    <path>{self.dir}/data/</path>
    <tmp_path>{self.dir}/tmp/</tmp_path>
    <user_files_path>{self.dir}/user_files/</user_files_path>
    <format_schema_path>{self.dir}/format_schemas/</format_schema_path>
{server}    <timezone>UTC</timezone>
    <max_table_size_to_drop>0</max_table_size_to_drop>
    <max_partition_size_to_drop>0</max_partition_size_to_drop>
    <zookeeper>
        <node><host>127.0.0.1</host><port>{self.zookeeper.port}</port></node>
        <session_timeout_ms>{self.tuning.zk_session_timeout_ms}</session_timeout_ms>
    </zookeeper>
    <macros>{macros}</macros>
    <profiles>
        <default>
{profile}        </default>
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
        self.write_remote_servers()

    def _https_config(self) -> str:
        """``<https_port>`` and the ``<openSSL><server>`` section it needs, or ''.

        Clients are not asked for certificates (``verificationMode`` none); no
        ``dhParamsFile``: this build (system Poco 1.11, OpenSSL 3) negotiates ECDHE and
        starts without one.
        """
        if self.https_port is None:
            return ""
        cert, key = ensure_certificate(self.tls_dir)
        return (f"    <https_port>{self.https_port}</https_port>\n"
                "    <openSSL>\n        <server>\n"
                f"            <certificateFile>{cert}</certificateFile>\n"
                f"            <privateKeyFile>{key}</privateKeyFile>\n"
                "            <verificationMode>none</verificationMode>\n"
                "        </server>\n    </openSSL>\n")

    def write_remote_servers(self) -> bool:
        """Write ``remote_servers`` to config.d; True if the file changed.

        An empty ``remote_servers`` leaves an existing file alone: ``services up`` without
        a cluster must not take the cluster away from a main server that still has one.
        """
        if not self.remote_servers:
            return False
        text = (f'<?xml version="1.0"?>\n<yandex>\n    <remote_servers>\n'
                f"{self.remote_servers}    </remote_servers>\n</yandex>\n")
        path = self.remote_servers_file
        if path.exists() and path.read_text() == text:
            return False
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")  # not *.xml: the server must never read half a file
        tmp.write_text(text)
        tmp.replace(path)
        return True

    def launch(self) -> None:
        """Spawn the server unless ours already runs; returns without waiting."""
        if self.process.pid() is not None:
            return
        ports = (self.http_port, self.tcp_port, self.interserver_port, self.https_port)
        for port in (p for p in ports if p is not None):
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

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        _wait(self.ready, self.process, f"ClickHouse {self.name}", timeout)

    def start(self, timeout: float = START_TIMEOUT) -> None:
        self.launch()
        self.wait_ready(timeout)

    def stop(self) -> bool:
        """SIGTERM and wait; True if it was running."""
        return self._stopped(self.process.stop())

    def kill(self) -> bool:
        """SIGKILL (a crash, for fault tests); True if it was running.

        Returns once the HTTP port is closed, so that :meth:`start` right after does not
        mistake the dying process's socket for a stranger's.
        """
        return self._stopped(self.process.kill())

    def _stopped(self, was_running: bool, timeout: float = 10.0) -> bool:
        """Wait until a server that was running has closed its HTTP port. One that was
        not is not waited for: its port may be another's (a private pair's 1×1 cluster
        shares the default ports with the shared cluster)."""
        deadline = time.monotonic() + timeout
        while was_running and port_open(self.http_port) and time.monotonic() < deadline:
            time.sleep(0.05)
        return was_running


@dataclass
class ClusterServer(ClickHouse):
    """A ClickHouse of the cluster: replica ``replica`` of shard ``shard`` (both from 1)."""

    shard: int = 1
    replica: int = 1


def cluster_ports(shard: int, replica: int, base: int = CLUSTER_PORT_BASE) -> tuple[int, int, int]:
    """(HTTP, TCP, interserver) ports of a cluster server; shard and replica from 1 to 9.

    HTTP = base + 10·shard + replica, TCP = that + 100, interserver = that + 200; with the
    default base, s1r1 answers HTTP on 28511 and s2r2 on 28522.
    """
    if not (1 <= shard <= 9 and 1 <= replica <= 9):
        raise ValueError(f"shard and replica must be 1..9, got {shard}, {replica}")
    http = base + 10 * shard + replica
    return http, http + 100, http + 200


_SERVER_NAME = re.compile(r"s(\d)r(\d)")


@dataclass
class Cluster:
    """N shards × M replicas of ClickHouse on 127.0.0.1, sharing the ZooKeeper.

    Every server (and ``main``, the main test server, if given) gets ``<remote_servers>``
    naming them as cluster ``name`` with ``internal_replication`` (a Distributed INSERT
    writes one replica per shard; ReplicatedMergeTree copies it to the others).  Each
    server has macros ``shard`` (``01``, ``02``, …) and ``replica`` (``r1``, ``r2``, …),
    so ``ReplicatedMergeTree('/clickhouse/tables/{shard}/db/t', '{replica}')`` works.
    ``shards[i][j]`` is replica j+1 of shard i+1; ``kill()``/``start()`` it in fault tests.
    """

    home: Path
    zookeeper: ZooKeeper
    main: ClickHouse | None
    shard_count: int
    replica_count: int
    name: str = CLUSTER_NAME
    port_base: int = CLUSTER_PORT_BASE

    def __post_init__(self) -> None:
        if self.shard_count < 1 or self.replica_count < 1:
            raise ValueError("a cluster needs at least one shard and one replica")
        self.shards: list[list[ClusterServer]] = [
            [self._server(s, r) for r in range(1, self.replica_count + 1)]
            for s in range(1, self.shard_count + 1)
        ]

    def _server(self, shard: int, replica: int) -> ClusterServer:
        http, tcp, interserver = cluster_ports(shard, replica, self.port_base)
        return ClusterServer(
            self.home, self.zookeeper, http_port=http, tcp_port=tcp,
            interserver_port=interserver, name=f"s{shard}r{replica}",
            macros={"shard": f"{shard:02d}", "replica": f"r{replica}"},
            tuning=SMALL_TUNING, remote_servers=self.remote_servers_xml(),
            shard=shard, replica=replica,
        )

    @property
    def servers(self) -> list[ClusterServer]:
        return [server for shard in self.shards for server in shard]

    def shard_urls(self) -> list[list[str]]:
        """HTTP URLs per shard, in shard and replica order."""
        return [[server.url for server in shard] for shard in self.shards]

    def remote_servers_xml(self) -> str:
        """The cluster's ``<remote_servers>`` entry (TCP ports, weights 1)."""
        shards = []
        for s in range(1, self.shard_count + 1):
            replicas = "".join(
                f"                <replica><host>127.0.0.1</host>"
                f"<port>{cluster_ports(s, r, self.port_base)[1]}</port></replica>\n"
                for r in range(1, self.replica_count + 1)
            )
            shards.append(
                "            <shard>\n                <weight>1</weight>\n"
                "                <internal_replication>true</internal_replication>\n"
                f"{replicas}            </shard>\n"
            )
        return f"        <{self.name}>\n{''.join(shards)}        </{self.name}>\n"

    def _expected_rows(self) -> str:
        return "".join(
            f"{s.shard}\t{s.replica}\t{s.tcp_port}\n" for s in self.servers
        )

    def seen_by(self, server: ClickHouse) -> bool:
        """True if ``server`` has loaded exactly this layout (from system.clusters)."""
        try:
            rows = server.query(
                "SELECT shard_num, replica_num, port FROM system.clusters "
                f"WHERE cluster = '{self.name}' ORDER BY shard_num, replica_num"
            )
        except (requests.RequestException, ServiceError):
            return False
        return rows == self._expected_rows()

    def up(self, timeout: float = START_TIMEOUT) -> None:
        """Start the missing servers (all at once) and wait until all are usable.

        Idempotent: running servers are kept; their and ``main``'s config.d is rewritten
        when the layout changed, and the call returns once every server has reloaded it.
        """
        if not self.zookeeper.ready():
            raise ServiceError("start ZooKeeper before the cluster")
        self.home.mkdir(parents=True, exist_ok=True)
        with _file_lock(self.home / ".lock"):
            for server in self.servers:
                server.write_remote_servers()
                server.launch()
            for server in self.servers:
                server.wait_ready(timeout)
            self._wait_seen(self.servers, timeout)
            if self.main is not None:
                self.main.remote_servers = self.remote_servers_xml()
                self.main.write_remote_servers()
                if self.main.process.pid() is None:
                    self.main.start(timeout)
                self._wait_seen([self.main], timeout)

    def _wait_seen(self, servers: list[ClickHouse], timeout: float) -> None:
        # The config reloader polls the files every ~2 s.
        deadline = time.monotonic() + timeout
        for server in servers:
            while not self.seen_by(server):
                if time.monotonic() > deadline:
                    raise ServiceError(
                        f"{server.name} ({server.url}) has not loaded cluster {self.name} "
                        f"after {timeout:.0f}s; see {server.remote_servers_file}"
                    )
                time.sleep(0.2)

    def down(self) -> list[str]:
        """Stop this layout's servers and any other cluster server left running here."""
        stopped = []
        with _file_lock(self.home / ".lock"):
            for server in self.servers + self.leftovers():
                if server.stop():
                    stopped.append(server.name)
        return stopped

    def leftovers(self) -> list[ClusterServer]:
        """Running servers under ``home`` that are not in this layout (an earlier N×M)."""
        mine = {server.name for server in self.servers}
        found = []
        for pid_file in sorted(self.home.glob("s*r*.pid")):
            match = _SERVER_NAME.fullmatch(pid_file.stem)
            if match and pid_file.stem not in mine:
                server = self._server(int(match[1]), int(match[2]))
                if server.process.pid() is not None:
                    found.append(server)
        return found

    def status(self) -> dict[str, dict[str, object]]:
        return {
            f"clickhouse-{server.name}": {
                "pid": server.process.pid(), "ready": server.ready(), "address": server.url,
            }
            for server in self.servers + self.leftovers()
        }


@dataclass
class Services:
    """The local ClickHouse + ZooKeeper pair used by tests, demo and benchmarks.

    With ``shards``/``replicas`` above 0, ``up`` also starts the :class:`Cluster`; with
    ``modern=True`` also the modern ClickHouse (:attr:`modern`).
    """

    home: Path
    zookeeper: ZooKeeper
    clickhouse: ClickHouse
    shards: int = 0
    replicas: int = 0
    cluster_port_base: int = CLUSTER_PORT_BASE
    modern_http_port: int = 8124  # = modern_server.DEFAULT_HTTP_PORT
    modern_tcp_port: int = 9001

    @classmethod
    def from_env(cls) -> Services:
        home = default_home()
        zk = ZooKeeper(home, port=int(os.environ.get("TXSINK_ZK_PORT", "2181")),
                       secure_port=int(os.environ.get("TXSINK_ZK_SECURE_PORT", "2281")))
        ch = ClickHouse(
            home, zk,
            http_port=int(os.environ.get("TXSINK_CH_HTTP_PORT", "8123")),
            tcp_port=int(os.environ.get("TXSINK_CH_TCP_PORT", "9000")),
            interserver_port=int(os.environ.get("TXSINK_CH_INTERSERVER_PORT", "9009")),
            https_port=int(os.environ.get("TXSINK_CH_HTTPS_PORT", "8443")),
        )
        return cls(
            home, zk, ch,
            shards=int(os.environ.get("TXSINK_SHARDS", "0")),
            replicas=int(os.environ.get("TXSINK_REPLICAS", "0")),
            cluster_port_base=int(
                os.environ.get("TXSINK_CLUSTER_PORT_BASE", str(CLUSTER_PORT_BASE))
            ),
            modern_http_port=int(os.environ.get("TXSINK_MODERN_HTTP_PORT", "8124")),
            modern_tcp_port=int(os.environ.get("TXSINK_MODERN_TCP_PORT", "9001")),
        )

    @property
    def modern(self) -> ModernClickHouse:
        """The modern ClickHouse server (26.x from chdb) of this home; not started. Its
        config names this home's ZooKeeper, for KeeperMap tables (the ``keepermap``
        coordinator store): that ZooKeeper is then the server's, not the sink's."""
        from tests.harness.modern_server import ModernClickHouse

        return ModernClickHouse(self.home, self.modern_http_port, self.modern_tcp_port,
                                zookeeper=self.zookeeper.hosts)

    def cluster(self, shards: int | None = None, replicas: int | None = None) -> Cluster:
        """The topology object (not started): arguments, else ``self.shards``/``replicas``.

        One of the two left at 0 counts as 1 (``--shards 2`` alone is 2×1).
        """
        shards = self.shards if shards is None else shards
        replicas = self.replicas if replicas is None else replicas
        if shards <= 0 and replicas <= 0:
            raise ValueError("no cluster configured: give shards/replicas (TXSINK_SHARDS)")
        return Cluster(self.home / "cluster", self.zookeeper, self.clickhouse,
                       max(shards, 1), max(replicas, 1), port_base=self.cluster_port_base)

    @property
    def has_cluster(self) -> bool:
        return self.shards > 0 or self.replicas > 0

    def up(self, modern: bool = False, modern_only: bool = False) -> None:
        """Start ZooKeeper, ClickHouse 18.16 (and the cluster), then the modern server.

        ``modern`` adds the modern ClickHouse; ``modern_only`` starts it alone.
        """
        if not modern_only:
            self._up_classic()
        if modern_only:  # no ZooKeeper started: a server without KeeperMap
            replace(self.modern, zookeeper=None).start()
        elif modern:
            self.modern.start()

    def _up_classic(self) -> None:
        ensure_installed()
        self.home.mkdir(parents=True, exist_ok=True)
        self.zookeeper.start()
        if not self.has_cluster:
            self.clickhouse.start()
            return
        cluster = self.cluster()
        # A main server started now reads the cluster at once instead of on reload.
        self.clickhouse.remote_servers = cluster.remote_servers_xml()
        self.clickhouse.start()
        cluster.up()

    def down(self, modern_only: bool = False) -> list[str]:
        """Stop what the pid files record: the modern server (if running) and, unless
        ``modern_only``, the cluster servers, ClickHouse and ZooKeeper."""
        modern = self.modern
        stopped = [modern.name] if modern.stop() else []
        if modern_only:
            return stopped
        # Cluster servers, then ClickHouse, then ZooKeeper: a ClickHouse stopping after
        # ZooKeeper would log ZooKeeper errors on the way out.
        stopped += self._cluster_for_down().down()
        for proc in (self.clickhouse.process, self.zookeeper.process):
            if proc.stop():
                stopped.append(proc.name)
        return stopped

    def _cluster_for_down(self) -> Cluster:
        # Without a configured layout a 1×1 object still finds every running leftover.
        return self.cluster() if self.has_cluster else self.cluster(1, 1)

    def status(self, modern: bool = False) -> dict[str, dict[str, object]]:
        """Each service's pid, readiness and address (``zookeeper-tls`` and
        ``clickhouse-https``: the TLS listeners, with their ``ca_file``, and ``problem``
        when the running server does not serve it); the modern server (with its ``version``) when
        ``modern`` or when it runs."""
        result: dict[str, dict[str, object]] = {
            "zookeeper": {"pid": self.zookeeper.process.pid(), "ready": self.zookeeper.ready(),
                          "address": self.zookeeper.hosts},
            "clickhouse": {"pid": self.clickhouse.process.pid(), "ready": self.clickhouse.ready(),
                           "address": self.clickhouse.url},
        }
        if self.zookeeper.secure_hosts is not None:
            pid = self.zookeeper.process.pid()
            problem = self.zookeeper.tls_problem()
            result["zookeeper-tls"] = {
                "pid": pid, "address": self.zookeeper.secure_hosts, "ready": problem is None,
                "ca_file": str(self.zookeeper.ca_file),
                **({"state": "not served", "problem": problem}
                   if pid is not None and problem is not None else {})}
        https_url = getattr(self.clickhouse, "https_url", None)  # a modern stand-in has none
        if https_url is not None:
            pid = self.clickhouse.process.pid()
            problem = self.clickhouse.https_problem()
            result["clickhouse-https"] = {
                "pid": pid, "address": https_url, "ready": problem is None,
                "ca_file": str(self.clickhouse.ca_file),
                # running from a config without HTTPS: not "starting", it never will
                **({"state": "not served", "problem": problem}
                   if pid is not None and problem is not None else {})}
        cluster = self._cluster_for_down()
        for name, info in cluster.status().items():
            if self.has_cluster or info["pid"] is not None:
                result[name] = info
        server = self.modern
        if modern or server.process.pid() is not None:
            result[server.name] = server.status()
        return result
