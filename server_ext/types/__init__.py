"""Column types and values: the target table as described, whether an Arrow schema and
each value fit it, content digests of stored rows, and the encoding of rows into an
ArrowStream body (the Native encoder of servers without one is in ``server_ext.old_server``)."""

from server_ext.types.arrow_schema import check_arrow_schema, type_problem
from server_ext.types.bad_values import BadRows
from server_ext.types.chtypes import ChType
from server_ext.types.digest import MODULUS, ContentDigest, digest_union
from server_ext.types.nested import flatten_schema
from server_ext.types.prepare import checked_batch, prepare_batch
from server_ext.types.row_checks import check_batch
from server_ext.types.target_table import Column, TargetTable, definitions, describe_table

__all__ = [
    "ChType",
    "Column",
    "TargetTable",
    "describe_table",
    "definitions",
    "check_arrow_schema",
    "type_problem",
    "check_batch",
    "checked_batch",
    "prepare_batch",
    "BadRows",
    "flatten_schema",
    "MODULUS",
    "ContentDigest",
    "digest_union",
]
