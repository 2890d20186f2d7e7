"""https:// servers and the ``ca_file`` option.

The ClickHouse and ZooKeeper servers of this project speak plain text, so TLS is proven
against a local HTTPS endpoint with a freshly made self-signed certificate (``openssl``),
answering as ClickHouse does: what is under test is the client's verification, which
does not depend on what stands behind the certificate.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from server_ext.client import ClickHouseClient
from server_ext.errors import ClickHouseError
from txsink.options import OptionError, parse_options


class _Answer(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"1\n")

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the test certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


@pytest.fixture(scope="module")
def https_url(certificate) -> Iterator[str]:
    cert, key = certificate
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_an_https_server_is_verified_against_the_ca_file(https_url, certificate):
    client = ClickHouseClient(https_url, ca_file=str(certificate[0]))
    assert client.query_value("SELECT 1", purpose="ask over TLS") == "1"


def test_a_certificate_no_ca_vouches_for_fails_at_once_naming_tls(https_url):
    client = ClickHouseClient(https_url, retries=5)
    with pytest.raises(ClickHouseError, match="TLS with 127.0.0.1.*certificate verify failed") \
            as err:
        client.query_value("SELECT 1", purpose="ask over TLS")
    assert err.value.retryable is False


def test_a_ca_file_that_does_not_exist_is_refused_naming_it(tmp_path):
    with pytest.raises(OptionError, match="ca_file=.*not a readable file"):
        parse_options({"url": "https://h:8443", "table": "db.t", "zookeeper": "z:2181",
                       "ca_file": str(tmp_path / "missing.pem")})
