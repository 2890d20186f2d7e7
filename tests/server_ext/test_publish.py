"""Publishing sealed branches into real 18.16 targets, including re-runs after crashes.

A crash is simulated by an ``on_step`` hook that raises at a named step; the re-run is a
plain second ``publish`` with the same manifest and ledger, as recovery would do it.
Every re-run must leave each staged row in the target exactly once.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from server_ext.client.http_client import ClickHouseClient
from server_ext.errors import InDoubtPublish, StagingChanged
from server_ext.publish.overwrite import publish_overwrite
from server_ext.publish.publish_branch import publish
from server_ext.publish.publish_ledger import MemoryLedger
from server_ext.publish.publish_steps import (
    PUBLISH_STEPS,
    STEP_AFTER_ATTACH,
    STEP_AFTER_INSERT,
    STEP_AFTER_INSERT_INTENT,
    STEP_AFTER_INTENT,
)
from server_ext.staging.manifest import Manifest
from server_ext.staging.seal import seal
from server_ext.staging.staging_tables import (
    STAGING_DATABASE,
    create_staging_table,
    rollback,
    staging_table_name,
)
from server_ext.types.target_table import TargetTable, describe_table
from tests.conftest import run_sql

COLUMNS = "(d Date, k UInt64, s String DEFAULT 'x', n Nullable(Int32))"
MONTHS = 3  # staged rows span three monthly partitions


class Crash(Exception):
    """Stands for the publishing process dying at a step."""


def crash_at(step: str, occurrence: int = 1) -> Callable[[str], None]:
    """A hook that raises the ``occurrence``-th time publish reaches ``step``."""
    seen = {"count": 0}

    def hook(name: str) -> None:
        if name == step:
            seen["count"] += 1
            if seen["count"] == occurrence:
                raise Crash(step)

    return hook


class RecordingLedger(MemoryLedger):
    """A MemoryLedger that keeps every value written, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[dict] = []

    def put(self, key: str, value: dict) -> None:
        self.writes.append(value)
        super().put(key, value)


@pytest.fixture
def staging_names(clickhouse_url: str) -> Iterator[Callable[[], str]]:
    """Factory of fresh staging table names; all of them are dropped after the test."""
    yield from _staging_names(clickhouse_url)


@pytest.fixture
def server_staging_names(server_url: str) -> Iterator[Callable[[], str]]:
    """``staging_names`` on the test's server (18.16 or 26.x, fixture ``server``)."""
    yield from _staging_names(server_url)


def _staging_names(clickhouse_url: str) -> Iterator[Callable[[], str]]:
    sink = f"test-{uuid.uuid4().hex}"
    names: list[str] = []

    def new() -> str:
        names.append(staging_table_name(sink, 1, f"p{len(names)}-a0-00000000"))
        return names[-1]

    yield new
    for name in names + [staging_table_name(sink, 1, "combined")]:
        run_sql(clickhouse_url, f"DROP TABLE IF EXISTS `{STAGING_DATABASE}`.`{name}`")


def make_target(url: str, client: ClickHouseClient, database: str, kind: str) -> TargetTable:
    engine = {
        "plain": "MergeTree()",
        "replicated": f"ReplicatedMergeTree('/clickhouse/tables/{database}/t', '{{replica}}')",
    }[kind]
    run_sql(url, f"CREATE TABLE `{database}`.t {COLUMNS} ENGINE = {engine} "
                 "PARTITION BY toYYYYMM(d) ORDER BY k")
    return describe_table(client, f"{database}.t")


def stage(client: ClickHouseClient, url: str, target: TargetTable, name: str,
          first_key: int, rows: int = 90) -> Manifest:
    """Stage ``rows`` rows with keys from ``first_key`` over three months, and seal."""
    staging = create_staging_table(client, target, name)
    run_sql(url, f"INSERT INTO {staging} (d, k, n) SELECT toDate('2024-01-01') + number % 90, "
                 f"{first_key} + number, number FROM system.numbers LIMIT {rows}")
    return seal(client, target, staging, expected_rows=rows)


def keys_in(url: str, database: str) -> tuple[int, int, int]:
    """(rows, distinct keys, sum of keys) of the target."""
    line = run_sql(url, f"SELECT count(), uniqExact(k), sum(k) FROM `{database}`.t")
    rows, distinct, total = map(int, line.split())
    return rows, distinct, total


def expect(*ranges: range) -> tuple[int, int, int]:
    keys = [k for r in ranges for k in r]
    return len(keys), len(set(keys)), sum(keys)


def staged_rows(url: str, name: str) -> int:
    return int(run_sql(url, f"SELECT count() FROM `{STAGING_DATABASE}`.`{name}`"))


