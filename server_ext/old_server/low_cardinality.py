"""The setting 18.16 needs to create a table with a LowCardinality column.

ClickHouse 18.16 creates such a table only with ``allow_experimental_low_cardinality_type``;
newer servers know the setting as obsolete, or not at all. Staging tables (and their
preflight twins, ``server_ext.staging.staging_tables``) are created with ``ddl_settings``.
"""

from __future__ import annotations

from server_ext.capabilities import known_settings
from server_ext.client.client_protocol import SqlClient
from server_ext.types.target_table import TargetTable

LOW_CARDINALITY_SETTING = "allow_experimental_low_cardinality_type"


def ddl_settings(client: SqlClient, target: TargetTable) -> dict[str, object] | None:
    """Settings a staging table of ``target`` needs to be created: the LowCardinality one
    where the target has such a column and the server knows the setting."""
    if not any("LowCardinality" in column.type for column in target.columns):
        return None
    if LOW_CARDINALITY_SETTING not in known_settings(client, (LOW_CARDINALITY_SETTING,)):
        return None
    return {LOW_CARDINALITY_SETTING: 1}
