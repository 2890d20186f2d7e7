"""The ZooKeeper tree: escaped names, one tree per sink, the branch ledger."""

from __future__ import annotations

import inspect

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from coordinator import (
    Coordinator,
    Ledger,
    MalformedRecord,
    PublishLeaseLost,
    SinkTreeDamaged,
    UnknownBranch,
    put_together,
)
from coordinator.plumbing.paths import SinkLayout, escape, unescape
from coordinator.sink_admin import SinkAdmin
from server_ext.publish.publish_ledger import PublishLedger as LedgerProtocol
from tests.coordinator.test_coordinator_support import new_coordinator

STAGING = "txs_orders_0123456789ab_e0_p0a0aaaa0000_01234567_r0123456789ab"
INTENT = {"state": "attaching", "attaching": ["202401"], "published": [], "watermark": 118}


@pytest.mark.parametrize("sink_id", ["orders", "a/b", ".", "..", "stream-äöü", "x%2Fy",
                                     "zookeeper", " spaced "])
def test_any_sink_id_is_one_reversible_znode_name(sink_id: str) -> None:
    name = escape(sink_id)
    assert "/" not in name and name not in (".", "..")
    assert unescape(name) == sink_id


def test_an_empty_sink_id_is_refused(zk: KazooClient) -> None:
    with pytest.raises(ValueError):
        Coordinator(zk, "")


def test_a_relative_root_is_refused(zk: KazooClient) -> None:
    with pytest.raises(ValueError, match="absolute"):
        Coordinator(zk, "orders", root="txsink")


def test_epochs_are_zero_padded_so_children_sort_in_epoch_order() -> None:
    layout = SinkLayout("/txsink", "s")
    assert layout.xid(9) < layout.xid(10)
    assert layout.xid(41).endswith("/xids/00000000000000000041")


def test_sinks_lists_every_sink_by_its_original_id(zk: KazooClient) -> None:
    for sink_id in ("checkpoint:/tmp/ckpt/a", "nightly", ".."):
        Coordinator(zk, sink_id).fence()
    assert SinkAdmin.sinks(zk) == sorted(["checkpoint:/tmp/ckpt/a", "nightly", ".."])


def test_sinks_under_another_root_are_separate(zk: KazooClient) -> None:
    Coordinator(zk, "orders", root="/other").fence()
    assert SinkAdmin.sinks(zk, "/other") == ["orders"]
    assert SinkAdmin.sinks(zk) == []


def test_ledger_returns_what_was_put_and_none_for_a_missing_key(zk: KazooClient) -> None:
    coord, generation = new_coordinator(zk)
    coord.begin(0, generation)
    coord.register_branch(0, "p0-a0-aaaa0000", generation, owner={})
    with coord.publish_lease(0):
        ledger = coord.ledger(0, "p0-a0-aaaa0000")
        assert ledger.get(STAGING) is None
        ledger.put(STAGING, INTENT)
    assert ledger.get(STAGING) == INTENT


def test_ledger_put_overwrites_the_previous_value(zk: KazooClient) -> None:
    coord, generation = new_coordinator(zk)
    coord.begin(0, generation)
    coord.register_branch(0, "p0-a0-aaaa0000", generation, owner={})
    with coord.publish_lease(0):
        ledger = coord.ledger(0, "p0-a0-aaaa0000")
        ledger.put(STAGING, INTENT)
        ledger.put(STAGING, {"state": "published"})
        ledger.put(f"{STAGING}.combined", {"state": "combined", "manifest": {"rows": 1}})
    assert ledger.get(STAGING) == {"state": "published"}
    assert ledger.items() == {STAGING: {"state": "published"},
                              f"{STAGING}.combined": {"state": "combined",
                                                      "manifest": {"rows": 1}}}


def test_only_the_xid_first_lease_is_first(zk: KazooClient) -> None:
    coord, generation = new_coordinator(zk)
    coord.begin(0, generation)
    with coord.publish_lease(0) as lease:
        assert lease.first
    with coord.publish_lease(0) as lease:
        assert not lease.first


def test_a_ledger_written_under_an_earlier_lease_is_read_under_the_next(
        zk: KazooClient) -> None:
    coord, generation = new_coordinator(zk)
    coord.begin(0, generation)
    coord.register_branch(0, "p0-a0-aaaa0000", generation, owner={})
    with coord.publish_lease(0):
        coord.ledger(0, "p0-a0-aaaa0000").put(STAGING, INTENT)
    with coord.publish_lease(0):
        assert coord.ledger(0, "p0-a0-aaaa0000").get(STAGING) == INTENT


def test_a_second_ledger_of_a_branch_under_the_first_lease_reads_what_the_first_wrote(
        zk: KazooClient) -> None:
    coord, generation = new_coordinator(zk)
    coord.begin(0, generation)
    coord.register_branch(0, "p0-a0-aaaa0000", generation, owner={})
    with coord.publish_lease(0):
        coord.ledger(0, "p0-a0-aaaa0000").put(STAGING, INTENT)
        assert coord.ledger(0, "p0-a0-aaaa0000").get(STAGING) == INTENT


