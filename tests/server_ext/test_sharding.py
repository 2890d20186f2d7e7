"""Shard layout discovery and row routing (server_ext.sharding).

Parity is judged by the real 18.16 server: it evaluates the sharding key over the same
values and picks the shard with ``key % total_weight`` against the cumulative weights,
making the key unsigned the way its ``Distributed`` insert does (Int8..Int32 through
UInt32, Int64 through UInt64; checked once by inserting through a Distributed table over
three shards with weights [1, 2, 4]). One test inserts through a real Distributed table
over the two-shard ``txsink_cluster``.
"""

from __future__ import annotations

import sys
import uuid

import numpy as np
import pyarrow as pa
import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server_ext.client.http_client import ClickHouseClient
from server_ext.sharding import (
    Shard,
    ShardingError,
    ShardLayout,
    ShardRouter,
    engine_arguments,
    layout_from_distributed,
    layout_from_urls,
    parse_shard_urls,
    shown_url,
)
from server_ext.sql import qualified_name, sql_string
from server_ext.types.chtypes import INTEGER_TYPES
from tests.conftest import run_sql
from tests.harness.services import Cluster

CLUSTER = "txsink_cluster"
SMALL_SIGNED = ("Int8", "Int16", "Int32")


def two_shards(key: str | None, weights: list[int] | None = None,
               table: str = "db.events") -> ShardLayout:
    weights = weights or [1, 1]
    urls = [[f"http://shard{i}:8123"] for i in range(len(weights))]
    return layout_from_urls(urls, table, key, weights)


def shard_of_rows(parts: dict[int, pa.RecordBatch], column: str = "i") -> dict[int, int]:
    """Row id -> shard index, from a split."""
    return {row: shard for shard, part in parts.items() for row in part.column(column).to_pylist()}


def sql_list(values: list) -> str:
    return "[" + ", ".join(sql_string(str(v)) for v in values) + "]"


def server_shards(client: ClickHouseClient, columns: dict[str, tuple[str, list]], key: str,
                  weights: list[int]) -> dict[int, int]:
    """Row id -> shard, as the 18.16 server computes it for ``key`` over typed columns.

    Values travel as strings and are parsed by the server into the given types.
    """
    n = len(next(iter(columns.values()))[1])
    typed = ", ".join(
        f"CAST(arrayElement({sql_list(values)}, i + 1), '{ch_type}') AS {name}"
        for name, (ch_type, values) in columns.items()
    )
    unsigned = (f"multiIf(toTypeName(k) IN {SMALL_SIGNED}, toUInt64(toUInt32(k)), "
                "toUInt64(k))")
    rows = client.query_rows(
        f"SELECT i, {shard_by_cumulative_weight('r', weights)} AS shard FROM ("
        f"SELECT i, {unsigned} % {sum(weights)} AS r FROM ("
        f"SELECT i, {key} AS k FROM (SELECT arrayJoin(range({n})) AS i, {typed})))",
        purpose="server shard of each row",
    )
    return {int(row["i"]): int(row["shard"]) for row in rows}


def shard_by_cumulative_weight(remainder: str, weights: list[int]) -> str:
    """SQL: the shard whose cumulative-weight range holds ``remainder`` (18.16 lambdas
    cannot capture columns, so: how many shards' ranges end at or before it)."""
    ends = [int(c) for c in np.cumsum(weights)[:-1]]
    return " + ".join(f"({remainder} >= {end})" for end in ends) or "0"


def arrow_batch(columns: dict[str, tuple[str, list]], arrow_types: dict[str, pa.DataType]
                ) -> pa.RecordBatch:
    n = len(next(iter(columns.values()))[1])
    arrays = {"i": pa.array(range(n), pa.int64())}
    for name, (_, values) in columns.items():
        arrays[name] = pa.array(values, arrow_types[name])
    return pa.record_batch(arrays)


ARROW_OF = {name: pa.from_numpy_dtype(np.dtype(dtype)) for name, (dtype, _, _) in
            INTEGER_TYPES.items()}


# -- shard URL option ---------------------------------------------------------------------


def test_parse_shard_urls_splits_shards_by_semicolon_and_replicas_by_comma() -> None:
    assert parse_shard_urls("http://a:8123,http://b:8123;http://c:8123,http://d:8123") == [
        ["http://a:8123", "http://b:8123"], ["http://c:8123", "http://d:8123"]]


