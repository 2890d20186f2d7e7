"""Shared fixtures: real ClickHouse, real ZooKeeper, real Spark (local mode).

Services are started once per run when absent (``tests.harness.services``). Every test gets its
own ClickHouse database and its own ZooKeeper chroot, so tests cannot see each other.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from hypothesis import settings
from kazoo.client import KazooClient
from kazoo.exceptions import NotEmptyError
from kazoo.retry import KazooRetry

from server_ext.client.http_client import ClickHouseClient
from server_ext.staging.staging_tables import (
    STAGING_DATABASE,
    parse_staging_table_name,
    rollback,
    staging_table_name,
)
from server_ext.staging.sweeper import staging_tables
from tests.harness import cli as harness_cli
from tests.harness.services import Cluster, Services

# The same examples on every run: an input that crashes the shared server (as some
# LowCardinality blocks crash 18.16) must fail every run, not one run in a few.
settings.register_profile("txsink", derandomize=True)
settings.load_profile("txsink")


#: Fixtures that reach a real server or start Spark: a test using any of them, directly or
#: through another fixture, is marked ``servers``; the rest is the fast tier
#: (``pytest -m "not servers"``: pure logic, no server, well under a minute).
SERVER_FIXTURES = frozenset({"services", "spark", "clickhouse_url", "zk_hosts", "cluster",
                             "modern_clickhouse", "server", "server_url", "keepermap_url",
                             "nodes"})


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "second_server: an every_spark test's run on its second server through "
        "mapInArrow, left out under the older PySparks (tests/harness/spark_versions.py: "
        "SECOND_SERVER)")


#: ``./run test`` runs the suite in two processes (pytest-xdist, ``--dist loadgroup``): each
#: module's tests go to one of them (its module fixtures are set up once), except
#: - ``cluster``: every test of the 2x2 cluster, which fault tests kill servers of;
#: - ``own-servers``: the modules that start servers or Spark clusters of their own on
#:   fixed ports, one after another;
#: - tests marked ``alone`` (they stop a shared server, or time Spark's scheduling, which a
#:   second process on the cores would change): run after the others, by themselves
#:   (``-m alone``).
OWN_SERVERS = frozenset({
    "tests/reliability/test_chaos_schedule.py", "tests/reliability/test_server_kills.py",
    "tests/reliability/test_bad_input.py", "tests/services/test_demo_modern.py",
    "tests/services/test_demo_options.py", "tests/services/test_services_cluster.py"})
#: The folders whose modules are the slowest, handed out first so that neither process is
#: left with a long module at the end.
SLOW_FIRST = ("tests/reliability/", "tests/spark/", "tests/ops/", "tests/core/")


def xdist_group(item: pytest.Item) -> str:
    module = item.nodeid.split("::", 1)[0]
    if "cluster" in getattr(item, "fixturenames", ()):
        return "cluster"
    return "own-servers" if module in OWN_SERVERS else module


def handed_out(group: str) -> int:
    if group == "own-servers":
        return -1
    return next((i for i, folder in enumerate(SLOW_FIRST) if group.startswith(folder)),
                len(SLOW_FIRST))


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.servers)
        item.add_marker(pytest.mark.xdist_group(xdist_group(item)))
    items.sort(key=lambda item: handed_out(xdist_group(item)))  # stable: order kept within


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on (at the moment of asking)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def status_line(capsys: pytest.CaptureFixture[str], name: str) -> str:
    """The line of ``./run services status`` for the service ``name``."""
    assert harness_cli.main(["services", "status"]) == 0
    return next(line for line in capsys.readouterr().out.splitlines()
                if line.startswith(name))


@pytest.fixture(scope="session")
def elsewhere_certificate(tmp_path_factory) -> tuple[Path, Path]:
    """(certificate, key): self-signed, naming only ``elsewhere.invalid``: a CA that
    vouches for none of the test servers, and a certificate for another host."""
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the test certificate")
    folder = tmp_path_factory.mktemp("elsewhere")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=elsewhere.invalid",
                    "-addext", "subjectAltName=DNS:elsewhere.invalid",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


@pytest.fixture(scope="session")
def services() -> Services:
    svc = Services.from_env()
    svc.up()
    return svc


RUN_STARTED = pytest.StashKey[float]()


def owns_the_run(config: pytest.Config) -> bool:
    """``./run test`` asks for the run's start and end below; with ``-n`` (pytest-xdist)
    only the controlling process does them, once for all its workers."""
    return (os.environ.get("TXSINK_TEST_SWEEP_AT_END") == "1"
            and not hasattr(config, "workerinput"))


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[RUN_STARTED] = time.time()
    if owns_the_run(session.config):
        empty_test_records(Services.from_env().modern.url)


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not owns_the_run(session.config):
        return
    svc = Services.from_env()
    unaccounted = drop_leftover_staging([svc.clickhouse.url, svc.modern.url],
                                        since=session.config.stash[RUN_STARTED])
    if unaccounted:
        print(f"\nstaging tables no txsink gc can account for: {unaccounted}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def empty_test_records(url: str) -> None:
    """The run's start: the test records table (``records_table``) loses what earlier runs
    left in it, before any test uses it. Its tests' sinks stay behind, and listing sinks
    (``recover``, ``status``, ``gc``) scans the whole table: grown over many runs, the
    scans slowed the KeeperMap tests by seconds each. Only ``./run test`` asks for it, as
    for the sweep below."""
    try:
        ClickHouseClient(url).execute(f"TRUNCATE TABLE IF EXISTS `{RECORDS_DATABASE}`.records",
                                      purpose="empty the test records table")
    except Exception:  # noqa: BLE001 - a server this run does not start
        pass


def drop_leftover_staging(urls: list[str], since: float) -> list[str]:
    """The run's end: every staging table the run left is one ``txsink gc`` accounts for,
    and is dropped.

    Each test's coordinator root lives in its own ZooKeeper chroot, deleted when the test
    ends, so at the end of the run no xid of any test is open: ``gc`` of the table's root
    judges every staging table the run created (metadata time since the run started) as
    not live and drops it. Such a table must therefore carry a parseable staging name with
    a root tag (what ``gc`` judges by); one that does not is a table no ``gc`` could ever
    account for, and fails the run. Tables older than the run are left alone. Only
    ``./run test`` asks for it: a developer's run beside another would drop that run's
    tables.
    """
    unaccounted = []
    for url in urls:
        try:
            client = ClickHouseClient(url)
            tables = staging_tables(client)
        except Exception:  # noqa: BLE001 - a server this run never started
            continue
        for name, created, _ in tables:
            if created < since:
                continue
            owner = parse_staging_table_name(name)
            if owner is None or owner.root_tag is None:
                unaccounted.append(f"{url}: {name}")
                continue
            rollback(client, name)
    return unaccounted


@pytest.fixture(scope="session")
def clickhouse_url(services: Services) -> str:
    return services.clickhouse.url


@pytest.fixture(scope="session")
def zk_hosts(services: Services) -> str:
    return services.zookeeper.hosts


def run_sql(url: str, sql: str) -> str:
    """Plain HTTP query for test setup and checks, independent of server_ext.

    A query of ``system.tables`` is repeated while 18.16 fails it (codes 60, 107) for a
    table dropped meanwhile (``server_ext/client/catalog.py`` says why)."""
    for _ in range(8):
        resp = requests.post(url, data=sql.encode(), timeout=30)
        body = resp.content.decode()
        if not ("system.tables" in sql and body.startswith(("Code: 60", "Code: 107"))):
            break
        time.sleep(0.02)
    if resp.status_code != 200:
        raise AssertionError(f"setup query failed ({resp.status_code}): {body.strip()}\n{sql}")
    return body


@pytest.fixture
def ch_db(clickhouse_url: str) -> Iterator[str]:
    """A fresh, empty database name, dropped after the test."""
    name = f"t_{uuid.uuid4().hex[:10]}"
    run_sql(clickhouse_url, f"CREATE DATABASE `{name}`")
    yield name
    run_sql(clickhouse_url, f"DROP DATABASE IF EXISTS `{name}`")


@pytest.fixture(scope="session")
def cluster(services: Services) -> Cluster:
    """The 2×2 ClickHouse cluster ``txsink_cluster``, started on first use.

    Like ``services`` it is left running after the run (``./run services down`` stops
    it); four servers of ~40 MB each, ~3 s to start.  Fault tests may ``kill()``/``start()`` its
    servers but must leave them running.
    """
    topology = services.cluster(shards=2, replicas=2)
    topology.up()
    return topology


@pytest.fixture
def cluster_db(cluster: Cluster) -> Iterator[str]:
    """A fresh database of the same name on every cluster server and the main server.

    The main server gets it too so that a Distributed table there can sit next to the
    shards' local tables under one name.  Dropped after the test; a server the test left
    down is skipped (its replica metadata stays in ZooKeeper under a unique path).
    """
    cluster.up()  # restarts a server that an earlier (failed) fault test left down
    name = f"t_{uuid.uuid4().hex[:10]}"
    urls = [server.url for server in cluster.servers]
    if cluster.main is not None:
        urls.append(cluster.main.url)
    for url in urls:
        run_sql(url, f"CREATE DATABASE `{name}`")
    yield name
    for url in urls:
        try:
            run_sql(url, f"DROP DATABASE IF EXISTS `{name}`")
        except (AssertionError, requests.RequestException):
            pass


@pytest.fixture
def client(clickhouse_url: str) -> ClickHouseClient:
    """A server_ext client of the test server (default user)."""
    return ClickHouseClient(clickhouse_url)


@pytest.fixture
def staging_name(clickhouse_url: str) -> Iterator[str]:
    """A fresh staging table name (real naming scheme), dropped after the test."""
    name = staging_table_name(f"test-{uuid.uuid4().hex}", 1, "p0-a0-00000000")
    yield name
    run_sql(clickhouse_url, f"DROP TABLE IF EXISTS `{STAGING_DATABASE}`.`{name}`")


def kazoo_client(hosts: str) -> KazooClient:
    """A kazoo client that reconnects within a second and retries commands meanwhile.

    Some tests restart ZooKeeper; kazoo's default reconnect back-off grows to minutes.
    """
    return KazooClient(
        hosts=hosts,
        connection_retry=KazooRetry(max_tries=-1, delay=0.1, max_delay=0.5),
        command_retry=KazooRetry(max_tries=-1, delay=0.1, max_delay=0.5, deadline=60),
    )


@pytest.fixture
def zk_chroot(zk_hosts: str) -> Iterator[str]:
    """A fresh ZooKeeper path to use as chroot; the tree is deleted after the test."""
    path = f"/tests/{uuid.uuid4().hex[:10]}"
    admin = kazoo_client(zk_hosts)
    admin.start(timeout=15)
    admin.ensure_path(path)
    yield path
    # A failed job's tasks that Spark kills may still write into the tree for a moment
    # after the job has failed (their branches are refused later): delete again then.
    for attempt in range(20):
        try:
            admin.retry(admin.delete, path, recursive=True)
            break
        except NotEmptyError:
            if attempt == 19:
                raise
            time.sleep(0.25)
    admin.stop()
    admin.close()


@pytest.fixture
def zk(zk_hosts: str, zk_chroot: str) -> Iterator[KazooClient]:
    """A started kazoo client rooted at the test's own chroot."""
    client = kazoo_client(zk_hosts + zk_chroot)
    client.start(timeout=15)
    yield client
    client.stop()
    client.close()


# -- The coordinator's two node stores -------------------------------------------------------
# Coordinator tests that take ``nodes`` (a factory of started node stores, each rooted at the
# test's own namespace) run once per store: ``[zookeeper]`` (kazoo, the test's chroot) and
# ``[keepermap]`` (KeeperMap tables of the modern server, ``coordinator/plumbing/keepermap/``).

STORES = ("zookeeper", "keepermap")
RECORDS_DATABASE = "txsink_test_records"
SNAPSHOT_EVERY = 16  # the property tests' KeeperMap stores: snapshots between their steps
RETAIN = 2.0  # and their retention (s): entries are deleted while the protocol runs


@pytest.fixture(scope="session")
def keepermap_url(services: Services) -> str:
    """A modern ClickHouse whose config names a ZooKeeper, so KeeperMap tables work:
    ``TXSINK_KEEPERMAP_URL``, else the modern server of ``./run services up --modern``."""
    url = os.environ.get("TXSINK_KEEPERMAP_URL")
    if url:
        return url
    server = services.modern
    server.start()
    return server.url


@pytest.fixture(scope="session")
def records_table(keepermap_url: str):
    """The session's table of coordinator records (``server_ext.ddl.records_table``)."""
    from server_ext.ddl.records_table import KeeperMapTable

    table = KeeperMapTable(ClickHouseClient(keepermap_url), RECORDS_DATABASE, "records")
    try:
        table.create(f"/{RECORDS_DATABASE}/records")
    except Exception as exc:  # noqa: BLE001 - say how to get a server that has it
        pytest.fail(f"no KeeperMap table on {keepermap_url} ({exc}); a modern server "
                    "started before its config named a ZooKeeper lacks it: restart it "
                    "(./run services down --modern-only; ./run services up --modern) or "
                    "set TXSINK_KEEPERMAP_URL to one that has it")
    return table


