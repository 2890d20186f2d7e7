"""The target check of ``txsink verify``: rows the targets hold against rows committed.

The audit of the coordinator's history (``coordinator.upkeep.audit``) cannot see a duplicate or a
loss that happened in ClickHouse: a publish repeated outside the protocol, a partition
dropped by hand. This check compares, per target partition, what the server holds with
what the committed xids put there, and says precisely when it cannot judge.

What it claims, per (table, partition id) touched by a retained decided xid of the sink:

- **expected rows** = the manifest rows of every committed xid (of every sink under the
  same coordinator root) that wrote the partition, counted from the last dynamic overwrite
  (``REPLACE PARTITION``: what came before is gone). Xids are ordered by decision time.
- **held rows** = the active parts' rows of the partition on the table's server (on each
  recorded replica of a Replicated table: the same ZooKeeper path is the same table).
- equal → ok; fewer → ``missing_rows``; more → ``duplicate_rows`` when the operator says
  the sinks under this root are the table's only writers (``exclusive``),
  ``unexplained_rows`` when nobody said (``unknown``: another writer, or a duplicate),
  not judged when the table is known to have other writers (``shared``).
- **content**: where every such xid recorded content digests (``server_ext.types.digest``)
  of the table's current columns, the partition's digest is compared too: equal counts
  with another content → ``altered_rows``; extra rows that are exactly one committed
  xid's → ``duplicate_rows``, exactly a never-published branch's → ``aborted_rows``
  (whatever the operator said of other writers, except ``shared``); missing rows that are
  exactly one xid's are named. Otherwise the partition is judged by count.

It does not judge (and says why) a partition that:

- a ``Committing`` xid is publishing, or that an xid decided while the check ran;
- lives in a table whose engine merges rows away (or has a TTL) and no longer holds
  exactly what was committed (judged before the merges; more rows are extra rows
  whatever the engine, as merges only take rows away), on a server that cannot be read,
  or whose replicas disagree;
- any sink under the root may have written in a committed xid whose record is gone and
  that the sink's summary does not hold (pruned before summaries existed, declared
  committed by ``txsink reset``, or a winner's record missing): what it wrote is unknown.
  Pruned xids the summary holds (``txsink.core.history_summary``) count as one
  contribution per partition, judged by content like the retained ones.
  Exception: a dynamic overwrite of the partition by that same sink after its last
  pruned epoch makes the earlier history irrelevant. And when one sink alone wrote the
  partition and its pruned epochs all precede the retained ones, fewer rows than the
  retained xids put there is still a certain loss.

A partition of a checked table that no retained xid wrote holds another writer's rows
(a publish only goes where its xid wrote): it is not judged (``other_writer``), unless
the operator says the sinks are the table's only writers (``exclusive``: its rows are
extra rows), and only when no sink under the root has lost history. The
tables and partitions that only unknown xids wrote cannot be found at all: the report
lists the sink's unknown epochs (``unknown_history``) so that it never reads as a full
check.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import server_ext
from coordinator import XidState
from coordinator.plumbing.nodes import NodeStore
from coordinator.sink_admin import SinkAdmin
from coordinator.upkeep.audit import (
    SinkHistory,
    changed_since,
    read_all_branches,
    read_history,
)
from coordinator.upkeep.retention import DecidedXid, Ranges
from server_ext.client import SqlClient
from server_ext.target_rows import TableRows, table_rows
from server_ext.types import MODULUS, ContentDigest, digest_union
from txsink.core.history_summary import (
    PartitionWrite,
    SummaryEntry,
    Unreadable,
    summary_entries,
    xid_writes,
)
from txsink.core.payload import CombinedBranch, Payload, contributions, from_record

Writers = Literal["exclusive", "unknown", "shared"]
WRITERS: tuple[Writers, ...] = ("exclusive", "unknown", "shared")
XIDS_SHOWN = 5  # in a sentence; the JSON lists up to XIDS_LISTED
XIDS_LISTED = 100

TableKey = tuple[str, str, str]  # (server URL, database, table)


@dataclass(frozen=True)
class Contribution:
    """What one decided xid (or a sink's summary of pruned ones) wrote to one partition:
    the ``write``, by whom and when."""

    sink_id: str
    epoch: int
    decided_at: float
    write: PartitionWrite
    # a summary of pruned xids (``first``..``epoch``, decided until ``last_at``); None: one xid
    first: int | None = None
    last_at: float | None = None

    @property
    def xid(self) -> str:
        if self.first is not None:
            return f"{self.sink_id}/{self.first}..{self.epoch} (pruned, summarized)"
        return f"{self.sink_id}/{self.epoch}"

    @property
    def first_epoch(self) -> int:
        return self.epoch if self.first is None else self.first

    @classmethod
    def of_summary(cls, sink_id: str, entry: SummaryEntry) -> Contribution:
        """The pruned xids' writes to one partition, as a sink's summary holds them: placed
        at the first of them (an overwrite, when ``overwrite``)."""
        return cls(sink_id, entry.last, entry.first_at, entry.write, entry.first,
                   entry.last_at)

    @property
    def table_key(self) -> TableKey:
        return (self.write.server, self.write.database, self.write.table)


@dataclass
class _SinkFacts:
    """One sink's history as the check needs it."""

    committed: list[Contribution] = field(default_factory=list)
    in_flight: list[Contribution] = field(default_factory=list)
    # decided epochs whose writes are unknown, as [first, last] ranges, and why
    unknown: list[tuple[int, int, str]] = field(default_factory=list)
    # some of them because a record is missing or unreadable (not pruned by retention)
    damaged: bool = False

    @property
    def last_unknown(self) -> int | None:
        return max((hi for _, hi, _ in self.unknown), default=None)


@dataclass
class _Group:
    """One partition of one stored table and everything known about it."""

    identity: str
    partition_id: str
    tables: list[TableRows | tuple[TableKey, str]] = field(default_factory=list)
    committed: list[Contribution] = field(default_factory=list)
    in_flight: list[Contribution] = field(default_factory=list)

    @property
    def value(self) -> str:
        for c in self.committed + self.in_flight:
            return c.write.value
        return self.partition_id

    @property
    def name(self) -> str:
        for table in self.tables:
            if isinstance(table, TableRows):
                return table.name
            return f"{table[0][1]}.{table[0][2]}"
        return "?"

    @property
    def servers(self) -> list[str]:
        return sorted({t.server if isinstance(t, TableRows) else t[0][0] for t in self.tables})


def check_targets(zk: NodeStore, root: str, sinks: Iterable[str],
                  client_for: Callable[[str | None], SqlClient], default_url: str | None,
                  writers: Writers = "unknown") -> dict[str, dict[str, Any]]:
    """The target report of each sink in ``sinks`` (see the module docstring).

    ``client_for(url)`` gives a client of a branch's server (None: ``default_url``, for
    records that name no server). Reads every sink under ``root``: another sink's commits
    into the same partition are expected rows, not extra ones.
    """
    if writers not in WRITERS:
        raise ValueError(f"writers must be one of {WRITERS}, got {writers!r}")
    scope = list(sinks)
    histories = {s: read_history(zk, root, s) for s in SinkAdmin.sinks(zk, root)}
    facts = {s: _facts(h, default_url) for s, h in histories.items()}
    names = {(c.write.database, c.write.table) for s in scope if s in facts
             for c in facts[s].committed + facts[s].in_flight}
    keys = {c.table_key for f in facts.values() for c in f.committed + f.in_flight
            if (c.write.database, c.write.table) in names}
    digested: dict[tuple[str, str], set[str]] = {}  # (database, table): partitions
    for f in facts.values():
        for c in f.committed:
            if c.write.digest is not None:
                digested.setdefault((c.write.database, c.write.table),
                                    set()).add(c.write.partition_id)
    tables = {key: _read_table(client_for, key, digested.get(key[1:], set()))
              for key in sorted(keys)}
    for sink_id, history in histories.items():  # decided while the tables were read
        epochs = changed_since(zk, root, history)
        late = _facts(read_history(zk, root, sink_id, epochs), default_url, pruned=False)
        facts[sink_id].in_flight += late.committed + late.in_flight
        facts[sink_id].unknown += [u for u in late.unknown if u not in facts[sink_id].unknown]
        facts[sink_id].damaged |= late.damaged
    groups = _groups(tables, facts)
    unpublished = _Unpublished(zk, root, list(histories), default_url)
    reports = {}
    for sink_id in scope:
        own = facts.get(sink_id, _SinkFacts())
        identities = {_identity(tables[c.table_key], c.table_key)
                      for c in own.committed + own.in_flight if c.table_key in tables}
        mine = [g for g in groups.values() if g.identity in identities and (
            not (g.committed or g.in_flight)
            or any(c.sink_id == sink_id for c in g.committed + g.in_flight))]
        reports[sink_id] = _report(mine, facts, writers, unpublished)
        reports[sink_id]["unknown_history"] = [
            {"first": lo, "last": hi, "reason": why} for lo, hi, why in own.unknown]
    return reports


def _facts(history: SinkHistory, default_url: str | None, pruned: bool = True) -> _SinkFacts:
    facts = _SinkFacts()
    read = {d.record.epoch for d in history.decided}
    if pruned:
        for lo, hi in _without(history.pruned_committed, history.summary.folded):
            # an xid pruned while it was being read is known after all
            if sum(lo <= e <= hi for e in read) < hi - lo + 1:
                facts.unknown.append((lo, hi, "no record: pruned without a summary (by an "
                                      "older release, or its record was unreadable), or "
                                      "declared committed by txsink reset"))
        facts.committed += [Contribution.of_summary(history.sink_id, entry)
                            for entry in summary_entries(history.summary)]
    for decided in history.decided:
        try:
            found = _contributions(decided, default_url)
        except Unreadable as exc:
            epoch = decided.record.epoch
            facts.unknown.append((epoch, epoch, str(exc)))
            facts.damaged = True
            continue
        if decided.record.state is XidState.COMMITTED:
            facts.committed += found
        else:
            facts.in_flight += found
    return facts


def _without(ranges: Ranges, removed: Ranges) -> Ranges:
    """The epochs of ``ranges`` not in ``removed``, as ranges."""
    left: Ranges = []
    for lo, hi in ranges:
        start = lo
        for rlo, rhi in sorted(removed):
            if rhi < start or rlo > hi:
                continue
            if rlo > start:
                left.append([start, rlo - 1])
            start = max(start, rhi + 1)
        if start <= hi:
            left.append([start, hi])
    return left


def _contributions(decided: DecidedXid, default_url: str | None) -> list[Contribution]:
    """What each winner of ``decided`` put where, one entry per (table, partition)."""
    record = decided.record
    decided_at = record.decided_at or record.updated
    return [Contribution(record.sink_id, record.epoch, decided_at, w)
            for w in xid_writes(decided, default_url)]


def _read_table(client_for: Callable[[str | None], SqlClient], key: TableKey,
                digest_partitions: set[str]) -> TableRows | tuple[TableKey, str]:
    server, database, table = key
    try:
        return table_rows(client_for(server), database, table, digest_partitions)
    except (server_ext.ClickHouseError, ValueError) as exc:
        return (key, f"{type(exc).__name__}: {exc}")


def _identity(table: TableRows | tuple[TableKey, str], key: TableKey) -> str:
    if isinstance(table, TableRows):
        return table.identity
    return f"unreadable:{key[0]}/{key[1]}.{key[2]}"


def _groups(tables: dict[TableKey, TableRows | tuple[TableKey, str]],
            facts: dict[str, _SinkFacts]) -> dict[tuple[str, str], _Group]:
    identity = {key: _identity(table, key) for key, table in tables.items()}
    by_identity: dict[str, list[TableRows | tuple[TableKey, str]]] = {}
    for key, table in tables.items():
        by_identity.setdefault(identity[key], []).append(table)
    groups: dict[tuple[str, str], _Group] = {}

    def group(ident: str, pid: str) -> _Group:
        if (ident, pid) not in groups:
            groups[(ident, pid)] = _Group(ident, pid, by_identity[ident])
        return groups[(ident, pid)]

    for ident, members in by_identity.items():
        for table in members:
            if isinstance(table, TableRows):
                for pid in table.partitions:
                    group(ident, pid)
    for f in facts.values():
        for c in f.committed:
            if c.table_key in identity:
                group(identity[c.table_key], c.write.partition_id).committed.append(c)
        for c in f.in_flight:
            if c.table_key in identity:
                group(identity[c.table_key], c.write.partition_id).in_flight.append(c)
    return groups


class _Unpublished:
    """The digests of branches that were never to be published, per target partition:
    (xid, branch, xid state, digest). Read on first use only (it reads every branch)."""

    def __init__(self, zk: NodeStore, root: str, sinks: list[str],
                 default_url: str | None) -> None:
        self.zk, self.root, self.sinks, self.default_url = zk, root, sinks, default_url
        self._found: dict[tuple[str, str, str], list[tuple[str, str, str, ContentDigest]]] \
            | None = None

    def __call__(self, database: str, table: str, partition_id: str
                 ) -> list[tuple[str, str, str, ContentDigest]]:
        if self._found is None:
            self._found = self._read()
        return self._found.get((database, table, partition_id), [])

    def _read(self) -> dict[tuple[str, str, str], list[tuple[str, str, str, ContentDigest]]]:
        found: dict[tuple[str, str, str], list[tuple[str, str, str, ContentDigest]]] = {}
        for sink in self.sinks:
            pairs = read_all_branches(self.zk, self.root, sink)
            published = set()  # winners, and the sources of a combined winner
            for record, branch in pairs:
                if record.state in (XidState.COMMITTING, XidState.COMMITTED) \
                        and branch.branch_id in record.winners:
                    published.add((record.epoch, branch.branch_id))
                    combined = _payload(branch.manifest)
                    if isinstance(combined, CombinedBranch):
                        published.update((record.epoch, s) for s in combined.sources)
            for record, branch in pairs:
                payload = _payload(branch.manifest)
                if payload is None or (record.epoch, branch.branch_id) in published:
                    continue
                for share in contributions(payload):
                    if share.digest is not None:
                        found.setdefault((share.database, share.table, share.partition_id),
                                         []).append((f"{sink}/{record.epoch}",
                                                     branch.branch_id, record.state.value,
                                                     share.digest))
        return found


def _payload(raw: dict[str, Any] | None) -> Payload | None:
    try:
        return from_record(raw)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        return None


Unpublished = Callable[[str, str, str], list[tuple[str, str, str, ContentDigest]]]


def _report(groups: list[_Group], facts: dict[str, _SinkFacts],
            writers: Writers, unpublished: Unpublished) -> dict[str, Any]:
    report: dict[str, Any] = {"checked": True, "writers": writers, "partitions_ok": 0,
                              "partitions_ok_by_count": 0, "anomalies": [], "not_judged": []}
    for g in sorted(groups, key=lambda g: (g.name, g.partition_id, g.identity)):
        verdict = _judge(g, facts, writers, unpublished)
        if verdict is None or verdict["kind"] == "ok_by_count":
            report["partitions_ok"] += 1
            report["partitions_ok_by_count"] += verdict is not None
        elif verdict["kind"] == "not_judged":
            report["not_judged"].append(verdict)
        else:
            report["anomalies"].append(verdict)
    return report


@dataclass(frozen=True)
class _Content:
    """A partition's content as held and as the committed xids' digests sum it."""

    held: ContentDigest
    expected: ContentDigest

    @property
    def equal(self) -> bool:
        return self.held == self.expected

    def difference(self, sign: int) -> tuple[int, int]:
        """(rows, sum) of held minus expected (``sign`` 1) or expected minus held (-1)."""
        rows = (self.held.rows - self.expected.rows) * sign
        return rows, (self.held.sum - self.expected.sum) * sign % MODULUS


def _content(g: _Group, readable: list[TableRows], relevant: list[Contribution]
             ) -> tuple[_Content | None, str]:
    """The partition's content to compare, or None and why it is compared by count."""
    table = readable[0]
    if table.digest_scheme is None:
        return None, table.digest_note or "the table was not hashed"
    held = table.digests.get(g.partition_id) or ContentDigest(0, 0, table.digest_scheme)
    if any(c.write.digest is None for c in relevant):
        return None, "an xid that wrote it recorded no content digest (an older release)"
    expected = digest_union([ContentDigest(0, 0, held.scheme)] + [c.write.digest for c in relevant])
    if expected is None or expected.scheme != held.scheme:
        return None, "the table's columns changed since an xid that wrote it was sealed"
    return _Content(held, expected), ""


def _judge(g: _Group, facts: dict[str, _SinkFacts], writers: Writers,
           unpublished: Unpublished) -> dict[str, Any] | None:
    """None when the partition holds what was committed; else a finding (see module doc)."""
    readable = [t for t in g.tables if isinstance(t, TableRows)]
    where = f"{g.name} partition {g.partition_id} on {', '.join(g.servers)}"
    if not readable:
        errors = "; ".join(t[1] for t in g.tables if not isinstance(t, TableRows))
        return _not_judged(g, where, f"cannot read the target ({errors})", cause="unreadable")
    inexact = next((t.exact for t in readable if t.exists and t.exact), None)
    if g.in_flight:
        xids = sorted({c.xid for c in g.in_flight})
        return _not_judged(g, where, f"xid {', '.join(xids)} is being published or was decided "
                           "during the check; run verify again (an xid that stays "
                           "Committing is stuck: txsink status names it, txsink recover "
                           "finishes it)", cause="in_flight")
    counts = {t.server: t.partitions.get(g.partition_id, 0) for t in readable}
    if len(set(counts.values())) > 1 or any(t.pending_inserts for t in readable):
        seen = ", ".join(f"{server}: {n}" for server, n in sorted(counts.items()))
        return _not_judged(g, where, f"replicas disagree or are catching up ({seen})",
                           cause="replicas")
    held = next(iter(counts.values()))
    missing_table = not any(t.exists for t in readable)
    ordered = sorted(g.committed, key=lambda c: (c.decided_at, c.sink_id, c.epoch))
    last_overwrite = max((i for i, c in enumerate(ordered) if c.write.overwrite), default=0)
    relevant = ordered[last_overwrite:]
    expected = sum(c.write.rows for c in relevant)
    if _summary_spans_overwrite(ordered, last_overwrite):
        return _not_judged(g, where, "a sink's summary of pruned xids spans another sink's "
                           "overwrite of the partition: which of its rows the overwrite "
                           "replaced is unknown", cause="by_design")
    lost = {s: f.unknown for s, f in facts.items() if f.unknown}
    if lost and not _history_covers(relevant, lost):
        if inexact:
            return _not_judged(g, where, inexact, cause="merges")
        gone = "; ".join(f"{s} epochs " + ", ".join(
            f"{lo}..{hi} ({why})" if lo != hi else f"{lo} ({why})" for lo, hi, why in u)
            for s, u in sorted(lost.items()))
        if held < expected and _lower_bound_holds(ordered, facts):
            return _finding("missing_rows", g, where, held, expected, relevant,
                            f"holds {held} rows, fewer than the {expected} the retained "
                            "committed xids alone put there"
                            + (" (the table does not exist)" if missing_table else ""))
        damaged = any(facts[s].damaged for s in lost)
        return _not_judged(g, where, f"committed history is incomplete: {gone}; what those "
                           f"xids wrote is unknown (holds {held} rows, retained xids "
                           f"account for {expected})", held, expected,
                           cause="lost_record" if damaged else "by_design")
    if not ordered and writers == "unknown":
        # no retained xid wrote it and none lost: a duplicate publish cannot land here
        return _not_judged(g, where, f"no xid of the sinks under this root wrote this "
                           f"partition: its {held} rows are another writer's "
                           "(--exclusive-target judges them as extra rows)", held, 0,
                           cause="other_writer")
    content, by_count = _content(g, readable, relevant) if not missing_table else (None, "")
    if inexact and not (content and content.equal) and held <= expected:
        # merges only ever take rows away: fewer (or changed) rows may be theirs
        return _not_judged(g, where, f"{inexact}; holds {held} rows, committed xids put "
                           f"{expected} there", held, expected, cause="merges")
    if held == expected:
        if content is None:
            return {"kind": "ok_by_count", "reason": by_count}
        if content.equal:
            return None
        return _finding("altered_rows", g, where, held, expected, relevant,
                        f"holds the {held} rows committed xids put there by count, but "
                        "not their content: rows were changed in place, or as many rows "
                        "lost as duplicated", content=content)
    if held < expected:
        cause = ("the table does not exist" if missing_table else
                 "the partition is gone" if held == 0 else "rows were deleted")
        hint = _same_rows(content, -1, relevant, "the missing rows are exactly what")
        return _finding("missing_rows", g, where, held, expected, relevant,
                        f"holds {held} rows, committed xids put {expected} there ({cause})"
                        + hint, content=content)
    extra = held - expected
    duplicate = _same_rows(content, 1, relevant, "the extra rows are exactly a second copy "
                           "of what")
    if duplicate and writers != "shared":
        return _finding("duplicate_rows", g, where, held, expected, relevant,
                        f"holds {held} rows, committed xids put {expected} there{duplicate}",
                        content=content)
    staged = _unpublished_rows(content, g, unpublished)
    if staged and writers != "shared":
        return _finding("aborted_rows", g, where, held, expected, relevant,
                        f"holds {held} rows, committed xids put {expected} there{staged}",
                        content=content)
    same = [c.xid for c in relevant if c.write.rows == extra]
    hint = duplicate or staged or (
        f"; the {extra} extra rows equal what {', '.join(same)} put there" if same else "")
    sentence = f"holds {held} rows, committed xids put {expected} there{hint}"
    if writers == "exclusive":
        return _finding("duplicate_rows", g, where, held, expected, relevant, sentence,
                        content=content)
    if writers == "unknown":
        return _finding("unexplained_rows", g, where, held, expected, relevant,
                        sentence + " (another writer, or a duplicate: --exclusive-target "
                        "or --shared-target says which)", content=content)
    return _not_judged(g, where, f"{sentence}; the table has other writers "
                       "(--shared-target)", held, expected)


def _same_rows(content: _Content | None, sign: int, relevant: list[Contribution],
               lead: str) -> str:
    """"; <lead> <xid> put there" when the difference is exactly one xid's rows."""
    if content is None:
        return ""
    rows, total = content.difference(sign)
    same = [c.xid for c in relevant if c.write.digest is not None
            and (c.write.digest.rows, c.write.digest.sum) == (rows, total)]
    return f"; {lead} {', '.join(same)} put there" if same else ""


def _unpublished_rows(content: _Content | None, g: _Group, unpublished: Unpublished) -> str:
    """"; the extra rows are exactly what branch B of xid X staged ..." when they are."""
    if content is None:
        return ""
    rows, total = content.difference(1)
    table = g.tables[0]
    database, name = (table.database, table.table) if isinstance(table, TableRows) \
        else table[0][1:]
    for xid, branch, state, digest in unpublished(database, name, g.partition_id):
        if (digest.rows, digest.sum) == (rows, total):
            return (f"; the extra rows are exactly what branch {branch} of {xid} ({state}) "
                    "staged, which was never to be published")
    return ""


def _summary_spans_overwrite(ordered: list[Contribution], last_overwrite: int) -> bool:
    """Whether a summary placed before the last overwrite holds writes decided after it
    (two sinks writing one partition, one of them overwriting it)."""
    if not ordered or not ordered[last_overwrite].write.overwrite:
        return False
    at = ordered[last_overwrite].decided_at
    return any(c.last_at is not None and c.last_at > at for c in ordered[:last_overwrite])


def _history_covers(relevant: list[Contribution], lost: dict[str, list]) -> bool:
    """Whether the unknown xids cannot matter: they all precede an overwrite, by their own
    sink, from which ``relevant`` counts (a sink publishes its xids in epoch order)."""
    if not relevant or not relevant[0].write.overwrite:
        return False
    first = relevant[0]
    return set(lost) == {first.sink_id} and \
        max(hi for _, hi, _ in lost[first.sink_id]) < first.first_epoch


def _lower_bound_holds(ordered: list[Contribution], facts: dict[str, _SinkFacts]) -> bool:
    """Whether the retained xids' rows are a floor despite the unknown ones: one sink wrote
    the partition, it alone has unknown xids, and they all precede its retained ones."""
    sinks = {c.sink_id for c in ordered}
    lost = {s for s, f in facts.items() if f.unknown}
    if len(sinks) != 1 or lost != sinks:
        return False
    (sink,) = sinks
    last = facts[sink].last_unknown
    return last is not None and last < min(c.first_epoch for c in ordered)


def _xids(contributions: list[Contribution]) -> dict[str, Any]:
    listed = [{"xid": c.xid, "rows": c.write.rows, "overwrite": c.write.overwrite}
              for c in contributions[:XIDS_LISTED]]
    return {"xids": listed, "more_xids": max(0, len(contributions) - XIDS_LISTED)}


def _finding(kind: str, g: _Group, where: str, held: int, expected: int,
             relevant: list[Contribution], sentence: str,
             content: _Content | None = None) -> dict[str, Any]:
    shown = ", ".join(f"{c.xid}: {c.write.rows}{' (overwrite)' if c.write.overwrite else ''}"
                      for c in relevant[-XIDS_SHOWN:])
    if len(relevant) > XIDS_SHOWN:
        shown = f"{len(relevant) - XIDS_SHOWN} earlier xid(s), " + shown
    detail = f"{kind} at {where}: {sentence} [{shown or 'no retained xid wrote it'}]"
    return {"kind": kind, "table": g.name, "partition_id": g.partition_id,
            "partition": g.value, "servers": g.servers, "rows": held, "expected": expected,
            "judged_by": "content" if content else "count", **_xids(relevant),
            "detail": detail}


#: Why a partition was not judged when a later run may judge it: the server could not
#: be read (down, wrong credentials), an xid was publishing, replicas were catching up.
#: ``txsink verify`` fails (exit 4) on these: it did not check what it was asked to.
RETRYABLE_CAUSES = frozenset({"unreadable", "in_flight", "replicas"})
#: ... and those that fail it for good: rows an engine's merges or a TTL may have taken
#: away (the partition was not judged before they did), and a decided xid whose winner's
#: record is missing (not pruned: lost), which the operator must look at.
FAILING_CAUSES = RETRYABLE_CAUSES | {"merges", "lost_record"}


def _not_judged(g: _Group, where: str, reason: str, held: int | None = None,
                expected: int | None = None, cause: str = "by_design") -> dict[str, Any]:
    """A partition verify says it cannot judge; ``cause`` is one of
    :data:`FAILING_CAUSES`, ``by_design`` (pruned history, a table shared with other
    writers: reported, never judgeable) or ``other_writer`` (a partition no xid of the
    sinks wrote)."""
    return {"kind": "not_judged", "table": g.name, "partition_id": g.partition_id,
            "partition": g.value, "servers": g.servers, "rows": held, "expected": expected,
            "reason": reason, "cause": cause, "detail": f"{where}: {reason}"}
