"""The operator's session: one session of the node store (ZooKeeper, or the KeeperMap
store with ``--coordinator keepermap``) and the ClickHouse clients of one command, and the
sinks of the root it may read.

Every command (``status.py``, ``recover.py``, ``gc.py``, ``verify.py``, ``reset.py``) is a
mixin of :class:`Session`; ``txsink.ops.Operations`` is all of them. Each returns
plain data (for ``--json``) and its module's ``render`` turns it into the text an operator
reads.
"""

from __future__ import annotations

from typing import Any

from coordinator import (
    AccessDenied,
    Coordinator,
)
from coordinator.plumbing.nodes import NodeStore
from coordinator.sink_admin import SinkAdmin
from server_ext.client import ClickHouseClient
from txsink.core import connections
from txsink.core.payload import BranchOwner
from txsink.options import (
    DEFAULT_RECORDS_TABLE,
    KEEPERMAP,
    ZOOKEEPER,
    ConnectionOptions,
    SinkOptions,
    StoreOptions,
    root_identity,
)
from txsink.options.store_options import DEFAULT_ZK_ROOT

CONNECT_SECONDS = 5.0  # an operator waits this long for ZooKeeper, then gets one line


class UnknownSink(LookupError):
    """An operator named a sink the root does not hold."""


class Session:
    """One ZooKeeper session (and, when needed, ClickHouse clients) per command: the
    sinks of the root it may read, their coordinators, the servers' clients."""

    def __init__(self, zookeeper: str, zk_root: str = DEFAULT_ZK_ROOT, url: str | None = None,
                 user: str | None = None, password: str | None = None,
                 zookeeper_auth: str | None = None,
                 zookeeper_ca_file: str | None = None, coordinator: str = ZOOKEEPER,
                 records_url: str | None = None,
                 records_table: str = DEFAULT_RECORDS_TABLE) -> None:
        self.root = zk_root
        self.zk: NodeStore
        if coordinator == KEEPERMAP:  # the records live in a KeeperMap table
            server = records_url or url
            if server is None:
                raise ValueError("--coordinator keepermap needs --records-url (or --url)")
            options = SinkOptions(
                connection=ConnectionOptions(url=server, user=user, password=password),
                table="", store=StoreOptions(zk_root=zk_root, coordinator=KEEPERMAP,
                                             records_url=records_url,
                                             records_table=records_table))
            self.root_identity = options.store.root_identity  # what gc may judge
            self.zk = connections.records(options, shared=False)
        else:
            self.root_identity = root_identity(zookeeper, zk_root)
            self.zk = connections.zookeeper(
                zookeeper, timeout=CONNECT_SECONDS, auth=zookeeper_auth,
                ca_file=zookeeper_ca_file, shared=False, named="--zookeeper",
                ca_named="TXSINK_ZOOKEEPER_CA_FILE",
                ca_advice="set TXSINK_ZOOKEEPER_CA_FILE to the CA of its certificate")
        self.url = url
        self.protected: list[str] = []  # sinks left out: their ACL names other credentials
        self._credentials = (user, password)

    def close(self) -> None:
        self.zk.stop()
        self.zk.close()

    def client_for(self, url: str | None = None) -> ClickHouseClient:
        """A client for ``url`` (a branch's server) or, for None, for ``--url``."""
        url = url or self.url
        if url is None:
            raise ValueError("this command needs --url")
        user, password = self._credentials
        return connections.clickhouse_client(url, user, password)

    def _sinks(self, only: str | None, must_exist: bool = False) -> list[str]:
        """The sinks a command works on: ``only``, or every sink of the root that this
        session may read. Sinks whose records carry an ACL for other credentials
        (``zookeeper_auth``) are left out and listed in ``self.protected``; naming one
        with ``only`` is refused with :class:`AccessDenied`. ``must_exist``: naming one
        the root does not hold is refused with :class:`UnknownSink` (a mistyped ``--sink``
        never passes for "nothing wrong"); ``recover`` allows it, since a pipeline
        recovers its sink before its first job makes it."""
        sinks = SinkAdmin.sinks(self.zk, self.root)
        if must_exist and only is not None and only not in sinks:
            raise UnknownSink(f"no sink {only!r} under {self.root_identity} (known: "
                              f"{', '.join(sinks[:10]) or 'none'})")
        chosen = [s for s in sinks if only is None or s == only]
        readable = [s for s in chosen if self._readable(s)]
        if only is not None and chosen and not readable:
            raise access_denied(f"sink {only}'s")
        return readable

    def _readable(self, sink_id: str) -> bool:
        if self._coordinator(sink_id).readable():
            return True
        if sink_id not in self.protected:
            self.protected.append(sink_id)
        return False

    def _protected_note(self) -> dict[str, Any]:
        """What a command's result says of the sinks it had to leave out."""
        return {"protected_sinks": sorted(self.protected)} if self.protected else {}

    def _coordinator(self, sink_id: str) -> Coordinator:
        return Coordinator(self.zk, sink_id, root=self.root, role="txsink operator")

    def _admin(self, sink_id: str) -> SinkAdmin:
        """The operators' front of ``sink_id``, over :meth:`_coordinator`'s store."""
        return SinkAdmin(self._coordinator(sink_id))


def access_denied(whose: str = "a sink's") -> AccessDenied:
    """The operator's refusal when ZooKeeper keeps ``whose`` records from this session."""
    return AccessDenied(f"ZooKeeper refuses this session access to {whose} records (their "
                        "ACL); set TXSINK_ZOOKEEPER_AUTH=user:password to the credentials "
                        "the sink was written with")


def staging_of(coord: Coordinator, epoch: int) -> list[str]:
    """The staging tables (and staging views) the xid's branches recorded as theirs."""
    names = []
    for branch in coord.branches(epoch):
        owner = BranchOwner.from_record(branch.owner)
        names += [name for name in (owner.staging, owner.view) if name] if owner else []
    return sorted(names)


def shown_epoch(epoch: int | None) -> str:
    """An epoch as the operators' text shows it: "none" for a sink that committed none."""
    return "none" if epoch is None else str(epoch)


def protected_lines(result: dict[str, Any]) -> list[str]:
    """The line a command's text opens with when it had to leave sinks out."""
    protected = result.get("protected_sinks") or []
    return [f"left out {len(protected)} sink(s) whose records need other ZooKeeper "
            f"credentials (TXSINK_ZOOKEEPER_AUTH): {', '.join(protected)}"] if protected else []


NO_SINKS = "no sinks under this root (--zookeeper host:port[/chroot], --zk-root)"