@pytest.fixture(params=STORES)
def store_kind(request) -> str:
    return request.param


@pytest.fixture
def nodes(request, store_kind: str):
    """A factory of started node stores of the test's own tree (see above): each call is
    a new session, as a new kazoo client is; all are stopped after the test."""
    opened: list = []
    if store_kind == "zookeeper":
        hosts = request.getfixturevalue("zk_hosts") + request.getfixturevalue("zk_chroot")

        def open_store():
            client = kazoo_client(hosts)
            client.start(timeout=15)
            opened.append(client)
            return client
    else:
        from coordinator.plumbing.keepermap import KeeperMapNodes

        table = request.getfixturevalue("records_table")
        namespace = f"/tests/{uuid.uuid4().hex[:10]}"

        def open_store():
            # snapshots every few entries: a store opened later starts from one; and
            # entries deleted behind them
            store = KeeperMapNodes(table, namespace=namespace, compact_every=SNAPSHOT_EVERY,
                                   retain=RETAIN)
            opened.append(store)
            return store
    yield open_store
    for store in opened:
        store.stop()
        store.close()


@pytest.fixture(scope="session")
def spark():
    """One local SparkSession for the whole run (start-up costs ~6 s).

    ``local[2,2]``: two cores, and a failed task is tried once more (the tests of retried
    tasks fail each first attempt); a write refused in its tasks (a bad value) fails
    twice, not three times over. Its Python workers start as the fault runs' drivers'
    do (``tests.harness.chaos.worker_site``): a failed task's worker is replaced."""
    from pyspark.sql import SparkSession

    from tests.harness.chaos.jvm import worker_pythonpath

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = worker_pythonpath()  # its Python workers start faster

    session = (
        SparkSession.builder.master("local[2,2]")
        .appName("txsink-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


# -- The modern server: ClickHouse 26.x (chdb) beside 18.16 --------------------------------
# End-to-end tests that take ``server_url`` (and ``server_db``) run once per server, with
# ids ``[ch18]`` and ``[ch26]``. To mark one server's run of a test, parametrize ``server``
# there instead: ``@on_servers(ch26=pytest.mark.xfail(strict=True, reason=...))``.

SERVERS = ("ch18", "ch26")


@pytest.fixture(scope="session")
def modern_clickhouse(services: Services):
    """The modern ClickHouse (26.x from chdb; ``./run services up --modern``).

    Started on first use and left running, like ``cluster``; ``./run services down``
    stops it. Its config names the local ZooKeeper for KeeperMap tables, but Replicated
    tables stay read-only there: they are 18.16-only.
    """
    server = services.modern
    server.start()
    return server


@pytest.fixture(scope="session")
def modern_clickhouse_url(modern_clickhouse) -> str:
    return modern_clickhouse.url


@pytest.fixture(params=SERVERS)
def server(request) -> str:
    """Which ClickHouse the test runs on: ``ch18`` (18.16) or ``ch26`` (26.x)."""
    return request.param


@pytest.fixture
def server_url(request, server: str) -> str:
    """HTTP URL of the server the test runs on (see ``server``)."""
    return request.getfixturevalue("clickhouse_url" if server == "ch18"
                                   else "modern_clickhouse_url")


@pytest.fixture
def server_options(server_url: str, zk_hosts: str, zk_chroot: str) -> dict[str, str]:
    """The sink's connection options for the test's server and a fresh ZooKeeper chroot."""
    return {"url": server_url, "zookeeper": zk_hosts + zk_chroot}


@pytest.fixture
def server_db(server_url: str) -> Iterator[str]:
    """A fresh, empty database on the test's server, dropped after the test."""
    name = f"t_{uuid.uuid4().hex[:10]}"
    run_sql(server_url, f"CREATE DATABASE `{name}`")
    yield name
    run_sql(server_url, f"DROP DATABASE IF EXISTS `{name}`")


def on_18_16_only(test):
    """Run ``test`` (which takes ``server``) on 18.16 alone, its id still naming the server:
    for what the sink decides before or apart from the server (a refused option or call, a
    covered ``txn_version``), where the modern server's run would repeat the same steps;
    the modern server's publish is tried by the module's other tests."""
    return pytest.mark.parametrize("server", ["ch18"], indirect=True)(test)


def on_servers(**marks):
    """Parametrize ``server`` with marks for some servers' runs, for example
    ``@on_servers(ch26=pytest.mark.xfail(strict=True, reason="bug ..."))``."""
    return pytest.mark.parametrize(
        "server", [pytest.param(name, marks=marks.get(name, ()), id=name) for name in SERVERS],
        indirect=True)
