"""Tables the sink creates or reads the shape of: a missing target and its columns, a
Distributed table over shards, the materialized-view tree, the quarantine table, the
coordinator's records table."""

from server_ext.ddl.create_distributed import cluster_shape, database_exists, distributed_table_sql
from server_ext.ddl.create_table import (
    DEFAULT_ENGINE,
    TableShape,
    TypeNotMapped,
    add_column,
    column_type,
    column_types,
    creatable_engine_problem,
    create_table,
    engine_name,
    expression_problem,
    type_families,
)
from server_ext.ddl.quarantine_table import (
    REPLICA_MACROS,
    KeptRows,
    ensure_quarantine_table,
    find_quarantine_table,
    quarantine_records,
    quarantine_schema_problem,
)
from server_ext.ddl.records_table import KeeperMapTable
from server_ext.ddl.views import ViewNode, ViewProblem, discover, staging_view_ddl, tree_problem

__all__ = [
    "DEFAULT_ENGINE",
    "TableShape",
    "TypeNotMapped",
    "add_column",
    "column_type",
    "column_types",
    "creatable_engine_problem",
    "create_table",
    "engine_name",
    "expression_problem",
    "type_families",
    "cluster_shape",
    "database_exists",
    "distributed_table_sql",
    "ViewNode",
    "ViewProblem",
    "discover",
    "staging_view_ddl",
    "tree_problem",
    "REPLICA_MACROS",
    "KeptRows",
    "ensure_quarantine_table",
    "find_quarantine_table",
    "quarantine_records",
    "quarantine_schema_problem",
    "KeeperMapTable",
]
