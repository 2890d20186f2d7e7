"""The old-server wing's ``attach_marked`` publish on real 18.16 targets: re-runs after
crashes decided from the parts above the watermark, the target's merges held, in-doubt
partitions, and statements repeated past the clones an interrupted one left (also the
overwrite's). The strategy's runs beside the others' stay in ``tests/server_ext/test_publish.py``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from server_ext.client.http_client import ClickHouseClient
from server_ext.errors import ClickHouseError, InDoubtPublish, StagingChanged
from server_ext.publish.attach_decision import max_block_number
from server_ext.publish.publish_branch import publish
from server_ext.publish.publish_ledger import MemoryLedger, resolve_partition
from server_ext.publish.publish_steps import PUBLISH_STEPS, STEP_AFTER_ATTACH, STEP_AFTER_INTENT
from server_ext.publish.strategy_run import STATEMENT_WAIT_SECONDS
from server_ext.staging.manifest import Manifest
from server_ext.staging.staging_tables import STAGING_DATABASE
from tests.conftest import run_sql
from tests.server_ext.test_publish import (
    Crash,
    crash_at,
    expect,
    keys_in,
    make_target,
    preexisting,
    stage,
    staged_rows,
)


@pytest.mark.parametrize("step", PUBLISH_STEPS["attach_marked"])
def test_attach_marked_rerun_after_crash_at_step_publishes_each_row_once(
        client, clickhouse_url, ch_db, staging_names, step) -> None:
    target = make_target(clickhouse_url, client, ch_db, "plain")
    old = preexisting(clickhouse_url, ch_db)
    manifest = stage(client, clickhouse_url, target, staging_names(), 0)
    ledger = MemoryLedger()
    with pytest.raises(Crash):
        publish(client, manifest, "attach_marked", ledger, on_step=crash_at(step))
    publish(client, manifest, "attach_marked", ledger)
    assert keys_in(clickhouse_url, ch_db) == expect(old, range(90))
    assert staged_rows(clickhouse_url, manifest.staging_table) == 0


def test_attach_marked_rerun_after_crashes_at_every_step_in_turn_publishes_once(
        client, clickhouse_url, ch_db, staging_names) -> None:
    target = make_target(clickhouse_url, client, ch_db, "plain")
    manifest = stage(client, clickhouse_url, target, staging_names(), 0)
    ledger = MemoryLedger()
    for step in PUBLISH_STEPS["attach_marked"]:
        try:
            publish(client, manifest, "attach_marked", ledger, on_step=crash_at(step))
        except Crash:
            pass
    publish(client, manifest, "attach_marked", ledger)
    assert keys_in(clickhouse_url, ch_db) == expect(range(90))


def leave_clones(client: ClickHouseClient, url: str, database: str, manifest: Manifest,
                 clones: list[tuple[int, int]]) -> list[str]:
    """Leave in the target's directory what a server killed inside an ATTACH leaves:
    clones ``tmp_replace_from_<partition>_<n>_<n>_<level>``. Each of ``clones`` is (the
    staged part, in command order; the how-manyth number the target's next statements
    draw): measured on 18.16, they draw the numbers after the target's highest block
    number, one per part cloned or failure."""
    path = run_sql(url, "SELECT data_path FROM system.tables WHERE database = "
                        f"'{database}' AND name = 't'").strip()
    highest = max_block_number(client, database, "t")
    parts = [(p.partition_id, name.split("_")[3])
             for p in manifest.partitions for name in sorted(p.part_names)]
    names = []
    for part, draw in clones:
        partition_id, level = parts[part]
        number = highest + draw
        names.append(f"tmp_replace_from_{partition_id}_{number}_{number}_{level}")
        (Path(path) / names[-1]).mkdir()
    return names


@pytest.mark.parametrize("where", ["first_command", "last_command", "in_turn"])
def test_attach_marked_publishes_once_past_clones_an_interrupted_attach_left(
        client, clickhouse_url, ch_db, staging_names, caplog, where) -> None:
    """The ALTER fails on a leftover after its earlier commands attached: the repeat
    decides those as attached and sends only the rest."""
    target = make_target(clickhouse_url, client, ch_db, "plain")
    preexisting(clickhouse_url, ch_db)
    manifest = stage(client, clickhouse_url, target, staging_names(), 0)
    last = sum(len(p.parts) for p in manifest.partitions) - 1
    clones = {"first_command": [(0, 1)], "last_command": [(last, last + 1)],
              "in_turn": [(0, 1), (0, 2)]}[where]
    leftovers = leave_clones(client, clickhouse_url, ch_db, manifest, clones)
    publish(client, manifest, "attach_marked", MemoryLedger())
    assert keys_in(clickhouse_url, ch_db) == expect(range(1000000, 1000003), range(90))
    assert all(f"holds {name}" in caplog.text for name in leftovers)


def test_overwrite_replaces_past_clones_an_interrupted_replace_left(
        client, clickhouse_url, ch_db, staging_names, caplog) -> None:
    target = make_target(clickhouse_url, client, ch_db, "plain")
    preexisting(clickhouse_url, ch_db)
    manifest = stage(client, clickhouse_url, target, staging_names(), 0)
    (leftover,) = leave_clones(client, clickhouse_url, ch_db, manifest, [(1, 2)])
    publish(client, manifest, "attach_marked", MemoryLedger(), overwrite=True)
    assert keys_in(clickhouse_url, ch_db) == expect(range(90))
    assert f"holds {leftover}" in caplog.text


def test_attach_marked_rerun_waits_for_a_statement_of_the_interrupted_run_to_end(
        server, server_url, server_db, server_staging_names) -> None:
    """The rerun waits for a running statement that names the staging table, and for
    nothing else: on 26.x the server's own keep-alive query (``txsink_keepalive``, running
    as long as the server does) is in ``system.processes`` throughout, and does not name
    the staging table. Were it taken for the interrupted ALTER, the rerun would wait
    ``STATEMENT_WAIT_SECONDS`` and give up with InDoubtPublish."""
    client = ClickHouseClient(server_url)
    target = make_target(server_url, client, server_db, "plain")
    manifest = stage(client, server_url, target, server_staging_names(), 0)
    ledger = MemoryLedger()
    with pytest.raises(Crash):
        publish(client, manifest, "attach_marked", ledger, on_step=crash_at(STEP_AFTER_INTENT))
    staging = f"`{STAGING_DATABASE}`.`{manifest.staging_table}`"
    slow = f"SELECT sleep(1.5), (SELECT count() FROM {staging})"
    still_running = threading.Thread(target=run_sql, args=(server_url, slow))  # the ALTER
    still_running.start()
    time.sleep(0.3)
    keepalive = int(run_sql(server_url, "SELECT count() FROM system.processes WHERE "
                                        "position(query, 'txsink_keepalive') > 0 AND "
                                        "position(query, 'system.processes') = 0"))
    assert keepalive == (1 if server == "ch26" else 0)
    started = time.monotonic()
    publish(client, manifest, "attach_marked", ledger)
    assert 1.0 < time.monotonic() - started < STATEMENT_WAIT_SECONDS
    still_running.join()
    assert keys_in(server_url, server_db) == expect(range(90))


def test_attach_partition_gives_attached_parts_block_numbers_above_the_watermark(
        client, clickhouse_url, ch_db, staging_names) -> None:
    """The server behaviour attach_marked's recovery rests on (measured on 18.16)."""
    target = make_target(clickhouse_url, client, ch_db, "plain")
    preexisting(clickhouse_url, ch_db)
    before = int(run_sql(clickhouse_url, "SELECT max(max_block_number) FROM system.parts "
                                         f"WHERE database = '{ch_db}'"))
    manifest = stage(client, clickhouse_url, target, staging_names(), 0)
    publish(client, manifest, "attach_marked", MemoryLedger())
    blocks = run_sql(clickhouse_url, "SELECT min_block_number, max_block_number FROM "
                                     f"system.parts WHERE database = '{ch_db}' AND active "
                                     f"AND max_block_number > {before} FORMAT CSV").split()
    assert len(blocks) == len(manifest.partitions)
    assert all(low == high for low, high in (b.split(",") for b in blocks))


