"""The modern ClickHouse server (26.x from the chdb wheel): ``./run services up --modern``."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests

from server_ext.capabilities import detect_capabilities
from server_ext.client.http_client import ClickHouseClient
from server_ext.publish.strategy_choice import choose_strategy
from tests.conftest import run_sql, status_line
from tests.harness import cli
from tests.harness.modern_server import (
    TESTED_CHDB_VERSIONS,
    ModernClickHouse,
    ModernServerError,
    chdb_version,
)
from tests.harness.services import (
    READONLY_USER,
    SECRET_PASSWORD,
    SECRET_USER,
    Services,
    port_open,
)


def free_ports(count: int) -> list[int]:
    """Ports nobody listens on now (the kernel's pick, released again)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@pytest.fixture
def private(services: Services, tmp_path: Path) -> Iterator[Services]:
    """A Services view with its own home and modern ports: its server may be stopped
    without disturbing the shared one. Only ever used with ``modern_only``."""
    http, tcp = free_ports(2)
    view = Services(tmp_path, services.zookeeper, services.clickhouse,
                    modern_http_port=http, modern_tcp_port=tcp)
    yield view
    view.down(modern_only=True)


def test_the_installed_chdb_is_a_tested_version() -> None:
    assert chdb_version() in TESTED_CHDB_VERSIONS


def test_modern_server_answers_and_is_26(modern_clickhouse: ModernClickHouse) -> None:
    url = modern_clickhouse.url
    assert run_sql(url, "SELECT 1") == "1\n"  # TabSeparated, as on 18.16
    assert modern_clickhouse.version().startswith("26.")
    assert run_sql(url, "SELECT timezone()").strip() in ("UTC", "Etc/UTC")


def test_modern_server_has_the_same_users(modern_clickhouse: ModernClickHouse) -> None:
    url = modern_clickhouse.url
    ok = requests.post(url, params={"user": SECRET_USER, "password": SECRET_PASSWORD},
                       data=b"SELECT currentUser()", timeout=10)
    assert ok.status_code == 200 and ok.text.strip() == SECRET_USER
    bad = requests.post(url, params={"user": SECRET_USER, "password": "wrong"},
                        data=b"SELECT 1", timeout=10)
    assert bad.status_code != 200
    assert bad.headers.get("X-ClickHouse-Exception-Code") == "516"
    readonly = requests.post(url, params={"user": READONLY_USER},
                             data=b"CREATE DATABASE never_created", timeout=10)
    assert readonly.status_code != 200 and "readonly" in readonly.text.lower()


def test_capabilities_pick_move_and_see_no_keeper(modern_clickhouse: ModernClickHouse) -> None:
    caps = detect_capabilities(ClickHouseClient(modern_clickhouse.url))
    assert caps.version[0] == 26
    assert caps.move_partition
    assert not caps.keeper  # no system.zookeeper in chdb's server mode: Replicated stays off
    assert choose_strategy(caps, SimpleNamespace(replicated=False)) == "move"


def test_status_shows_the_modern_server_with_its_version(
    services: Services, modern_clickhouse: ModernClickHouse, capsys: pytest.CaptureFixture
) -> None:
    info = services.status()["clickhouse-modern"]
    assert info["pid"] == modern_clickhouse.process.pid() is not None
    assert info["ready"] and info["address"] == modern_clickhouse.url
    assert str(info["version"]).startswith("26.")
    line = status_line(capsys, "clickhouse-modern")
    assert modern_clickhouse.url in line and "ready" in line and "version=26." in line


def test_up_again_keeps_the_running_server(
    services: Services, modern_clickhouse: ModernClickHouse
) -> None:
    pid = modern_clickhouse.process.pid()
    services.up(modern_only=True)
    assert services.modern.process.pid() == pid


def test_stop_and_start_keep_the_data(private: Services) -> None:
    private.up(modern_only=True)
    server = private.modern
    assert server.ready() and server.url == f"http://127.0.0.1:{private.modern_http_port}"
    assert private.status()["clickhouse-modern"]["ready"]
    run_sql(server.url, "CREATE DATABASE kept")
    run_sql(server.url, "CREATE TABLE kept.t (id UInt64, day Date) ENGINE = MergeTree "
                        "PARTITION BY toYYYYMM(day) ORDER BY id")
    run_sql(server.url, "INSERT INTO kept.t VALUES (1, '2026-01-01'), (2, '2026-02-01')")

    assert private.down(modern_only=True) == ["clickhouse-modern"]
    assert server.process.pid() is None and not server.ready()
    assert not port_open(private.modern_http_port) and not port_open(private.modern_tcp_port)
    assert "stopped after" in server.process.log_file.read_text()  # a clean stop
    assert private.down(modern_only=True) == []

    private.up(modern_only=True)
    assert run_sql(server.url, "SELECT id FROM kept.t ORDER BY id") == "1\n2\n"


def test_up_modern_gives_the_server_a_keeper_for_keepermap_tables(private: Services) -> None:
    """``services up --modern`` writes the ``<zookeeper>`` section the keepermap store
    needs (the ZooKeeper is the server's); ``--modern-only`` starts none and writes none."""
    server = private.modern
    server.start()
    config = server.config_file.read_text()
    assert f"<port>{private.zookeeper.port}</port>" in config
    assert "<keeper_map_path_prefix>" in config
    name = f"km_{uuid.uuid4().hex[:8]}"
    run_sql(server.url, f"CREATE TABLE default.{name} (k String, v String) "
                        f"ENGINE = KeeperMap('/{name}') PRIMARY KEY k")
    run_sql(server.url, f"INSERT INTO default.{name} VALUES ('a', '1')")
    assert run_sql(server.url, f"SELECT v FROM default.{name}") == "1\n"
    run_sql(server.url, f"DROP TABLE default.{name} SYNC")
    private.down(modern_only=True)
    private.up(modern_only=True)
    assert "<zookeeper>" not in server.config_file.read_text()


def test_a_taken_port_is_named(private: Services) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", private.modern_http_port))
        holder.listen()
        with pytest.raises(ModernServerError, match=f"port {private.modern_http_port} is taken"):
            private.up(modern_only=True)
    assert private.modern.process.pid() is None


def test_a_server_that_cannot_listen_fails_with_its_log(private: Services) -> None:
    # Bound but not listening: the launcher's probe finds the port free, the server
    # cannot bind it and exits; the error shows the tail of its log.
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", private.modern_tcp_port))
        with pytest.raises(ModernServerError, match="(?s)exited during start-up.*in use"):
            private.up(modern_only=True)
    assert private.modern.process.pid() is None


def test_cli_modern_flags() -> None:
    args = cli.build_parser().parse_args(
        ["services", "up", "--modern", "--modern-http-port", "18124",
         "--modern-tcp-port", "19001"])
    assert (args.modern, args.modern_only) == (True, False)
    assert (args.modern_http_port, args.modern_tcp_port) == (18124, 19001)
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["services", "up", "--modern", "--modern-only"])
