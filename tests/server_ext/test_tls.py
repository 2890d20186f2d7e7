"""https:// servers and the ``ca_file`` option, against the real ClickHouse 18.16.

The main 18.16 test server serves HTTPS on ``services.clickhouse.https_port`` (8443,
``TXSINK_CH_HTTPS_PORT``) with a self-signed certificate kept in the services home, which
is also its CA (``services.clickhouse.ca_file``).  A server still running from a config
without HTTPS fails these tests with a message saying to restart the services.

REQUESTS_CA_BUNDLE may be set (it is on the development machine): it never trusts the
self-signed certificate, so "without ``ca_file``" means "not trusted" either way.

The modern 26.x server is not used: chdb's server opens only HTTP and native TCP
listeners (``SYSTEM START LISTEN`` takes nothing else).  One certificate problem the
real server cannot show is a trusted certificate naming another host (it listens on
127.0.0.1 only, which its certificate names): a tiny local HTTPS server shows that one.
"""

from __future__ import annotations

import re
import ssl
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import txsink
from coordinator import Coordinator
from coordinator.sink_admin import SinkAdmin
from server_ext.client.http_client import ClickHouseClient
from server_ext.errors import ClickHouseError
from tests.conftest import free_port, kazoo_client, status_line
from tests.harness.services import (
    SECRET_PASSWORD,
    SECRET_USER,
    ClickHouse,
    Services,
    ensure_certificate,
)
from tests.sinkutil import assert_exactly_once, create_events, events_df, id_counts, staging_tables
from txsink.options import OptionError, parse_options

ZK_ROOT = "/txsink-test-tls"
TLS_ERROR = (r"TLS_ERROR: TLS with 127\.0\.0\.1:\d+ failed \(check the server's certificate "
             r"and the ca_file option\): certificate verify failed: self-signed certificate")


@pytest.fixture(scope="module")
def https_server(services: Services) -> ClickHouse:
    """The 18.16 test server, checked to answer over verified TLS."""
    problem = services.clickhouse.https_problem()
    if problem is not None:
        pytest.fail(f"ClickHouse 18.16 does not serve HTTPS: {problem}", pytrace=False)
    return services.clickhouse


@pytest.fixture(autouse=True)
def _registered(spark) -> None:
    txsink.register(spark)


@pytest.fixture
def target(clickhouse_url: str, ch_db: str) -> str:
    return create_events(clickhouse_url, ch_db, name="tls_events")


@pytest.fixture
def options(https_server: ClickHouse, zk_hosts: str, zk_chroot: str,
            target: str) -> dict[str, str]:
    """Sink options for the https:// URL, without ``ca_file``; a sink and root of their own."""
    return {"url": str(https_server.https_url), "zookeeper": zk_hosts + zk_chroot,
            "zk_root": ZK_ROOT, "table": target, "sink_id": f"tls-{uuid.uuid4().hex[:8]}"}


def write(spark, options: dict[str, str], count: int = 300) -> None:
    (events_df(spark, 0, count, partitions=2).write.format("clickhouse_tx")
        .options(**options).mode("append").save())


def refused(spark, clickhouse_url: str, options: dict[str, str]) -> str:
    """Write; return the error text after checking that nothing was staged or decided."""
    with pytest.raises(Exception) as info:
        write(spark, options)
    assert id_counts(clickhouse_url, options["table"]) == {}, "rows reached the target"
    assert staging_tables(clickhouse_url, options) == [], "a staging table was made"
    admin = kazoo_client(options["zookeeper"])
    admin.start(timeout=15)
    try:
        assert SinkAdmin.sinks(admin, ZK_ROOT) == [], "the sink was opened in ZooKeeper"
        assert SinkAdmin(Coordinator(admin, options["sink_id"], root=ZK_ROOT)).xids() == [], \
            "a transaction was opened in ZooKeeper"
    finally:
        admin.stop()
        admin.close()
    return str(info.value)


def test_a_write_over_https_with_the_ca_file_lands_every_row_exactly_once(
        spark, https_server, clickhouse_url, options):
    write(spark, {**options, "ca_file": str(https_server.ca_file)})
    assert_exactly_once(clickhouse_url, options["table"], range(300))


def test_an_untrusted_certificate_is_refused_naming_tls_before_anything_is_staged(
        spark, clickhouse_url, options):
    message = refused(spark, clickhouse_url, options)
    assert re.search(TLS_ERROR, message, re.DOTALL), message[-800:]


def test_credentials_never_appear_in_a_tls_error(spark, clickhouse_url, options):
    message = refused(spark, clickhouse_url,
                      {**options, "user": SECRET_USER, "password": SECRET_PASSWORD})
    assert "TLS_ERROR" in message, message[-800:]
    assert SECRET_PASSWORD not in message
    assert SECRET_USER not in message


def test_an_untrusted_certificate_fails_at_once_without_retries(https_server):
    client = ClickHouseClient(str(https_server.https_url), retries=5)
    with pytest.raises(ClickHouseError, match="certificate verify failed") as err:
        client.query_value("SELECT 1", purpose="ask over TLS")
    assert err.value.retryable is False


def test_requests_ca_bundle_set_when_the_client_is_made_verifies_the_server(
        https_server, monkeypatch):
    # the client reads requests' environment variables once, when it is made
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(https_server.ca_file))
    client = ClickHouseClient(str(https_server.https_url))
    monkeypatch.delenv("REQUESTS_CA_BUNDLE")
    assert client.query_value("SELECT 1", purpose="ask over TLS") == "1"


def test_services_status_lists_the_https_url_with_its_ca_file(https_server, capsys):
    line = status_line(capsys, "clickhouse-https")
    assert f"{https_server.https_url} " in line and " ready " in line
    assert f"ca_file={https_server.ca_file}" in line


def test_a_server_running_without_https_is_reported_with_how_to_restart(
        services: Services, tmp_path: Path):
    port = free_port()  # nothing listens on it, as after an older ``up``
    older = ClickHouse(tmp_path, services.zookeeper, https_port=port)
    ensure_certificate(older.tls_dir)
    problem = older.https_problem()
    assert problem is not None
    assert f"nothing listens on https://127.0.0.1:{port}" in problem
    assert "./run services down, then ./run services up" in problem


# -- a certificate for another host (a local HTTPS server) ---------------------------------


class _Answer(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"1\n")

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def elsewhere_url(elsewhere_certificate) -> Iterator[str]:
    cert, key = elsewhere_certificate
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_trusted_certificate_for_another_host_is_refused(elsewhere_url, elsewhere_certificate):
    client = ClickHouseClient(elsewhere_url, ca_file=str(elsewhere_certificate[0]))
    with pytest.raises(ClickHouseError, match=r"TLS with 127\.0\.0\.1:\d+ failed .*IP address "
                       r"mismatch, certificate is not valid for '127\.0\.0\.1'") as err:
        client.query_value("SELECT 1", purpose="ask over TLS")
    assert err.value.retryable is False


def test_a_ca_file_that_does_not_exist_is_refused_naming_it(tmp_path):
    with pytest.raises(OptionError, match="ca_file=.*not a readable file"):
        parse_options({"url": "https://h:8443", "table": "db.t", "zookeeper": "z:2181",
                       "ca_file": str(tmp_path / "missing.pem")})
