"""A stream's plan kept between micro-batches (``txsink.core.plan.StreamPlans``), against
the real servers (fixture ``server``: 18.16 and 26.x): reused while the tables it
described are unchanged, planned afresh once any of them changed, and the sink opened on
every call all the same."""

from __future__ import annotations

import pytest
from pyspark.sql.types import DateType, DoubleType, LongType, StringType, StructField, StructType

import txsink
from server_ext.errors import ClickHouseError
from tests.conftest import run_sql
from tests.sinkutil import assert_exactly_once, create_events
from tests.spark.test_sink_streaming import run_stream, write_input_file
from txsink.core import driver
from txsink.core.plan import StreamPlans, plan_afresh, plan_write
from txsink.options import parse_options

SCHEMA = StructType([StructField("id", LongType()), StructField("day", DateType()),
                     StructField("name", StringType()), StructField("value", DoubleType())])


@pytest.fixture
def stream_options(server_url, server_db, server_options) -> dict[str, str]:
    table = create_events(server_url, server_db)
    return {**server_options, "table": table, "sink_id": "events"}


def stream_plan(options: dict[str, str]):
    return plan_write(options, SCHEMA, False, streaming=True)


def same_plan(a, b) -> bool:
    """One plan handed out twice (each call's copy carries its own message count; a plan
    made afresh has a write id of its own)."""
    return a.write_id == b.write_id


def test_a_stream_plan_is_reused_while_its_tables_are_unchanged(stream_options):
    assert same_plan(stream_plan(stream_options), stream_plan(stream_options))


def test_a_stream_plan_is_made_again_after_a_column_is_added(server_url, stream_options):
    first = stream_plan(stream_options)
    run_sql(server_url, f"ALTER TABLE {stream_options['table']} ADD COLUMN note String "
                        "DEFAULT ''")
    again = stream_plan(stream_options)
    assert "note" in {c.name for c in again.table.columns}
    assert "note" not in {c.name for c in first.table.columns}


def test_a_stream_plan_is_made_again_after_a_view_of_the_target_is_created(
        server_url, server_db, stream_options):
    assert stream_plan(stream_options).views == ()
    run_sql(server_url, f"CREATE MATERIALIZED VIEW `{server_db}`.`ids` ENGINE = MergeTree() "
                        f"ORDER BY id AS SELECT id FROM {stream_options['table']}")
    assert [n.view for n in stream_plan(stream_options).views] == [(server_db, "ids")]


def test_a_stream_plan_of_a_target_with_a_view_is_kept_from_the_second_call(
        server_url, server_db, stream_options):
    run_sql(server_url, f"CREATE MATERIALIZED VIEW `{server_db}`.`ids` ENGINE = MergeTree() "
                        f"ORDER BY id AS SELECT id FROM {stream_options['table']}")
    first, second = stream_plan(stream_options), stream_plan(stream_options)
    assert not same_plan(first, second)
    assert same_plan(stream_plan(stream_options), second)


def test_a_change_while_a_stream_plan_is_made_shows_at_the_next_call(server_url,
                                                                      stream_options):
    options = parse_options(stream_options)
    plans, key = StreamPlans(), ("stream",)

    def made_then_altered():
        plan = plan_afresh(options, SCHEMA, False, streaming=True)
        run_sql(server_url, f"ALTER TABLE {stream_options['table']} ADD COLUMN note String "
                            "DEFAULT ''")
        return plan

    plans.plan(key, options, made_then_altered)
    again, kept = plans.plan(key, options,
                             lambda: plan_afresh(options, SCHEMA, False, streaming=True))
    assert not kept
    assert "note" in {c.name for c in again.table.columns}


def test_a_stream_plan_of_a_dropped_target_is_refused_naming_it(server_url, stream_options):
    stream_plan(stream_options)
    run_sql(server_url, f"DROP TABLE {stream_options['table']}")
    with pytest.raises(ClickHouseError, match="events"):
        stream_plan(stream_options)


def test_a_kept_stream_plan_still_opens_the_sink_on_every_call(stream_options, monkeypatch):
    stream_plan(stream_options)
    opened = []
    monkeypatch.setattr(driver, "open_stream", lambda *args: opened.append(args))
    stream_plan(stream_options)
    stream_plan(stream_options)
    assert len(opened) == 2


def test_batch_plans_are_never_kept(stream_options):
    batch = {**stream_options, "sink_id": "batch"}
    first = plan_write(batch, SCHEMA, False, streaming=False)
    assert plan_write(batch, SCHEMA, False, streaming=False).epoch == first.epoch + 1


def test_a_view_created_between_micro_batches_gets_the_later_micro_batches_rows(
        spark, tmp_path, server_url, server_db, stream_options):
    txsink.register(spark)
    table = stream_options.pop("table")
    source, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    write_input_file(source, 0, range(0, 100))
    run_stream(spark, source, checkpoint, stream_options, table)
    run_sql(server_url, f"CREATE MATERIALIZED VIEW `{server_db}`.`ids` ENGINE = MergeTree() "
                        f"ORDER BY id AS SELECT id FROM {table}")
    write_input_file(source, 1, range(100, 250))
    run_stream(spark, source, checkpoint, stream_options, table)
    assert_exactly_once(server_url, table, range(250))
    assert_exactly_once(server_url, f"{server_db}.ids", range(100, 250))
