"""``BranchPublisher.groups`` and ``together``: which winners of one epoch are published
at once, and which of a group share one intent write."""

from __future__ import annotations

from coordinator import BranchRecord, BranchState
from server_ext import Manifest
from server_ext.staging.manifest import PartitionManifest, StagedPart
from txsink.core.payload import CombinedBranch, StagedBranch, to_record
from txsink.core.publisher import BranchPublisher


def manifest(branch_id: str, rows: int, table: str = "events", level: int = 0) -> Manifest:
    """A staging table holding one part of ``rows`` rows in 202401."""
    part = StagedPart(f"202401_1_1_{level}", rows, rows * 10)
    return Manifest("db", table, "txsink_staging", f"s_{branch_id}",
                    (PartitionManifest("202401", "202401", (part,)),))


def winner(branch_id: str, payload: StagedBranch | CombinedBranch) -> BranchRecord:
    return BranchRecord("sink", 1, branch_id, BranchState.PREPARED, 1,
                        manifest=to_record(payload))


def staged(branch_id: str, rows: int, strategy: str = "move", table: str = "events",
           level: int = 0) -> BranchRecord:
    """A prepared winner of its own staging."""
    return winner(branch_id, StagedBranch(manifest(branch_id, rows, table, level), strategy,
                                          f"s_{branch_id}", None, rows))


def grouped(winners: list[BranchRecord]) -> list[list[str]]:
    return [[b.branch_id for b in group]
            for group in BranchPublisher.groups(winners)]


def together(winners: list[BranchRecord]) -> list[str]:
    return [m.staging_table for m in BranchPublisher.together(winners)]


def test_winners_of_one_table_are_one_group() -> None:
    assert grouped([staged("p0", 10), staged("p1", 11)]) == [["p0", "p1"]]


def test_winners_of_different_tables_are_different_groups() -> None:
    winners = [staged("p0", 10), staged("p1", 10), staged("p2", 10, table="rollup")]
    assert grouped(winners) == [["p0", "p1"], ["p2"]]


def test_move_winners_without_look_alike_parts_are_published_together() -> None:
    assert together([staged("p0", 10), staged("p1", 11)]) == ["s_p0", "s_p1"]


def test_move_winners_with_parts_of_equal_rows_and_bytes_go_one_after_another() -> None:
    assert together([staged("p0", 10), staged("p1", 10)]) == []


def test_winners_of_another_strategy_go_one_after_another() -> None:
    assert together([staged("p0", 10, "attach_marked"), staged("p1", 11, "attach_marked")]) == []


def test_move_winners_holding_merged_parts_go_one_after_another() -> None:
    assert together([staged("p0", 10, level=1), staged("p1", 11)]) == []


def test_a_combined_winner_goes_one_after_another_with_the_others() -> None:
    combined = CombinedBranch.of({"p2": manifest("p2", 12), "p3": manifest("p3", 13)},
                                 strategy="move", staging="c", server=None)
    assert together([staged("p0", 10), winner("c", combined)]) == []


def test_a_lone_winner_is_published_on_its_own() -> None:
    assert together([staged("p0", 10)]) == []
