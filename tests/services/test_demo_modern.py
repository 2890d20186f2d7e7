"""``./run demo --server modern``: the demo's private modern server, killed and restarted.

This checks what the demo relies on: the private services it builds for ``--server
modern`` (its own ZooKeeper and modern server, never the shared ones), a kill -9 and
restart of that server through the chaos faults, and the strategy the sink picks there;
with ``--coordinator keepermap``, the same server with that ZooKeeper as its Keeper,
whose records table outlives kills of either. One short run of the demo itself (Spark,
a few minutes) checks the keepermap demo end to end.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from server_ext.capabilities import detect_capabilities
from server_ext.client.http_client import ClickHouseClient
from server_ext.publish.strategy_choice import choose_strategy
from tests.conftest import run_sql
from tests.harness import cli as harness_cli
from tests.harness.chaos.faults import kill_server, private_services, restart_server
from tests.harness.demo import PORT_BASE, RECORDS_TABLE
from tests.harness.modern_server import ModernClickHouse, chdb_version
from tests.harness.services import ClickHouse, Services, port_open
from txsink.ops import cli

pytestmark = [pytest.mark.servers,  # starts servers of its own
              pytest.mark.skipif(chdb_version() is None, reason="needs the chdb package")]


def free_base() -> int:
    """A port base whose ZooKeeper (+1) and modern (+5, +6) ports are free, away from
    the demo's own range (a demo may be running)."""
    for base in range(PORT_BASE + 300, PORT_BASE + 900, 10):
        if not any(port_open(base + offset) for offset in (1, 5, 6)):
            return base
    raise RuntimeError("no free port range for a private modern server")


def running(services: Services) -> Iterator[Services]:
    try:
        services.up()
        yield services
    finally:
        services.down()


@pytest.fixture
def private(tmp_path: Path) -> Iterator[Services]:
    yield from running(private_services(tmp_path / "services", free_base(), "modern"))


@pytest.fixture
def keeper_private(tmp_path: Path) -> Iterator[Services]:
    """The demo's services for ``--coordinator keepermap``: ZooKeeper is the server's Keeper."""
    yield from running(private_services(tmp_path / "services", free_base(), "modern",
                                        keeper=True))


def test_cli_demo_server_option() -> None:
    parser = harness_cli.build_parser()
    assert parser.parse_args(["demo"]).server == "18.16"
    assert parser.parse_args(["demo", "--server", "modern"]).server == "modern"
    with pytest.raises(SystemExit):
        parser.parse_args(["demo", "--server", "19.1"])


def test_private_services_layout(tmp_path: Path) -> None:
    classic = private_services(tmp_path, PORT_BASE)
    assert isinstance(classic.clickhouse, ClickHouse)
    assert classic.clickhouse.http_port == PORT_BASE + 2
    modern = private_services(tmp_path, PORT_BASE, "modern")
    assert isinstance(modern.clickhouse, ModernClickHouse)
    assert modern.zookeeper.port == PORT_BASE + 1
    assert (modern.clickhouse.http_port, modern.clickhouse.tcp_port) == (PORT_BASE + 5,
                                                                         PORT_BASE + 6)
    # down() stops ``services.modern``: it must be this private server, not the shared one
    assert modern.modern.process.pid_file == modern.clickhouse.process.pid_file
    assert modern.modern.url == modern.clickhouse.url
    with pytest.raises(ValueError, match="unknown server"):
        private_services(tmp_path, PORT_BASE, "19.1")


def test_kill_and_restart_the_private_modern_server(private: Services) -> None:
    server = private.clickhouse
    url = server.url
    assert run_sql(url, "SELECT version()").startswith("26.")
    caps = detect_capabilities(ClickHouseClient(url))
    assert choose_strategy(caps, SimpleNamespace(replicated=False)) == "move"
    run_sql(url, "CREATE DATABASE demo")
    run_sql(url, "CREATE TABLE demo.t (id UInt64) ENGINE = MergeTree ORDER BY id")
    run_sql(url, "INSERT INTO demo.t SELECT number FROM numbers(1000)")

    pid = server.process.pid()
    assert kill_server(private, "clickhouse")
    assert server.process.pid() is None
    assert not port_open(server.http_port) and not port_open(server.tcp_port)
    assert private.zookeeper.ready()  # only the killed server is down

    restart_server(private, "clickhouse")
    assert server.ready() and server.process.pid() not in (None, pid)
    assert run_sql(url, "SELECT count(), uniqExact(id) FROM demo.t") == "1000\t1000\n"

    assert kill_server(private, "zookeeper") and not private.zookeeper.ready()
    restart_server(private, "zookeeper")
    assert private.zookeeper.ready() and server.ready()


def records_ready(services: Services) -> bool:
    """The demo's records table on the private server can hold records (and is read)."""
    return cli.create_records_table(services.clickhouse.url, RECORDS_TABLE).problem() is None


def test_the_keeper_backed_private_modern_server_keeps_its_records_table_across_kills(
        keeper_private: Services) -> None:
    server, zookeeper = keeper_private.clickhouse, keeper_private.zookeeper
    assert records_ready(keeper_private)

    assert kill_server(keeper_private, "zookeeper") and server.ready()
    restart_server(keeper_private, "zookeeper")
    assert records_ready(keeper_private)

    assert kill_server(keeper_private, "clickhouse")
    restart_server(keeper_private, "clickhouse")
    assert records_ready(keeper_private)

    # both down: the server is brought back after its Keeper, which it needs to start
    assert kill_server(keeper_private, "zookeeper") and kill_server(keeper_private, "clickhouse")
    restart_server(keeper_private, "clickhouse")
    assert zookeeper.ready() and server.ready()
    assert records_ready(keeper_private)


#: With 4 epochs, seed 0 kills ClickHouse while epoch 1 writes (its staging and its view's
#: staging) and ZooKeeper (the records table's Keeper) while epoch 2 publishes.
DEMO_ARGS = ("--server", "modern", "--coordinator", "keepermap", "--epochs", "4",
             "--rows-per-epoch", "2000", "--seed", "0", "--without-plain")
DEMO_PORTS = range(PORT_BASE + 1, PORT_BASE + 7)


@pytest.mark.timeout(1200)
def test_the_demo_with_keepermap_records_on_the_modern_server_is_exactly_once() -> None:
    if any(port_open(port) for port in DEMO_PORTS):
        pytest.skip(f"the demo's ports {DEMO_PORTS.start}..{DEMO_PORTS.stop - 1} are in use "
                    "(a demo is running)")
    demo = subprocess.run([sys.executable, "-m", "tests.harness", "demo", *DEMO_ARGS],
                          capture_output=True, text=True, timeout=1100)
    out = demo.stdout
    assert demo.returncode == 0, out + demo.stderr[-3000:]
    assert f"coordinator records: KeeperMap table {RECORDS_TABLE} on " in out, out
    assert "clickhouse_tx: epoch 1 writing -> clickhouse kill -9" in out, out
    assert "clickhouse_tx: epoch 2 publishing -> zookeeper kill -9" in out, out
    assert "txsink verify (clickhouse_tx history): no anomalies" in out, out
    assert "clickhouse_tx: EXACTLY ONCE" in out, out