def preexisting(url: str, database: str) -> range:
    """Rows already in the target, in the same partitions as the staged ones."""
    run_sql(url, f"INSERT INTO `{database}`.t (d, k) SELECT toDate('2024-01-15') + number * 30, "
                 "1000000 + number FROM system.numbers LIMIT 3")
    return range(1000000, 1000003)


# -- every strategy on 18.16: a clean publish and a repeat ---------------------------------


@pytest.mark.parametrize("kind,strategy", [("plain", "attach_marked"),
                                           ("replicated", "attach_replicated")])
def test_publish_makes_every_staged_row_visible_once_and_empties_staging(
        client, clickhouse_url, ch_db, staging_names, kind, strategy) -> None:
    target = make_target(clickhouse_url, client, ch_db, kind)
    old = preexisting(clickhouse_url, ch_db)
    manifest = stage(client, clickhouse_url, target, staging_names(), 0)
    report = publish(client, manifest, strategy, MemoryLedger())
    assert report.published == ["202401", "202402", "202403"] and report.rows == 90
    assert keys_in(clickhouse_url, ch_db) == expect(old, range(90))
    assert staged_rows(clickhouse_url, manifest.staging_table) == 0


@pytest.mark.parametrize("kind,strategy", [("plain", "attach_marked"),
                                           ("replicated", "attach_replicated")])
def test_repeated_publish_changes_nothing(
        client, clickhouse_url, ch_db, staging_names, kind, strategy) -> None:
    target = make_target(clickhouse_url, client, ch_db, kind)
    manifest = stage(client, clickhouse_url, target, staging_names(), 0)
    ledger = MemoryLedger()
    publish(client, manifest, strategy, ledger)
    report = publish(client, manifest, strategy, ledger)
    assert report.published == [] and report.already_published == list(manifest.partition_ids)
    assert keys_in(clickhouse_url, ch_db) == expect(range(90))


@pytest.mark.parametrize("strategy", ["attach_marked", "attach_replicated"])
def test_publish_after_staging_was_dropped_by_the_caller_changes_nothing(
        client, clickhouse_url, ch_db, staging_names, strategy) -> None:
    kind = "replicated" if strategy == "attach_replicated" else "plain"
    target = make_target(clickhouse_url, client, ch_db, kind)
    manifest = stage(client, clickhouse_url, target, staging_names(), 0)
    ledger = MemoryLedger()
    publish(client, manifest, strategy, ledger)
    rollback(client, manifest.staging_table)
    publish(client, manifest, strategy, ledger)
    assert keys_in(clickhouse_url, ch_db) == expect(range(90))


def test_publish_of_an_empty_manifest_does_nothing(
        client, clickhouse_url, ch_db, staging_names) -> None:
    target = make_target(clickhouse_url, client, ch_db, "plain")
    manifest = stage(client, clickhouse_url, target, staging_names(), 0, rows=0)
    ledger = MemoryLedger()
    assert publish(client, manifest, "attach_marked", ledger).published == []
    assert ledger.keys() == []


def test_unknown_strategy_is_refused(client, clickhouse_url, ch_db, staging_names) -> None:
    target = make_target(clickhouse_url, client, ch_db, "plain")
    manifest = stage(client, clickhouse_url, target, staging_names(), 0, rows=3)
    with pytest.raises(ValueError, match="unknown publish strategy"):
        publish(client, manifest, "teleport", MemoryLedger())


def test_publish_refuses_staging_that_changed_since_seal(
        client, clickhouse_url, ch_db, staging_names) -> None:
    target = make_target(clickhouse_url, client, ch_db, "plain")
    manifest = stage(client, clickhouse_url, target, staging_names(), 0)
    run_sql(clickhouse_url, f"INSERT INTO `{STAGING_DATABASE}`.`{manifest.staging_table}` "
                            "(d, k) VALUES ('2024-01-20', 5000)")
    with pytest.raises(StagingChanged, match="202401"):
        publish(client, manifest, "attach_marked", MemoryLedger())
    assert keys_in(clickhouse_url, ch_db) == (0, 0, 0)


def test_publish_refuses_staging_that_vanished_before_publish(
        client, clickhouse_url, ch_db, staging_names) -> None:
    target = make_target(clickhouse_url, client, ch_db, "plain")
    manifest = stage(client, clickhouse_url, target, staging_names(), 0)
    rollback(client, manifest.staging_table)
    with pytest.raises(StagingChanged, match="no longer holds"):
        publish(client, manifest, "attach_marked", MemoryLedger())


# -- crash at every step, then re-run ------------------------------------------------------