def test_attach_marked_keeps_target_merges_stopped_while_a_publish_is_interrupted(
        client, clickhouse_url, ch_db, staging_names) -> None:
    target = make_target(clickhouse_url, client, ch_db, "plain")
    manifest = stage(client, clickhouse_url, target, staging_names(), 0)
    ledger = MemoryLedger()
    with pytest.raises(Crash):
        publish(client, manifest, "attach_marked", ledger, on_step=crash_at(STEP_AFTER_ATTACH))
    with pytest.raises(ClickHouseError, match="Cancelled merging parts"):
        client.execute(f"OPTIMIZE TABLE `{ch_db}`.t FINAL", purpose="test", retry=False)
    publish(client, manifest, "attach_marked", ledger)
    client.execute(f"OPTIMIZE TABLE `{ch_db}`.t FINAL", purpose="test", retry=False)


def test_attach_marked_refusing_a_changed_staging_leaves_the_target_merging(
        client, clickhouse_url, ch_db, staging_names) -> None:
    target = make_target(clickhouse_url, client, ch_db, "plain")
    manifest = stage(client, clickhouse_url, target, staging_names(), 0)
    lost = manifest.partitions[0].partition_id
    client.execute(f"ALTER TABLE `{STAGING_DATABASE}`.`{manifest.staging_table}` DROP "
                   f"PARTITION ID '{lost}'", purpose="lose staged rows")
    preexisting(clickhouse_url, ch_db)
    with pytest.raises(StagingChanged, match=lost):
        publish(client, manifest, "attach_marked", MemoryLedger())
    client.execute(f"OPTIMIZE TABLE `{ch_db}`.t FINAL", purpose="test", retry=False)