def test_parse_shard_urls_ignores_whitespace_around_parts() -> None:
    assert parse_shard_urls(" https://a:8443 ; http://c:8123 , http://d ") == [
        ["https://a:8443"], ["http://c:8123", "http://d"]]


@pytest.mark.parametrize(("text", "named"), [
    ("", "empty"),
    ("http://a:8123;;http://b:8123", "shard 2"),
    ("http://a:8123;http://b:8123,", "replica 2 of shard 2"),
    ("ftp://a:21", "shard 1, replica 1"),
    ("a:8123", "shard 1, replica 1"),
    ("http://a:8123;http://b:port", "shard 2, replica 1"),
    ("http://a:8123/?user=x", "query"),
])
def test_parse_shard_urls_rejects_a_bad_part_naming_it(text: str, named: str) -> None:
    with pytest.raises(ShardingError, match=named):
        parse_shard_urls(text)


def test_parse_shard_urls_never_echoes_credentials() -> None:
    with pytest.raises(ShardingError) as info:
        parse_shard_urls("http://a:8123;http://admin:hunter2@b:8123")
    assert "hunter2" not in str(info.value) and "admin" not in str(info.value)
    assert "shard 2, replica 1" in str(info.value) and "credentials" in str(info.value)


@pytest.mark.parametrize("url", [
    "http://admin:hun/ter2@b:8123",  # a password with a slash: parsed as a path
    "http://admin:8123/hunter2@b:8123",
    "http://admin:hun?ter2@b:8123",
    "http://admin:hun#ter2@b:8123",
    "http://b:8123;password=hunter2",
    "http://b:8123/?user=admin@corp&password=hunter2",
])
def test_a_malformed_url_with_a_secret_is_refused_and_never_echoed(url: str) -> None:
    with pytest.raises(ShardingError) as info:
        parse_shard_urls(f"http://a:8123;{url}")
    assert "hunter2" not in str(info.value) and ", replica 1: " in str(info.value)
    assert "ter2" not in shown_url(url)


def test_parse_shard_urls_rejects_a_server_given_twice() -> None:
    with pytest.raises(ShardingError, match="given twice.*shard 1.*shard 2"):
        parse_shard_urls("http://a:8123;http://a:8123")


def test_sharding_errors_are_value_errors() -> None:
    assert issubclass(ShardingError, ValueError)


# -- layouts by hand ---------------------------------------------------------------------------


def test_layout_from_urls_defaults_weights_to_one_and_normalises_the_table() -> None:
    layout = layout_from_urls([["http://a:1"], ["http://b:1", "http://c:1"]], "events", "id")
    assert layout.shards == (Shard(0, 1, ("http://a:1",)),
                             Shard(1, 1, ("http://b:1", "http://c:1")))
    assert (layout.local_table, layout.sharding_key) == ("default.events", "id")


def test_layout_slots_give_each_shard_weight_consecutive_slots() -> None:
    layout = two_shards("id", [1, 2])
    assert (layout.total_weight, layout.slots) == (3, (0, 1, 1))


@pytest.mark.parametrize(("weights", "message"), [
    ([1], "1 weight"),
    ([1, 0], "weight 0"),
])
def test_layout_from_urls_rejects_bad_weights(weights: list[int], message: str) -> None:
    with pytest.raises(ShardingError, match=message):
        layout_from_urls([["http://a:1"], ["http://b:1"]], "db.t", "id", weights)


# -- Distributed definitions on the 18.16 server ----------------------------------------------


def test_engine_arguments_keep_commas_and_parentheses_inside_quotes_and_calls() -> None:
    text = ("Distributed(`my,cluster`, 'd\\'b', \"t\", "
            "if(a > 0, intHash64(a), cityHash64(concat(s, ',)'))) % 3)")
    assert engine_arguments(text) == [
        "`my,cluster`", "'d\\'b'", '"t"',
        "if(a > 0, intHash64(a), cityHash64(concat(s, ',)'))) % 3"]


@pytest.fixture
def cluster_name(client: ClickHouseClient) -> str:
    """txsink_cluster if the server knows it, else any cluster it has."""
    names = [row["cluster"] for row in client.query_rows(
        "SELECT DISTINCT cluster FROM system.clusters", purpose="list clusters")]
    if not names:
        pytest.skip("the test server has no cluster in system.clusters")
    return CLUSTER if CLUSTER in names else names[0]


