"""Options of the ``clickhouse_tx`` data source, parsed once and checked strictly.

Spark hands a data source its options as a case-insensitive map of strings. A typo in an
option name would otherwise be silently ignored, so unknown names are an error that
names them. Credentials come from the options or from the environment
(``TXSINK_CLICKHOUSE_USER`` / ``TXSINK_CLICKHOUSE_PASSWORD``) and never appear in
``repr`` or errors.
"""

from __future__ import annotations

import math
import os
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Literal

from coordinator.plumbing.auth import DigestAuth, hosts_problem
from coordinator.plumbing.nodes import SESSION_TIMEOUT as DEFAULT_SESSION_TIMEOUT
from coordinator.plumbing.paths import check_root
from server_ext.client import ENCODINGS, header_problem
from server_ext.publish import STRATEGIES as server_strategies
from server_ext.publish import Strategy
from server_ext.sharding import (
    ShardingError,
    parse_shard_urls,
    shown_url,
    url_problem,
)
from server_ext.staging import DEFAULT_LIMIT as DEFAULT_PARTITION_LIMIT
from txsink.options import bad_rows_options, distributed_options, insert_settings, table_options
from txsink.options.sink_ids import stream_sink_id_of_checkpoint
from txsink.options.target_name import name_problem

AUTO = "auto"  # the strategy option's default: the server picks (capabilities.choose_strategy)
STRATEGIES = (AUTO, *server_strategies)
REPLICA_CHOICES = ("round_robin", "random")
#: Bounds of the option ``session_timeout`` (seconds); a ZooKeeper server may narrow
#: them further (its minSessionTimeout .. maxSessionTimeout).
MIN_SESSION_TIMEOUT, MAX_SESSION_TIMEOUT = 2.0, 600.0
#: The option ``retention`` (seconds): finished xids older than this are folded into the
#: sink's summary and removed by the writers; 0 keeps them for ever.
DEFAULT_RETENTION, MAX_RETENTION = 3600.0, 10 * 365 * 86_400.0
#: What happens to the materialized views the target feeds: staged and published with
#: the target's rows (``server_ext.ddl.views``), or left without them (logged at WARNING).
VIEW_CHOICES = ("stage", "ignore")

#: Options Spark itself may add to a write; accepted and ignored unless used.
SPARK_OPTIONS = frozenset({"path", "checkpointlocation", "queryname"})

#: Internal options set by :func:`txsink.transaction` to join its xid.
TX_SINK_ID = "txsink.tx.sink_id"
TX_EPOCH = "txsink.tx.epoch"
TX_GENERATION = "txsink.tx.generation"


#: Where the coordinator's records live: ZooKeeper (or Keeper) through kazoo, or KeeperMap
#: tables of a ClickHouse the sink writes to (``coordinator/plumbing/keepermap/``).
ZOOKEEPER, KEEPERMAP = "zookeeper", "keepermap"
STORES = (ZOOKEEPER, KEEPERMAP)
DEFAULT_RECORDS_TABLE = "txsink.records"
#: options that name one store only: giving them with the other store names both
STORE_OPTIONS = {ZOOKEEPER: ("zookeeper", "zookeeper_auth", "zookeeper_ca_file"),
                 KEEPERMAP: ("records_url", "records_table")}


#: The option ``publish``: a streaming epoch's publish runs before its commit returns
#: (inline), or in the background while the next micro-batch runs (pipelined).
INLINE = "inline"
PIPELINED = "pipelined"
PUBLISH_CHOICES = (PIPELINED, INLINE)
#: The option ``carry_max_bytes``'s bound: one task's rows in one commit message.
MAX_CARRY_BYTES = 64 << 20


class OptionError(ValueError):
    """An option is missing, unknown or has a value that cannot be used."""


