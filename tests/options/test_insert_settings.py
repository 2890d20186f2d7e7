"""``settings.<name>`` options: ClickHouse settings for the sink's own INSERTs, checked
against the server in hand before anything is staged (``txsink/options/insert_settings.py``)."""

from __future__ import annotations

import pytest

import txsink
from tests.sinkutil import (
    assert_exactly_once,
    create_events,
    events_df,
    staging_insert_settings,
    staging_tables,
)
from txsink.options import OptionError, parse_options
from txsink.options.insert_settings import REFUSED

BASE = {"url": "http://h:8123", "zookeeper": "z:2181", "table": "t"}


@pytest.fixture(autouse=True)
def _registered(spark) -> None:
    txsink.register(spark)


@pytest.fixture
def options(server_options, server_url, server_db) -> dict[str, str]:
    return {**server_options, "table": create_events(server_url, server_db),
            "sink_id": "with-settings"}


def write(spark, options: dict[str, str], **settings: str) -> None:
    (events_df(spark, 0, 400).write.format("clickhouse_tx").options(**options)
        .options(**{f"settings.{k}": v for k, v in settings.items()}).mode("append").save())


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_setting_that_would_break_the_guarantee_is_refused_by_name(name):
    with pytest.raises(OptionError, match=f"settings.{name} cannot be passed"):
        parse_options({**BASE, f"settings.{name}": "1"})


def test_setting_name_that_is_not_an_identifier_is_refused():
    with pytest.raises(OptionError, match="is not a ClickHouse setting name"):
        parse_options({**BASE, "settings.max threads": "1"})


def test_setting_reaches_every_staging_insert(spark, modern_clickhouse_url, zk_hosts,
                                              zk_chroot):
    """On 26.x, whose query log records each query's settings (18.16's does not)."""
    from tests.conftest import run_sql

    db = "settings_reach"
    run_sql(modern_clickhouse_url, f"DROP DATABASE IF EXISTS {db}")
    run_sql(modern_clickhouse_url, f"CREATE DATABASE {db}")
    options = {"url": modern_clickhouse_url, "zookeeper": zk_hosts + zk_chroot,
               "table": create_events(modern_clickhouse_url, db), "sink_id": "reach"}
    try:
        write(spark, options, max_threads="3")
        inserts = staging_insert_settings(modern_clickhouse_url, options, "max_threads")
        assert inserts and set(inserts) == {"3"}
        assert_exactly_once(modern_clickhouse_url, options["table"], range(400))
    finally:
        run_sql(modern_clickhouse_url, f"DROP DATABASE IF EXISTS {db}")


def test_setting_the_server_does_not_know_is_refused_naming_its_version(
        spark, server, options):
    """``max_partitions_per_insert_block`` exists on 26.x, not on 18.16."""
    if server == "ch26":
        write(spark, options, max_partitions_per_insert_block="1000")
        assert_exactly_once(options["url"], options["table"], range(400))
        return
    with pytest.raises(Exception, match=r"settings.max_partitions_per_insert_block: "
                                        r"ClickHouse 18\.16\S* at .* has no such setting"):
        write(spark, options, max_partitions_per_insert_block="1000")
    assert staging_tables(options["url"], options) == []
    assert_exactly_once(options["url"], options["table"], [])


def test_setting_value_the_server_rejects_is_refused_before_staging(spark, options):
    with pytest.raises(Exception, match="settings options refused by"):
        write(spark, options, max_block_size="abc")
    assert staging_tables(options["url"], options) == []
    assert_exactly_once(options["url"], options["table"], [])
