"""The ``move`` strategy on the ClickHouse 26.9 engine (chdb, in-process).

chdb opens one data path per process for the life of the process, so every test shares
``ChdbClient.for_process()`` and works in its own database. Nothing here forks.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from server_ext.capabilities import detect_capabilities
from server_ext.client.chdb_client import ChdbClient
from server_ext.errors import InDoubtPublish, StagingChanged
from server_ext.publish.move import move_apart, move_together
from server_ext.publish.publish_branch import publish
from server_ext.publish.publish_ledger import MemoryLedger, PublishRecord, ledger_key
from server_ext.publish.publish_steps import PUBLISH_STEPS
from server_ext.publish.strategy_choice import choose_strategy
from server_ext.staging.manifest import Manifest
from server_ext.staging.seal import seal
from server_ext.staging.staging_tables import (
    STAGING_DATABASE,
    create_staging_table,
    staging_table_name,
)
from server_ext.types.target_table import TargetTable, describe_table


class Crash(Exception):
    """Stands for the publishing process dying at a step."""


def crash_at(step: str, occurrence: int = 1) -> Callable[[str], None]:
    seen = {"count": 0}

    def hook(name: str) -> None:
        if name == step:
            seen["count"] += 1
            if seen["count"] == occurrence:
                raise Crash(step)

    return hook


@pytest.fixture
def chdb() -> ChdbClient:
    return ChdbClient.for_process()


@pytest.fixture
def database(chdb: ChdbClient) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:10]}"
    chdb.execute(f"CREATE DATABASE `{name}`", purpose="test setup")
    yield name
    chdb.execute(f"DROP DATABASE IF EXISTS `{name}`", purpose="test cleanup")


@pytest.fixture
def staging_name(chdb: ChdbClient) -> Iterator[str]:
    name = staging_table_name(f"test-{uuid.uuid4().hex}", 1, "p0-a0-00000000")
    yield name
    chdb.execute(f"DROP TABLE IF EXISTS `{STAGING_DATABASE}`.`{name}`", purpose="test cleanup")


@pytest.fixture
def other_staging(chdb: ChdbClient) -> Iterator[str]:
    """A second task's staging table of the same xid."""
    name = staging_table_name(f"test-{uuid.uuid4().hex}", 1, "p1-a0-00000000")
    yield name
    chdb.execute(f"DROP TABLE IF EXISTS `{STAGING_DATABASE}`.`{name}`", purpose="test cleanup")


def make_target(chdb: ChdbClient, database: str) -> TargetTable:
    chdb.execute(f"CREATE TABLE `{database}`.t (d Date, k UInt64, s String DEFAULT 'x') "
                 "ENGINE = MergeTree PARTITION BY toYYYYMM(d) ORDER BY k "
                 "SETTINGS index_granularity = 1024", purpose="test setup")
    return describe_table(chdb, f"{database}.t")


def stage(chdb: ChdbClient, target: TargetTable, name: str, rows: int = 90,
          first_day: int = 0, first_key: int = 0) -> Manifest:
    """``rows`` rows, one a day from 2024-01-01 + ``first_day``, keys from ``first_key``."""
    staging = create_staging_table(chdb, target, name)
    chdb.execute(f"INSERT INTO {staging} (d, k) SELECT toDate('2024-01-01') + {first_day} + "
                 f"number % 90, {first_key} + number FROM system.numbers LIMIT {rows}",
                 purpose="test setup")
    return seal(chdb, target, staging, expected_rows=rows)


def keys_in(chdb: ChdbClient, database: str) -> tuple[int, int, int]:
    row = chdb.query_rows(f"SELECT count() AS n, uniqExact(k) AS u, sum(k) AS s "
                          f"FROM `{database}`.t", purpose="test check")[0]
    return int(row["n"]), int(row["u"]), int(row["s"])


ALL_ROWS = (90, 90, sum(range(90)))


def test_modern_engine_gets_the_move_strategy_for_a_plain_target(chdb, database) -> None:
    target = make_target(chdb, database)
    assert choose_strategy(detect_capabilities(chdb), target) == "move"


def test_staging_on_modern_engine_has_the_target_keys_and_granularity(
        chdb, database, staging_name) -> None:
    target = make_target(chdb, database)
    create_staging_table(chdb, target, staging_name)
    staged = describe_table(chdb, f"{STAGING_DATABASE}.{staging_name}")
    assert (staged.partition_key, staged.sorting_key, staged.index_granularity) == (
        target.partition_key, target.sorting_key, 1024)
    assert [c.name for c in staged.columns] == [c.name for c in target.columns]


