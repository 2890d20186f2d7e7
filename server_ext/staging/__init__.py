"""A branch's staging table: its name and creation, the rows written into it within the
bounds of one write, its seal and manifest, its rollback and sweep."""

from server_ext.staging.manifest import Manifest, PartitionManifest, StagedPart
from server_ext.staging.partition_bound import (
    DEFAULT_LIMIT,
    PartitionCounter,
    check_partition_bound,
    partition_bound_settings,
)
from server_ext.staging.seal import (
    StagedRowsMismatch,
    digested,
    expire_rows,
    read_staged_partitions,
    read_staged_tables,
    seal,
    staged_digests,
)
from server_ext.staging.staging_tables import (
    STAGING_DATABASE,
    StagingName,
    UnsupportedTarget,
    create_staging_table,
    merges_at_insert,
    parse_staging_table_name,
    publish_problem,
    rollback,
    root_tag,
    sink_key,
    staging_qualified,
    staging_table_name,
)
from server_ext.staging.sweeper import staging_tables, sweep
from server_ext.staging.writer import DEFAULT_BLOCK_ROWS, BranchWriter

__all__ = [
    "STAGING_DATABASE",
    "StagingName",
    "UnsupportedTarget",
    "create_staging_table",
    "merges_at_insert",
    "parse_staging_table_name",
    "publish_problem",
    "rollback",
    "root_tag",
    "sink_key",
    "staging_qualified",
    "staging_table_name",
    "BranchWriter",
    "DEFAULT_BLOCK_ROWS",
    "StagedRowsMismatch",
    "digested",
    "expire_rows",
    "read_staged_partitions",
    "read_staged_tables",
    "seal",
    "staged_digests",
    "Manifest",
    "PartitionManifest",
    "StagedPart",
    "DEFAULT_LIMIT",
    "PartitionCounter",
    "check_partition_bound",
    "partition_bound_settings",
    "staging_tables",
    "sweep",
]