@dataclass(frozen=True)
class SinkOptions:
    """Everything a writer needs to reach ClickHouse and ZooKeeper, validated."""

    url: str
    table: str
    zookeeper: str  # "" with coordinator=keepermap
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    zookeeper_auth: str | None = field(default=None, repr=False)  # user:password (digest)
    sink_id: str | None = None
    zk_root: str = "/txsink"
    strategy: Strategy | Literal["auto"] = AUTO
    insert_block_rows: int = 1_048_576
    timeout: float = 30.0
    retries: int = 5
    # seconds a dead writer's sessions (leases, liveness holders) outlive it in the node store
    session_timeout: float = DEFAULT_SESSION_TIMEOUT
    checkpoint_location: str | None = None
    recover_on_start: bool = True
    shards: str | None = None
    sharding_key: str | None = None
    replica_choice: str = "round_robin"
    txn_version: int | None = None
    compression: str | None = None  # Content-Encoding of the INSERT bodies (None: none)
    ca_file: str | None = None  # CA bundle that https:// servers are verified against
    zookeeper_ca_file: str | None = None  # set: ZooKeeper over TLS, verified with this CA
    insert_settings: tuple[tuple[str, str], ...] = ()  # settings.<name> options
    materialized_views: str = "stage"  # one of VIEW_CHOICES
    # partitions one write's rows may span (server_ext.staging.partition_bound); 0: no bound
    max_partitions_per_job: int = DEFAULT_PARTITION_LIMIT
    # seconds a finished xid's records stay before the writers fold and remove them
    # (coordinator/upkeep/retention.py); 0: kept for ever
    retention: float = DEFAULT_RETENTION
    coordinator: str = ZOOKEEPER  # where the coordinator's records live: one of STORES
    records_url: str | None = None  # keepermap: the server of the records table (else url)
    records_table: str = DEFAULT_RECORDS_TABLE  # keepermap: database.table of the records
    # the target made to fit the data (options/table_options.py, write/target_setup.py)
    create_table: str = "never"  # or "if_missing"
    schema_evolution: str = "none"  # or "add_columns"
    engine: str = "MergeTree"  # a created table's engine clause
    order_by: str | None = None  # a created table's sorting key (None: tuple())
    partition_by: str | None = None  # a created table's partition key (None: none)
    # a Distributed table created above the local tables (txsink/options/distributed_options.py)
    distributed_table: str | None = None  # database.table, on the url server
    cluster: str | None = None  # its cluster, from the servers' remote_servers
    # what a value that does not fit its column does (txsink/options/bad_rows_options.py)
    bad_rows: str = "fail"  # or "quarantine"
    quarantine_table: str | None = None  # database.table of the quarantined rows
    max_bad_rows: int = bad_rows_options.DEFAULT_MAX_BAD_ROWS  # per write (xid)
    # streaming: an epoch's publish after its decision (inline) or in the background
    # while the next micro-batch runs (pipelined, txsink/core/pipeline.py)
    publish: str = "inline"  # one of PUBLISH_CHOICES
    #: a task whose rows take at most this many Arrow bytes carries them to the driver in
    #: its commit message instead of staging them (``txsink.core.carried_rows``); 0: never
    carry_max_bytes: int = 0
    tx_epoch: int | None = None
    tx_generation: int | None = None

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.repr
        )
        return (f"SinkOptions({shown}, password={'***' if self.password else None}, "
                f"zookeeper_auth={'***' if self.zookeeper_auth else None})")

    def with_table(self, table: str) -> SinkOptions:
        return replace(self, table=table)

    @property
    def root_identity(self) -> str:
        """The coordinator root this sink's xids live under (see :func:`root_identity`);
        with the KeeperMap store, the records table's name before ``zk_root``."""
        if self.coordinator == KEEPERMAP:
            return f"/keepermap/{self.records_table}{root_identity('', self.zk_root)}"
        return root_identity(self.zookeeper, self.zk_root)

    @property
    def records_server(self) -> str:
        """The ClickHouse whose KeeperMap table holds the records (``coordinator=keepermap``)."""
        return self.records_url or self.url

    def in_transaction(self) -> bool:
        return self.tx_epoch is not None

    def resolved_sink_id(self, streaming: bool) -> str:
        """The sink id: the option, else (streaming) one derived from the checkpoint.

        A streaming query keeps its checkpoint across restarts, so the derived id is
        stable; a batch job without ``sink_id`` gets a fresh one (each job is its own
        writer).
        """
        if self.sink_id:
            return self.sink_id
        if streaming:
            if not self.checkpoint_location:
                raise OptionError("streaming writes need sink_id or a checkpointLocation")
            return stream_sink_id_of_checkpoint(self.checkpoint_location)
        return f"batch-{uuid.uuid4().hex[:16]}"


ONE_OFF_SINK = re.compile(r"^batch-[0-9a-f]{16}$")  # what resolved_sink_id gives a batch job


def is_one_off(sink_id: str) -> bool:
    """Whether ``sink_id`` is a one-off batch job's (written once, never again)."""
    return ONE_OFF_SINK.match(sink_id) is not None


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


#: The options users set (documented in docs/usage.md).
PUBLIC_OPTIONS = (
    "url", "table", "zookeeper", "user", "password", "zookeeper_auth", "sink_id", "zk_root",
    "strategy", "insert_block_rows", "timeout", "retries", "session_timeout",
    "recover_on_start", "shards",
    "sharding_key", "replica_choice", "txn_version", "compression", "ca_file",
    "zookeeper_ca_file", "materialized_views", "max_partitions_per_job", "retention",
    "coordinator", "records_url", "records_table", "publish", "carry_max_bytes",
    *table_options.OPTION_NAMES,
    *distributed_options.OPTION_NAMES, *bad_rows_options.OPTION_NAMES,
)