def test_move_publishes_every_staged_row_once_and_empties_staging(
        chdb, database, staging_name) -> None:
    manifest = stage(chdb, make_target(chdb, database), staging_name)
    report = publish(chdb, manifest, "move", MemoryLedger())
    assert report.published == ["202401", "202402", "202403"]
    assert keys_in(chdb, database) == ALL_ROWS
    assert chdb.query_value(f"SELECT count() FROM `{STAGING_DATABASE}`.`{staging_name}`",
                            purpose="test check") == "0"


def test_repeated_move_publish_is_a_no_op(chdb, database, staging_name) -> None:
    manifest = stage(chdb, make_target(chdb, database), staging_name)
    ledger = MemoryLedger()
    publish(chdb, manifest, "move", ledger)
    report = publish(chdb, manifest, "move", ledger)
    assert report.published == [] and len(report.already_published) == 3
    assert keys_in(chdb, database) == ALL_ROWS


def test_move_that_returned_is_recorded_by_its_intent_and_a_repeat_marks_it_published(
        chdb, database, staging_name) -> None:
    manifest = stage(chdb, make_target(chdb, database), staging_name)
    ledger = MemoryLedger()
    publish(chdb, manifest, "move", ledger)
    key = ledger_key(manifest.staging_table)
    assert PublishRecord.load(ledger, key).intended == set(manifest.partition_ids)
    publish(chdb, manifest, "move", ledger)
    assert PublishRecord.load(ledger, key).is_published
    assert keys_in(chdb, database) == ALL_ROWS


@pytest.mark.parametrize("step", PUBLISH_STEPS["move"])
def test_move_rerun_after_crash_at_step_publishes_each_row_once(
        chdb, database, staging_name, step) -> None:
    manifest = stage(chdb, make_target(chdb, database), staging_name)
    ledger = MemoryLedger()
    with pytest.raises(Crash):
        publish(chdb, manifest, "move", ledger, on_step=crash_at(step))
    publish(chdb, manifest, "move", ledger)
    assert keys_in(chdb, database) == ALL_ROWS


def test_move_rerun_after_a_crash_inside_the_multi_partition_alter_moves_the_rest(
        chdb, database, staging_name) -> None:
    manifest = stage(chdb, make_target(chdb, database), staging_name)
    ledger = MemoryLedger()
    with pytest.raises(Crash):
        publish(chdb, manifest, "move", ledger, on_step=crash_at("publish.after_intent"))
    chdb.execute(f"ALTER TABLE `{STAGING_DATABASE}`.`{staging_name}` MOVE PARTITION ID "
                 f"'202402' TO TABLE `{database}`.t", purpose="the part of the ALTER that ran")
    publish(chdb, manifest, "move", ledger)
    assert keys_in(chdb, database) == ALL_ROWS


def back_in_staging_after_a_restart(chdb: ChdbClient, database: str, staging_name: str,
                                    partition_id: str, ledger: MemoryLedger) -> None:
    """The state a server killed inside a MOVE can come back with (measured on 26.9): the
    partition is in the target (one fresh block, the same parts) and still in staging;
    and the server started after the intent (its clock in the intent set back to 0)."""
    chdb.execute(f"ALTER TABLE `{database}`.t ATTACH PARTITION ID '{partition_id}' FROM "
                 f"`{STAGING_DATABASE}`.`{staging_name}`", purpose="the move that ran")
    intent = ledger.get(ledger_key(staging_name))
    assert intent is not None and intent["server_clock"] > 0
    ledger.put(ledger_key(staging_name), {**intent, "server_clock": 0})


def interrupted_while_another_run_moved(chdb: ChdbClient, target: TargetTable, name: str,
                                        other_name: str) -> tuple[Manifest, MemoryLedger]:
    """A run of staging ``name`` crashed after its intent; then another run (staging
    ``other_name``, ``OTHER_ROWS``) moved its parts above that intent's watermark."""
    manifest = stage(chdb, target, name)
    other = stage(chdb, target, other_name, **OTHER_ROWS)
    ledger = MemoryLedger()
    with pytest.raises(Crash):
        publish(chdb, manifest, "move", ledger, on_step=crash_at("publish.after_intent"))
    publish(chdb, other, "move", MemoryLedger())
    return manifest, ledger


def test_move_rerun_on_a_server_not_restarted_moves_the_rest_though_merges_mixed_the_target(
        chdb, database, staging_name, other_staging) -> None:
    """Another run's parts moved above this run's watermark and merged with older parts:
    no restart came between, so what is still staged was not moved and is moved now."""
    while int(chdb.query_value("SELECT uptime()", purpose="test setup")) < 2:
        time.sleep(0.2)  # a server started seconds before the intent, as one in service
    target = make_target(chdb, database)
    chdb.execute(f"INSERT INTO `{database}`.t (d, k) VALUES ('2024-02-09', 900)",
                 purpose="an earlier row in the partition")
    manifest, ledger = interrupted_while_another_run_moved(chdb, target, staging_name,
                                                           other_staging)
    chdb.execute(f"OPTIMIZE TABLE `{database}`.t FINAL", purpose="merge across the watermark")
    publish(chdb, manifest, "move", ledger)
    count, unique, _ = keys_in(chdb, database)
    assert (count, unique) == (131, 131)


