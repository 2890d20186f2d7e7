"""The audit verifier: read a sink's history and report what must never happen.

The eBay block aggregator's runtime verifier, applied to our transaction log. The
coordinator prevents every one of these by construction; the audit exists to *prove* it
after the fact (and to catch what a hand edit, a bug, or a publish outside the protocol
did). It only reads.

Anomalies:

- ``gap``: an epoch between two committed epochs has no record at all (neither live nor
  pruned): a micro-batch whose data was never committed, or an allocated epoch whose
  ``begin`` never happened.
- ``double_commit``: an xid whose history shows more than one ``Committing`` or
  ``Committed`` entry.
- ``non_winner_published``: a branch marked ``Committed`` that is not a winner of its
  xid's current attempt, or whose xid is not committing.
- ``old_committing``: an xid ``Committing`` for longer than a threshold: publishing is
  stuck (ClickHouse down, an in-doubt partition) and needs ``recover`` or an operator.
- ``row_count_mismatch``: given ``target_counts`` (rows the targets actually gained per
  epoch, measured by the caller), the winners' manifests (their top-level ``rows``) say
  otherwise.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from coordinator.formats.records import BranchRecord, XidRecord
from coordinator.formats.states import BranchState, XidState
from coordinator.plumbing.nodes import NodeStore
from coordinator.plumbing.paths import SinkLayout
from coordinator.plumbing.store import SinkStore, default_retry
from coordinator.upkeep.retention import (
    DecidedXid,
    Ranges,
    Retention,
    Summary,
    add_to_ranges,
    in_ranges,
)


class AnomalyKind(StrEnum):
    GAP = "gap"
    DOUBLE_COMMIT = "double_commit"
    NON_WINNER_PUBLISHED = "non_winner_published"
    OLD_COMMITTING = "old_committing"
    ROW_COUNT_MISMATCH = "row_count_mismatch"


@dataclass(frozen=True)
class Anomaly:
    """One finding: what, where (epoch, branch) and a sentence an operator can act on."""

    kind: AnomalyKind
    sink_id: str
    epoch: int
    detail: str
    branch_id: str | None = None

    def __str__(self) -> str:
        where = f"{self.sink_id}/{self.epoch}" + (f" branch {self.branch_id}"
                                                  if self.branch_id else "")
        return f"{self.kind.value} at {where}: {self.detail}"


def audit(client: NodeStore, root: str, sink_id: str,
          target_counts: Mapping[int, int] | None = None,
          committing_older_than: float = 300.0) -> list[Anomaly]:
    """Every anomaly in ``sink_id``'s history, in epoch order.

    ``target_counts`` maps an epoch to the rows its targets gained (the caller measures
    them; the coordinator knows nothing about tables).
    """
    store = SinkStore(client, SinkLayout(root, sink_id), default_retry(client))
    records = store.run(store.read_xids, store.run(store.epochs, False))
    branches = {r.epoch: store.run(store.read_branches, r.epoch) for r in records}
    pruned = Retention(store).ranges()
    now = time.time()
    found = _gaps(sink_id, records, pruned)
    for record in records:
        found += _double_commits(record)
        found += _non_winners_published(record, branches[record.epoch])
        found += _old_committing(record, now, committing_older_than)
    for epoch, gained in sorted((int(e), int(n)) for e, n in (target_counts or {}).items()):
        record = next((r for r in records if r.epoch == epoch), None)
        found += _row_count(sink_id, epoch, record, branches.get(epoch, {}), gained)
    return sorted(found, key=lambda a: (a.epoch, a.kind.value, a.branch_id or ""))


def _gaps(sink_id: str, records: list[XidRecord], pruned: dict[str, Ranges]) -> list[Anomaly]:
    committed = add_to_ranges(pruned["committed"], [
        r.epoch for r in records if r.state is XidState.COMMITTED])
    if not committed:
        return []
    known = add_to_ranges(pruned["committed"] + pruned["aborted"], [r.epoch for r in records])
    low, high = committed[0][0], committed[-1][1]
    gaps = []
    for (_, end), (start, _) in zip(known, known[1:], strict=False):
        if end >= low and start <= high:
            gaps.append(Anomaly(
                AnomalyKind.GAP, sink_id, end + 1,
                f"epochs {end + 1}..{start - 1} have no record between committed "
                f"epochs {low} and {high}"))
    return gaps


def _double_commits(record: XidRecord) -> list[Anomaly]:
    states = [entry.get("state") for entry in record.history]
    decisions, commits = states.count("Committing"), states.count("Committed")
    if decisions <= 1 and commits <= 1:
        return []
    return [Anomaly(AnomalyKind.DOUBLE_COMMIT, record.sink_id, record.epoch,
                    f"history shows {decisions} commit decisions and {commits} commits")]


def _non_winners_published(record: XidRecord, branches: dict[str, BranchRecord]
                           ) -> list[Anomaly]:
    committing = record.state in (XidState.COMMITTING, XidState.COMMITTED)
    found = []
    for branch in branches.values():
        if branch.state is not BranchState.COMMITTED:
            continue
        if committing and branch.branch_id in record.winners and \
                branch.attempt == record.attempt:
            continue
        found.append(Anomaly(
            AnomalyKind.NON_WINNER_PUBLISHED, record.sink_id, record.epoch,
            f"branch is Committed (attempt {branch.attempt}) but the xid is "
            f"{record.state.value} (attempt {record.attempt}) with winners "
            f"{list(record.winners)}", branch.branch_id))
    return found


def _old_committing(record: XidRecord, now: float, threshold: float) -> list[Anomaly]:
    if record.state is not XidState.COMMITTING:
        return []
    age = now - (record.decided_at or record.updated)
    if age <= threshold:
        return []
    return [Anomaly(AnomalyKind.OLD_COMMITTING, record.sink_id, record.epoch,
                    f"Committing for {age:.0f} s (threshold {threshold:.0f} s): publishing "
                    "is stuck; run recover or inspect the winners")]


def _row_count(sink_id: str, epoch: int, record: XidRecord | None,
               branches: dict[str, BranchRecord], gained: int) -> list[Anomaly]:
    if record is None or record.state is XidState.COMMITTING:
        return []  # pruned, never begun, or still publishing: nothing to compare yet
    if record.state is XidState.COMMITTED:
        rows = [branches[b].rows if b in branches else None for b in record.winners]
        if any(r is None for r in rows):
            return [Anomaly(AnomalyKind.ROW_COUNT_MISMATCH, sink_id, epoch,
                            f"targets gained {gained} rows but a winner's manifest has no "
                            "row count to compare")]
        expected = sum(r for r in rows if r is not None)
    else:
        expected = 0  # nothing of an uncommitted xid may be visible
    if expected == gained:
        return []
    return [Anomaly(AnomalyKind.ROW_COUNT_MISMATCH, sink_id, epoch,
                    f"winners' manifests say {expected} rows, targets gained {gained} "
                    f"(xid is {record.state.value})")]


# -- history for the target check -------------------------------------------------------
# The coordinator does not read manifests or tables: it hands the caller what each decided
# xid's winners recorded, and says which committed xids it can no longer show.


@dataclass(frozen=True)
class SinkHistory:
    """What a sink's retained records say it made visible.

    ``decided`` are the retained ``Committing``/``Committed`` xids in epoch order (none
    that ``summary`` holds already); ``pruned_committed`` the ``[first, last]`` ranges of
    committed epochs whose records retention deleted; ``summary`` what retention folded
    of them (an epoch pruned and not in ``summary.folded``: what it wrote is unknown);
    ``states`` every retained xid's state when read, for :func:`changed_since`.
    """

    sink_id: str
    decided: tuple[DecidedXid, ...]
    pruned_committed: Ranges
    states: dict[int, XidState]
    summary: Summary = Summary()


def read_history(client: NodeStore, root: str, sink_id: str,
                 epochs: list[int] | None = None) -> SinkHistory:
    """The decided xids of ``sink_id`` (only ``epochs`` when given), its pruned ranges and
    its summary.

    The pruned ranges and the summary are read *after* the records: retention records an
    epoch as pruned (and folded) before deleting it, so an xid deleted while this runs is
    either read or in the ranges; one both read and folded is counted by the summary only.
    """
    store = SinkStore(client, SinkLayout(root, sink_id), default_retry(client))
    wanted = store.run(store.epochs, False) if epochs is None else epochs
    records = store.run(store.read_xids, wanted)
    decided = []
    for record in records:
        if record.state not in (XidState.COMMITTING, XidState.COMMITTED):
            continue
        found = store.run(store.read_branches, record.epoch, record.winners)
        decided.append(DecidedXid(
            record, tuple(found[b] for b in record.winners if b in found),
            tuple(b for b in record.winners if b not in found)))
    retention = Retention(store)
    pruned = retention.ranges()["committed"]
    summary = retention.summary()
    decided = [d for d in decided if not in_ranges(summary.folded, d.record.epoch)]
    return SinkHistory(sink_id, tuple(decided), pruned,
                       {r.epoch: r.state for r in records}, summary)


def read_all_branches(client: NodeStore, root: str, sink_id: str
                      ) -> list[tuple[XidRecord, BranchRecord]]:
    """Every retained branch of ``sink_id`` with its xid, for ``verify`` to name rows that
    were never to be published (a rolled-back attempt's staging attached by hand). Reads
    every branch: called only when a target holds extra rows."""
    store = SinkStore(client, SinkLayout(root, sink_id), default_retry(client))
    return [(record, branch)
            for record in store.run(store.read_xids, store.run(store.epochs, False))
            for branch in store.run(store.read_branches, record.epoch).values()]


def changed_since(client: NodeStore, root: str, history: SinkHistory) -> list[int]:
    """Epochs decided since ``history`` was read, or decided then and not yet Committed.

    What a caller compares with a target read between the two reads: a publish of any of
    these may or may not be in what it read.
    """
    store = SinkStore(client, SinkLayout(root, history.sink_id), default_retry(client))
    now = store.run(store.read_xids, store.run(store.epochs, False))
    changed = []
    for record in now:
        if record.state not in (XidState.COMMITTING, XidState.COMMITTED):
            continue
        if history.states.get(record.epoch) is not XidState.COMMITTED:
            changed.append(record.epoch)
    return changed
