"""A partition's content digest (``server_ext.types.digest``) is taken of every column type each
server has, and stays the same however the rows are split into parts or rewritten.

The digests are taken on the real servers: which types ``cityHash64`` takes, and what it
does with a NULL, differ between 18.16 and 26.x.
"""

from __future__ import annotations

import pytest

from server_ext.capabilities import row_hash_argument
from server_ext.client.http_client import ClickHouseClient
from server_ext.types.digest import ContentDigest, digest_union, partition_digests
from server_ext.types.target_table import describe_table
from tests.conftest import run_sql

# (column type, a value, another value) per server; NULL where the type takes one
COMMON = [
    ("UInt64", "1", "2"), ("Int8", "-1", "1"), ("Float64", "1.5", "2.5"),
    ("String", "'a'", "''"), ("FixedString(3)", "'ab'", "'abc'"), ("Date", "'2026-01-01'",
                                                                   "'2026-01-02'"),
    ("DateTime", "'2026-01-01 00:00:00'", "'2026-01-01 00:00:01'"),
    ("Enum8('a' = 1, 'b' = 2)", "'a'", "'b'"), ("Decimal(10, 2)", "1.5", "1.25"),
    ("UUID", "'61f0c404-5cb3-11e7-907b-a6006ad3dba0'", "'61f0c404-5cb3-11e7-907b-a6006ad3dba1'"),
    ("Nullable(String)", "NULL", "''"), ("Nullable(Decimal(10, 2))", "NULL", "0"),
    ("Array(Nullable(String))", "[NULL]", "['']"),
    ("Array(Array(Nullable(UInt8)))", "[[1, NULL]]", "[[1, 0]]"),
    ("Tuple(Nullable(UInt8), String)", "(NULL, 'a')", "(0, 'a')"),
    ("LowCardinality(Nullable(String))", "NULL", "'x'"),
]
MODERN = [
    ("Map(String, Nullable(UInt8))", "map('k', NULL)", "map('k', 0)"),
    ("JSON", "'{\"a\": 1}'", "'{\"a\": 2}'"), ("Dynamic", "NULL", "1"),
    ("Variant(UInt8, String)", "NULL", "'x'"), ("Int256", "5", "6"), ("IPv6", "'::1'", "'::2'"),
    ("DateTime64(3)", "'2026-01-01 00:00:00.001'", "'2026-01-01 00:00:00.002'"),
    ("Bool", "true", "false"), ("Date32", "'1900-01-01'", "'1900-01-02'"),
]
LOW_CARDINALITY = "allow_experimental_low_cardinality_type=1"  # 18.16 asks for it


def creating_url(server: str, url: str) -> str:
    return f"{url}/?{LOW_CARDINALITY}" if server == "ch18" else url


def digests_of(client: ClickHouseClient, table: str) -> dict[str, ContentDigest]:
    database, name = table.split(".")
    target = describe_table(client, table)
    columns = [(c.name, c.type) for c in target.columns]
    return partition_digests(client, database, name, columns, row_hash_argument(client),
                             purpose="test")


@pytest.fixture
def typed_table(server: str, server_url: str, server_db: str) -> str:
    """Row p (partition p) differs from the last row only in column p; two parts each."""
    types = COMMON + (MODERN if server == "ch26" else [])
    columns = ", ".join(f"c{i} {t}" for i, (t, _, _) in enumerate(types))
    url = creating_url(server, server_url)
    run_sql(url, f"CREATE TABLE `{server_db}`.`t` (p UInt8, {columns}) ENGINE = MergeTree "
                 "PARTITION BY p ORDER BY p")
    rows = [", ".join(other if j == i else first for j, (_, first, other) in enumerate(types))
            for i in range(len(types) + 1)]
    for _ in range(2):
        run_sql(url, f"INSERT INTO `{server_db}`.`t` VALUES "
                     + ", ".join(f"({p}, {values})" for p, values in enumerate(rows)))
    return f"{server_db}.t"


def test_every_column_type_is_digested_and_each_value_changes_the_digest(
        server_url: str, typed_table: str) -> None:
    found = digests_of(ClickHouseClient(server_url), typed_table)
    partitions = int(run_sql(server_url, f"SELECT uniqExact(p) FROM {typed_table}"))
    assert len(found) == partitions and {d.rows for d in found.values()} == {2}
    # a NULL is not its type's default, and no column is left out of the hash
    assert len({d.sum for d in found.values()}) == partitions


def test_the_digest_is_the_same_after_a_merge_and_after_a_rewrite(
        server: str, server_url: str, typed_table: str) -> None:
    client = ClickHouseClient(server_url)
    before = digests_of(client, typed_table)
    copy = typed_table + "_copy"
    run_sql(creating_url(server, server_url), f"CREATE TABLE {copy} AS {typed_table}")
    run_sql(server_url, f"INSERT INTO {copy} SELECT * FROM {typed_table}")
    run_sql(server_url, f"OPTIMIZE TABLE {typed_table} FINAL")
    assert digests_of(client, typed_table) == before == digests_of(client, copy)


def test_digests_of_different_schemes_do_not_combine() -> None:
    assert digest_union([ContentDigest(1, 5, "a"), ContentDigest(2, 2**64 - 1, "a")]) == \
        ContentDigest(3, 4, "a")
    assert digest_union([ContentDigest(1, 5, "a"), ContentDigest(1, 5, "b")]) is None
    assert digest_union([ContentDigest(1, 5, "a"), None]) is None
