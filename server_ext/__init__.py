"""server_ext: the ClickHouse side of txsink. Knows nothing about Spark or the coordinator's store.

Folders, one job each: ``client/`` (talking to a server), ``types/`` (the target's columns
and whether values fit them, encoding), ``staging/`` (a branch's staging table up to its
seal), ``publish/`` (making sealed branches visible exactly once), ``ddl/`` (tables the
sink creates or reads the shape of), ``sharding/`` (shard layouts and row routing),
``old_server/`` (what only ClickHouse 18.16 needs, chosen in ``capabilities``); at the
top ``sql`` (SQL text and quoting), ``errors``, ``capabilities`` (what a server can do) and
``target_rows`` (a target's rows per partition for ``txsink verify``). This module
re-exports the names a write's path uses most; the rest are public in their folder.
"""

from server_ext.capabilities import Capabilities, detect_capabilities
from server_ext.client import ChdbClient, ClickHouseClient
from server_ext.errors import ClickHouseError, SchemaMismatch, ServerUnreachable, StagingChanged
from server_ext.publish import choose_strategy
from server_ext.staging import (
    STAGING_DATABASE,
    BranchWriter,
    Manifest,
    PartitionManifest,
    UnsupportedTarget,
    create_staging_table,
    digested,
    read_staged_tables,
    rollback,
    seal,
    staged_digests,
    staging_table_name,
)
from server_ext.types import TargetTable, check_arrow_schema, checked_batch, describe_table

__all__ = [
    "STAGING_DATABASE",
    "BranchWriter",
    "Capabilities",
    "ChdbClient",
    "ClickHouseClient",
    "ClickHouseError",
    "Manifest",
    "PartitionManifest",
    "SchemaMismatch",
    "ServerUnreachable",
    "StagingChanged",
    "TargetTable",
    "UnsupportedTarget",
    "check_arrow_schema",
    "checked_batch",
    "choose_strategy",
    "create_staging_table",
    "describe_table",
    "detect_capabilities",
    "digested",
    "read_staged_tables",
    "rollback",
    "seal",
    "staged_digests",
    "staging_table_name",
]
