"""Publishing several winners in one pass through one combined staging table (18.16; the
rewrite path on 26.x too).

Each test stages a few sealed branches into fresh staging tables, then publishes them with
``publish_combined``; a crash is an ``on_step`` hook that raises at a named step, and the
repeat is a second call with the same sources and ledger, as recovery makes it.
"""

from __future__ import annotations

import uuid

import pytest

from server_ext.client.http_client import ClickHouseClient
from server_ext.errors import StagingChanged
from server_ext.publish.combined import (
    COMBINE_STEPS,
    SizeLimits,
    attach_to_precombined,
    combine_key,
    create_precombined,
    publish_combined,
)
from server_ext.publish.publish_ledger import MemoryLedger
from server_ext.publish.publish_steps import PUBLISH_STEPS
from server_ext.staging.manifest import Manifest
from server_ext.staging.seal import merge_partitions, seal
from server_ext.staging.staging_tables import (
    STAGING_DATABASE,
    create_staging_table,
    staging_table_name,
)
from server_ext.types.target_table import describe_table
from tests.conftest import run_sql
from tests.server_ext.test_publish import Crash, crash_at, expect, keys_in, make_target, stage

BRANCHES = 4
ROWS = 90  # per branch, over three monthly partitions


@pytest.fixture
def client(clickhouse_url: str) -> ClickHouseClient:
    return ClickHouseClient(clickhouse_url)


def drop_staging(url: str, sink_id: str) -> None:
    prefix = staging_table_name(sink_id, 1, "x").split("_e1_")[0]
    for name in run_sql(url, "SELECT name FROM system.tables WHERE database = "
                             f"'{STAGING_DATABASE}'").split():
        if name.startswith(prefix):
            run_sql(url, f"DROP TABLE IF EXISTS `{STAGING_DATABASE}`.`{name}`")


@pytest.fixture
def sink(clickhouse_url: str):
    """A fresh sink id; its staging tables (sources and combined) are dropped after."""
    sink_id = f"test-{uuid.uuid4().hex}"
    yield sink_id
    drop_staging(clickhouse_url, sink_id)


@pytest.fixture
def server_sink(server_url: str):
    """``sink`` on the test's server."""
    sink_id = f"test-{uuid.uuid4().hex}"
    yield sink_id
    drop_staging(server_url, sink_id)


@pytest.fixture
def staging_names(sink: str):
    names = iter(range(1000))
    return lambda: staging_table_name(sink, 1, f"p{next(names)}-a0-00000000")


@pytest.fixture
def combined(sink: str) -> str:
    return staging_table_name(sink, 1, "combined-00000000")


def staged_branches(client, url, target, staging_names, count: int = BRANCHES):
    return [stage(client, url, target, staging_names(), first_key=i * ROWS, rows=ROWS)
            for i in range(count)]


def active_parts(url: str, database: str) -> dict[str, int]:
    lines = run_sql(url, "SELECT partition_id, count() FROM system.parts WHERE database = "
                         f"'{database}' AND table = 't' AND active GROUP BY partition_id")
    return {pid: int(n) for pid, n in (line.split("\t") for line in lines.splitlines())}


def contributed(client, target, sources: list[Manifest], name: str) -> str:
    """Every source attached into the pre-combined table ``name``, as the tasks do."""
    create_precombined(client, target, name)
    for source in sources:
        assert attach_to_precombined(client, source, name)
    return name


@pytest.fixture
def precombined(sink: str) -> str:
    return staging_table_name(sink, 1, "precombined-g1-00000000")


def tables_left(url: str, names: list[str]) -> list[str]:
    listed = ", ".join(f"'{n}'" for n in names)
    found = run_sql(url, "SELECT name FROM system.tables WHERE database = "
                         f"'{STAGING_DATABASE}' AND name IN ({listed})")
    return found.split()


@pytest.mark.parametrize("strategy", ["attach_marked", "attach_replicated"])
def test_combined_publish_adds_one_part_per_target_partition(
        client, clickhouse_url, ch_db, staging_names, combined, strategy):
    kind = "replicated" if strategy == "attach_replicated" else "plain"
    target = make_target(clickhouse_url, client, ch_db, kind)
    sources = staged_branches(client, clickhouse_url, target, staging_names)
    publish_combined(client, sources, combined, strategy, MemoryLedger())
    assert keys_in(clickhouse_url, ch_db) == expect(range(BRANCHES * ROWS))
    assert active_parts(clickhouse_url, ch_db) == {"202401": 1, "202402": 1, "202403": 1}