@pytest.fixture
def cluster_rows(client: ClickHouseClient, cluster_name: str) -> list[dict]:
    return client.query_rows(
        "SELECT shard_num, shard_weight, replica_num, host_name FROM system.clusters "
        f"WHERE cluster = '{cluster_name}' ORDER BY shard_num, replica_num", purpose="cluster")


def create_distributed(client: ClickHouseClient, db: str, name: str, args: str) -> str:
    client.execute(f"CREATE TABLE IF NOT EXISTS {qualified_name(db, 'local')} "
                   "(id Int64, name String) ENGINE = MergeTree() ORDER BY id", purpose="local")
    client.execute(f"CREATE TABLE {qualified_name(db, name)} AS {qualified_name(db, 'local')} "
                   f"ENGINE = Distributed({args})", purpose="create distributed")
    return f"{db}.{name}"


def shape_urls(rows: list[dict]) -> list[list[str]]:
    shards: dict[int, list[str]] = {}
    for row in rows:
        shards.setdefault(int(row["shard_num"]), []).append(
            f"http://s{row['shard_num']}r{row['replica_num']}:8123")
    return list(shards.values())


def test_layout_from_distributed_reads_cluster_weights_table_and_key(
        client: ClickHouseClient, ch_db: str, cluster_name: str, cluster_rows: list[dict]
) -> None:
    table = create_distributed(client, ch_db, "dist",
                               f"{cluster_name}, {ch_db}, local, cityHash64(name, id) % 5")
    urls = shape_urls(cluster_rows)
    layout = layout_from_distributed(client, table, http_urls=urls)
    assert layout.local_table == f"{ch_db}.local"
    assert layout.sharding_key == "cityHash64(name, id) % 5"
    assert [list(shard.replicas) for shard in layout.shards] == urls
    weights = {int(r["shard_num"]): int(r["shard_weight"]) for r in cluster_rows}
    assert [shard.weight for shard in layout.shards] == list(weights.values())


def test_layout_from_distributed_reads_quoted_and_backquoted_names(
        client: ClickHouseClient, ch_db: str, cluster_name: str, cluster_rows: list[dict]
) -> None:
    client.execute(f"CREATE TABLE {qualified_name(ch_db, 'lo,cal')} (id Int64, name String) "
                   "ENGINE = MergeTree() ORDER BY id", purpose="local")
    table = create_distributed(
        client, ch_db, "we'ird", f"`{cluster_name}`, '{ch_db}', `lo,cal`, "
        "if(id > 0, intHash64(id), cityHash64(concat(name, ',)')))")
    layout = layout_from_distributed(client, table, http_urls=shape_urls(cluster_rows))
    assert layout.local_table == f"{ch_db}.`lo,cal`"
    assert layout.sharding_key == "if(id > 0, intHash64(id), cityHash64(concat(name, ',)')))"


def test_layout_from_distributed_without_key_has_none(
        client: ClickHouseClient, ch_db: str, cluster_name: str, cluster_rows: list[dict]
) -> None:
    table = create_distributed(client, ch_db, "dist", f"'{cluster_name}', {ch_db}, 'local'")
    layout = layout_from_distributed(client, table, http_urls=shape_urls(cluster_rows))
    assert layout.sharding_key is None


def test_layout_from_distributed_refuses_http_port_when_replicas_share_a_host(
        client: ClickHouseClient, ch_db: str, cluster_name: str, cluster_rows: list[dict]
) -> None:
    if len({row["host_name"] for row in cluster_rows}) == len(cluster_rows):
        pytest.skip(f"the replicas of {cluster_name} have hosts of their own")
    table = create_distributed(client, ch_db, "dist", f"{cluster_name}, {ch_db}, local, id")
    with pytest.raises(ShardingError, match="share a host.*give http_urls"):
        layout_from_distributed(client, table, http_port=8123)


def test_layout_from_distributed_rejects_http_urls_of_the_wrong_shape(
        client: ClickHouseClient, ch_db: str, cluster_name: str, cluster_rows: list[dict]
) -> None:
    table = create_distributed(client, ch_db, "dist", f"{cluster_name}, {ch_db}, local, id")
    urls = shape_urls(cluster_rows)
    with pytest.raises(ShardingError, match="http_urls has"):
        layout_from_distributed(client, table, http_urls=[*urls, ["http://extra:8123"]])
    with pytest.raises(ShardingError, match="http_urls or their http_port"):
        layout_from_distributed(client, table)


