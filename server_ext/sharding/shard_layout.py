"""What a sharded target is: its shards (weights, replica URLs), local table and key.

``ShardLayout.slots`` is the server's weight-slot assignment (``key % total_weight``).
A layout is built by hand (``layout_from_urls``) or read from a ``Distributed`` table
(``server_ext.sharding.discovery``).
"""

from __future__ import annotations

from dataclasses import dataclass

from server_ext.errors import ShardingError
from server_ext.sharding.urls import check_url, reject_duplicates
from server_ext.sql import identifier_text, split_table_name


@dataclass(frozen=True)
class Shard:
    """One shard: ``index`` 0-based in cluster order, its ``weight`` and replicas' URLs."""

    index: int
    weight: int
    replicas: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.index < 0:
            raise ShardingError(f"shard index {self.index} is negative")
        if self.weight < 1:
            raise ShardingError(
                f"shard {self.index + 1} has weight {self.weight}; txsink needs every "
                "shard's weight to be at least 1"
            )
        if not self.replicas:
            raise ShardingError(f"shard {self.index + 1} has no replica")


@dataclass(frozen=True)
class ShardLayout:
    """The shards of a target, the table on each, and the key that picks the shard.

    ``sharding_key`` None means: rows may go to any shard (as with ``rand()``); with one
    shard it is the only choice.
    """

    shards: tuple[Shard, ...]
    local_table: str
    sharding_key: str | None

    def __post_init__(self) -> None:
        if not 1 <= len(self.shards) <= 65535:
            raise ShardingError(f"a shard layout needs 1 to 65535 shards, not {len(self.shards)}")
        for position, shard in enumerate(self.shards):
            if shard.index != position:
                raise ShardingError(f"shard at position {position} has index {shard.index}")
        if self.sharding_key is not None and not self.sharding_key.strip():
            raise ShardingError("the sharding key is empty; give an expression or None")
        table_text(self.local_table)  # raises ShardingError on a malformed name

    @property
    def total_weight(self) -> int:
        return sum(shard.weight for shard in self.shards)

    @property
    def slots(self) -> tuple[int, ...]:
        """Shard index of each slot (``key % total_weight``), as the server assigns them."""
        return tuple(shard.index for shard in self.shards for _ in range(shard.weight))


def layout_from_urls(shard_urls: list[list[str]], local_table: str,
                     sharding_key: str | None, weights: list[int] | None = None) -> ShardLayout:
    """A layout given by hand: replica URLs per shard (cluster order), weights default 1."""
    if not shard_urls:
        raise ShardingError("no shard given")
    if weights is not None and len(weights) != len(shard_urls):
        raise ShardingError(f"{len(weights)} weight(s) given for {len(shard_urls)} shard(s)")
    for urls in shard_urls:
        for url in urls:
            check_url(url)
    reject_duplicates(shard_urls)
    shards = tuple(
        Shard(index, weights[index] if weights else 1, tuple(urls))
        for index, urls in enumerate(shard_urls)
    )
    return ShardLayout(shards, table_text(local_table), _clean_key(sharding_key))


def table_text(name: str) -> str:
    """``db.table`` with each part bare if it is a plain word, else backquoted."""
    try:
        database, table = split_table_name(name)
    except ValueError as exc:
        raise ShardingError(str(exc)) from None
    return f"{identifier_text(database)}.{identifier_text(table)}"


def _clean_key(key: str | None) -> str | None:
    return key.strip() if key is not None else None
