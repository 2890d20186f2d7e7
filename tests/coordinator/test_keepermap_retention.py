"""The KeeperMap store's retention: old log entries are deleted, and no copy misses one.

Pure logic over an in-memory key-value table with the KeeperMap table's semantics (a
strict create of several keys is all or nothing); the same rules over the real table are
checked in ``tests/coordinator/test_keepermap_store.py``. Time is the store's own: ``retain`` is set
to a fraction of a second, so "older than the retention" is a short sleep.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import pytest
from kazoo.exceptions import BadVersionError, ConnectionLoss

from coordinator.plumbing.keepermap import KeeperMapNodes
from tests.coordinator.test_keepermap_store import SINK, tree

RETAIN = 0.2  # seconds


class MemoryTable:
    """A dict with the KeeperMap table's API (``coordinator.plumbing.keepermap.KeyValueTable``)."""

    def __init__(self) -> None:
        self.rows: dict[str, str] = {}

    def get_many(self, keys: Iterable[str]) -> dict[str, str]:
        return {k: self.rows[k] for k in keys if k in self.rows}

    def create_new(self, rows: dict[str, str]) -> bool:
        if any(k in self.rows for k in rows):
            return False
        self.rows.update(rows)
        return True

    def put(self, key: str, value: str) -> None:
        self.rows[key] = value

    def keys_with_prefix(self, prefix: str) -> list[str]:
        return sorted(k for k in self.rows if k.startswith(prefix))

    def delete(self, keys: Iterable[str]) -> None:
        for key in keys:
            self.rows.pop(key, None)

    def entries(self) -> list[str]:
        return [k for k in self.rows if k.startswith("log:")]


@pytest.fixture
def table() -> MemoryTable:
    return MemoryTable()


def store(table: MemoryTable, every: int = 10) -> KeeperMapNodes:
    return KeeperMapNodes(table, compact_every=every, retain=RETAIN)


def write(nodes: KeeperMapNodes, count: int, path: str = f"{SINK}/a") -> None:
    nodes.ensure_path(path)
    for i in range(count):
        nodes.set(path, f"value {i}".encode())


def test_entries_below_a_snapshot_older_than_the_retention_are_deleted(table) -> None:
    writer = store(table)
    write(writer, 40)
    time.sleep(RETAIN * 1.5)
    write(writer, 40)
    # the snapshots at 40 (or below) are past the retention when the one at 80 is stored
    assert len(table.entries()) <= 40 + 10
    assert table.rows[f"trim:{SINK}"] in {"20", "30", "40"}
    assert tree(KeeperMapNodes(table)) == tree(writer)


def test_a_snapshot_stored_below_the_trimmed_window_is_deleted_by_a_later_trim(table) -> None:
    """A writer paused past a trim stores its snapshot late, below where trims go on."""
    writer = store(table)
    write(writer, 40)
    late = {k: v for k, v in table.rows.items() if k.startswith(f"snap:{SINK}:{10:020d}")}
    time.sleep(RETAIN * 1.5)
    write(writer, 40)
    table.rows.update(late)  # stored again, after the trim that deleted it
    time.sleep(RETAIN * 1.5)
    write(writer, 20)
    assert not any(k.startswith(f"snap:{SINK}:{10:020d}") for k in table.rows)


def test_entries_within_the_retention_are_kept(table) -> None:
    writer = store(table)
    write(writer, 80)
    assert len(table.entries()) == 82  # the two paths and the sets
    assert f"trim:{SINK}" not in table.rows


def test_a_log_never_trimmed_is_trimmed_in_steps_of_the_batch(table, monkeypatch) -> None:
    monkeypatch.setattr("coordinator.plumbing.keepermap.snapshot.TRIM_BATCH", 25)
    writer = store(table)
    write(writer, 60)
    time.sleep(RETAIN * 1.5)
    write(writer, 20)  # one snapshot (at 70, then 80): two trims of at most 25 entries
    assert int(table.rows[f"trim:{SINK}"]) <= 50
    assert len(table.entries()) >= 30


def test_a_reader_whose_copy_is_older_than_half_the_retention_starts_from_the_snapshot(
        table) -> None:
    """Without the pointer read, the reader would find the entry after its copy deleted
    and take its stale copy for current."""
    writer, reader = store(table), store(table)
    write(writer, 5)
    assert tree(reader) == tree(writer)
    time.sleep(RETAIN)
    write(writer, 45)
    time.sleep(RETAIN * 1.5)
    write(writer, 30)
    assert f"log:{SINK}:{6:020d}" not in table.rows  # the entry after the reader's copy
    assert tree(reader) == tree(writer)