def test_layout_from_distributed_refuses_current_database(
        client: ClickHouseClient, ch_db: str, cluster_name: str) -> None:
    table = create_distributed(client, ch_db, "dist",
                               f"{cluster_name}, currentDatabase(), local, id")
    with pytest.raises(ShardingError, match="currentDatabase"):
        layout_from_distributed(client, table, http_port=8123)


def test_layout_from_distributed_refuses_an_empty_database_without_default_database(
        client: ClickHouseClient, ch_db: str, cluster_name: str, cluster_rows: list[dict]
) -> None:
    defaults = client.query_rows(f"SELECT DISTINCT default_database FROM system.clusters "
                                 f"WHERE cluster = '{cluster_name}'", purpose="defaults")
    if [row["default_database"] for row in defaults] != [""]:
        pytest.skip(f"{cluster_name} sets <default_database>")
    table = create_distributed(client, ch_db, "dist", f"{cluster_name}, '', local, id")
    with pytest.raises(ShardingError, match="names no database"):
        layout_from_distributed(client, table, http_port=8123)


def test_layout_from_distributed_refuses_a_table_that_is_not_distributed(
        client: ClickHouseClient, ch_db: str) -> None:
    client.execute(f"CREATE TABLE {qualified_name(ch_db, 'plain')} (id Int64) "
                   "ENGINE = MergeTree() ORDER BY id", purpose="plain")
    with pytest.raises(ShardingError, match="MergeTree table, not a Distributed"):
        layout_from_distributed(client, f"{ch_db}.plain", http_port=8123)


class RecordedServer:
    """Answers layout queries with rows a real 18.16 server gave for a cluster whose
    replicas set <default_database> (s0/s1/s2 or all 'shared'), weights [1, 2, 4]."""

    url = "http://recorded:8123"

    def __init__(self, engine_full: str, defaults: list[str]) -> None:
        self.engine_full = engine_full
        self.defaults = defaults

    def query_rows(self, sql: str, *, purpose: str, settings: dict | None = None
                   ) -> list[dict]:
        if "system.tables" in sql:
            return [{"engine": "Distributed", "engine_full": self.engine_full}]
        return [
            {"shard_num": i + 1, "shard_weight": w, "replica_num": 1, "host_name": f"ch{i}",
             "host_address": f"10.0.0.{i}", "port": 9000, "default_database": d}
            for i, (w, d) in enumerate(zip([1, 2, 4], self.defaults, strict=True))
        ]


def test_layout_from_distributed_resolves_an_empty_database_to_the_replicas_default() -> None:
    server = RecordedServer("Distributed(probe, '', l, i64)", ["shared"] * 3)
    layout = layout_from_distributed(server, "x.d1", http_port=8123)
    assert (layout.local_table, [s.weight for s in layout.shards]) == ("shared.l", [1, 2, 4])


def test_layout_from_distributed_builds_urls_from_host_names_and_http_port() -> None:
    server = RecordedServer("Distributed(probe, shared, l, i64)", [""] * 3)
    layout = layout_from_distributed(server, "x.d1", http_port=18123)
    assert [shard.replicas for shard in layout.shards] == [
        ("http://ch0:18123",), ("http://ch1:18123",), ("http://ch2:18123",)]


def test_layout_from_distributed_refuses_replicas_with_different_default_databases() -> None:
    server = RecordedServer("Distributed(probe, '', l, i64)", ["s0", "s1", "s2"])
    with pytest.raises(ShardingError, match="'s0', 's1', 's2'"):
        layout_from_distributed(server, "x.d1", http_port=8123)


# -- routing parity: integer columns ----------------------------------------------------------


