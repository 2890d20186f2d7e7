"""Records other releases read: publish records, owner records, epoch metrics, operators'
decisions. Each fixture is a record as the releases before the ``format`` keys wrote it,
byte for byte; each type reads it, round-trips its own, and refuses what it cannot read.
"""

from __future__ import annotations

import pytest

from coordinator import BranchRecord, BranchState
from server_ext.publish.publish_ledger import (
    ATTACHING,
    COMBINED,
    PUBLISHED,
    MemoryLedger,
    PublishRecord,
    UnknownPublishRecord,
)
from server_ext.staging.manifest import Manifest
from tests.core.test_commit_payload import FORMAT_1_BRANCH, MANIFEST_V1
from txsink.core.metrics import RECOVERY, EpochMetrics, GivenUpPartition
from txsink.core.operator_records import (
    GIVEN_UP_KEY,
    SWITCH_KEY,
    GivenUp,
    GivenUpPartitions,
    StrategySwitch,
    SwitchStep,
)
from txsink.core.payload import BranchOwner, staging_place

OLD_INTENT = {"state": "attaching", "attaching": ["202401"], "published": ["202312"],
              "watermark": 118}
OLD_REPLICATED_INTENT = {"state": "attaching", "attaching": ["202401"], "published": [],
                         "at": 1764000000.5}
OLD_OWNER = {"host": "worker-3", "pid": 4242, "stage": 2, "partition": 0, "attempt": 1,
             "task_attempt_id": 17, "run_id": None, "staging": "txs_a", "server": None,
             "shard": 0}
OLD_METRICS = {"rows": 90, "bytes": 4000, "branches": 2, "partitions": 2, "stage_ms": 10.5,
               "seal_ms": 3.0, "commit_ms": 88.1, "cleanup_ms": 4.0, "latency_ms": 120.0,
               "committed_at": 1764000001.0, "finished_by": "writer"}


def test_an_intent_without_format_key_reads_with_its_partitions_and_watermark():
    record = PublishRecord.from_dict(OLD_INTENT)
    assert (record.state, record.intended, record.published, record.watermark) == (
        ATTACHING, {"202401"}, ("202312",), 118)


def test_a_replicated_intent_keeps_the_time_its_first_attach_began():
    assert PublishRecord.from_dict(OLD_REPLICATED_INTENT).at == 1764000000.5


def test_a_published_record_names_no_partition_in_flight():
    record = PublishRecord.from_dict({"state": "published"})
    assert record.is_published and record.intended == set()


def test_a_combined_record_carries_the_combined_tables_manifest():
    raw = {"state": "combined", "manifest": MANIFEST_V1}
    record = PublishRecord.from_dict(raw)
    assert record.state == COMBINED and record.manifest == Manifest.from_dict(MANIFEST_V1)


@pytest.mark.parametrize("record", [
    PublishRecord.intent(["202401"], ["202312"], watermark=118),
    PublishRecord.intent([], ["a"], deduplicated=("b",)),
    PublishRecord.intent(["b"], [], at=1.5, blocks_before={"b": ("b_replace_from_1",)}),
    PublishRecord.intent([], ["a"], deduplicated=("b",), watermarks={"b": 7}),
    PublishRecord(PUBLISHED),
    PublishRecord(COMBINED, manifest=Manifest.from_dict(MANIFEST_V1)),
], ids=["intent", "deduplicated", "replicated_intent", "copy_intent", "published",
        "combined"])
def test_a_publish_record_round_trips_through_the_ledger(record):
    ledger = MemoryLedger()
    record.store(ledger, "txs_a")
    assert PublishRecord.load(ledger, "txs_a") == record


@pytest.mark.parametrize("raw", [{"format": 2, "state": "published"}, {"state": "half"}],
                         ids=["newer_format", "unknown_state"])
def test_a_publish_record_this_release_cannot_read_is_refused_by_name(raw):
    with pytest.raises(UnknownPublishRecord, match="publish record"):
        PublishRecord.from_dict(raw)


