"""Per-process clients for ClickHouse and the coordinator's node store.

Spark reuses its Python workers across tasks, so a worker keeps one kazoo session per
ensemble (or one KeeperMap store session per records table) and one HTTP connection pool
per ClickHouse URL and user instead of paying the store's handshake (~16 ms for
ZooKeeper) on every task.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.retry import KazooRetry

from coordinator import (
    AccessDenied,
    Coordinator,
    DigestAuth,
    ZooKeeperTLS,
    hosts_problem,
    tls_hint,
)
from coordinator.plumbing.keepermap import KeeperMapNodes
from coordinator.plumbing.nodes import SESSION_TIMEOUT, NodeStore
from server_ext.client import DEFAULT_RETRIES, DEFAULT_TIMEOUT, ClickHouseClient
from server_ext.ddl import KeeperMapTable
from txsink.core import crashpoints
from txsink.core.message_count import count_request, count_statement
from txsink.options import KEEPERMAP, SinkOptions

_lock = threading.Lock()
_zk: dict[tuple[str, str | None, str | None, float], KazooClient] = {}  # hosts, auth, CA, timeout
_allowed: set[tuple[str, str | None, str, str]] = set()  # sinks this process may read
# (url, user, password, timeout, retries, CA, how its statements are counted)
_ch: dict[tuple[str, str | None, str | None, float, int, str | None, Callable[[], None]],
          ClickHouseClient] = {}
# (pid, url, user, table, session timeout)
_records: dict[tuple[int, str, str | None, str, float], KeeperMapNodes] = {}


class CountedKazooClient(KazooClient):
    """A kazoo client that counts each request it sends (``message_count``): ``_call``
    is the one method every kazoo 2.x request passes, the session's pings and handshake
    apart (kazoo has no public hook for it)."""

    def _call(self, request: Any, async_object: Any) -> Any:
        count_request()
        return super()._call(request, async_object)


class RecordsUnusable(ValueError):
    """The KeeperMap table named for the coordinator's records cannot hold them."""


class ZooKeeperUnreachable(ConnectionError):
    """The ZooKeeper ensemble named by the ``zookeeper`` option did not answer."""


def zookeeper(hosts: str, timeout: float = 15.0, auth: str | None = None,
              ca_file: str | None = None, *, shared: bool = True,
              session_timeout: float = SESSION_TIMEOUT,
              named: str = "the zookeeper option",
              ca_named: str = "the zookeeper_ca_file option",
              ca_advice: str = "give the zookeeper_ca_file option") -> KazooClient:
    """A started kazoo client for ``hosts`` (which may end in a chroot path); with
    ``auth`` (``user:password``) its session authenticates with the digest scheme and
    creates znodes only that identity may touch (``coordinator/plumbing/auth.py``); with
    ``ca_file`` it speaks TLS, verifying the server with that CA (``coordinator/plumbing/tls.py``).
    ``timeout`` bounds the connection attempt; ``session_timeout`` is the session's
    (ZooKeeper may narrow it to its minSessionTimeout .. maxSessionTimeout).

    ``shared``: one session per process and ensemble, reused by every task a Spark worker
    runs; an operator command takes its own (``shared=False``) and closes it. ``named``
    is how the caller names the address in a refusal, ``ca_named`` the CA file and
    ``ca_advice`` how to give one.
    A TLS failure raises ``ZooKeeperTLSError`` within seconds, before any session:
    kazoo itself would retry it as a dropped connection until ``timeout``.
    """
    problem = hosts_problem(hosts)
    if problem:
        raise ValueError(f"{named} {problem}")
    digest = DigestAuth.parse(auth) if auth else None
    tls = ZooKeeperTLS(ca_file) if ca_file else None
    with _lock:
        key = (hosts, auth, ca_file, session_timeout)
        client = _zk.get(key) if shared else None
        if client is not None and client.connected:
            return client
        if tls is not None:
            tls.check(hosts, advice=f"check the server's certificate and {ca_named}")
        client = CountedKazooClient(
            hosts=hosts,
            auth_data=digest.auth_data if digest else None,
            default_acl=digest.acl if digest else None,
            timeout=session_timeout,
            connection_retry=KazooRetry(max_tries=-1, delay=0.2, max_delay=2.0),
            command_retry=KazooRetry(max_tries=20, delay=0.1, max_delay=2.0, deadline=60.0),
            **(tls.kazoo_args() if tls else {}),
        )
        try:
            client.start(timeout=timeout)
        except Exception:
            client.stop()
            client.close()
            bare = hosts.partition("/")[0]
            raise ZooKeeperUnreachable(
                f"no answer from ZooKeeper at {bare} within {timeout:.0f} s (is it running, "
                f"and is {named} host:port[/chroot] right?)"
                f"{'' if tls else tls_hint(bare, ca_advice)}") from None
        if shared:
            _zk[key] = client
        return client