@pytest.mark.parametrize("step", COMBINE_STEPS + PUBLISH_STEPS["attach_marked"])
def test_repeat_after_a_crash_at_each_step_publishes_every_row_once(
        client, clickhouse_url, ch_db, staging_names, combined, step):
    target = make_target(clickhouse_url, client, ch_db, "plain")
    sources = staged_branches(client, clickhouse_url, target, staging_names)
    ledger = MemoryLedger()
    with pytest.raises(Crash):
        publish_combined(client, sources, combined, "attach_marked", ledger,
                         on_step=crash_at(step))
    publish_combined(client, sources, combined, "attach_marked", ledger)
    assert keys_in(clickhouse_url, ch_db) == expect(range(BRANCHES * ROWS))


def test_repeat_before_the_record_rebuilds_the_combined_table_from_the_sources(
        client, clickhouse_url, ch_db, staging_names, combined):
    target = make_target(clickhouse_url, client, ch_db, "plain")
    sources = staged_branches(client, clickhouse_url, target, staging_names)
    ledger = MemoryLedger()
    with pytest.raises(Crash):
        publish_combined(client, sources, combined, "attach_marked", ledger,
                         on_step=crash_at("combine.after_build"))
    assert ledger.get(combine_key(combined)) is None
    run_sql(clickhouse_url, f"INSERT INTO `{STAGING_DATABASE}`.`{combined}` (d, k) "
                            "VALUES ('2024-01-02', 999999)")  # a half-built leftover
    publish_combined(client, sources, combined, "attach_marked", ledger)
    assert keys_in(clickhouse_url, ch_db) == expect(range(BRANCHES * ROWS))


def test_source_that_lost_its_parts_is_refused_before_anything_is_combined(
        client, clickhouse_url, ch_db, staging_names, combined):
    target = make_target(clickhouse_url, client, ch_db, "plain")
    sources = staged_branches(client, clickhouse_url, target, staging_names)
    run_sql(clickhouse_url, f"ALTER TABLE `{STAGING_DATABASE}`.`{sources[2].staging_table}` "
                            "DROP PARTITION ID '202402'")
    with pytest.raises(StagingChanged, match="202402"):
        publish_combined(client, sources, combined, "attach_marked", MemoryLedger())
    assert keys_in(clickhouse_url, ch_db) == (0, 0, 0)
    assert tables_left(clickhouse_url, [combined]) == []


def test_attached_partitions_of_more_parts_than_merge_above_parts_are_merged_into_one(
        client, clickhouse_url, ch_db, staging_names, combined):
    target = make_target(clickhouse_url, client, ch_db, "plain")
    sources = staged_branches(client, clickhouse_url, target, staging_names)
    publish_combined(client, sources, combined, "attach_marked", MemoryLedger(),
                     limits=SizeLimits(rewrite_max_bytes=0, merge_above_parts=BRANCHES - 1))
    assert keys_in(clickhouse_url, ch_db) == expect(range(BRANCHES * ROWS))
    assert active_parts(clickhouse_url, ch_db) == {"202401": 1, "202402": 1, "202403": 1}


def test_attached_partitions_of_at_most_merge_above_parts_parts_are_published_as_staged(
        client, clickhouse_url, ch_db, staging_names, combined):
    """No merge in the commit: as many parts per partition as a plain INSERT from as many
    tasks adds, left to the server's background merges."""
    target = make_target(clickhouse_url, client, ch_db, "plain")
    sources = staged_branches(client, clickhouse_url, target, staging_names)
    publish_combined(client, sources, combined, "attach_marked", MemoryLedger(),
                     limits=SizeLimits(rewrite_max_bytes=0, merge_above_parts=BRANCHES))
    assert keys_in(clickhouse_url, ch_db) == expect(range(BRANCHES * ROWS))
    assert active_parts(clickhouse_url, ch_db) == {"202401": BRANCHES, "202402": BRANCHES,
                                                   "202403": BRANCHES}


