"""Deciding whether an interrupted publish statement made a partition visible.

ATTACH into a plain MergeTree gives each attached part a fresh block number above the
watermark recorded in the publish intent and keeps its rows, bytes, level and content;
this module reads the target's parts above the watermark and compares. See the
``attach_marked`` module and ``docs/design.md`` for the whole argument. An INSERT of one
staged partition (``attach_replicated``'s copy of parts the server deduplicated) leaves
one fresh part with the partition's rows and content above the partition's watermark.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from server_ext.client.client_protocol import SqlClient
from server_ext.sql import qualified_name, quote_identifier, sql_string
from server_ext.staging.manifest import Manifest, PartitionManifest, StagedPart
from server_ext.types.target_table import describe_table


@dataclass(frozen=True)
class _TargetPart:
    name: str
    rows: int
    bytes: int
    level: int
    min_block: int
    max_block: int
    data_version: int

    @property
    def single_block(self) -> bool:
        """One block number, never mutated: how ATTACH and INSERT create a part."""
        return self.min_block == self.max_block == self.data_version

    @property
    def fresh_insert(self) -> bool:
        """A part as an INSERT creates it (a rewrite of a lone part raises its level)."""
        return self.single_block and self.level == 0


Signature = tuple[int, int, int, str]  # rows, bytes, level, content fingerprint


class AttachDecider:
    """Decides, per partition, whether an interrupted ``attach_marked`` run attached it.

    Attached: every staged part has exactly one counterpart above the watermark with the
    same rows, bytes, level and content. Not attached: every part above the watermark is a
    fresh insert unlike any staged part. Anything else is recorded in ``in_doubt``.
    """

    def __init__(self, client: SqlClient, manifest: Manifest, watermark: int) -> None:
        self.client = client
        self.manifest = manifest
        self.watermark = watermark
        self.in_doubt: list[tuple[str, str]] = []
        self.target = qualified_name(manifest.target_database, manifest.target_table)
        self.staging = qualified_name(manifest.staging_database, manifest.staging_table)
        self._columns: list[str] | None = None

    def attached(self, partition: PartitionManifest, sealed: dict[str, bool]) -> bool:
        above = self.parts_above(partition.partition_id)
        if not sealed[partition.partition_id]:
            return self.doubt(partition, "the staging partition is gone before the mark", above)
        wanted = {(p.rows, p.bytes, p.level) for p in partition.parts}
        candidates = [p for p in above
                      if p.single_block and (p.rows, p.bytes, p.level) in wanted]
        found: Counter[Signature] = Counter()
        staged: Counter[Signature] = Counter()
        if candidates:
            found = Counter(self.signatures(self.target, partition, candidates))
            staged = Counter(self.signatures(self.staging, partition, partition.parts))
            if found == staged:
                return True
        if all(p.fresh_insert for p in above) and not found & staged:
            return False
        reason = ("parts above the watermark match the staged parts only partly or more than "
                  "once" if found & staged else "merged or mutated parts above the watermark")
        return self.doubt(partition, reason, above)

    def dropped(self, partition: PartitionManifest, watermark: int, taken: int
                ) -> list[str] | None:
        """The staged parts of ``partition`` that ATTACHes which took ``taken`` of them
        left out: those without a counterpart (one block, same rows, bytes, level and
        content) above ``watermark``. None where the parts above do not show exactly
        ``taken`` counterparts (merged since, or a foreign look-alike arrived)."""
        above = self.parts_above(partition.partition_id, watermark)
        wanted = {(p.rows, p.bytes, p.level) for p in partition.parts}
        candidates = [p for p in above if p.single_block and (p.rows, p.bytes, p.level) in wanted]
        found: Counter[Signature] = Counter()
        if candidates:
            found = Counter(self.signatures(self.target, partition, candidates))
        prints = self.fingerprints(self.staging, partition.partition_id,
                                   list(partition.part_names))
        own = {p.name: (p.rows, p.bytes, p.level, prints.get(p.name, "")) for p in partition.parts}
        matched = found & Counter(own.values())
        if sum(matched.values()) != taken or sum(found.values()) != taken:
            return None
        left = []
        for name, signature in own.items():
            if matched[signature]:
                matched[signature] -= 1
            else:
                left.append(name)
        return left

    def inserted(self, partition: PartitionManifest, watermark: int,
                 part_names: tuple[str, ...]) -> bool:
        """Whether an interrupted INSERT of the staged parts ``part_names`` of
        ``partition``, sent as one block, reached the target: exactly one fresh part above
        ``watermark`` holds their rows and content. Not: none does, and every part above
        is a fresh insert (other writers')."""
        above = self.parts_above(partition.partition_id, watermark)
        rows = sum(p.rows for p in partition.parts if p.name in part_names)
        candidates = [p.name for p in above if p.fresh_insert and p.rows == rows]
        matches = []
        if candidates:
            staged = self.fingerprints(self.staging, partition.partition_id, list(part_names))
            whole = str(sum(int(value) for value in staged.values()) % 2 ** 64)
            found = self.fingerprints(self.target, partition.partition_id, candidates)
            matches = [name for name in candidates if found.get(name) == whole]
        if len(matches) == 1:
            return True
        if not matches and all(p.fresh_insert for p in above):
            return False
        return self.doubt(partition, "parts above the watermark match the staged rows more "
                          "than once or were merged", above, watermark)

    def doubt(self, partition: PartitionManifest, reason: str, above: list[_TargetPart],
              watermark: int | None = None) -> bool:
        listing = ", ".join(f"{p.name} ({p.rows} rows)" for p in above) or "none"
        sealed = ", ".join(f"{p.name} ({p.rows} rows)" for p in partition.parts)
        mark = self.watermark if watermark is None else watermark
        self.in_doubt.append((partition.partition_id,
                              f"partition {partition.partition_id!r}: {reason}; target parts "
                              f"above block {mark}: {listing}; sealed: {sealed}"))
        return False

    def parts_above(self, partition_id: str, watermark: int | None = None
                    ) -> list[_TargetPart]:
        mark = self.watermark if watermark is None else watermark
        rows = self.client.query_rows(
            "SELECT name, rows, bytes_on_disk, level, min_block_number, max_block_number, "
            "data_version FROM system.parts WHERE database = "
            f"{sql_string(self.manifest.target_database)} AND table = "
            f"{sql_string(self.manifest.target_table)} AND active AND partition_id = "
            f"{sql_string(partition_id)} AND max_block_number > {int(mark)} "
            "ORDER BY name",
            purpose="read target parts above the watermark",
        )
        return [_TargetPart(r["name"], int(r["rows"]), int(r["bytes_on_disk"]),
                            int(r["level"]), int(r["min_block_number"]),
                            int(r["max_block_number"]), int(r["data_version"])) for r in rows]

    def signatures(self, table: str, partition: PartitionManifest,
                   parts: Iterable[StagedPart | _TargetPart]) -> list[Signature]:
        by_name = {p.name: p for p in parts}
        prints = self.fingerprints(table, partition.partition_id, list(by_name))
        return [(p.rows, p.bytes, p.level, prints.get(name, "")) for name, p in by_name.items()]

    def fingerprints(self, table: str, partition_id: str,
                     part_names: list[str]) -> dict[str, str]:
        """Order-independent hash of every stored column of each named part of ``table``.

        Text forms are hashed, because cityHash64 on 18.16 refuses Decimal and Nullable
        inside Array, and returns NULL for NULL.
        """
        hashed = ", ".join(f"ifNull(toString({quote_identifier(c)}), '\\\\N')"
                           for c in self.stored_columns())
        names = ", ".join(sql_string(n) for n in part_names)
        rows = self.client.query_rows(
            f"SELECT _part AS part, toString(sum(cityHash64({hashed}))) AS fingerprint "
            f"FROM {table} WHERE _partition_id = {sql_string(partition_id)} "
            f"AND _part IN ({names}) GROUP BY _part",
            purpose="fingerprint parts to decide an interrupted publish",
        )
        return {row["part"]: row["fingerprint"] for row in rows}

    def stored_columns(self) -> list[str]:
        if self._columns is None:
            target = describe_table(
                self.client, f"{self.manifest.target_database}.{self.manifest.target_table}")
            self._columns = [c.name for c in target.columns if c.default_kind != "ALIAS"]
        return self._columns


def partition_watermarks(client: SqlClient, database: str, table: str,
                         partition_ids: Iterable[str]) -> dict[str, int]:
    """Highest block number of any part (active or not) of each named partition; 0 for a
    partition without parts. A Replicated table numbers blocks per partition."""
    wanted = list(partition_ids)
    rows = client.query_rows(
        "SELECT partition_id, max(max_block_number) AS mark FROM system.parts WHERE "
        f"database = {sql_string(database)} AND table = {sql_string(table)} AND "
        f"partition_id IN ({', '.join(sql_string(pid) for pid in wanted)}) "
        "GROUP BY partition_id",
        purpose="read block number watermarks of target partitions",
    )
    found = {row["partition_id"]: int(row["mark"]) for row in rows}
    return {pid: found.get(pid, 0) for pid in wanted}


def max_block_number(client: SqlClient, database: str, table: str) -> int:
    """Highest block number of any part (active or not) of a table; 0 for none."""
    return int(client.query_value(
        "SELECT max(max_block_number) FROM system.parts WHERE database = "
        f"{sql_string(database)} AND table = {sql_string(table)}",
        purpose="read block number watermark of target",
    ))