def clickhouse_client(url: str, user: str | None = None, password: str | None = None, *,
                      timeout: float = DEFAULT_TIMEOUT, retries: int = DEFAULT_RETRIES,
                      ca_file: str | None = None,
                      counted_as: Callable[[], None] = count_statement) -> ClickHouseClient:
    """The process's client for ``url`` and these credentials and settings: one HTTP
    connection pool each, shared by the sink's tasks, its driver and operators.
    ``counted_as``: how its statements are counted (``message_count``; the KeeperMap
    records' client counts store requests)."""
    key = (url, user, password, timeout, retries, ca_file, counted_as)
    with _lock:
        client = _ch.get(key)
        if client is None:
            client = ClickHouseClient(url, user=user, password=password, timeout=timeout,
                                      retries=retries, ca_file=ca_file,
                                      on_statement=counted_as)
            _ch[key] = client
        return client


def clickhouse(options: SinkOptions, url: str | None = None,
               counted_as: Callable[[], None] = count_statement) -> ClickHouseClient:
    """A client for ``url`` (default: the ``url`` option) with the options' credentials."""
    given = options.connection
    return clickhouse_client(url or given.url, given.user, given.password,
                             timeout=given.timeout, retries=given.retries,
                             ca_file=given.ca_file, counted_as=counted_as)


class Clients:
    """The ClickHouse clients of one plan (or task): one per server, made at its first use
    with the options' credentials and kept, so each check is handed a client rather than
    making one. ``clients()`` is the ``url`` server's, ``clients(url)`` another's."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self._made: dict[str, ClickHouseClient] = {}

    def __call__(self, url: str | None = None) -> ClickHouseClient:
        url = url or self.options.connection.url
        client = self._made.get(url)
        if client is None:
            client = self._made[url] = clickhouse(self.options, url)
        return client


def clients_for(options: SinkOptions, clients: Clients | None) -> Clients:
    """``clients`` if given (the planner's), else the options' own."""
    return clients if clients is not None else Clients(options)


def records(options: SinkOptions, *, shared: bool = True) -> KeeperMapNodes:
    """The process's KeeperMap node store for the options' records table
    (``coordinator=keepermap``): one session per process (a forked worker makes its own);
    ``shared=False``: a session of its own (an operator command, which stops it).

    The table is checked once per process before its first use: a server without
    KeeperMap or without Keeper, a missing table and a table of another format are
    refused with :class:`RecordsUnusable` naming the problem, before anything is staged.
    """
    given = options.store
    database, table = given.records_table.split(".", 1)
    key = (os.getpid(), options.records_server, options.connection.user, given.records_table,
           given.session_timeout)
    with _lock:
        store = _records.get(key)
        if store is not None:
            return store if shared else KeeperMapNodes(store.table, given.session_timeout)
    records_table = KeeperMapTable(clickhouse(options, options.records_server, count_request),
                                   database, table)
    problem = records_table.problem()
    if problem is not None:
        raise RecordsUnusable(f"coordinator=keepermap: {problem}")
    if not shared:
        return KeeperMapNodes(records_table, given.session_timeout)
    with _lock:
        return _records.setdefault(key, KeeperMapNodes(records_table, given.session_timeout))


def node_store(options: SinkOptions) -> NodeStore:
    """Where the options keep the coordinator's records: a kazoo client or the KeeperMap
    store (the option ``coordinator``)."""
    store = options.store
    if store.coordinator == KEEPERMAP:
        return records(options)
    return zookeeper(store.zookeeper, auth=store.zookeeper_auth,
                     ca_file=store.zookeeper_ca_file, session_timeout=store.session_timeout)


def coordinator(options: SinkOptions, sink_id: str, role: str = "driver") -> Coordinator:
    """The sink's coordinator; its commit and abort steps pass the named crash points.

    A sink whose records this session may not read (their ACL names other credentials)
    is refused here with :class:`AccessDenied`, before anything is claimed or staged; so
    is an existing tree that is damaged or, with ``zookeeper_auth``, not protected by
    this writer's credentials (``Coordinator.check_tree``), once per process and sink;
    ``role`` names the holder of the publish leases it takes, for operators and recovery;
    with ``coordinator=keepermap``, a records table that cannot hold the records
    (:class:`RecordsUnusable`).
    """
    client = node_store(options)
    coord = Coordinator(client, sink_id, root=options.store.zk_root, on_step=crashpoints.hit,
                        role=role)
    store = options.store
    key = (store.root_identity, store.zookeeper_auth, store.zk_root, sink_id)
    if key not in _allowed:
        if not coord.readable():
            raise AccessDenied(
                f"ZooKeeper refuses access to sink {sink_id}'s records ({coord.layout.sink}):"
                " their ACL names other credentials than this writer's zookeeper_auth "
                "(or TXSINK_ZOOKEEPER_AUTH)")
        coord.check_tree()
        _allowed.add(key)
    return coord


@atexit.register
def _close() -> None:
    for key, store in list(_records.items()):
        if key[0] == os.getpid():  # ends the session: its liveness holders go at once
            store.stop()
    for client in list(_zk.values()):
        try:
            client.stop()
            client.close()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass
