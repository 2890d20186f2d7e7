"""The options of a Distributed table the sink creates (``distributed_table``,
``cluster``), checked before any server is asked, and the statements it runs (pure
text; the writes are ``tests/core/test_sharded_creation.py``'s)."""

from __future__ import annotations

import pytest

from server_ext.ddl.create_distributed import distributed_table_sql
from server_ext.ddl.quarantine_table import table_ddl
from server_ext.publish.strategy_choice import Strategy
from txsink.core.quarantine_plan import _common_strategy
from txsink.options import OptionError, parse_options

SHARDS = "http://a:8123,http://b:8123;http://c:8123,http://d:8123"
BASE = {"url": "http://a:8123", "zookeeper": "zk:2181", "table": "db.events",
        "create_table": "if_missing", "shards": SHARDS, "sharding_key": "id",
        "distributed_table": "db.events_all", "cluster": "prod"}


def parsed(**changes: str | None):
    given = {k: v for k, v in {**BASE, **changes}.items() if v is not None}
    return parse_options(given, env={})


def test_a_complete_option_set_is_parsed():
    options = parsed()
    given = options.distributed
    assert (given.distributed_table, given.cluster) == ("db.events_all", "prod")


def test_distributed_table_without_create_table_is_refused_naming_it():
    with pytest.raises(OptionError, match="distributed_table .*needs create_table=if_missing"):
        parsed(create_table=None)


@pytest.mark.parametrize("missing", ["cluster", "shards", "sharding_key"])
def test_distributed_table_without_one_of_its_options_is_refused_naming_it(missing):
    with pytest.raises(OptionError, match=f"distributed_table needs {missing} "):
        parsed(**{missing: None})


def test_every_missing_option_is_named_at_once():
    with pytest.raises(OptionError, match="needs cluster, sharding_key"):
        parsed(cluster=None, sharding_key=None)


def test_cluster_without_distributed_table_is_refused():
    with pytest.raises(OptionError, match="option cluster .*needs distributed_table"):
        parsed(distributed_table=None)


def test_distributed_table_naming_the_local_table_is_refused():
    with pytest.raises(OptionError, match="names the local table"):
        parsed(distributed_table="`db`.`events`")


@pytest.mark.parametrize("name", ["events_all", "`a`.`b`.`c`", ""])
def test_distributed_table_must_be_database_dot_table(name):
    with pytest.raises(OptionError, match="distributed_table"):
        parsed(distributed_table=name)


def test_a_local_table_without_its_database_is_refused():
    with pytest.raises(OptionError, match="option table='events' must be database.table"):
        parsed(table="events")


def test_distributed_table_with_add_columns_is_refused():
    with pytest.raises(OptionError, match="schema_evolution=add_columns"):
        parsed(schema_evolution="add_columns")


def test_a_sharding_key_that_ends_the_statement_is_refused():
    with pytest.raises(OptionError, match="option sharding_key=.*';' ends the statement"):
        parsed(sharding_key="id; DROP TABLE x")


def test_the_distributed_statement_quotes_every_name_and_writes_the_database_out():
    sql = distributed_table_sql("db.events_all", [("id", "Int64"), ("my col", "String")],
                                "prod's", "db.events", "id")
    assert sql == ("CREATE TABLE IF NOT EXISTS `db`.`events_all` (`id` Int64, `my col` String) "
                   "ENGINE = Distributed('prod\\'s', 'db', 'events', `id`)")


def test_an_expression_key_is_kept_as_written():
    sql = distributed_table_sql("d.t", [("name", "String")], "c", "d.l", "cityHash64(name)")
    assert sql.endswith("ENGINE = Distributed('c', 'd', 'l', cityHash64(name))")


def test_a_quarantine_table_for_a_replicated_shard_uses_the_shard_and_replica_macros():
    sql = table_ddl("db.bad", replicated=True)
    assert ("ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/txsink_quarantine/db/bad'"
            ", '{replica}') ORDER BY (sink_id, epoch)") in sql


def test_a_quarantine_table_of_one_server_stays_plain_merge_tree():
    assert "ENGINE = MergeTree ORDER BY" in table_ddl("db.bad")


def test_the_quarantine_strategy_is_the_first_servers_choice_when_every_server_has_it():
    move, marked = Strategy.MOVE, Strategy.ATTACH_MARKED
    assert _common_strategy([(move, [move, marked]), (move, [move, marked])], "d.q") == move


def test_the_quarantine_strategy_falls_back_to_one_every_shard_supports():
    move, marked = Strategy.MOVE, Strategy.ATTACH_MARKED
    assert _common_strategy([(move, [move, marked]), (marked, [marked])], "d.q") == marked
