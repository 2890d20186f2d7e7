"""The sink's options: parsed once into a :class:`SinkOptions`, checked strictly.

``sink_options`` parses and checks every option (unknown ones by name); the other modules
each own one family (``bad_rows``, ``distributed``, ``table``, ``insert_settings``,
``target_name``). Importing this package imports no server client.
"""

from txsink.options.sink_options import (
    CREDENTIAL_VARIABLES,
    DEFAULT_RECORDS_TABLE,
    INLINE,
    KEEPERMAP,
    PIPELINED,
    PUBLISH_CHOICES,
    STORE_OPTIONS,
    TX_EPOCH,
    TX_GENERATION,
    TX_SINK_ID,
    ZOOKEEPER,
    ZOOKEEPER_CA_FILE_VARIABLE,
    OptionError,
    SinkOptions,
    credentials_from,
    is_one_off,
    parse_options,
    require_file,
    root_identity,
)

__all__ = ["CREDENTIAL_VARIABLES", "DEFAULT_RECORDS_TABLE", "INLINE", "KEEPERMAP", "PIPELINED",
           "PUBLISH_CHOICES", "STORE_OPTIONS",
           "TX_EPOCH", "TX_GENERATION", "TX_SINK_ID", "ZOOKEEPER", "ZOOKEEPER_CA_FILE_VARIABLE",
           "OptionError", "SinkOptions", "credentials_from", "is_one_off", "parse_options",
           "require_file", "root_identity"]