def integer_case(draw: st.DrawFn) -> tuple[str, list[int], list[int]]:
    ch_type = draw(st.sampled_from(sorted(INTEGER_TYPES)))
    _, low, high = INTEGER_TYPES[ch_type]
    edges = st.sampled_from([low, high, 0, -1 if low < 0 else 1, low + 1, high - 1])
    values = draw(st.lists(st.one_of(st.integers(low, high), edges), min_size=1, max_size=60))
    weights = draw(st.lists(st.integers(1, 5), min_size=2, max_size=4))
    return ch_type, values, weights


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=st.composite(integer_case)())
def test_integer_column_key_matches_the_server_for_every_integer_type(
        client: ClickHouseClient, case: tuple[str, list[int], list[int]]) -> None:
    ch_type, values, weights = case
    columns = {"k": (ch_type, values)}
    batch = arrow_batch(columns, {"k": ARROW_OF[ch_type]})
    router = ShardRouter(two_shards("k", weights), batch.schema)
    assert shard_of_rows(router.split(batch)) == server_shards(client, columns, "k", weights)


def test_negative_int32_key_wraps_through_uint32_not_uint64() -> None:
    # 18.16 put Int32 -1 with weights [3, 4] on shard 1: 4294967295 % 7 = 3 (UInt64: 1).
    batch = pa.record_batch({"i": pa.array([0]), "k": pa.array([-1], pa.int32())})
    router = ShardRouter(two_shards("k", [3, 4]), batch.schema)
    assert list(router.split(batch)) == [1]


def test_rows_with_a_null_key_are_the_keyless_ones_named_with_their_column() -> None:
    batch = pa.record_batch({"i": pa.array([0, 1, 2, 3]),
                             "k": pa.array([5, None, 7, None], pa.int64())})
    router = ShardRouter(two_shards("k"), batch.schema)
    bad = router.keyless(batch)
    assert bad is not None and bad.rows.tolist() == [1, 3] and bad.columns == ("k", "k")
    assert bad.reasons[0] == "null in sharding key k: a null key has no shard"
    assert router.keyless(batch.slice(0, 1)) is None  # every row has a shard


def test_column_types_override_the_arrow_type_of_an_integer_key(
        client: ClickHouseClient) -> None:
    values = [-1, -7, 5, -2**31, 2**31 - 1]
    batch = arrow_batch({"k": ("Int64", values)}, {"k": pa.int64()})
    router = ShardRouter(two_shards("k", [3, 4]), batch.schema, {"k": "Int32"})
    expected = server_shards(client, {"k": ("Int32", values)}, "k", [3, 4])
    assert shard_of_rows(router.split(batch)) == expected


# -- routing parity: expressions evaluated by chdb -------------------------------------------

NAMES = ["", "a", "Zürich", "x" * 17, "y" * 33, "long-" * 40, "tab\there", "it's", "👍"]
IDS = [0, 1, -1, 7, -8, 2**31 - 1, -(2**31), 2**62, -(2**63), 2**63 - 1, 123456789]


@pytest.mark.parametrize("key", [
    "cityHash64(name)", "cityHash64(name, id)", "intHash64(id)", "intHash32(id)",
    "sipHash64(name)", "halfMD5(name)", "murmurHash2_32(name)", "id % 3",
    "if(id > 0, intHash64(id), cityHash64(name))",
])
@pytest.mark.parametrize("weights", [[1, 2], [2, 3, 5]])
def test_expression_key_matches_the_server(client: ClickHouseClient, key: str,
                                           weights: list[int]) -> None:
    ids = IDS * 2
    names = (NAMES * 3)[:len(ids)]
    columns = {"id": ("Int64", ids), "name": ("String", names)}
    batch = arrow_batch(columns, {"id": pa.int64(), "name": pa.string()})
    router = ShardRouter(two_shards(key, weights), batch.schema, server=client)
    assert shard_of_rows(router.split(batch)) == server_shards(client, columns, key, weights)


def test_expression_key_with_a_function_the_server_lacks_is_refused_naming_it(
        client: ClickHouseClient) -> None:
    batch = pa.record_batch({"id": pa.array([1], pa.int64())})
    with pytest.raises(ShardingError, match="the server cannot evaluate sharding key "
                                            "xxHash64"):
        ShardRouter(two_shards("xxHash64(id)", [1, 2]), batch.schema, {"id": "Int64"},
                    server=client)


def test_expression_key_sees_the_servers_column_types(client: ClickHouseClient) -> None:
    ids = IDS[:7]
    batch = arrow_batch({"id": ("Int64", ids)}, {"id": pa.int64()})
    router = ShardRouter(two_shards("cityHash64(id)", [1, 1, 1]), batch.schema, {"id": "Int32"})
    expected = server_shards(client, {"id": ("Int32", ids)}, "cityHash64(id)", [1, 1, 1])
    assert shard_of_rows(router.split(batch)) == expected