@pytest.mark.parametrize("step", PUBLISH_STEPS["attach_replicated"])
def test_attach_replicated_rerun_after_crash_at_step_publishes_each_row_once(
        client, clickhouse_url, ch_db, staging_names, step) -> None:
    target = make_target(clickhouse_url, client, ch_db, "replicated")
    old = preexisting(clickhouse_url, ch_db)
    manifest = stage(client, clickhouse_url, target, staging_names(), 0)
    ledger = MemoryLedger()
    with pytest.raises(Crash):
        publish(client, manifest, "attach_replicated", ledger, on_step=crash_at(step))
    publish(client, manifest, "attach_replicated", ledger)
    assert keys_in(clickhouse_url, ch_db) == expect(old, range(90))
    assert staged_rows(clickhouse_url, manifest.staging_table) == 0


@pytest.mark.parametrize("step", ["publish.after_intent", "publish.after_attach"])
def test_attach_replicated_repeat_after_the_dedup_window_is_in_doubt_not_repeated(
        client, clickhouse_url, ch_db, staging_names, step) -> None:
    run_sql(clickhouse_url, f"CREATE TABLE `{ch_db}`.t {COLUMNS} ENGINE = ReplicatedMergeTree("
                            f"'/clickhouse/tables/{ch_db}/t', '{{replica}}') PARTITION BY "
                            "toYYYYMM(d) ORDER BY k SETTINGS "
                            "replicated_deduplication_window_seconds = 2")
    target = describe_table(client, f"{ch_db}.t")
    manifest = stage(client, clickhouse_url, target, staging_names(), 0)
    ledger = MemoryLedger()
    with pytest.raises(Crash):
        publish(client, manifest, "attach_replicated", ledger, on_step=crash_at(step))
    time.sleep(2.5)  # the server may have forgotten the first ATTACH's block ids by now
    with pytest.raises(InDoubtPublish, match="replicated_deduplication_window_seconds"):
        publish(client, manifest, "attach_replicated", ledger)
    attached = expect(range(90)) if step == "publish.after_attach" else (0, 0, 0)
    assert keys_in(clickhouse_url, ch_db) == attached


@pytest.mark.parametrize("kind,strategy", [("plain", "attach_marked"),
                                           ("replicated", "attach_replicated")])
def test_rerun_after_a_crash_inside_the_multi_partition_alter_publishes_each_row_once(
        client, clickhouse_url, ch_db, staging_names, kind, strategy) -> None:
    """The ALTER's commands are not atomic together: one partition may be in, others not."""
    target = make_target(clickhouse_url, client, ch_db, kind)
    old = preexisting(clickhouse_url, ch_db)
    manifest = stage(client, clickhouse_url, target, staging_names(), 0)
    ledger = MemoryLedger()
    with pytest.raises(Crash):
        publish(client, manifest, strategy, ledger, on_step=crash_at(STEP_AFTER_INTENT))
    run_sql(clickhouse_url, f"ALTER TABLE `{ch_db}`.t ATTACH PARTITION ID '202402' FROM "
                            f"`{STAGING_DATABASE}`.`{manifest.staging_table}`")
    publish(client, manifest, strategy, ledger)
    assert keys_in(clickhouse_url, ch_db) == expect(old, range(90))


@pytest.mark.parametrize("strategy", ["attach_marked", "attach_replicated"])
def test_publish_writes_two_ledger_records_whatever_the_partition_count(
        client, clickhouse_url, ch_db, staging_names, strategy) -> None:
    kind = "replicated" if strategy == "attach_replicated" else "plain"
    target = make_target(clickhouse_url, client, ch_db, kind)
    manifest = stage(client, clickhouse_url, target, staging_names(), 0)
    ledger = RecordingLedger()
    publish(client, manifest, strategy, ledger)
    assert [w["state"] for w in ledger.writes] == ["attaching", "published"]
    assert ledger.writes[0]["attaching"] == list(manifest.partition_ids)


# -- attach_marked: how an interrupted attach is decided ---------------------------------


# -- attach_replicated: the server's content deduplication ---------------------------------


def stage_again(client: ClickHouseClient, url: str, target: TargetTable, name: str
                ) -> Manifest:
    """``stage(..., 0)`` once more: parts byte-identical to its first staging's."""
    return stage(client, url, target, name, 0)


def published_then_staged_again(client: ClickHouseClient, url: str, database: str,
                                staging_names: Callable[[], str],
                                again: Callable[..., Manifest] = stage_again
                                ) -> tuple[MemoryLedger, Manifest]:
    """A Replicated target that got ``stage(..., 0)``'s rows through ``attach_replicated``,
    and a second staging from ``again`` holding a part byte-identical to it per partition."""
    target = make_target(url, client, database, "replicated")
    first = stage(client, url, target, staging_names(), 0)
    second = again(client, url, target, staging_names())
    ledger = MemoryLedger()
    publish(client, first, "attach_replicated", ledger)
    return ledger, second