def test_partitions_above_merge_max_bytes_keep_their_parts(
        client, clickhouse_url, ch_db, staging_names, combined):
    target = make_target(clickhouse_url, client, ch_db, "plain")
    sources = staged_branches(client, clickhouse_url, target, staging_names)
    publish_combined(client, sources, combined, "attach_marked", MemoryLedger(),
                     limits=SizeLimits(rewrite_max_bytes=0, merge_max_bytes=0))
    assert keys_in(clickhouse_url, ch_db) == expect(range(BRANCHES * ROWS))
    assert set(active_parts(clickhouse_url, ch_db).values()) == {BRANCHES}


# -- the rewrite path on both servers -------------------------------------------------------


def stage_sql(client: ClickHouseClient, url: str, target, sink_id: str, branch: int,
              select: str, rows: int):
    staging = create_staging_table(client, target,
                                   staging_table_name(sink_id, 1, f"p{branch}-a0-0"))
    run_sql(url, f"INSERT INTO {staging} {select}")
    return seal(client, target, staging, expected_rows=rows)


def test_rewrite_copies_materialized_values_as_staged(server_url, server_db, server_sink):
    client = ClickHouseClient(server_url)
    run_sql(server_url, f"CREATE TABLE `{server_db}`.t (d Date, k UInt64, "
                        "m UInt32 MATERIALIZED rand()) ENGINE = MergeTree() "
                        "PARTITION BY toYYYYMM(d) ORDER BY k")
    target = describe_table(client, f"{server_db}.t")
    sources = [stage_sql(client, server_url, target, server_sink, i,
                         f"(d, k) SELECT toDate('2024-01-01') + number, {i * 10} + number "
                         "FROM system.numbers LIMIT 10", rows=10) for i in range(3)]
    staged = sum(int(run_sql(server_url, f"SELECT sum(m) FROM `{STAGING_DATABASE}`."
                                         f"`{m.staging_table}`")) for m in sources)
    publish_combined(client, sources, staging_table_name(server_sink, 1, "combined-0"),
                     "attach_marked", MemoryLedger())
    assert int(run_sql(server_url, f"SELECT sum(m) FROM `{server_db}`.t")) == staged


def test_rewrite_of_an_epoch_over_more_than_100_partitions_adds_one_part_each(
        server_url, server_db, server_sink):
    client = ClickHouseClient(server_url)
    run_sql(server_url, f"CREATE TABLE `{server_db}`.t (d Date, k UInt64) ENGINE = MergeTree() "
                        "PARTITION BY d ORDER BY k")
    target = describe_table(client, f"{server_db}.t")
    sources = [stage_sql(client, server_url, target, server_sink, i,
                         f"SELECT toDate('2024-01-01') + number % 60 + {i * 60}, number "
                         "FROM system.numbers LIMIT 60", rows=60) for i in range(3)]
    publish_combined(client, sources, staging_table_name(server_sink, 1, "combined-0"),
                     "attach_marked", MemoryLedger())
    parts = run_sql(server_url, "SELECT count(), uniqExact(partition_id) FROM system.parts "
                                f"WHERE database = '{server_db}' AND table = 't' AND active")
    assert parts.split() == ["180", "180"]


def empty_branch(target, staging_names):
    """A winner whose task got no rows: sealed with no partitions, no staging table."""
    return Manifest(target.database, target.name, STAGING_DATABASE, staging_names(), ())


def test_winners_that_staged_nothing_are_left_out_of_the_combine(
        client, clickhouse_url, ch_db, staging_names, combined):
    target = make_target(clickhouse_url, client, ch_db, "plain")
    sources = [*staged_branches(client, clickhouse_url, target, staging_names, count=2),
               empty_branch(target, staging_names)]
    publish_combined(client, sources, combined, "attach_marked", MemoryLedger())
    assert keys_in(clickhouse_url, ch_db) == expect(range(2 * ROWS))


