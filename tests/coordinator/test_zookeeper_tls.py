"""ZooKeeper over TLS (option ``zookeeper_ca_file``, CLI ``TXSINK_ZOOKEEPER_CA_FILE``),
against the real ZooKeeper 3.8's TLS port.

``./run services up`` gives ZooKeeper a ``secureClientPort`` (2281,
``TXSINK_ZK_SECURE_PORT``) with the self-signed certificate of the services home, which
is also its CA (``services.zookeeper.ca_file``). A ZooKeeper still running from a config
without it fails these tests with a message saying to restart the services.

The real server's certificate names the only address it listens on, so a trusted
certificate naming another host is shown by a tiny local TLS server instead.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import txsink
from coordinator import Coordinator, XidState, ZooKeeperTLS, ZooKeeperTLSError
from coordinator.sink_admin import SinkAdmin
from tests.conftest import free_port, kazoo_client, status_line
from tests.harness.services import Services, ZooKeeper
from tests.sinkutil import assert_exactly_once, create_events, events_df, id_counts, staging_tables
from txsink.core import connections
from txsink.ops import cli
from txsink.options import OptionError, parse_options

ZK_ROOT = "/txsink-test-zktls"
FAILS_WITHIN = 5.0  # seconds; kazoo alone would retry a failed handshake until its timeout


@pytest.fixture(scope="module")
def tls_zookeeper(services: Services) -> ZooKeeper:
    """The test ZooKeeper, checked to complete a verified handshake on its TLS port."""
    problem = services.zookeeper.tls_problem()
    if problem is not None:
        pytest.fail(f"ZooKeeper does not serve TLS: {problem}", pytrace=False)
    return services.zookeeper


@pytest.fixture(scope="module")
def secure_hosts(tls_zookeeper: ZooKeeper) -> str:
    return str(tls_zookeeper.secure_hosts)


@pytest.fixture
def target(clickhouse_url: str, ch_db: str) -> str:
    return create_events(clickhouse_url, ch_db, name="zktls_events")


@pytest.fixture
def options(clickhouse_url: str, secure_hosts: str, zk_chroot: str,
            target: str) -> dict[str, str]:
    """Sink options naming the TLS port, without ``zookeeper_ca_file``; a chroot, root and
    sink of their own."""
    return {"url": clickhouse_url, "zookeeper": secure_hosts + zk_chroot, "zk_root": ZK_ROOT,
            "table": target, "sink_id": f"zktls-{uuid.uuid4().hex[:8]}"}


@pytest.fixture
def admin(zk_hosts: str, zk_chroot: str) -> Iterator:
    """A plain session on the test's chroot, to look at what the sink recorded."""
    client = kazoo_client(zk_hosts + zk_chroot)
    client.start(timeout=15)
    yield client
    client.stop()
    client.close()


def write(spark, options: dict[str, str], count: int = 300) -> None:
    txsink.register(spark)
    (events_df(spark, 0, count, partitions=2).write.format("clickhouse_tx")
        .options(**options).mode("append").save())


def test_a_write_over_zookeeper_tls_lands_every_row_exactly_once_with_its_records(
        spark, tls_zookeeper, clickhouse_url, options, admin):
    write(spark, {**options, "zookeeper_ca_file": str(tls_zookeeper.ca_file)})
    assert_exactly_once(clickhouse_url, options["table"], range(300))
    assert SinkAdmin.sinks(admin, ZK_ROOT) == [options["sink_id"]]
    xids = SinkAdmin(Coordinator(admin, options["sink_id"], root=ZK_ROOT)).xids()
    assert [x.state for x in xids] == [XidState.COMMITTED]
    assert staging_tables(clickhouse_url, options) == []


def test_an_untrusted_zookeeper_certificate_is_refused_naming_tls_before_anything_is_staged(
        spark, clickhouse_url, options, admin, elsewhere_certificate):
    started = time.monotonic()
    with pytest.raises(Exception) as info:
        write(spark, {**options, "zookeeper_ca_file": str(elsewhere_certificate[0])})
    elapsed = time.monotonic() - started
    message = str(info.value)
    assert (f"ZooKeeperTLSError: TLS with ZooKeeper at {options['zookeeper'].split('/')[0]} "
            "failed (check the server's certificate and the zookeeper_ca_file option): "
            "certificate verify failed: self-signed certificate") in message, message[-800:]
    assert elapsed < 10.0, f"the refusal took {elapsed:.1f}s"  # Spark's planning included
    assert id_counts(clickhouse_url, options["table"]) == {}, "rows reached the target"
    assert staging_tables(clickhouse_url, options) == [], "a staging table was made"
    assert SinkAdmin.sinks(admin, ZK_ROOT) == [], "the sink was opened in ZooKeeper"


