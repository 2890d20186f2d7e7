"""The old-server wing's key probe: the probe rows of a key's columns, and an expression
key 18.16 computes otherwise than chdb (``toInt32(-8) % 70001``) refused by name."""

from __future__ import annotations

import pyarrow as pa
import pytest

from server_ext.client.http_client import ClickHouseClient
from server_ext.errors import ShardingError
from server_ext.old_server.key_probe import probe_sql, probe_values
from server_ext.sharding import ShardRouter
from tests.server_ext.test_sharding import two_shards


@pytest.mark.parametrize("key,types", [("id % 70001", {"id": "Int32"}),
                                       ("toInt32(-8) % 70001", {})],
                         ids=["column", "constant"])
def test_expression_key_the_server_computes_otherwise_is_refused_naming_both_values(
        client: ClickHouseClient, key: str, types: dict[str, str]) -> None:
    batch = pa.record_batch({"id": pa.array([-8, 8], pa.int64())})
    with pytest.raises(ShardingError, match=r"gives \d+ \(Int32\) on the server and -\d+ "):
        ShardRouter(two_shards(key, [1, 2]), batch.schema, types, server=client)


def test_probe_rows_cover_every_probed_column_and_each_value_of_the_longest() -> None:
    sql = probe_sql("cityHash64(a, b)", {"a": "Nullable(Int8)", "b": "LowCardinality(String)"})
    assert sql is not None
    assert sql.count("UNION ALL") == len(probe_values("Int8")) - 1
    assert all(value in sql for value in probe_values("String"))


def test_a_key_on_a_column_of_a_type_without_probe_values_is_not_probed() -> None:
    assert probe_values("Array(Int32)") is None
    assert probe_sql("cityHash64(a, b)", {"a": "Int32", "b": "Array(Int32)"}) is None