def test_move_rerun_after_a_restart_brought_a_moved_partition_back_moves_it_no_more(
        chdb, database, staging_name) -> None:
    manifest = stage(chdb, make_target(chdb, database), staging_name)
    ledger = MemoryLedger()
    with pytest.raises(Crash):
        publish(chdb, manifest, "move", ledger, on_step=crash_at("publish.after_intent"))
    back_in_staging_after_a_restart(chdb, database, staging_name, "202402", ledger)
    report = publish(chdb, manifest, "move", ledger)
    assert (report.published, report.already_published) == (["202401", "202403"], ["202402"])
    assert keys_in(chdb, database) == ALL_ROWS


def test_move_rerun_decides_again_after_a_second_interruption(
        chdb, database, staging_name) -> None:
    """The second intent records the decided partition as published, so a third run
    does not judge it against a newer watermark (which would say "not moved")."""
    manifest = stage(chdb, make_target(chdb, database), staging_name)
    ledger = MemoryLedger()
    with pytest.raises(Crash):
        publish(chdb, manifest, "move", ledger, on_step=crash_at("publish.after_intent"))
    back_in_staging_after_a_restart(chdb, database, staging_name, "202402", ledger)
    with pytest.raises(Crash):
        publish(chdb, manifest, "move", ledger, on_step=crash_at("publish.after_intent"))
    publish(chdb, manifest, "move", ledger)
    assert keys_in(chdb, database) == ALL_ROWS


def test_move_rerun_is_in_doubt_when_a_merge_mixed_the_moved_part(
        chdb, database, staging_name) -> None:
    target = make_target(chdb, database)
    chdb.execute(f"INSERT INTO `{database}`.t (d, k) VALUES ('2024-02-09', 900)",
                 purpose="an earlier row in the partition")
    manifest = stage(chdb, target, staging_name)
    ledger = MemoryLedger()
    with pytest.raises(Crash):
        publish(chdb, manifest, "move", ledger, on_step=crash_at("publish.after_intent"))
    back_in_staging_after_a_restart(chdb, database, staging_name, "202402", ledger)
    chdb.execute(f"OPTIMIZE TABLE `{database}`.t PARTITION ID '202402' FINAL",
                 purpose="a merge after the restart")
    with pytest.raises(InDoubtPublish, match="202402") as err:
        publish(chdb, manifest, "move", ledger)
    assert err.value.partition_ids == ["202402"] and "merged" in err.value.found
    moved = next(p.rows for p in manifest.partitions if p.partition_id == "202402")
    assert keys_in(chdb, database)[0] == 1 + moved  # the earlier row, the partition once


OTHER_ROWS = {"first_day": 10, "first_key": 1000, "rows": 40}  # 21 and 19 rows a month


def test_move_apart_allows_staging_tables_without_look_alike_parts(
        chdb, database, staging_name, other_staging) -> None:
    target = make_target(chdb, database)
    assert move_apart([stage(chdb, target, staging_name),
                       stage(chdb, target, other_staging, **OTHER_ROWS)])


def test_move_apart_refuses_staging_tables_holding_parts_of_equal_rows_and_bytes(
        chdb, database, staging_name, other_staging) -> None:
    target = make_target(chdb, database)
    assert not move_apart([stage(chdb, target, staging_name),
                           stage(chdb, target, other_staging, rows=60)])


@pytest.mark.parametrize("restart_brought_back", [False, True])
def test_move_rerun_decides_its_own_parts_while_another_run_moved_above_its_watermark(
        chdb, database, staging_name, other_staging, restart_brought_back) -> None:
    """The case ``move_apart`` lets happen: the other staging table's parts are moved
    after this run's intent, so they lie above its watermark when the run is repeated."""
    manifest, ledger = interrupted_while_another_run_moved(
        chdb, make_target(chdb, database), staging_name, other_staging)
    if restart_brought_back:
        back_in_staging_after_a_restart(chdb, database, staging_name, "202402", ledger)
    publish(chdb, manifest, "move", ledger)
    count, unique, total = keys_in(chdb, database)
    assert (count, unique) == (130, 130)
    assert total == sum(range(90)) + sum(range(1000, 1040))