def test_tls_against_the_plain_port_is_refused_at_once_naming_it(tls_zookeeper):
    started = time.monotonic()
    with pytest.raises(ZooKeeperTLSError, match=(
            rf"TLS with ZooKeeper at {tls_zookeeper.hosts} failed .*: the server closed the "
            rf"connection during the TLS handshake: {tls_zookeeper.hosts} does not speak TLS")):
        connections.zookeeper(tls_zookeeper.hosts, ca_file=str(tls_zookeeper.ca_file))
    assert time.monotonic() - started < FAILS_WITHIN


def test_a_plain_session_against_the_tls_port_says_the_port_speaks_tls(secure_hosts):
    with pytest.raises(connections.ZooKeeperUnreachable,
                       match=f"{secure_hosts} speaks TLS: give the zookeeper_ca_file option"):
        connections.zookeeper(secure_hosts, timeout=2.0)


def test_the_operator_cli_reads_a_sink_over_tls_with_the_ca_variable(
        tls_zookeeper, secure_hosts, zk_chroot, admin, monkeypatch, capsys):
    Coordinator(admin, "zktls-cli", root=ZK_ROOT).fence()
    monkeypatch.setenv("TXSINK_ZOOKEEPER_CA_FILE", str(tls_zookeeper.ca_file))
    assert cli.main(["status", "--zookeeper", secure_hosts + zk_chroot, "--zk-root", ZK_ROOT,
                     "--sink", "zktls-cli"]) == 0
    assert "zktls-cli: generation 1" in capsys.readouterr().out


# -- a trusted certificate for another host (a local TLS server) ---------------------------


@pytest.fixture(scope="module")
def elsewhere_port(elsewhere_certificate) -> Iterator[int]:
    """A local port answering TLS handshakes with the ``elsewhere.invalid`` certificate."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*elsewhere_certificate)
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            try:
                with context.wrap_socket(conn, server_side=True):
                    pass
            except OSError:  # the client refuses the certificate
                pass

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()[1]
    listener.shutdown(socket.SHUT_RDWR)
    listener.close()


def test_a_trusted_certificate_for_another_host_is_refused(elsewhere_port, elsewhere_certificate):
    tls = ZooKeeperTLS(str(elsewhere_certificate[0]))
    with pytest.raises(ZooKeeperTLSError, match=(
            rf"TLS with ZooKeeper at 127\.0\.0\.1:{elsewhere_port} failed \(advice\): "
            r"certificate verify failed: IP address mismatch, certificate is not valid for "
            r"'127\.0\.0\.1'")):
        tls.check(f"127.0.0.1:{elsewhere_port}", advice="advice")


# -- the services and the option ----------------------------------------------------------


def test_services_status_lists_the_zookeeper_tls_address_with_its_ca_file(
        tls_zookeeper, capsys):
    line = status_line(capsys, "zookeeper-tls")
    assert f"{tls_zookeeper.secure_hosts} " in line and " ready " in line
    assert f"ca_file={tls_zookeeper.ca_file}" in line


def test_a_zookeeper_running_without_tls_is_reported_with_how_to_restart(
        services: Services, tmp_path: Path):
    port = free_port()  # nothing listens on it, as after an older ``up``
    older = ZooKeeper(tmp_path, port=services.zookeeper.port, secure_port=port)
    older.write_keystore()
    problem = older.tls_problem()
    assert problem is not None
    assert f"nothing listens on 127.0.0.1:{port}" in problem
    assert "./run services down, then ./run services up" in problem


def test_a_zookeeper_ca_file_that_does_not_exist_is_refused_naming_it(tmp_path):
    with pytest.raises(OptionError, match="zookeeper_ca_file=.*not a readable file"):
        parse_options({"url": "http://h:8123", "table": "db.t", "zookeeper": "z:2281",
                       "zookeeper_ca_file": str(tmp_path / "missing.pem")})
