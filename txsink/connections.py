"""Per-process clients for ClickHouse and ZooKeeper.

Spark reuses its Python workers across tasks, so a worker keeps one kazoo session per
ensemble and one HTTP connection pool per ClickHouse URL and user instead of paying
the ~16 ms ZooKeeper handshake on every task.
"""

from __future__ import annotations

import atexit
import threading

from kazoo.client import KazooClient
from kazoo.retry import KazooRetry

from coordinator import Coordinator
from server_ext.client import ClickHouseClient
from txsink import crashpoints
from txsink.options import SinkOptions

_lock = threading.Lock()
_zk: dict[str, KazooClient] = {}
_ch: dict[tuple[str, str | None, str | None, float, int], ClickHouseClient] = {}


class ZooKeeperUnreachable(ConnectionError):
    """The ZooKeeper ensemble named by the ``zookeeper`` option did not answer."""


def zookeeper(hosts: str, timeout: float = 15.0) -> KazooClient:
    """A started kazoo client for ``hosts`` (which may end in a chroot path)."""
    with _lock:
        client = _zk.get(hosts)
        if client is not None and client.connected:
            return client
        client = KazooClient(
            hosts=hosts,
            timeout=10.0,
            connection_retry=KazooRetry(max_tries=-1, delay=0.2, max_delay=2.0),
            command_retry=KazooRetry(max_tries=20, delay=0.1, max_delay=2.0, deadline=60.0),
        )
        try:
            client.start(timeout=timeout)
        except Exception as exc:
            client.close()
            raise ZooKeeperUnreachable(
                f"ZooKeeper at {hosts} did not answer within {timeout:.0f}s ({exc})"
            ) from None
        _zk[hosts] = client
        return client


def clickhouse(options: SinkOptions, url: str | None = None) -> ClickHouseClient:
    """A client for ``url`` (default: the ``url`` option) with the options' credentials."""
    url = url or options.url
    key = (url, options.user, options.password, options.timeout, options.retries)
    with _lock:
        client = _ch.get(key)
        if client is None:
            client = ClickHouseClient(
                url, user=options.user, password=options.password,
                timeout=options.timeout, retries=options.retries,
            )
            _ch[key] = client
        return client


def coordinator(options: SinkOptions, sink_id: str) -> Coordinator:
    """The sink's coordinator; its commit and abort steps pass the named crash points."""
    return Coordinator(zookeeper(options.zookeeper), sink_id, root=options.zk_root,
                       on_step=crashpoints.hit)


@atexit.register
def _close() -> None:
    for client in list(_zk.values()):
        try:
            client.stop()
            client.close()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass
