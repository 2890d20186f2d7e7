"""The commit payload: what a prepared branch records for whoever publishes it.

A branch's payload is written into its record in the coordinator's store at ``prepare``
and read by the publish of the same job, and also by a later recovery, ``txsink recover``,
``resolve`` and ``verify``, possibly of a newer release. So it is typed, versioned and
read and written only here (:func:`to_record` / :func:`from_record`).

Two kinds:

- :class:`StagedBranch` — a task attempt's branch: its sealed staging table on one
  server, published as it is.
- :class:`CombinedBranch` — made by the driver at commit, one per server, when several
  winners staged there: they are published in one pass through one combined staging
  table (``server_ext.publish.combined``). Its ``sources`` are the task branches whose rows it
  carries; their own records keep their manifests.

Formats: 1 (no ``format`` key: the releases before the combined publish; an overwrite
embedded its sources' manifests under ``overwrite_of``), 2 (this one). A reader accepts
both; a payload of an unknown newer format is refused by name, never guessed at. Keys a
reader does not know are ignored: they may only carry what a publish can do without
(``contributed``/``precombined``, the pre-combined table, are such keys; so is ``view``,
the staging view of a materialized view's share, which a rollback drops with the share's
staging table). Content digests (``server_ext.types.digest``) are such keys too: a staged
branch's travel in its manifest's partitions, a combined branch's (the sum of its
sources', per partition) under ``digests``; a payload without them (older releases)
is judged by ``verify`` by its row counts alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from coordinator import BranchRecord
from server_ext.publish import Strategy
from server_ext.staging import Manifest
from server_ext.types import ContentDigest, digest_union

FORMAT = 2


class UnknownPayload(ValueError):
    """A branch record holds a payload this release cannot read."""


@dataclass(frozen=True)
class StagedBranch:
    """A task attempt's sealed staging table on one server."""

    manifest: Manifest
    strategy: Strategy
    staging: str
    server: str | None
    rows: int
    overwrite: bool = False
    contributed: str = ""  # the pre-combined table its parts were attached into
    view: str = ""  # the staging view that filled it (a materialized view's share)


@dataclass(frozen=True)
class CombinedBranch:
    """The winners of one server and table, published in one pass from one combined table.

    ``sources`` name the task branches (format 2); ``target`` and ``partitions`` (id,
    value, rows) summarize what they staged, so that ``verify`` and ``status`` need not
    read every source. A format-1 overwrite payload carries the sources' manifests
    instead (``embedded``). ``precombined`` names the table the sources that contributed
    share ("": read the sources); the others are copied from their own staging
    (:func:`direct_sources`).
    """

    sources: tuple[str, ...]
    staging: str
    strategy: Strategy
    server: str | None
    rows: int
    overwrite: bool = False
    target: tuple[str, str] = ("", "")
    partitions: tuple[tuple[str, str, int], ...] = ()
    embedded: tuple[Manifest, ...] = ()
    precombined: str = ""
    digests: tuple[tuple[str, ContentDigest], ...] = ()  # (partition id, sum of sources')

    @classmethod
    def of(cls, sources: dict[str, Manifest], **fields: object) -> CombinedBranch:
        """The combined branch of ``sources`` (branch id → sealed manifest)."""
        partitions: dict[str, list] = {}
        for manifest in sources.values():
            for partition in manifest.partitions:
                entry = partitions.setdefault(partition.partition_id, [partition.value, 0, []])
                entry[1] += partition.rows
                entry[2].append(partition.digest)
        first = next(iter(sources.values()))
        digests = ((pid, digest_union(entry[2])) for pid, entry in sorted(partitions.items()))
        return cls(sources=tuple(sorted(sources)),
                   rows=sum(m.rows for m in sources.values()),
                   target=(first.target_database, first.target_table),
                   partitions=tuple((pid, value, rows) for pid, (value, rows, _)
                                    in sorted(partitions.items())),
                   digests=tuple((pid, d) for pid, d in digests if d is not None),
                   **fields)  # type: ignore[arg-type]


Payload = StagedBranch | CombinedBranch


@dataclass(frozen=True)
class BranchOwner:
    """The owner record of a branch, written when it is registered, before its staging
    exists: where the staging is (what a rollback of a branch that never got prepared
    needs) and which task attempt registered it (for operators).

    Format 1: these keys, with or without ``format``; keys a reader does not know are
    ignored.
    """

    staging: str
    server: str | None = None
    view: str = ""  # the staging view filling it (a materialized view's share)
    shard: int | None = None
    task: dict[str, Any] = field(default_factory=dict)  # host, pid, stage, partition, ...

    def to_record(self) -> dict[str, Any]:
        return {**self.task, "format": 1, "staging": self.staging, "server": self.server,
                **({"view": self.view} if self.view else {}),
                **({"shard": self.shard} if self.shard is not None else {})}

    @classmethod
    def from_record(cls, raw: dict[str, Any] | None) -> BranchOwner | None:
        if not raw or not raw.get("staging"):
            return None
        own = ("format", "staging", "server", "view", "shard")
        shard = raw.get("shard")
        return cls(staging=raw["staging"], server=raw.get("server"), view=raw.get("view") or "",
                   shard=None if shard is None else int(shard),
                   task={k: v for k, v in raw.items() if k not in own})


@dataclass(frozen=True)
class StagingPlace:
    """Where a branch's staging is: its table, the staging view filling it ("" for
    none), and the server (None: the sink's default server)."""

    staging: str
    view: str
    server: str | None