def test_expression_key_keeps_row_order_on_a_large_batch(client: ClickHouseClient) -> None:
    n = 200_000
    batch = pa.record_batch({"i": pa.array(np.arange(n, dtype=np.int64))})
    router = ShardRouter(two_shards("intHash64(i)", [2, 3]), batch.schema)
    got = np.zeros(n, dtype=np.int64)
    for shard, part in router.split(batch).items():
        got[part.column("i").to_numpy()] = shard
    shard = shard_by_cumulative_weight("intHash64(number) % 5", [2, 3])
    text = run_sql(client.url, f"SELECT {shard} FROM system.numbers LIMIT {n}")
    assert np.array_equal(got, np.array(text.split(), dtype=np.int64))


def test_constant_key_is_made_unsigned_at_its_own_width() -> None:
    # 18.16 put every row of key toInt16(-1) with weights [1, 2, 4] on shard 1: 65535 % 7 = 1.
    batch = pa.record_batch({"i": pa.array([0, 1])})
    router = ShardRouter(two_shards("toInt16(-1)", [1, 2, 4]), batch.schema)
    assert {shard: part.num_rows for shard, part in router.split(batch).items()} == {1: 2}


def chdb_values(sql: str) -> list[str]:
    from server_ext.client.chdb_client import ChdbClient

    return [row["v"] for row in ChdbClient.for_process().query_rows(sql, purpose="chdb hash")]


@pytest.mark.parametrize("function", [
    "cityHash64", "intHash64", "intHash32", "sipHash64", "halfMD5", "metroHash64",
    "murmurHash2_32"])
def test_hash_functions_agree_between_the_18_16_server_and_chdb(
        client: ClickHouseClient, function: str) -> None:
    args = ["toInt64(-5)", "toUInt64(42)", "toInt32(-1)"]
    if function not in ("intHash64", "intHash32"):
        args += ["'abc'", "''", "'Zürich'", f"'{'z' * 70}'"]
    sql = " UNION ALL ".join(f"SELECT toString({function}({a})) AS v" for a in args)
    server = [row["v"] for row in client.query_rows(
        f"SELECT v FROM ({sql}) ORDER BY v", purpose="server hash")]
    assert sorted(chdb_values(sql)) == server


def test_xxhash64_in_chdb_gives_the_reference_xxh64_values() -> None:
    # 18.16 has no xxHash64; these are the reference XXH64 (seed 0) digests.
    # UNION ALL keeps no order (its parts may run at once)
    assert sorted(chdb_values("SELECT toString(xxHash64('')) AS v UNION ALL "
                              "SELECT toString(xxHash64('abc')) AS v")) == sorted([
        str(0xEF46DB3751D8E999), str(0x44BC2CF5AD770999)])


def test_farmhash64_differs_between_18_16_and_chdb(client: ClickHouseClient) -> None:
    # A known limit (see the module docstring): do not shard an 18.16 cluster by farmHash64.
    server = client.query_value("SELECT toString(farmHash64('abc'))", purpose="farmHash64")
    assert chdb_values("SELECT toString(farmHash64('abc')) AS v") != [server]


# -- rows that may go to any shard -------------------------------------------------------------


def test_rand_key_cuts_a_batch_into_contiguous_weighted_slices() -> None:
    batch = pa.record_batch({"i": pa.array(range(3000))})
    parts = ShardRouter(two_shards("rand()", [1, 2]), batch.schema).split(batch)
    assert {shard: part.num_rows for shard, part in parts.items()} == {0: 1000, 1: 2000}
    assert parts[0].column("i").to_pylist() == list(range(1000))
    assert parts[1].column("i").to_pylist() == list(range(1000, 3000))


def test_rand_key_spreads_small_batches_by_weight() -> None:
    router = ShardRouter(two_shards("rand()", [1, 2, 3]), pa.schema([("i", pa.int64())]))
    totals = [0, 0, 0]
    for _ in range(600):
        for shard, part in router.split(pa.record_batch({"i": pa.array([0])})).items():
            totals[shard] += part.num_rows
    assert totals == [100, 200, 300]


def test_no_key_with_one_shard_sends_every_row_to_it() -> None:
    layout = layout_from_urls([["http://a:8123"]], "db.t", None)
    batch = pa.record_batch({"i": pa.array(range(5))})
    assert ShardRouter(layout, batch.schema).split(batch) == {0: batch}


