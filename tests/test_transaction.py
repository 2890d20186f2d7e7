"""``txsink.transaction()``: several writes become visible together, or not at all.

Every test here runs on ClickHouse 18.16 and 26.x (``[ch18]``/``[ch26]``).
"""

from __future__ import annotations

import pytest

import txsink
from tests.sinkutil import assert_exactly_once, create_events, events_df, staging_tables


@pytest.fixture
def tables(server_url, server_db):
    return tuple(create_events(server_url, server_db, name) for name in ("facts", "daily"))


def test_writes_to_two_tables_commit_together(spark, server_url, zk_hosts, zk_chroot, tables):
    facts, daily = tables
    with txsink.transaction(spark, url=server_url, zookeeper=zk_hosts + zk_chroot,
                            sink_id="nightly") as tx:
        tx.write(events_df(spark, 0, 500), facts)
        tx.write(events_df(spark, 1000, 300), daily)
        assert_exactly_once(server_url, facts, [])  # nothing visible inside the block
    assert_exactly_once(server_url, facts, range(500))
    assert_exactly_once(server_url, daily, range(1000, 1300))


def test_exception_inside_the_block_aborts_every_write(
    spark, server_url, zk_hosts, zk_chroot, tables
):
    facts, daily = tables
    root = {"zookeeper": zk_hosts + zk_chroot}
    before = staging_tables(server_url, root)
    with pytest.raises(RuntimeError, match="stop here"):
        with txsink.transaction(spark, url=server_url, zookeeper=zk_hosts + zk_chroot,
                                sink_id="nightly") as tx:
            tx.write(events_df(spark, 0, 500), facts)
            tx.write(events_df(spark, 1000, 300), daily)
            raise RuntimeError("stop here")
    assert_exactly_once(server_url, facts, [])
    assert_exactly_once(server_url, daily, [])
    assert staging_tables(server_url, root) == before