def twice(keys: range) -> tuple[int, int, int]:
    rows, distinct, total = expect(keys)
    return 2 * rows, distinct, 2 * total


def test_replicated_publish_of_content_identical_to_an_earlier_branch_copies_it_once(
        client, clickhouse_url, ch_db, staging_names) -> None:
    ledger, second = published_then_staged_again(client, clickhouse_url, ch_db, staging_names)
    report = publish(client, second, "attach_replicated", ledger)
    assert report.published == list(second.partition_ids)
    assert keys_in(clickhouse_url, ch_db) == twice(range(90))
    assert staged_rows(clickhouse_url, second.staging_table) == 0
    publish(client, second, "attach_replicated", ledger)  # a repeat copies nothing again
    assert keys_in(clickhouse_url, ch_db) == twice(range(90))


@pytest.mark.parametrize("step", [STEP_AFTER_INTENT, STEP_AFTER_ATTACH,
                                  STEP_AFTER_INSERT_INTENT, STEP_AFTER_INSERT,
                                  "publish.after_mark"])
def test_replicated_copy_of_deduplicated_content_rerun_after_crash_at_step_copies_it_once(
        client, clickhouse_url, ch_db, staging_names, step) -> None:
    ledger, second = published_then_staged_again(client, clickhouse_url, ch_db, staging_names)
    with pytest.raises(Crash):
        publish(client, second, "attach_replicated", ledger, on_step=crash_at(step))
    publish(client, second, "attach_replicated", ledger)
    assert keys_in(clickhouse_url, ch_db) == twice(range(90))
    assert staged_rows(clickhouse_url, second.staging_table) == 0


def stage_twice(client: ClickHouseClient, url: str, target: TargetTable, name: str
                ) -> Manifest:
    """Staging whose every partition holds a part byte-identical to ``stage(..., 0)``'s and
    a part of other rows (keys 500..679, two a day)."""
    staging = create_staging_table(client, target, name)
    for first_key, rows in ((0, 90), (500, 180)):
        run_sql(url, f"INSERT INTO {staging} (d, k, n) SELECT toDate('2024-01-01') + "
                     f"number % 90, {first_key} + number, number FROM system.numbers "
                     f"LIMIT {rows}")
    return seal(client, target, staging, expected_rows=270)


@pytest.mark.parametrize("step", [None, STEP_AFTER_ATTACH, STEP_AFTER_INSERT_INTENT,
                                  STEP_AFTER_INSERT])
def test_replicated_publish_copies_only_the_parts_the_server_dropped(
        client, clickhouse_url, ch_db, staging_names, step) -> None:
    ledger, second = published_then_staged_again(client, clickhouse_url, ch_db, staging_names,
                                                  stage_twice)
    assert all(len(p.parts) == 2 for p in second.partitions)
    if step is not None:
        with pytest.raises(Crash):
            publish(client, second, "attach_replicated", ledger, on_step=crash_at(step))
    publish(client, second, "attach_replicated", ledger)
    rows, distinct, total = keys_in(clickhouse_url, ch_db)
    assert (rows, distinct, total) == (360, 270, 2 * sum(range(90)) + sum(range(500, 680)))
    assert staged_rows(clickhouse_url, second.staging_table) == 0


def test_replicated_copy_rerun_is_in_doubt_when_a_merge_mixed_the_copied_part(
        client, clickhouse_url, ch_db, staging_names) -> None:
    ledger, second = published_then_staged_again(client, clickhouse_url, ch_db, staging_names)
    with pytest.raises(Crash):
        publish(client, second, "attach_replicated", ledger,
                on_step=crash_at(STEP_AFTER_INSERT))
    run_sql(clickhouse_url, f"SYSTEM START MERGES `{ch_db}`.t")
    run_sql(clickhouse_url, f"OPTIMIZE TABLE `{ch_db}`.t PARTITION 202401 FINAL")
    with pytest.raises(InDoubtPublish, match="merged"):
        publish(client, second, "attach_replicated", ledger)
    assert keys_in(clickhouse_url, ch_db) == twice(range(90))


