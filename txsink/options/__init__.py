"""The sink's options: parsed once into a :class:`SinkOptions`, checked strictly.

``sink_options`` parses every option (unknown ones by name) into one record per family,
each family parsed and checked by its own module: ``connection_options``,
``store_options``, ``table_options`` (the target's set-up), ``distributed_options``,
``bad_rows_options``, ``publish_options``, ``transaction_options``; beside them
``insert_settings`` and ``target_name``. Importing this package imports no server client.
"""

from txsink.options.bad_rows_options import BadRowsOptions
from txsink.options.connection_options import (
    CREDENTIAL_VARIABLES,
    ConnectionOptions,
    credentials_from,
)
from txsink.options.distributed_options import DistributedOptions
from txsink.options.parse_util import OptionError, require_file
from txsink.options.publish_options import INLINE, PIPELINED, PUBLISH_CHOICES, PublishOptions
from txsink.options.sink_options import SinkOptions, parse_options
from txsink.options.store_options import (
    DEFAULT_RECORDS_TABLE,
    KEEPERMAP,
    STORE_OPTIONS,
    ZOOKEEPER,
    StoreOptions,
    root_identity,
)
from txsink.options.table_options import TargetOptions
from txsink.options.transaction_options import (
    TX_EPOCH,
    TX_GENERATION,
    TX_SINK_ID,
    TransactionOptions,
    is_one_off,
)

#: The CA file the operator CLI reaches ZooKeeper over TLS with (the sink's option
#: ``zookeeper_ca_file``); not a credential, but set beside them.
ZOOKEEPER_CA_FILE_VARIABLE = "TXSINK_ZOOKEEPER_CA_FILE"

__all__ = ["CREDENTIAL_VARIABLES", "DEFAULT_RECORDS_TABLE", "INLINE", "KEEPERMAP", "PIPELINED",
           "PUBLISH_CHOICES", "STORE_OPTIONS",
           "TX_EPOCH", "TX_GENERATION", "TX_SINK_ID", "ZOOKEEPER", "ZOOKEEPER_CA_FILE_VARIABLE",
           "BadRowsOptions", "ConnectionOptions", "DistributedOptions", "OptionError",
           "PublishOptions", "SinkOptions", "StoreOptions", "TargetOptions",
           "TransactionOptions", "credentials_from", "is_one_off", "parse_options",
           "require_file", "root_identity"]