def test_split_of_an_empty_batch_has_no_shard() -> None:
    batch = pa.record_batch({"i": pa.array([], pa.int64())})
    assert ShardRouter(two_shards("i"), batch.schema).split(batch) == {}


def test_split_keeps_row_order_within_a_shard_and_omits_empty_shards() -> None:
    batch = pa.record_batch({"i": pa.array([4, 2, 8, 6, 0], pa.uint8())})
    parts = ShardRouter(two_shards("i", [1, 1, 1, 1]), batch.schema).split(batch)
    assert {shard: part.column("i").to_pylist() for shard, part in parts.items()} == {
        0: [4, 8, 0], 2: [2, 6]}


# -- key errors ----------------------------------------------------------------------------------


def test_missing_key_column_is_named() -> None:
    schema = pa.schema([("id", pa.int64())])
    with pytest.raises(ShardingError, match="`user_id`, which the data does not have"):
        ShardRouter(two_shards("user_id"), schema)
    with pytest.raises(ShardingError, match="uses `user_id`, which is not a column"):
        ShardRouter(two_shards("cityHash64(user_id)"), schema)


@pytest.mark.parametrize(("key", "types", "found"), [
    ("toString(id)", None, "String"),
    ("score", None, "double"),
    ("id", {"id": "Nullable(Int64)"}, "Nullable"),
    ("cityHash64(id)", {"id": "Nullable(Int64)"}, "Nullable"),
    ("toFloat64(id)", None, "Float64"),
])
def test_key_that_is_not_an_integer_is_rejected(key: str, types: dict | None,
                                                found: str) -> None:
    schema = pa.schema([("id", pa.int64()), ("score", pa.float64())])
    with pytest.raises(ShardingError, match=f"{found}.*not an integer type"):
        ShardRouter(two_shards(key), schema, types)


def test_null_in_a_key_column_is_rejected_naming_the_row() -> None:
    batch = pa.record_batch({"id": pa.array([1, None, 3], pa.int64())})
    for key in ("id", "intHash64(id)"):
        with pytest.raises(ShardingError, match="`id`.*null in row 1"):
            ShardRouter(two_shards(key), batch.schema).split(batch)


def test_expression_key_without_chdb_says_to_install_it_or_use_an_integer_column(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "chdb", None)  # import chdb now raises ImportError
    with pytest.raises(ShardingError, match="pip install chdb.*bare integer column"):
        ShardRouter(two_shards("cityHash64(name)"), pa.schema([("name", pa.string())]))


# -- a real Distributed insert on the cluster ---------------------------------------------------


def test_router_matches_rows_inserted_through_a_distributed_table(
        cluster: Cluster, cluster_db: str) -> None:
    local = f"`{cluster_db}`.`events`"
    for server in cluster.servers:
        run_sql(server.url, f"CREATE TABLE {local} (i Int64, name String) "
                            "ENGINE = MergeTree() ORDER BY i")
    main = cluster.main.url
    run_sql(main, f"CREATE TABLE {local} (i Int64, name String) ENGINE = MergeTree() ORDER BY i")
    run_sql(main, f"CREATE TABLE `{cluster_db}`.`dist` AS {local} ENGINE = "
                  f"Distributed({CLUSTER}, {cluster_db}, events, cityHash64(name))")
    names = [f"user-{uuid.uuid4().hex[:i % 20]}" for i in range(400)]
    body = "".join(f"{i}\t{name}\n" for i, name in enumerate(names)).encode()
    resp = requests.post(main, params={"query": f"INSERT INTO `{cluster_db}`.`dist` FORMAT TSV",
                                       "insert_distributed_sync": "1"}, data=body, timeout=30)
    assert resp.status_code == 200, resp.text

    layout = layout_from_distributed(ClickHouseClient(main), f"{cluster_db}.dist",
                                     http_urls=cluster.shard_urls())
    batch = pa.record_batch({"i": pa.array(range(len(names))), "name": pa.array(names)})
    routed = shard_of_rows(ShardRouter(layout, batch.schema).split(batch))
    landed = {int(i): index for index, shard in enumerate(cluster.shards)
              for server in shard for i in run_sql(server.url, f"SELECT i FROM {local}").split()}
    assert routed == landed and len(set(landed.values())) == 2