def two_branches(zk: KazooClient) -> Coordinator:
    coord, generation = new_coordinator(zk)
    coord.begin(0, generation)
    for branch_id in ("p0-a0-aaaa0000", "p1-a0-bbbb0000"):
        coord.register_branch(0, branch_id, generation, owner={})
    return coord


def test_entries_of_several_ledgers_are_written_together(zk: KazooClient) -> None:
    coord = two_branches(zk)
    with coord.publish_lease(0):
        first, second = coord.ledger(0, "p0-a0-aaaa0000"), coord.ledger(0, "p1-a0-bbbb0000")
        put_together([(first, STAGING, INTENT), (second, "other", {"state": "published"})])
        assert first.get(STAGING) == INTENT
    assert coord.ledger(0, "p0-a0-aaaa0000").get(STAGING) == INTENT
    assert coord.ledger(0, "p1-a0-bbbb0000").get("other") == {"state": "published"}


def test_entries_written_together_after_the_lease_was_lost_are_none_written(
        zk: KazooClient) -> None:
    coord = two_branches(zk)
    with coord.publish_lease(0) as lease:
        ledgers = [coord.ledger(0, "p0-a0-aaaa0000"), coord.ledger(0, "p1-a0-bbbb0000")]
        zk.delete(lease.node)  # as a session expiry deletes it
        with pytest.raises(PublishLeaseLost):
            put_together([(ledger, STAGING, INTENT) for ledger in ledgers])
    assert coord.ledger(0, "p0-a0-aaaa0000").items() == {}
    assert coord.ledger(0, "p1-a0-bbbb0000").items() == {}


def test_the_coordinator_ledger_implements_the_server_ext_protocol() -> None:
    """``coordinator.Ledger`` is the ZooKeeper ``server_ext.publish.PublishLedger`` (the two
    packages never import each other, so the match is structural: checked here)."""
    wanted = [n for n in vars(LedgerProtocol) if not n.startswith("_")]
    assert sorted(wanted) == ["confirm", "get", "put"]
    for name in wanted:
        ours = inspect.signature(getattr(Ledger, name)).parameters
        theirs = inspect.signature(getattr(LedgerProtocol, name)).parameters
        assert list(ours) == list(theirs), name


def test_ledger_keys_may_hold_any_character(zk: KazooClient) -> None:
    coord, generation = new_coordinator(zk)
    coord.begin(0, generation)
    coord.register_branch(0, "p0-a0-aaaa0000", generation, owner={})
    with coord.publish_lease(0):
        coord.ledger(0, "p0-a0-aaaa0000").put("(2024, 'a/b')", {"ok": 1})
    assert coord.ledger(0, "p0-a0-aaaa0000").get("(2024, 'a/b')") == {"ok": 1}


def test_ledger_of_an_unregistered_branch_is_refused(zk: KazooClient) -> None:
    coord, generation = new_coordinator(zk)
    coord.begin(0, generation)
    with pytest.raises(UnknownBranch), coord.publish_lease(0):
        coord.ledger(0, "p0-a0-nobody00").put("all", {"ok": 1})


# -- the shape of an existing tree: completed when provably half-made, else refused ----

SINK_NODE = "/txsink/sinks/orders"


@pytest.mark.timeout(60)
def test_a_sink_node_without_record_or_children_is_refused_naming_its_path(
        zk: KazooClient) -> None:
    zk.create(SINK_NODE, b"", makepath=True)
    with pytest.raises(SinkTreeDamaged, match=f"{SINK_NODE} exists but does not hold"):
        Coordinator(zk, "orders").fence()
    assert zk.get_children(SINK_NODE) == []


@pytest.mark.timeout(60)
def test_a_half_made_sink_tree_is_completed_and_then_used(zk: KazooClient) -> None:
    layout = SinkLayout("/txsink", "orders")
    zk.create(layout.sink, layout.initial()[layout.sink], makepath=True)
    coord = Coordinator(zk, "orders")
    assert coord.fence() == 1
    assert coord.allocate_epoch() == 0
    assert sorted(zk.get_children(layout.sink)) == sorted(
        p.rsplit("/", 1)[1] for p in layout.initial() if p != layout.sink)


def test_a_tree_missing_a_record_after_xids_began_is_refused_naming_the_record(
        zk: KazooClient) -> None:
    coord, generation = new_coordinator(zk, "orders")
    coord.begin(0, generation)
    zk.delete(f"{SINK_NODE}/last_committed")
    with pytest.raises(SinkTreeDamaged, match=f"lacks {SINK_NODE}/last_committed"):
        Coordinator(zk, "orders").check_tree()
    with pytest.raises(NoNodeError):
        zk.get(f"{SINK_NODE}/last_committed")  # not guessed back


@pytest.mark.timeout(60)
def test_a_record_that_is_not_json_is_refused_naming_its_path(zk: KazooClient) -> None:
    Coordinator(zk, "orders").fence()
    zk.set(f"{SINK_NODE}/generation", b"\x00garbage")
    with pytest.raises(MalformedRecord, match=f"{SINK_NODE}/generation does not hold"):
        Coordinator(zk, "orders").fence()