def test_attach_marked_rerun_is_in_doubt_when_a_merge_mixed_the_attached_part(
        client, clickhouse_url, ch_db, staging_names) -> None:
    target = make_target(clickhouse_url, client, ch_db, "plain")
    old = preexisting(clickhouse_url, ch_db)
    manifest = stage(client, clickhouse_url, target, staging_names(), 0)
    ledger = MemoryLedger()
    with pytest.raises(Crash):
        publish(client, manifest, "attach_marked", ledger, on_step=crash_at(STEP_AFTER_ATTACH))
    run_sql(clickhouse_url, f"SYSTEM START MERGES `{ch_db}`.t")  # as a server restart would
    run_sql(clickhouse_url, f"OPTIMIZE TABLE `{ch_db}`.t PARTITION ID '202401' FINAL")
    with pytest.raises(InDoubtPublish, match="202401") as err:
        publish(client, manifest, "attach_marked", ledger)
    assert err.value.partition_ids == ["202401"] and "merged" in err.value.found
    assert keys_in(clickhouse_url, ch_db) == expect(old, range(90))  # nothing doubled


def test_in_doubt_partition_resolved_as_attached_is_not_attached_again(
        client, clickhouse_url, ch_db, staging_names) -> None:
    target = make_target(clickhouse_url, client, ch_db, "plain")
    manifest = stage(client, clickhouse_url, target, staging_names(), 0)
    ledger = MemoryLedger()
    with pytest.raises(Crash):
        publish(client, manifest, "attach_marked", ledger, on_step=crash_at(STEP_AFTER_ATTACH))
    run_sql(clickhouse_url, f"SYSTEM START MERGES `{ch_db}`.t")
    run_sql(clickhouse_url, f"OPTIMIZE TABLE `{ch_db}`.t PARTITION ID '202401' FINAL")
    with pytest.raises(InDoubtPublish):
        publish(client, manifest, "attach_marked", ledger)
    resolve_partition(manifest, "202401", ledger, attached=True)
    publish(client, manifest, "attach_marked", ledger)
    assert keys_in(clickhouse_url, ch_db) == expect(range(90))


def test_attach_marked_rerun_attaches_when_only_foreign_parts_arrived_above_the_watermark(
        client, clickhouse_url, ch_db, staging_names) -> None:
    target = make_target(clickhouse_url, client, ch_db, "plain")
    manifest = stage(client, clickhouse_url, target, staging_names(), 0)
    ledger = MemoryLedger()
    with pytest.raises(Crash):
        publish(client, manifest, "attach_marked", ledger, on_step=crash_at(STEP_AFTER_INTENT))
    foreign = preexisting(clickhouse_url, ch_db)  # other writers insert in the window
    publish(client, manifest, "attach_marked", ledger)
    assert keys_in(clickhouse_url, ch_db) == expect(foreign, range(90))


def test_attach_marked_rerun_is_in_doubt_when_an_identical_part_arrived_besides_the_attach(
        client, clickhouse_url, ch_db, staging_names) -> None:
    target = make_target(clickhouse_url, client, ch_db, "plain")
    manifest = stage(client, clickhouse_url, target, staging_names(), 0, rows=1)
    ledger = MemoryLedger()
    with pytest.raises(Crash):
        publish(client, manifest, "attach_marked", ledger, on_step=crash_at(STEP_AFTER_ATTACH))
    run_sql(clickhouse_url, f"INSERT INTO `{ch_db}`.t (d, k, n) VALUES ('2024-01-01', 0, 0)")
    with pytest.raises(InDoubtPublish, match="more than once"):
        publish(client, manifest, "attach_marked", ledger)
    assert keys_in(clickhouse_url, ch_db)[0] == 2  # ours and the identical foreign row