def test_an_owner_record_without_format_key_reads_with_its_task():
    owner = BranchOwner.from_record(OLD_OWNER)
    assert owner is not None
    assert (owner.staging, owner.server, owner.shard) == ("txs_a", None, 0)
    assert owner.task["task_attempt_id"] == 17
    assert BranchOwner.from_record(owner.to_record()) == owner


def _branch(owner: dict, manifest: dict | None = None) -> BranchRecord:
    return BranchRecord(sink_id="s", epoch=4, branch_id="p0-a0", state=BranchState.PREPARED,
                        generation=1, owner=owner, manifest=manifest)


def test_a_prepared_branchs_staging_is_where_its_payload_says():
    place = staging_place(_branch(OLD_OWNER, FORMAT_1_BRANCH))
    assert place is not None
    assert (place.staging, place.server) == (FORMAT_1_BRANCH["staging"],
                                             FORMAT_1_BRANCH["server"])


def test_an_unprepared_branchs_staging_is_where_its_owner_record_says():
    place = staging_place(_branch({**OLD_OWNER, "view": "txs_a-mv"}))
    assert place is not None and (place.staging, place.view) == ("txs_a", "txs_a-mv")


def test_a_branch_that_recorded_no_staging_has_no_place():
    assert staging_place(_branch({"host": "h"})) is None


def test_metrics_without_format_key_read_as_the_writers():
    metrics = EpochMetrics.from_dict(OLD_METRICS)
    assert (metrics.rows, metrics.commit_ms, metrics.by_writer) == (90, 88.1, True)
    assert EpochMetrics.from_dict(metrics.to_dict()) == metrics


def test_metrics_recovery_marked_are_not_the_writers():
    metrics = EpochMetrics.from_dict({**OLD_METRICS, "finished_by": RECOVERY,
                                      "recovered_at": 1764000002.0})
    assert not metrics.by_writer and metrics.recovered_at == 1764000002.0


def test_metrics_keys_of_a_newer_release_are_ignored():
    assert EpochMetrics.from_dict({**OLD_METRICS, "p99_ms": 3}).rows == 90


def test_metrics_given_up_partitions_round_trip():
    given = GivenUpPartition("p0-a0", "202401", "db.t", 60, "lost disk", 1764000003.0)
    metrics = EpochMetrics(given_up=(given,), strategy_switches={"p0": {"from": "move",
                                                                        "to": "attach_marked"}})
    assert EpochMetrics.from_dict(metrics.to_dict()) == metrics


def test_a_strategy_switch_without_format_key_reads_with_its_history():
    ledger = MemoryLedger()
    ledger.put(SWITCH_KEY, {"to": "attach_marked", "history": [
        {"from": "move", "to": "attach_marked", "why": "no MOVE", "cleared_intent": ["1"],
         "moved_before": [], "at": 1.0, "by": "host:1"}]})
    switch = StrategySwitch.load(ledger)
    assert switch is not None and switch.to == "attach_marked"
    assert switch.history[0] == SwitchStep("move", "attach_marked", "no MOVE", ("1",), (),
                                           1.0, "host:1")


def test_a_second_strategy_switch_keeps_the_first_in_its_history():
    ledger = MemoryLedger()
    first = SwitchStep("move", "attach_marked", "a", (), (), 1.0, "x")
    StrategySwitch("move").then(first).store(ledger)
    second = SwitchStep("attach_marked", "move", "b", (), (), 2.0, "y")
    StrategySwitch.load(ledger).then(second).store(ledger)  # type: ignore[union-attr]
    assert StrategySwitch.load(ledger) == StrategySwitch("move", (first, second))


def test_given_up_partitions_without_format_key_read_and_accumulate():
    ledger = MemoryLedger()
    ledger.put(GIVEN_UP_KEY, {"partitions": {"1": {"rows": 5, "reason": "", "at": 1.0,
                                                   "by": "x"}}})
    GivenUpPartitions.load(ledger).adding({"2": GivenUp(7, "r", 2.0, "y")}).store(ledger)
    assert sorted(GivenUpPartitions.load(ledger).partitions) == ["1", "2"]