def test_replicated_publish_into_a_table_views_read_keeps_the_servers_deduplication(
        client, clickhouse_url, ch_db, staging_names, caplog) -> None:
    """A copy by INSERT would fire the views again; a plain INSERT's block the table drops
    still reaches its views, so the table keeps the server's deduplication, with a
    warning."""
    target = make_target(clickhouse_url, client, ch_db, "replicated")
    run_sql(clickhouse_url, f"CREATE MATERIALIZED VIEW `{ch_db}`.keys ENGINE = MergeTree() "
                            f"ORDER BY k AS SELECT k FROM `{ch_db}`.t")
    first = stage(client, clickhouse_url, target, staging_names(), 0)
    second = stage(client, clickhouse_url, target, staging_names(), 0)
    ledger = MemoryLedger()
    publish(client, first, "attach_replicated", ledger)
    with caplog.at_level("WARNING"):
        publish(client, second, "attach_replicated", ledger)
    assert "feeds materialized views" in caplog.text
    assert keys_in(clickhouse_url, ch_db) == expect(range(90))
    assert int(run_sql(clickhouse_url, f"SELECT count() FROM `{ch_db}`.keys")) == 0
    assert staged_rows(clickhouse_url, second.staging_table) == 0


def test_replicated_publish_of_identical_parts_within_one_branch_keeps_all_rows(
        client, clickhouse_url, ch_db, staging_names) -> None:
    target = make_target(clickhouse_url, client, ch_db, "replicated")
    staging = create_staging_table(client, target, staging_names())
    for _ in range(3):
        run_sql(clickhouse_url, f"INSERT INTO {staging} (d, k) VALUES ('2024-01-01', 7)")
    manifest = seal(client, target, staging, expected_rows=3)
    publish(client, manifest, "attach_replicated", MemoryLedger())
    assert keys_in(clickhouse_url, ch_db) == (3, 1, 21)


# -- dynamic partition overwrite ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["plain", "replicated"])
def test_overwrite_replaces_partitions_in_the_data_and_leaves_the_others(
        client, clickhouse_url, ch_db, staging_names, kind) -> None:
    target = make_target(clickhouse_url, client, ch_db, kind)
    run_sql(clickhouse_url, f"INSERT INTO `{ch_db}`.t (d, k) VALUES ('2024-01-09', 900), "
                            "('2024-06-09', 901)")
    manifest = stage(client, clickhouse_url, target, staging_names(), 0)
    report = publish(client, manifest, "attach_marked", MemoryLedger(), overwrite=True)
    assert report.published == ["202401", "202402", "202403"]
    assert keys_in(clickhouse_url, ch_db) == expect(range(90), [901])


def test_overwrite_combines_all_branches_staging_the_same_partition(
        client, clickhouse_url, ch_db, staging_names) -> None:
    target = make_target(clickhouse_url, client, ch_db, "plain")
    run_sql(clickhouse_url, f"INSERT INTO `{ch_db}`.t (d, k) VALUES ('2024-01-09', 900)")
    branches = [stage(client, clickhouse_url, target, staging_names(), start)
                for start in (0, 100)]
    publish_overwrite(client, branches, staging_names(), MemoryLedger())
    assert keys_in(clickhouse_url, ch_db) == expect(range(90), range(100, 190))


@pytest.mark.parametrize("kind", ["plain", "replicated"])
@pytest.mark.parametrize("step", PUBLISH_STEPS["replace"])
def test_overwrite_rerun_after_crash_at_step_leaves_exactly_the_new_rows(
        client, clickhouse_url, ch_db, staging_names, kind, step) -> None:
    target = make_target(clickhouse_url, client, ch_db, kind)
    preexisting(clickhouse_url, ch_db)
    branches = [stage(client, clickhouse_url, target, staging_names(), start)
                for start in (0, 100)]
    combined = staging_names()
    ledger = MemoryLedger()
    with pytest.raises(Crash):
        publish_overwrite(client, branches, combined, ledger, on_step=crash_at(step))
    publish_overwrite(client, branches, combined, ledger)
    assert keys_in(clickhouse_url, ch_db) == expect(range(90), range(100, 190))
    assert run_sql(clickhouse_url, f"EXISTS TABLE `{STAGING_DATABASE}`.`{combined}`") == "0\n"


def test_overwrite_repeated_after_success_changes_nothing(
        client, clickhouse_url, ch_db, staging_names) -> None:
    target = make_target(clickhouse_url, client, ch_db, "plain")
    branches = [stage(client, clickhouse_url, target, staging_names(), start)
                for start in (0, 100)]
    combined, ledger = staging_names(), MemoryLedger()
    publish_overwrite(client, branches, combined, ledger)
    report = publish_overwrite(client, branches, combined, ledger)
    assert report.published == [] and len(report.already_published) == MONTHS
    assert keys_in(clickhouse_url, ch_db) == expect(range(90), range(100, 190))
