"""The chaos TCP proxy delays, cuts and black-holes real ClickHouse traffic on command."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlparse

import pytest
import requests

from tests.harness.chaos.proxy import TcpProxy


@pytest.fixture
def proxy(clickhouse_url: str) -> Iterator[TcpProxy]:
    parsed = urlparse(clickhouse_url)
    with TcpProxy(parsed.hostname, parsed.port) as p:
        yield p


def query(proxy: TcpProxy, sql: str, timeout: float = 5.0) -> str:
    resp = requests.post(f"http://{proxy.address}", data=sql.encode(), timeout=timeout)
    resp.raise_for_status()
    return resp.content.decode("utf-8").strip()


def test_passes_queries_through_unchanged(proxy):
    assert query(proxy, "SELECT 40 + 2") == "42"
    assert proxy.stats.accepted == 1


def test_delay_holds_every_request_at_least_that_long(proxy):
    proxy.delay(0.3)
    started = time.monotonic()
    assert query(proxy, "SELECT 1") == "1"
    assert time.monotonic() - started >= 0.6  # the request and the answer both wait


def test_cut_fails_a_query_in_flight(proxy):
    errors: list[Exception] = []

    def slow_query() -> None:
        try:
            query(proxy, "SELECT sleep(2)", timeout=10)
        except requests.RequestException as exc:
            errors.append(exc)

    worker = threading.Thread(target=slow_query)
    worker.start()
    deadline = time.monotonic() + 5
    while proxy.open_connections == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proxy.cut() == 1
    worker.join()
    assert len(errors) == 1 and isinstance(errors[0], requests.ConnectionError)


def test_connections_opened_after_a_cut_pass_again(proxy):
    proxy.cut()
    assert query(proxy, "SELECT 7") == "7"


def test_blackhole_accepts_the_connection_but_never_answers(proxy):
    proxy.blackhole()
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=2) as sock:
        sock.sendall(b"GET /ping HTTP/1.0\r\n\r\n")
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sock.recv(100)
    with pytest.raises(requests.ReadTimeout):
        query(proxy, "SELECT 1", timeout=0.5)


def test_restore_after_blackhole_answers_and_closes_the_held_connections(proxy):
    proxy.blackhole()
    held = socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
    held.sendall(b"GET /ping HTTP/1.0\r\n\r\n")
    time.sleep(0.2)
    proxy.restore()
    assert held.recv(100) == b""  # closed: the bytes it sent were dropped, not delayed
    held.close()
    assert query(proxy, "SELECT 3") == "3"


def test_stop_closes_every_connection_and_the_port(clickhouse_url):
    parsed = urlparse(clickhouse_url)
    proxy = TcpProxy(parsed.hostname, parsed.port).start()
    held = socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
    time.sleep(0.1)
    proxy.stop()
    assert held.recv(100) == b""
    held.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=1).close()