def test_a_writer_whose_copy_is_stale_reads_before_it_appends(table) -> None:
    """Its conditional write is judged against the newest tree and refused; it never
    lands in the gap the deleted entries left."""
    stale, busy = store(table), store(table)
    stale.ensure_path(f"{SINK}/a")
    _, seen = stale.get(f"{SINK}/a")
    time.sleep(RETAIN)
    write(busy, 45)
    time.sleep(RETAIN * 1.5)
    write(busy, 30)
    with pytest.raises(BadVersionError):
        stale.set(f"{SINK}/a", b"late", version=seen.version)
    assert stale.get(f"{SINK}/a") == busy.get(f"{SINK}/a")
    assert tree(KeeperMapNodes(table)) == tree(busy)


def test_a_pointer_to_a_deleted_snapshot_reads_the_newest_one(table) -> None:
    """A writer paused past the retention may put the pointer back to a snapshot trimmed
    since: a reader new to the sink then lists the heads and loads the newest."""
    writer = store(table)
    write(writer, 40)
    time.sleep(RETAIN * 1.5)
    write(writer, 40)
    table.put(f"base:{SINK}", "10")
    assert f"snap:{SINK}:{10:020d}" not in table.rows
    assert tree(KeeperMapNodes(table)) == tree(writer)


class LosingChunks(MemoryTable):
    """The table, whose chunk reads find nothing the first ``losses`` times."""

    def __init__(self, rows: dict[str, str], losses: int) -> None:
        super().__init__()
        self.rows, self.losses = rows, losses

    def get_many(self, keys):
        keys = list(keys)
        if self.losses and any(k.startswith("snap:") and k.count(":") > 2 for k in keys):
            self.losses -= 1
            return {}
        return super().get_many(keys)


def test_a_snapshot_deleted_while_it_is_read_is_read_again_from_the_newest_head(
        table) -> None:
    writer = store(table)
    write(writer, 25)
    reader = KeeperMapNodes(LosingChunks(table.rows, losses=1))
    assert tree(reader) == tree(writer)


def test_no_whole_snapshot_to_read_is_a_retryable_loss(table) -> None:
    """Chunks gone at every try: ``ConnectionLoss``, which the coordinator's retry policy
    retries, never a half-restored tree."""
    writer = store(table)
    write(writer, 25)
    reader = KeeperMapNodes(LosingChunks(table.rows, losses=2))
    with pytest.raises(ConnectionLoss):
        reader.get(SINK)
    assert tree(reader) == tree(writer)


def test_a_new_snapshot_drops_the_chunks_of_the_older_ones(table) -> None:
    """The table holds one snapshot of the tree, whatever the retention of the log."""
    writer = KeeperMapNodes(table, compact_every=10, retain=3600)
    write(writer, 55)
    chunks = {k.rsplit(":", 1)[0] for k in table.rows
              if k.startswith("snap:") and k.count(":") > 2}
    heads = [k for k in table.rows if k.startswith("snap:") and k.count(":") == 2]
    assert chunks == {max(heads)} and len(heads) == 5
    assert tree(KeeperMapNodes(table)) == tree(writer)


def test_a_sink_deleted_whole_leaves_no_key_of_its_log(table) -> None:
    """What ``txsink gc`` does to a one-off sink it forgets: its log, snapshots and
    pointers go with it; another sink's stay."""
    writer = store(table)
    write(writer, 30)
    write(writer, 5, path="/r/sinks/other/a")
    writer.delete(SINK, recursive=True)
    assert [k for k in table.rows if SINK + ":" in k or k.endswith(SINK)] == []
    assert any("/r/sinks/other" in k for k in table.rows)
    assert KeeperMapNodes(table).exists(SINK) is None


def test_a_writers_own_tree_is_what_every_reader_folds_times_included(table,
                                                                      monkeypatch) -> None:
    """The writer applies an entry to its tree with the time the entry records, so a
    snapshot of its tree and a fold of its entries agree to the millisecond."""
    ticks = iter(range(10**9))
    monkeypatch.setattr("coordinator.plumbing.keepermap.log_store.time.time",
                        lambda: 1.8e9 + next(ticks) / 7)
    writer = store(table, every=1000)
    write(writer, 5)
    reader = KeeperMapNodes(table)
    assert reader.get(f"{SINK}/a") == writer.get(f"{SINK}/a")
    assert reader.get(SINK) == writer.get(SINK)
