"""The options of the coordinator's store: ``coordinator`` (where the records live),
``zookeeper``, ``zookeeper_auth``, ``zookeeper_ca_file`` (the ZooKeeper store),
``records_url``, ``records_table`` (the KeeperMap store), ``zk_root`` and
``session_timeout`` (both stores).

Giving an option of the store not in use is refused, naming both. The session timeout's
default is the node store's own (``coordinator.plumbing.nodes.SESSION_TIMEOUT``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from coordinator.plumbing.auth import DigestAuth, hosts_problem
from coordinator.plumbing.nodes import SESSION_TIMEOUT as DEFAULT_SESSION_TIMEOUT
from coordinator.plumbing.paths import DEFAULT_ROOT, check_root
from server_ext.sharding import shown_url, url_problem
from txsink.options.connection_options import CREDENTIAL_VARIABLES
from txsink.options.parse_util import OptionError, given, numbers, require_file
from txsink.options.target_name import name_problem

#: Where the coordinator's records live: ZooKeeper (or Keeper) through kazoo, or KeeperMap
#: tables of a ClickHouse the sink writes to (``coordinator/plumbing/keepermap/``).
ZOOKEEPER, KEEPERMAP = "zookeeper", "keepermap"
STORES = (ZOOKEEPER, KEEPERMAP)
DEFAULT_RECORDS_TABLE = "txsink.records"
DEFAULT_ZK_ROOT = DEFAULT_ROOT
#: options that name one store only: giving them with the other store names both
STORE_OPTIONS = {ZOOKEEPER: ("zookeeper", "zookeeper_auth", "zookeeper_ca_file"),
                 KEEPERMAP: ("records_url", "records_table")}
#: Bounds of the option ``session_timeout`` (seconds); a ZooKeeper server may narrow
#: them further (its minSessionTimeout .. maxSessionTimeout).
MIN_SESSION_TIMEOUT, MAX_SESSION_TIMEOUT = 2.0, 600.0

OPTION_NAMES = ("coordinator", "zookeeper", "zookeeper_auth", "zookeeper_ca_file",
                "records_url", "records_table", "zk_root", "session_timeout")


@dataclass(frozen=True)
class StoreOptions:
    """Where and how the coordinator keeps the sink's records."""

    zookeeper: str = ""  # hosts[/chroot]; "" with coordinator=keepermap
    zookeeper_auth: str | None = field(default=None, repr=False)  # user:password (digest)
    zookeeper_ca_file: str | None = None  # set: ZooKeeper over TLS, verified with this CA
    zk_root: str = DEFAULT_ZK_ROOT
    # seconds a dead writer's sessions (leases, liveness holders) outlive it in the node store
    session_timeout: float = DEFAULT_SESSION_TIMEOUT
    coordinator: str = ZOOKEEPER  # where the coordinator's records live: one of STORES
    records_url: str | None = None  # keepermap: the server of the records table (else url)
    records_table: str = DEFAULT_RECORDS_TABLE  # keepermap: database.table of the records

    def __repr__(self) -> str:
        return (f"StoreOptions(coordinator={self.coordinator!r}, zookeeper={self.zookeeper!r}, "
                f"zookeeper_auth={'***' if self.zookeeper_auth else None}, "
                f"zookeeper_ca_file={self.zookeeper_ca_file!r}, zk_root={self.zk_root!r}, "
                f"session_timeout={self.session_timeout!r}, records_url={self.records_url!r}, "
                f"records_table={self.records_table!r})")

    @property
    def root_identity(self) -> str:
        """The coordinator root this sink's xids live under (see :func:`root_identity`);
        with the KeeperMap store, the records table's name before ``zk_root``."""
        if self.coordinator == KEEPERMAP:
            return f"/keepermap/{self.records_table}{root_identity('', self.zk_root)}"
        return root_identity(self.zookeeper, self.zk_root)


def root_identity(zookeeper: str, zk_root: str) -> str:
    """The absolute znode path of a coordinator root: the connection's chroot + ``zk_root``.

    Staging table names carry a hash of it so that ``txsink gc`` of one root never judges
    another root's staging. The host list is left out (the same ensemble may be named by
    different host lists); ``127.0.0.1:2181/prod`` with ``/txsink`` and ``127.0.0.1:2181``
    with ``/prod/txsink`` are the same znodes and so the same root. The chroot is split
    off as kazoo does (everything from the first ``/``).
    """
    chroot = zookeeper.partition("/")[2]
    parts = [p for p in f"{chroot}/{zk_root}".split("/") if p]
    return "/" + "/".join(parts)


def check_coordinator(values: dict[str, object]) -> str:
    """The ``coordinator`` option, checked: one store, and no option of the other one."""
    raw = str(values.get("coordinator", ZOOKEEPER)).strip().lower()
    named = [s for s in STORES if s in raw]
    if len(named) > 1:
        raise OptionError(f"option coordinator={raw!r} names both stores; the records live in "
                          f"one: {ZOOKEEPER} (the default) or {KEEPERMAP}")
    if raw not in STORES:
        raise OptionError(f"option coordinator={raw!r} is not one of {', '.join(STORES)}")
    other = KEEPERMAP if raw == ZOOKEEPER else ZOOKEEPER
    named_other = [n for n in STORE_OPTIONS[other] if values.get(n)]
    if named_other:
        raise OptionError(
            f"option coordinator={raw} keeps the records in {raw}, but option(s) "
            f"{', '.join(named_other)} name the {other} store: give the options of one store "
            f"({', '.join(STORE_OPTIONS[raw])})")
    values["coordinator"] = raw
    if raw == KEEPERMAP:
        problem = name_problem("records_table",
                               str(values.get("records_table", DEFAULT_RECORDS_TABLE)))
        if problem:
            raise OptionError(problem)
        url = values.get("records_url")
        if url is not None and (not str(url).startswith(("http://", "https://"))
                                or url_problem(str(url))):
            raise OptionError(f"option records_url must be an http(s):// URL without "
                              f"credentials or a query string, got {shown_url(str(url))}")
        values.setdefault("zookeeper", "")
    return raw


def parse(values: dict[str, object]) -> StoreOptions:
    """These options of ``values`` (``coordinator`` checked by :func:`check_coordinator`,
    credentials from the environment already in it), checked."""
    problem = hosts_problem(str(values["zookeeper"]))
    if problem:
        raise OptionError(f"option zookeeper {problem}")
    if values.get("zookeeper_auth"):
        try:
            DigestAuth.parse(str(values["zookeeper_auth"]))
        except ValueError as exc:
            raise OptionError(f"option zookeeper_auth (or {CREDENTIAL_VARIABLES['zookeeper_auth']})"
                              f" cannot be used: {exc}") from None
    numbers(values, (("session_timeout", float, MIN_SESSION_TIMEOUT, MAX_SESSION_TIMEOUT),))
    require_file("option zookeeper_ca_file", values.get("zookeeper_ca_file"))
    try:
        check_root(str(values.get("zk_root", DEFAULT_ZK_ROOT)), "option zk_root")
    except ValueError as exc:
        raise OptionError(str(exc)) from None
    return StoreOptions(**given(values, OPTION_NAMES))  # type: ignore[arg-type]