def staging_place(record: BranchRecord) -> StagingPlace | None:
    """Where the branch's staging is, from its payload once prepared, else from its owner
    record; None for a branch that recorded none."""
    try:
        prepared = from_record(record.manifest)
    except (UnknownPayload, KeyError, TypeError, ValueError):
        prepared = None
    owner = BranchOwner.from_record(record.owner)
    if prepared is not None:
        view = prepared.view if isinstance(prepared, StagedBranch) else ""
        return StagingPlace(prepared.staging, view or (owner.view if owner else ""),
                            prepared.server or (owner.server if owner else None))
    return None if owner is None else StagingPlace(owner.staging, owner.view, owner.server)


def to_record(payload: Payload) -> dict[str, Any]:
    """The JSON object stored as the branch record's ``manifest``."""
    common = {"format": FORMAT, "staging": payload.staging, "strategy": payload.strategy,
              "server": payload.server, "rows": payload.rows, "overwrite": payload.overwrite}
    if isinstance(payload, StagedBranch):
        return {**common, "kind": "staged", "manifest": payload.manifest.to_dict(),
                **({"contributed": payload.contributed} if payload.contributed else {}),
                **({"view": payload.view} if payload.view else {})}
    if payload.embedded:
        raise ValueError("a combined payload is written with sources, not manifests")
    return {**common, "kind": "combined", "sources": list(payload.sources),
            "target": list(payload.target), "partitions": [list(p) for p in payload.partitions],
            **({"precombined": payload.precombined} if payload.precombined else {}),
            **({"digests": {pid: d.to_json() for pid, d in payload.digests}}
               if payload.digests else {})}


def from_record(raw: dict[str, Any] | None) -> Payload | None:
    """The payload of a branch record (None: the branch was never prepared)."""
    if not raw:
        return None
    version = int(raw.get("format", 1))
    if version > FORMAT:
        raise UnknownPayload(
            f"branch payload format {version} is newer than this release reads ({FORMAT}); "
            "finish it with the release that wrote it")
    try:
        strategy = Strategy(raw["strategy"])
    except (KeyError, ValueError):
        raise UnknownPayload(f"branch payload with publish strategy {raw.get('strategy')!r}, "
                             "which this release does not know") from None
    common = {"staging": raw["staging"], "strategy": strategy,
              "server": raw.get("server"), "rows": int(raw.get("rows", 0))}
    if version == 1:
        if raw.get("overwrite_of") is not None:
            return CombinedBranch(sources=(), overwrite=True, embedded=tuple(
                Manifest.from_dict(m) for m in raw["overwrite_of"]), **common)
        return StagedBranch(manifest=Manifest.from_dict(raw["manifest"]),
                            overwrite=bool(raw.get("overwrite")), **common)
    kind = raw.get("kind")
    if kind == "staged":
        return StagedBranch(manifest=Manifest.from_dict(raw["manifest"]),
                            overwrite=bool(raw.get("overwrite")),
                            contributed=str(raw.get("contributed") or ""),
                            view=str(raw.get("view") or ""), **common)
    if kind == "combined":
        return CombinedBranch(
            sources=tuple(raw["sources"]), overwrite=bool(raw.get("overwrite")),
            precombined=str(raw.get("precombined") or ""),
            target=(raw["target"][0], raw["target"][1]),
            partitions=tuple((p[0], p[1], int(p[2])) for p in raw["partitions"]),
            digests=tuple((pid, ContentDigest.from_json(d))
                          for pid, d in sorted((raw.get("digests") or {}).items())), **common)
    raise UnknownPayload(f"branch payload of unknown kind {kind!r}")


class Share(NamedTuple):
    """What a winner makes visible in one partition of one target table."""

    database: str
    table: str
    partition_id: str
    value: str
    rows: int
    digest: ContentDigest | None  # None: not recorded (an older release)


def task_branches(payload: Payload) -> int:
    """How many task branches' rows a winner makes visible: a combined branch's sources,
    else its own."""
    return len(payload.sources) if isinstance(payload, CombinedBranch) and payload.sources else 1


def contributions(payload: Payload) -> list[Share]:
    """One :class:`Share` per partition a winner makes visible."""
    if isinstance(payload, StagedBranch):
        manifests: tuple[Manifest, ...] = (payload.manifest,)
    elif payload.embedded:
        manifests = payload.embedded
    else:
        database, table = payload.target
        digests = dict(payload.digests)
        return [Share(database, table, pid, value, rows, digests.get(pid))
                for pid, value, rows in payload.partitions]
    return [Share(m.target_database, m.target_table, p.partition_id, p.value, p.rows, p.digest)
            for m in manifests for p in m.partitions]


def staged_manifest(record: BranchRecord) -> Manifest:
    """The sealed manifest of a task branch's record; refuses anything else by name."""
    payload = from_record(record.manifest)
    if not isinstance(payload, StagedBranch):
        raise UnknownPayload(f"branch {record.branch_id} of xid {record.xid} has no sealed "
                             "staging table of its own")
    return payload.manifest


def precombined_of(sources: Sequence[BranchRecord]) -> str:
    """The pre-combined table that the sources (task branches) which contributed share;
    "" if none did, or not all to the same table (the combine then reads the sources).
    The others are attached from their own staging (:func:`direct_sources`)."""
    tables = {p.contributed for p in _with_rows(sources) if p.contributed}
    return tables.pop() if len(tables) == 1 else ""


def direct_sources(sources: Sequence[BranchRecord], precombined: str) -> frozenset[str]:
    """The staging tables of the sources with rows that did not contribute to
    ``precombined``: the combine copies their partitions from there."""
    return frozenset(p.manifest.staging_table for p in _with_rows(sources)
                     if p.contributed != precombined)


def _with_rows(sources: Sequence[BranchRecord]) -> list[StagedBranch]:
    return [p for p in (from_record(r.manifest) for r in sources)
            if isinstance(p, StagedBranch) and p.manifest.partitions]
