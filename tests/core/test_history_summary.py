"""The sink's summary of pruned xids (``txsink/core/history_summary.py``) and the option
``retention``: pure logic, no servers."""

from __future__ import annotations

import json

import pytest

from server_ext.types import ContentDigest
from txsink.core.history_summary import PartitionWrite, SummaryEntry
from txsink.core.retention_step import pass_interval
from txsink.options import OptionError, parse_options

BASE = {"url": "http://ch:8123", "table": "db.t", "zookeeper": "zk:2181"}


def write(rows: int, total: int, overwrite: bool = False, scheme: str = "s1"
          ) -> PartitionWrite:
    return PartitionWrite("http://ch:8123", "db", "t", "202601", "202601", rows, overwrite,
                          ContentDigest(rows, total, scheme))


def first(w: PartitionWrite) -> SummaryEntry:
    return SummaryEntry.first_of(w, 0, 10.0)


def test_writes_to_a_partition_add_up_rows_and_digests() -> None:
    entry = first(write(10, 5)).plus(write(3, 7), epoch=1, at=11.0)
    assert (entry.write.rows, entry.write.digest, entry.first, entry.last) == (
        13, ContentDigest(13, 12, "s1"), 0, 1)


def test_an_overwrite_replaces_what_the_partition_held() -> None:
    entry = first(write(10, 5)).plus(write(4, 9, overwrite=True), epoch=2, at=12.0)
    assert (entry.write.rows, entry.write.overwrite, entry.first, entry.first_at) == (
        4, True, 2, 12.0)


def test_a_write_hashed_otherwise_leaves_the_partition_judged_by_count() -> None:
    entry = first(write(10, 5)).plus(write(3, 7, scheme="s2"), epoch=1, at=11.0)
    assert (entry.write.rows, entry.write.digest) == (13, None)


def test_an_entry_reads_back_as_written() -> None:
    entry = first(write(10, 2**64 - 1))
    raw = json.loads(json.dumps(entry.to_json()))
    assert SummaryEntry.from_json(entry.key, raw) == entry


def test_an_entry_is_stored_in_the_form_of_earlier_releases() -> None:
    """The summary is a stored record: the key and fields a release before the entry
    embedded its write wrote, read back the same."""
    entry = first(write(10, 5)).plus(write(3, 7), epoch=1, at=11.0)
    assert entry.key == '["http://ch:8123", "db", "t", "202601"]'
    assert entry.to_json() == {
        "value": "202601", "rows": 13, "digest": ContentDigest(13, 12, "s1").to_json(),
        "overwrite": False, "first": 0, "last": 1, "first_at": 10.0, "last_at": 11.0}
    assert SummaryEntry.from_json(entry.key, entry.to_json()) == entry


def test_retention_defaults_to_an_hour_and_zero_keeps_for_ever() -> None:
    assert parse_options(BASE, env={}).transaction.retention == 3600.0
    assert parse_options({**BASE, "retention": "0"}, env={}).transaction.retention == 0.0


@pytest.mark.parametrize("value", ["-1", "soon", "nan", "1e12"])
def test_a_retention_out_of_range_is_refused_by_name(value: str) -> None:
    with pytest.raises(OptionError, match=r"option retention="):
        parse_options({**BASE, "retention": value}, env={})


def test_writers_pass_a_twentieth_of_the_retention_apart_at_most_a_minute() -> None:
    assert (pass_interval(20), pass_interval(3600)) == (1.0, 60.0)