_NAMES = {
    **{name: name for name in PUBLIC_OPTIONS},
    "checkpointlocation": "checkpoint_location",
    TX_EPOCH: "tx_epoch",
    TX_GENERATION: "tx_generation",
    TX_SINK_ID: "sink_id",
}


#: The environment variables the sink and the CLI take ClickHouse credentials from.
CREDENTIAL_VARIABLES = {"user": "TXSINK_CLICKHOUSE_USER",
                        "password": "TXSINK_CLICKHOUSE_PASSWORD",
                        "zookeeper_auth": "TXSINK_ZOOKEEPER_AUTH"}


#: The CA file the operator CLI reaches ZooKeeper over TLS with (the sink's option
#: ``zookeeper_ca_file``); not a credential, but set beside them.
ZOOKEEPER_CA_FILE_VARIABLE = "TXSINK_ZOOKEEPER_CA_FILE"


def require_file(label: str, path: object) -> None:
    """Refuse ``label=path`` unless ``path`` is unset or names a file (a CA bundle that
    is missing would otherwise fail only at the first TLS handshake)."""
    if path and not os.path.isfile(str(path)):
        raise OptionError(f"{label}={path!r} is not a readable file")


def credentials_from(env: Mapping[str, str]) -> dict[str, str]:
    """``user``/``password``/``zookeeper_auth`` from the credential variables of ``env``
    (unset or empty: absent)."""
    return {name: env[var] for name, var in CREDENTIAL_VARIABLES.items() if env.get(var)}


def _number(name: str, raw: str, kind: type, minimum: float,
            maximum: float = 2**63 - 1) -> int | float:
    """``raw`` as ``kind``, finite and within [minimum, maximum] (nan compares false with
    everything, so it is refused by name here, not deep inside a request)."""
    try:
        value = kind(raw)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise OptionError(f"option {name}={raw!r} is not {what}") from None
    if not math.isfinite(value):
        raise OptionError(f"option {name}={raw!r} must be a finite number")
    if value < minimum:
        raise OptionError(f"option {name}={raw!r} must be at least {minimum}")
    if value > maximum:
        raise OptionError(f"option {name}={raw!r} must be at most {maximum}")
    return value