def test_a_combine_of_winners_that_all_staged_nothing_publishes_nothing(
        client, clickhouse_url, ch_db, staging_names, combined):
    target = make_target(clickhouse_url, client, ch_db, "plain")
    sources = [empty_branch(target, staging_names) for _ in range(3)]
    publish_combined(client, sources, combined, "attach_marked", MemoryLedger())
    assert keys_in(clickhouse_url, ch_db) == (0, 0, 0)


def test_sources_whose_parts_are_large_already_keep_their_parts(
        client, clickhouse_url, ch_db, staging_names, combined):
    """Rewriting or merging parts above ``small_part_bytes`` would cost more in the commit
    than the parts it saves (here every part counts as large)."""
    target = make_target(clickhouse_url, client, ch_db, "plain")
    sources = staged_branches(client, clickhouse_url, target, staging_names)
    publish_combined(client, sources, combined, "attach_marked", MemoryLedger(),
                     limits=SizeLimits(small_part_bytes=1))
    assert keys_in(clickhouse_url, ch_db) == expect(range(BRANCHES * ROWS))
    assert set(active_parts(clickhouse_url, ch_db).values()) == {BRANCHES}


def test_combine_takes_the_rows_from_the_precombined_table_when_every_source_contributed(
        client, clickhouse_url, ch_db, staging_names, combined, precombined):
    target = make_target(clickhouse_url, client, ch_db, "plain")
    sources = staged_branches(client, clickhouse_url, target, staging_names)
    contributed(client, target, sources, precombined)
    for source in sources:  # the sources are not read: take them away
        run_sql(clickhouse_url, f"DROP TABLE `{STAGING_DATABASE}`.`{source.staging_table}`")
    publish_combined(client, sources, combined, "attach_marked", MemoryLedger(),
                     precombined=precombined)
    assert keys_in(clickhouse_url, ch_db) == expect(range(BRANCHES * ROWS))
    assert all(n <= BRANCHES for n in active_parts(clickhouse_url, ch_db).values())


def test_sources_that_did_not_contribute_are_copied_from_their_own_staging(
        client, clickhouse_url, ch_db, staging_names, combined, precombined):
    target = make_target(clickhouse_url, client, ch_db, "plain")
    sources = staged_branches(client, clickhouse_url, target, staging_names)
    own, pooled = sources[:2], sources[2:]
    contributed(client, target, pooled, precombined)
    for source in pooled:  # taken from the pre-combined table: take them away
        run_sql(clickhouse_url, f"DROP TABLE `{STAGING_DATABASE}`.`{source.staging_table}`")
    publish_combined(client, sources, combined, "attach_marked", MemoryLedger(),
                     precombined=precombined,
                     direct=frozenset(m.staging_table for m in own))
    assert keys_in(clickhouse_url, ch_db) == expect(range(BRANCHES * ROWS))


def test_a_direct_source_found_in_the_precombined_table_too_makes_the_combine_read_the_sources(
        client, clickhouse_url, ch_db, staging_names, combined, precombined):
    """A contribution that failed half-way leaves rows in the pre-combined table."""
    target = make_target(clickhouse_url, client, ch_db, "plain")
    sources = staged_branches(client, clickhouse_url, target, staging_names)
    contributed(client, target, sources, precombined)
    publish_combined(client, sources, combined, "attach_marked", MemoryLedger(),
                     precombined=precombined, direct=frozenset({sources[0].staging_table}))
    assert keys_in(clickhouse_url, ch_db) == expect(range(BRANCHES * ROWS))


def test_a_precombined_partition_of_more_parts_than_merge_above_parts_is_copied_as_one(
        client, clickhouse_url, ch_db, staging_names, combined, precombined):
    target = make_target(clickhouse_url, client, ch_db, "plain")
    sources = staged_branches(client, clickhouse_url, target, staging_names)
    contributed(client, target, sources, precombined)
    publish_combined(client, sources, combined, "attach_marked", MemoryLedger(),
                     precombined=precombined,
                     limits=SizeLimits(merge_above_parts=BRANCHES - 1))
    assert keys_in(clickhouse_url, ch_db) == expect(range(BRANCHES * ROWS))
    assert active_parts(clickhouse_url, ch_db) == {"202401": 1, "202402": 1, "202403": 1}


