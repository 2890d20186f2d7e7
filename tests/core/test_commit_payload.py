"""The commit payload a branch records is read by every later release's recovery.

Format 1 is what releases before the combined publish wrote (no ``format`` key); the
fixtures below are such records byte for byte. Format 2 adds ``format`` and ``kind``.
"""

from __future__ import annotations

import json

import pytest

import server_ext
from coordinator import PublishFailed, XidState
from server_ext.client.http_client import ClickHouseClient
from server_ext.publish import publish
from server_ext.publish.publish_steps import STEP_AFTER_ATTACH
from server_ext.types.digest import ContentDigest
from tests.ops.test_verify_target import ROOT, SINK, Writer, create_table
from txsink.core.payload import (
    CombinedBranch,
    StagedBranch,
    UnknownPayload,
    contributions,
    from_record,
    to_record,
)
from txsink.ops.commands import Operations

MANIFEST_V1 = {
    "v": 1, "target": ["db", "events"],
    "staging": ["txsink_staging", "txs_s_0123456789ab_e4_p0a0s0_89abcdef_r0f5b911f7acf"],
    "partitions": [{"id": "202401", "value": "202401",
                    "parts": [["202401_1_1_0", 60, 1200]]},
                   {"id": "202402", "value": "202402",
                    "parts": [["202402_2_2_0", 30, 700]]}],
}
FORMAT_1_BRANCH = json.loads(json.dumps({
    "manifest": MANIFEST_V1, "overwrite": False, "rows": 90,
    "server": "http://127.0.0.1:8123", "staging": MANIFEST_V1["staging"][1],
    "strategy": "attach_marked",
}))
FORMAT_1_OVERWRITE = {
    "overwrite_of": [MANIFEST_V1], "rows": 90, "server": None,
    "staging": "txs_s_0123456789ab_e4_overwrite1234abcd_5555aaaa_r0f5b911f7acf",
    "strategy": "attach_marked",
}


def test_format_1_branch_payload_is_read_as_a_staged_branch():
    found = from_record(FORMAT_1_BRANCH)
    assert isinstance(found, StagedBranch)
    assert (found.strategy, found.rows, found.overwrite) == ("attach_marked", 90, False)
    assert found.manifest.partition_ids == ("202401", "202402")


def test_format_1_overwrite_payload_is_read_with_its_embedded_manifests():
    found = from_record(FORMAT_1_OVERWRITE)
    assert isinstance(found, CombinedBranch) and found.overwrite
    assert [m.staging_table for m in found.embedded] == [MANIFEST_V1["staging"][1]]
    assert [(c.partition_id, c.value, c.rows, c.digest) for c in contributions(found)] == [
        ("202401", "202401", 60, None), ("202402", "202402", 30, None)]


def test_staged_branch_round_trips_through_its_record():
    staged = from_record(FORMAT_1_BRANCH)
    assert from_record(json.loads(json.dumps(to_record(staged)))) == staged


def test_combined_branch_round_trips_and_summarizes_its_sources():
    manifest = server_ext.Manifest.from_dict(MANIFEST_V1)
    combined = CombinedBranch.of({"p1-a0-s0-1": manifest, "p0-a0-s0-2": manifest},
                                 staging="txs_c", strategy="move", server=None)
    assert combined.sources == ("p0-a0-s0-2", "p1-a0-s0-1")
    assert combined.partitions == (("202401", "202401", 120), ("202402", "202402", 60))
    assert from_record(json.loads(json.dumps(to_record(combined)))) == combined


DIGEST = {"rows": 60, "sum": "18446744073709551615", "scheme": "0123456789abcdef"}
FORMAT_2_COMBINED_WITHOUT_DIGESTS = {
    "format": 2, "kind": "combined", "staging": "txs_c", "strategy": "move", "server": None,
    "rows": 90, "overwrite": False, "sources": ["p0-a0-s0-1", "p1-a0-s0-2"],
    "target": ["db", "events"], "partitions": [["202401", "202401", 60], ["202402", "202402", 30]],
}


def test_a_format_2_payload_without_digests_reads_with_none():
    staged = from_record({**FORMAT_1_BRANCH, "format": 2, "kind": "staged"})
    combined = from_record(FORMAT_2_COMBINED_WITHOUT_DIGESTS)
    assert [c.digest for p in (staged, combined) for c in contributions(p)] == [None] * 4


def test_digests_round_trip_and_a_combined_branch_sums_its_sources():
    manifest = server_ext.Manifest.from_dict({**MANIFEST_V1, "partitions": [
        {**MANIFEST_V1["partitions"][0], "digest": DIGEST}, MANIFEST_V1["partitions"][1]]})
    staged = StagedBranch(manifest=manifest, strategy="move", staging="s", server=None, rows=90)
    assert from_record(json.loads(json.dumps(to_record(staged)))) == staged
    combined = CombinedBranch.of({"a": manifest, "b": manifest}, staging="c", strategy="move",
                                 server=None)
    assert from_record(json.loads(json.dumps(to_record(combined)))) == combined
    # 202402 had no digest in a source: the combined branch records none for it
    assert [(c.partition_id, c.digest) for c in contributions(combined)] == [
        ("202401", ContentDigest(120, 2**64 - 2, "0123456789abcdef")), ("202402", None)]


def test_payload_of_a_newer_format_is_refused_by_name():
    with pytest.raises(UnknownPayload, match="format 3"):
        from_record({**FORMAT_1_BRANCH, "format": 3})


def test_committing_xid_of_format_1_interrupted_after_an_attach_is_finished_once(
        zk, zk_hosts, zk_chroot, clickhouse_url, ch_db):
    """The old release decided two branches and died right after one ATTACH (intent
    recorded, mark not): this release's recovery finishes it, every row once."""
    table = create_table(clickhouse_url, ch_db)
    writer = Writer(zk, clickhouse_url, table)
    coord, client = writer.coord, ClickHouseClient(clickhouse_url)
    epoch = coord.allocate_epoch()
    coord.begin(epoch, writer.generation)
    first, _ = writer._stage(epoch, {"2024-01": range(0, 50), "2024-02": range(50, 100)})
    second, _ = writer._stage(epoch, {"2024-01": range(100, 150)})

    def old_release_publish(record) -> None:  # its per-branch publish, dying mid-way
        def die(step: str) -> None:
            if step == STEP_AFTER_ATTACH:
                raise RuntimeError("driver died")
        publish(client, server_ext.Manifest.from_dict(record.manifest["manifest"]),
                           record.manifest["strategy"],
                           coord.ledger(epoch, record.branch_id), on_step=die)

    with pytest.raises(PublishFailed):
        coord.commit(epoch, writer.generation, [first, second], publish=old_release_publish,
                     rollback=lambda record: None)
    ops = Operations(zk_hosts + zk_chroot, zk_root=ROOT, url=clickhouse_url)
    try:
        ops.recover(SINK)
    finally:
        ops.close()
    assert coord.xid(epoch).state is XidState.COMMITTED
    rows, distinct = map(int, client.query_value(
        f"SELECT concat(toString(count()), ' ', toString(uniqExact(id))) FROM {table}",
        purpose="count").split())
    assert (rows, distinct) == (150, 150)