def _store(values: dict[str, object]) -> str:
    """The ``coordinator`` option, checked: one store, and no option of the other one."""
    raw = str(values.get("coordinator", ZOOKEEPER)).strip().lower()
    named = [s for s in STORES if s in raw]
    if len(named) > 1:
        raise OptionError(f"option coordinator={raw!r} names both stores; the records live in "
                          f"one: {ZOOKEEPER} (the default) or {KEEPERMAP}")
    if raw not in STORES:
        raise OptionError(f"option coordinator={raw!r} is not one of {', '.join(STORES)}")
    other = KEEPERMAP if raw == ZOOKEEPER else ZOOKEEPER
    given = [n for n in STORE_OPTIONS[other] if values.get(n)]
    if given:
        raise OptionError(
            f"option coordinator={raw} keeps the records in {raw}, but option(s) "
            f"{', '.join(given)} name the {other} store: give the options of one store "
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
    return raw


def parse_options(
    raw: Mapping[str, str], env: Mapping[str, str] | None = None, *, require_table: bool = True
) -> SinkOptions:
    """Validate a Spark option map into :class:`SinkOptions`.

    ``require_table=False`` is for a multi-table transaction, whose tables come per write.
    """
    env = os.environ if env is None else env
    given = {str(k).lower(): str(v) for k, v in raw.items()}
    unknown = sorted(k for k in given if k not in _NAMES and k not in SPARK_OPTIONS
                     and not k.startswith(insert_settings.PREFIX))
    if unknown:
        raise OptionError(
            f"unknown option(s): {', '.join(unknown)} (known: {', '.join(PUBLIC_OPTIONS)}, "
            "settings.<name>)"
        )
    values: dict[str, object] = {_NAMES[k]: v for k, v in given.items() if k in _NAMES}
    try:
        values["insert_settings"] = insert_settings.parse(given)
    except insert_settings.SettingRefused as exc:
        raise OptionError(str(exc)) from None
    store = _store(values)
    try:
        table_options.check(values)
        distributed_options.check(values)
        bad_rows_options.check(values)
    except ValueError as exc:
        raise OptionError(str(exc)) from None
    required = ("url", "table", "zookeeper") if require_table else ("url", "zookeeper")
    if store == KEEPERMAP:
        required = tuple(n for n in required if n != "zookeeper")
        values.setdefault("zookeeper", "")
    missing = [n for n in required if not values.get(n)]
    if missing:
        raise OptionError(f"missing required option(s): {', '.join(missing)}")
    problem = name_problem("table", str(values["table"]), database=False) \
        if values.get("table") else None
    if problem:
        raise OptionError(problem)
    problem = hosts_problem(str(values["zookeeper"]))
    if problem:
        raise OptionError(f"option zookeeper {problem}")
    url = str(values["url"])
    if not url.startswith(("http://", "https://")):
        raise OptionError(f"option url must start with http:// or https://, got "
                          f"{shown_url(url)}")
    problem = url_problem(url)  # before any request: a query string may hold a password
    if problem:
        raise OptionError(f"option url: {problem}")
    strategy = str(values.get("strategy", "auto"))
    if strategy not in STRATEGIES:
        raise OptionError(f"option strategy={strategy!r} is not one of {', '.join(STRATEGIES)}")
    values["strategy"] = strategy if strategy == AUTO else Strategy(strategy)
    for name, value in credentials_from(env).items():
        values.setdefault(name, value)
    for name in ("user", "password"):
        problem = header_problem(values.get(name))  # type: ignore[arg-type]
        if problem:
            raise OptionError(f"option {name} (or {CREDENTIAL_VARIABLES[name]}) cannot "
                              f"be used: {problem}")
    if values.get("zookeeper_auth"):
        try:
            DigestAuth.parse(str(values["zookeeper_auth"]))
        except ValueError as exc:
            raise OptionError(f"option zookeeper_auth (or {CREDENTIAL_VARIABLES['zookeeper_auth']})"
                              f" cannot be used: {exc}") from None
    for name, kind, minimum, maximum in (
        ("insert_block_rows", int, 1, 2**31 - 1), ("timeout", float, 0.1, 86_400),
        ("retries", int, 0, 1_000),
        ("session_timeout", float, MIN_SESSION_TIMEOUT, MAX_SESSION_TIMEOUT),
        ("tx_epoch", int, 0, 2**63 - 1),
        ("tx_generation", int, 0, 2**31 - 1), ("txn_version", int, 0, 2**63 - 1),
        ("max_partitions_per_job", int, 0, 2**31 - 1),
        ("retention", float, 0.0, MAX_RETENTION),
        ("carry_max_bytes", int, 0, MAX_CARRY_BYTES),
    ):
        if name in values:
            values[name] = _number(name, str(values[name]), kind, minimum, maximum)
    if "recover_on_start" in values:
        flag = str(values["recover_on_start"]).lower()
        if flag not in ("true", "false"):
            raise OptionError(f"option recover_on_start={flag!r} must be true or false")
        values["recover_on_start"] = flag == "true"
    choice = str(values.get("replica_choice", "round_robin")).lower()
    if choice not in REPLICA_CHOICES:
        raise OptionError(
            f"option replica_choice={choice!r} is not one of {', '.join(REPLICA_CHOICES)}")
    values["replica_choice"] = choice
    publish = str(values.get("publish", INLINE)).lower()
    if publish not in PUBLISH_CHOICES:
        raise OptionError(f"option publish={publish!r} is not one of "
                          f"{', '.join(PUBLISH_CHOICES)}")
    values["publish"] = publish
    views = str(values.get("materialized_views", "stage")).lower()
    if views not in VIEW_CHOICES:
        raise OptionError(f"option materialized_views={views!r} is not one of "
                          f"{', '.join(VIEW_CHOICES)}")
    values["materialized_views"] = views
    compression = str(values.get("compression") or "none").lower()
    if compression not in ("none", *ENCODINGS):
        raise OptionError(f"option compression={compression!r} is not one of none, "
                          f"{', '.join(ENCODINGS)}")
    values["compression"] = None if compression == "none" else compression
    for name in ("ca_file", "zookeeper_ca_file"):
        require_file(f"option {name}", values.get(name))
    if "shards" in values:
        try:
            parse_shard_urls(str(values["shards"]))
        except ShardingError as exc:
            raise OptionError(f"option shards: {exc}") from None
    if "txn_version" in values and not values.get("sink_id"):
        raise OptionError("option txn_version needs sink_id: the pair (sink_id, txn_version) "
                          "names the job's data across reruns")
    try:
        check_root(str(values.get("zk_root", "/txsink")), "option zk_root")
    except ValueError as exc:
        raise OptionError(str(exc)) from None
    values.setdefault("table", "")
    return SinkOptions(**values)  # type: ignore[arg-type]