class DescribeCounter(ClickHouseClient):
    """A client that counts the statements describing a table."""

    describes = 0

    def query_rows(self, sql: str, *, purpose: str, settings: dict | None = None) -> list[dict]:
        self.describes += purpose.startswith("describe table")
        return super().query_rows(sql, purpose=purpose, settings=settings)


def test_a_combine_given_the_stagings_description_does_not_describe_the_target_again(
        clickhouse_url, ch_db, staging_names, combined, precombined):
    client = DescribeCounter(clickhouse_url)
    target = make_target(clickhouse_url, client, ch_db, "plain")
    sources = staged_branches(client, clickhouse_url, target, staging_names)
    contributed(client, target, sources, precombined)
    client.describes = 0
    publish_combined(client, sources, combined, "attach_marked", MemoryLedger(),
                     precombined=precombined, target=target)
    assert keys_in(clickhouse_url, ch_db) == expect(range(BRANCHES * ROWS))
    assert client.describes == 0


@pytest.mark.parametrize("spoiled_by", ["a failed attempt's contribution",
                                        "a branch contributed twice", "its table dropped"])
def test_a_precombined_table_with_other_rows_makes_the_combine_read_the_sources(
        client, clickhouse_url, ch_db, staging_names, combined, precombined, spoiled_by):
    target = make_target(clickhouse_url, client, ch_db, "plain")
    sources = staged_branches(client, clickhouse_url, target, staging_names)
    contributed(client, target, sources, precombined)
    if spoiled_by == "a failed attempt's contribution":
        loser = stage(client, clickhouse_url, target, staging_names(), first_key=10_000)
        assert attach_to_precombined(client, loser, precombined)
    elif spoiled_by == "a branch contributed twice":
        assert attach_to_precombined(client, sources[1], precombined)
    else:
        run_sql(clickhouse_url, f"DROP TABLE `{STAGING_DATABASE}`.`{precombined}`")
    publish_combined(client, sources, combined, "attach_marked", MemoryLedger(),
                     precombined=precombined)
    assert keys_in(clickhouse_url, ch_db) == expect(range(BRANCHES * ROWS))


def test_repeat_after_a_crash_in_a_combine_from_the_precombined_table_publishes_once(
        client, clickhouse_url, ch_db, staging_names, combined, precombined):
    target = make_target(clickhouse_url, client, ch_db, "plain")
    sources = staged_branches(client, clickhouse_url, target, staging_names)
    contributed(client, target, sources, precombined)
    ledger = MemoryLedger()
    with pytest.raises(Crash):
        publish_combined(client, sources, combined, "attach_marked", ledger,
                         precombined=precombined, on_step=crash_at("combine.after_build"))
    publish_combined(client, sources, combined, "attach_marked", ledger,
                     precombined=precombined)
    assert keys_in(clickhouse_url, ch_db) == expect(range(BRANCHES * ROWS))


def test_a_contribution_to_a_missing_precombined_table_reports_failure(
        client, clickhouse_url, ch_db, staging_names, precombined):
    target = make_target(clickhouse_url, client, ch_db, "plain")
    source = stage(client, clickhouse_url, target, staging_names(), first_key=0)
    assert not attach_to_precombined(client, source, precombined)


@pytest.mark.parametrize("server", ["ch26"], indirect=True)  # 18.16 lacks the setting
def test_merging_a_partition_that_a_background_merge_made_one_part_leaves_that_part(
        server_url: str, server_db: str) -> None:
    table = f"`{server_db}`.pool"
    run_sql(server_url, f"CREATE TABLE {table} (d Date, k UInt64) ENGINE = MergeTree "
                        "PARTITION BY toYYYYMM(d) ORDER BY k")
    for start in (0, 100):
        run_sql(server_url, f"INSERT INTO {table} SELECT toDate('2024-01-01'), {start} + number "
                            "FROM numbers(100)")
    run_sql(server_url, f"OPTIMIZE TABLE {table} FINAL")  # what the background merge did
    parts = f"SELECT name FROM system.parts WHERE database = '{server_db}' AND active"
    merged = run_sql(server_url, parts).split()
    merge_partitions(ClickHouseClient(server_url), table, ["202401"], merges_on=True)
    assert run_sql(server_url, parts).split() == merged == ["202401_1_2_1"]