class CountingWriter:
    """``move_together``'s intent writer over memory ledgers, counting its writes."""

    def __init__(self) -> None:
        self.writes = 0

    def __call__(self, entries) -> None:
        self.writes += 1
        for ledger, key, value in entries:
            ledger.put(key, value)


def staged_pair(chdb: ChdbClient, database: str, staging_name: str, other_staging: str
                ) -> list[tuple[Manifest, MemoryLedger]]:
    target = make_target(chdb, database)
    return [(stage(chdb, target, staging_name), MemoryLedger()),
            (stage(chdb, target, other_staging, **OTHER_ROWS), MemoryLedger())]


BOTH_ROWS = (130, 130, sum(range(90)) + sum(range(1000, 1040)))


def test_moves_together_publish_both_tables_once_with_one_intent_write(
        chdb, database, staging_name, other_staging) -> None:
    items = staged_pair(chdb, database, staging_name, other_staging)
    writer = CountingWriter()
    reports = move_together(chdb, items, writer)
    assert writer.writes == 1
    assert [r.rows for r in reports] == [90, 40]
    assert keys_in(chdb, database) == BOTH_ROWS


def test_moves_together_leave_each_table_recorded_as_its_own_move_would(
        chdb, database, staging_name, other_staging) -> None:
    items = staged_pair(chdb, database, staging_name, other_staging)
    move_together(chdb, items, CountingWriter())
    for manifest, ledger in items:
        record = PublishRecord.load(ledger, ledger_key(manifest.staging_table))
        assert record.intended == set(manifest.partition_ids)
        assert publish(chdb, manifest, "move", ledger).published == []
    assert keys_in(chdb, database) == BOTH_ROWS


# every crash point of a joint publish: the second MOVE's too
JOINT_CRASHES = [(step, 1) for step in PUBLISH_STEPS["move"]] + [("publish.after_attach", 2)]


@pytest.mark.parametrize(("step", "occurrence"), JOINT_CRASHES)
def test_moves_together_repeated_table_by_table_after_a_crash_publish_each_row_once(
        chdb, database, staging_name, other_staging, step, occurrence) -> None:
    items = staged_pair(chdb, database, staging_name, other_staging)
    with pytest.raises(Crash):
        move_together(chdb, items, CountingWriter(), on_step=crash_at(step, occurrence))
    for manifest, ledger in items:
        publish(chdb, manifest, "move", ledger)
    assert keys_in(chdb, database) == BOTH_ROWS


@pytest.mark.parametrize(("step", "occurrence"), JOINT_CRASHES)
def test_moves_together_repeated_together_after_a_crash_publish_each_row_once(
        chdb, database, staging_name, other_staging, step, occurrence) -> None:
    items = staged_pair(chdb, database, staging_name, other_staging)
    with pytest.raises(Crash):
        move_together(chdb, items, CountingWriter(), on_step=crash_at(step, occurrence))
    move_together(chdb, items, CountingWriter())
    assert keys_in(chdb, database) == BOTH_ROWS


def test_moves_together_refuse_a_changed_table_before_writing_any_intent(
        chdb, database, staging_name, other_staging) -> None:
    items = staged_pair(chdb, database, staging_name, other_staging)
    chdb.execute(f"ALTER TABLE `{STAGING_DATABASE}`.`{other_staging}` DROP PARTITION ID "
                 "'202402'", purpose="lose staged rows")
    writer = CountingWriter()
    with pytest.raises(StagingChanged, match="202402"):
        move_together(chdb, items, writer)
    assert writer.writes == 0 and keys_in(chdb, database) == (0, 0, 0)


def test_move_refuses_a_partition_gone_from_staging_without_an_intent(
        chdb, database, staging_name) -> None:
    manifest = stage(chdb, make_target(chdb, database), staging_name)
    chdb.execute(f"ALTER TABLE `{STAGING_DATABASE}`.`{staging_name}` DROP PARTITION ID "
                 "'202402'", purpose="lose staged rows")
    with pytest.raises(StagingChanged, match="202402"):
        publish(chdb, manifest, "move", MemoryLedger())
    assert keys_in(chdb, database) == (0, 0, 0)


def test_overwrite_on_modern_engine_replaces_only_partitions_in_the_data(
        chdb, database, staging_name) -> None:
    target = make_target(chdb, database)
    chdb.execute(f"INSERT INTO `{database}`.t (d, k) VALUES ('2024-01-09', 900), "
                 "('2024-06-09', 901)", purpose="test setup")
    manifest = stage(chdb, target, staging_name)
    publish(chdb, manifest, "move", MemoryLedger(), overwrite=True)
    assert keys_in(chdb, database) == (91, 91, sum(range(90)) + 901)
