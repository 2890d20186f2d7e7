"""server_ext: the ClickHouse side of txsink (client, SQL text, capabilities, schema, encoder,
writer, staging, seal, publish, rollback, sweeper). Knows nothing about Spark or ZooKeeper."""

from server_ext.capabilities import (
    STRATEGIES,
    Capabilities,
    Strategy,
    choose_strategy,
    detect_capabilities,
)
from server_ext.chdb_client import ChdbClient
from server_ext.client import ClickHouseClient
from server_ext.encoder import (
    arrow_stream_chunks,
    encode_column,
    encode_native_block,
    to_arrow_stream_batch,
)
from server_ext.errors import (
    ClickHouseError,
    InDoubtPublish,
    InvalidValue,
    PartitionLimitExceeded,
    PartsDeduplicated,
    PublishError,
    SchemaMismatch,
    ServerUnreachable,
    StagingChanged,
)
from server_ext.ledger import Ledger, MemoryLedger, resolve_partition
from server_ext.manifest import Manifest, PartitionManifest, StagedPart
from server_ext.overwrite import publish_overwrite
from server_ext.prepare import checked_batch, prepare_batch
from server_ext.publish import publish
from server_ext.publish_steps import PUBLISH_STEPS, PublishReport
from server_ext.schema import (
    Column,
    TargetTable,
    check_arrow_schema,
    check_batch,
    describe_table,
)
from server_ext.seal import (
    StagedRowsMismatch,
    digested,
    read_staged_tables,
    seal,
    staged_digests,
)
from server_ext.sharding import (
    Shard,
    ShardingError,
    ShardLayout,
    ShardRouter,
    layout_from_distributed,
    layout_from_urls,
    parse_shard_urls,
)
from server_ext.sql import qualified_name, quote_identifier, split_table_name, sql_string
from server_ext.staging import (
    STAGING_DATABASE,
    StagingName,
    UnsupportedTarget,
    branch_key,
    create_staging,
    parse_staging_table_name,
    rollback,
    staging_table_name,
)
from server_ext.staging import sink_key as staging_sink_key
from server_ext.sweeper import sweep
from server_ext.views import ViewNode, ViewProblem
from server_ext.writer import BranchWriter

__all__ = [
    # data path
    "STRATEGIES",
    "BranchWriter",
    "Capabilities",
    "ChdbClient",
    "ClickHouseClient",
    "ClickHouseError",
    "Column",
    "InvalidValue",
    "PartitionLimitExceeded",
    "SchemaMismatch",
    "ServerUnreachable",
    "Strategy",
    "TargetTable",
    "ViewNode",
    "ViewProblem",
    "arrow_stream_chunks",
    "check_arrow_schema",
    "checked_batch",
    "prepare_batch",
    "check_batch",
    "choose_strategy",
    "describe_table",
    "detect_capabilities",
    "encode_column",
    "encode_native_block",
    "qualified_name",
    "quote_identifier",
    "split_table_name",
    "sql_string",
    "to_arrow_stream_batch",
    # two-phase commit
    "STAGING_DATABASE",
    "PUBLISH_STEPS",
    "InDoubtPublish",
    "Ledger",
    "Manifest",
    "MemoryLedger",
    "PartitionManifest",
    "PartsDeduplicated",
    "PublishError",
    "PublishReport",
    "StagedPart",
    "StagedRowsMismatch",
    "StagingChanged",
    "StagingName",
    "UnsupportedTarget",
    "branch_key",
    "create_staging",
    "parse_staging_table_name",
    "publish",
    "publish_overwrite",
    "resolve_partition",
    "rollback",
    "read_staged_tables",
    "seal",
    "staged_digests",
    "digested",
    "staging_sink_key",
    "staging_table_name",
    "sweep",
    # sharding
    "Shard",
    "ShardLayout",
    "ShardRouter",
    "ShardingError",
    "layout_from_distributed",
    "layout_from_urls",
    "parse_shard_urls",
]
