"""The manifest of a prepared branch: which parts its staging table holds, per partition.

Why a manifest: prepare and publish run in different processes (a Spark task seals, the
driver or a later recovery publishes), possibly days apart. The manifest is what the task
hands over. It is recorded in the coordinator's store with the branch (so it is kept
compact) and lets publish check that the staging table still holds exactly what was sealed
before anything is made visible.

Contract: a ``Manifest`` is immutable; ``Manifest.from_dict(m.to_dict()) == m``; the dict
holds only JSON types. Part names follow ClickHouse's ``<partition id>_<min block>_<max
block>_<level>[_<mutation>]``; the block numbers and level are read back from the name
instead of being stored twice. A partition may carry its content digest
(``server_ext.types.digest``, key ``digest``); manifests without one (older releases, tables
filled from other staging tables) still read, and readers ignore the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from server_ext.sql import split_table_name
from server_ext.staging.staging_tables import STAGING_DATABASE
from server_ext.types.digest import ContentDigest

MANIFEST_VERSION = 1


class _NamedTable(Protocol):
    database: str
    name: str


@dataclass(frozen=True)
class StagedPart:
    """One data part of a staging table."""

    name: str
    rows: int
    bytes: int

    def _blocks_and_level(self) -> tuple[int, int, int]:
        # A partition id never contains '_', so the fields after it are numbers.
        min_block, max_block, level = self.name.split("_")[1:4]
        return int(min_block), int(max_block), int(level)

    @property
    def min_block(self) -> int:
        return self._blocks_and_level()[0]

    @property
    def max_block(self) -> int:
        return self._blocks_and_level()[1]

    @property
    def level(self) -> int:
        return self._blocks_and_level()[2]


@dataclass(frozen=True)
class PartitionManifest:
    """The staged parts of one partition of the target."""

    partition_id: str
    value: str  # the partition expression's value as the server prints it, e.g. 202401
    parts: tuple[StagedPart, ...]
    digest: ContentDigest | None = None  # its rows' content, as sealed (None: not taken)

    @property
    def rows(self) -> int:
        return sum(part.rows for part in self.parts)

    @property
    def bytes(self) -> int:
        return sum(part.bytes for part in self.parts)

    @property
    def min_block(self) -> int:
        return min(part.min_block for part in self.parts)

    @property
    def max_block(self) -> int:
        return max(part.max_block for part in self.parts)

    @property
    def part_names(self) -> tuple[str, ...]:
        return tuple(part.name for part in self.parts)


@dataclass(frozen=True)
class Manifest:
    """Everything publish needs to know about one sealed staging table."""

    target_database: str
    target_table: str
    staging_database: str
    staging_table: str
    partitions: tuple[PartitionManifest, ...]

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.partitions)

    @property
    def bytes(self) -> int:
        return sum(p.bytes for p in self.partitions)

    @property
    def is_empty(self) -> bool:
        return not self.partitions

    @property
    def partition_ids(self) -> tuple[str, ...]:
        return tuple(p.partition_id for p in self.partitions)

    def partition(self, partition_id: str) -> PartitionManifest:
        for partition in self.partitions:
            if partition.partition_id == partition_id:
                return partition
        raise KeyError(partition_id)

    @classmethod
    def empty(cls, target: _NamedTable, staging: str) -> Manifest:
        """The manifest of a branch that wrote nothing (it never created its staging table).

        ``staging`` is a bare staging table name or a qualified one.
        """
        database, table = split_table_name(staging, default_database=STAGING_DATABASE)
        return cls(target.database, target.name, database, table, ())

    def to_dict(self) -> dict[str, Any]:
        """Compact JSON-safe form: ``{"v", "target", "staging", "partitions"}``."""
        return {
            "v": MANIFEST_VERSION,
            "target": [self.target_database, self.target_table],
            "staging": [self.staging_database, self.staging_table],
            "partitions": [
                {
                    "id": p.partition_id,
                    "value": p.value,
                    "parts": [[part.name, part.rows, part.bytes] for part in p.parts],
                    **({"digest": p.digest.to_json()} if p.digest else {}),
                }
                for p in self.partitions
            ],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        """Inverse of ``to_dict``; refuses a manifest written by a newer version."""
        version = data.get("v")
        if version != MANIFEST_VERSION:
            raise ValueError(f"unsupported manifest version {version!r}")
        return cls(
            target_database=data["target"][0],
            target_table=data["target"][1],
            staging_database=data["staging"][0],
            staging_table=data["staging"][1],
            partitions=tuple(
                PartitionManifest(
                    partition_id=p["id"],
                    value=p["value"],
                    parts=tuple(StagedPart(name, int(rows), int(size))
                                for name, rows, size in p["parts"]),
                    digest=ContentDigest.from_json(p["digest"]) if p.get("digest") else None,
                )
                for p in data["partitions"]
            ),
        )
