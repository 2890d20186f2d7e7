"""Options of the ``clickhouse_tx`` data source, parsed once and checked strictly.

Spark hands a data source its options as a case-insensitive map of strings. A typo in an
option name would otherwise be silently ignored, so unknown names are an error that
names them. A :class:`SinkOptions` holds the ``table`` and one frozen record per family
of options, each parsed by its own module: ``connection`` (connection_options.py),
``store`` (store_options.py), ``target`` (table_options.py), ``distributed``
(distributed_options.py), ``bad_rows`` (bad_rows_options.py), ``publish``
(publish_options.py) and ``transaction`` (transaction_options.py). Credentials come from
the options or from the environment (``TXSINK_CLICKHOUSE_USER`` /
``TXSINK_CLICKHOUSE_PASSWORD``) and never appear in ``repr`` or errors.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from txsink.options import (
    bad_rows_options,
    connection_options,
    distributed_options,
    insert_settings,
    publish_options,
    store_options,
    table_options,
    transaction_options,
)
from txsink.options.bad_rows_options import BadRowsOptions
from txsink.options.connection_options import (
    CREDENTIAL_VARIABLES,
    ConnectionOptions,
    credentials_from,
)
from txsink.options.distributed_options import DistributedOptions
from txsink.options.parse_util import OptionError
from txsink.options.publish_options import PublishOptions
from txsink.options.store_options import KEEPERMAP, StoreOptions
from txsink.options.table_options import TargetOptions
from txsink.options.target_name import name_problem
from txsink.options.transaction_options import (
    TX_EPOCH,
    TX_GENERATION,
    TX_SINK_ID,
    TransactionOptions,
)

#: Options Spark itself may add to a write; accepted and ignored unless used.
SPARK_OPTIONS = frozenset({"path", "checkpointlocation", "queryname"})


@dataclass(frozen=True)
class SinkOptions:
    """Everything a writer needs to reach ClickHouse and its coordinator's store, validated:
    the target ``table`` and one record per family of options."""

    connection: ConnectionOptions
    table: str
    store: StoreOptions = field(default_factory=StoreOptions)
    target: TargetOptions = field(default_factory=TargetOptions)
    distributed: DistributedOptions = field(default_factory=DistributedOptions)
    bad_rows: BadRowsOptions = field(default_factory=BadRowsOptions)
    publish: PublishOptions = field(default_factory=PublishOptions)
    transaction: TransactionOptions = field(default_factory=TransactionOptions)

    def with_table(self, table: str) -> SinkOptions:
        return replace(self, table=table)

    @property
    def records_server(self) -> str:
        """The ClickHouse whose KeeperMap table holds the records (``coordinator=keepermap``)."""
        return self.store.records_url or self.connection.url


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
    settings = connection_options.parse_settings(given)
    store = store_options.check_coordinator(values)
    try:
        target = table_options.parse(values)
        distributed = distributed_options.parse(values)
        bad_rows = bad_rows_options.parse(values)
    except ValueError as exc:
        raise OptionError(str(exc)) from None
    required = ("url", "table", "zookeeper") if require_table else ("url", "zookeeper")
    if store == KEEPERMAP:
        required = tuple(n for n in required if n != "zookeeper")
    missing = [n for n in required if not values.get(n)]
    if missing:
        raise OptionError(f"missing required option(s): {', '.join(missing)}")
    problem = name_problem("table", str(values["table"]), database=False) \
        if values.get("table") else None
    if problem:
        raise OptionError(problem)
    for name, value in credentials_from(env).items():
        values.setdefault(name, value)
    return SinkOptions(
        connection=connection_options.parse(values, settings),
        table=str(values.get("table", "")),
        store=store_options.parse(values),
        target=target, distributed=distributed, bad_rows=bad_rows,
        publish=publish_options.parse(values),
        transaction=transaction_options.parse(values))


__all__ = ["CREDENTIAL_VARIABLES", "PUBLIC_OPTIONS", "SPARK_OPTIONS", "OptionError",
           "SinkOptions", "parse_options"]
