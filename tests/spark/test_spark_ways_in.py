"""The ways in that work on every PySpark from 3.5: ``txsink.write``,
``txsink.foreach_batch`` and ``txsink.transaction`` (all through ``mapInArrow``).

The tests marked ``every_spark`` are the exactly-once guarantee; they use no
``pyspark.sql.datasource`` and also run under PySpark 3.5 and 4.0 (``pytest -m
every_spark`` in a virtualenv of that PySpark). Each runs on both servers (ids ``[ch18]``,
``[ch26]``) in the main environment, but the refusals of a call no server answers (an
unknown mode, ``foreach_batch`` outside a stream or in complete mode), which run on 18.16
only (``on_18_16_only``); and on 18.16 under the older PySparks: their
``[ch26]`` runs are marked ``second_server``. What a PySpark changes here is Spark's
side, and the tasks get the same Arrow schema on each
(``test_the_arrow_schema_is_the_one_the_tasks_receive``, run under every version), so the
modern server would see the same batches and the same commit as under the main
environment's PySpark (``tests/harness/spark_versions.py``, ``SECOND_SERVER``). The data
source's own forms are checked where the API exists and skipped where it does not.
"""

from __future__ import annotations

import threading
import time

import pytest
from pyspark.sql import functions as F

import txsink
from tests.conftest import on_18_16_only, run_sql
from tests.sinkutil import SHORT_SESSION, assert_exactly_once, create_events, events_df
from txsink.core.spark_arrow import arrow_schema
from txsink.options import OptionError
from txsink.spark.versions import has_data_source, has_stream_arrow_writer

every_spark = pytest.mark.every_spark


@pytest.fixture(params=["ch18", pytest.param("ch26", marks=pytest.mark.second_server)])
def server(request) -> str:
    """``tests/conftest.py``'s servers, the modern one's runs marked ``second_server``
    (the module docstring says why the older PySparks leave them out)."""
    return request.param


@pytest.fixture
def db(server_db: str) -> str:
    return server_db


@pytest.fixture
def options(server_url: str, zk_hosts: str, zk_chroot: str) -> dict[str, str]:
    return {"url": server_url, "zookeeper": zk_hosts + zk_chroot, **SHORT_SESSION}


@pytest.fixture
def target(server_url: str, db: str) -> str:
    return create_events(server_url, db)


def count(url: str, table: str) -> int:
    db, name = table.split(".", 1)
    return int(run_sql(url, f"SELECT count() FROM `{db}`.`{name}`").strip())


def fail_first_attempt_after(rows_before_failure: int):
    """A mapInArrow function that fails each task's first attempt once it has handed on
    ``rows_before_failure`` rows (they are staged by then)."""

    def fn(batches):
        from pyspark import TaskContext

        attempt, sent = TaskContext.get().attemptNumber(), 0
        for batch in batches:
            if attempt == 0 and sent >= rows_before_failure:
                raise RuntimeError("injected task failure after staging")
            sent += batch.num_rows
            yield batch

    return fn


# -- txsink.write ---------------------------------------------------------------------------


@every_spark
def test_write_makes_every_row_visible_exactly_once(spark, server_url, options, target):
    txsink.write(events_df(spark, 0, 3000), table=target, **options)
    assert_exactly_once(server_url, target, range(3000))


@every_spark
def test_write_takes_column_names_with_a_backtick_or_a_dot(spark, server_url, db, options):
    run_sql(server_url, f"CREATE TABLE `{db}`.odd (`id` Int64, `a.b` String, `c``d` Int32) "
                        "ENGINE = MergeTree ORDER BY id")
    df = spark.range(300).selectExpr("id", "concat('x', id) AS `a.b`", "int(id) AS `c``d`")
    txsink.write(df, table=f"{db}.odd", **options)
    assert run_sql(server_url, f"SELECT count(), sum(`c``d`), countIf(`a.b` = concat('x', "
                               f"toString(id))) FROM `{db}`.odd").split() == ["300", "44850",
                                                                             "300"]


@every_spark
def test_write_rerun_of_a_committed_txn_version_writes_nothing(spark, server_url, options,
                                                               target):
    for _ in range(2):
        txsink.write(events_df(spark, 0, 500), table=target, sink_id="nightly",
                     txn_version=7, **options)
    assert_exactly_once(server_url, target, range(500))


@every_spark
def test_write_overwrite_replaces_only_the_partitions_present(spark, server_url, options,
                                                              target):
    txsink.write(events_df(spark, 0, 900), table=target, **options)  # January..March
    january = events_df(spark, 10_000, 3100).where("month(day) = 1")
    txsink.write(january, table=target, mode="overwrite", **options)
    kept = [i for i in range(900) if i % 90 >= 31]  # February and March of the first write
    assert_exactly_once(server_url, target,
                        [*kept, *(i for i in range(10_000, 13_100) if i % 90 < 31)])


@every_spark
def test_write_task_retried_after_staging_publishes_each_row_once(spark, server_url,
                                                                  options, target):
    df = events_df(spark, 0, 4000)
    flaky = df.mapInArrow(fail_first_attempt_after(200), df.schema)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    try:
        txsink.write(flaky, table=target, insert_block_rows="100", **options)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert_exactly_once(server_url, target, range(4000))


@every_spark
def test_write_of_a_failing_job_leaves_nothing_visible(spark, server_url, options, target):
    doomed = events_df(spark, 0, 2000).withColumn(
        "value", F.when(F.col("id") == 1500, F.raise_error(F.lit("boom")))
        .otherwise(F.col("value")))
    with pytest.raises(Exception, match="boom"):
        txsink.write(doomed, table=target, insert_block_rows="100", **options)
    assert count(server_url, target) == 0


@every_spark
def test_write_refuses_a_bad_input_before_anything_is_visible(spark, server_url, options,
                                                              target):
    bad = events_df(spark, 0, 100).withColumn("extra", F.lit(1))
    with pytest.raises(Exception, match="extra"):
        txsink.write(bad, table=target, **options)
    assert count(server_url, target) == 0


@every_spark
@on_18_16_only
def test_write_refuses_an_unknown_mode(spark, options, target):
    with pytest.raises(OptionError, match="mode"):
        txsink.write(events_df(spark, 0, 10), table=target, mode="ignore", **options)


@every_spark
def test_write_feeds_the_targets_materialized_view(spark, server_url, db, options, target):
    run_sql(server_url, f"CREATE TABLE `{db}`.`names` (id UInt64, name String) "
                            "ENGINE = MergeTree() ORDER BY id")
    run_sql(server_url, f"CREATE MATERIALIZED VIEW `{db}`.`names_mv` TO `{db}`.`names` "
                            f"AS SELECT id, name FROM `{db}`.`events`")
    txsink.write(events_df(spark, 0, 1000), table=target, **options)
    assert_exactly_once(server_url, target, range(1000))
    assert_exactly_once(server_url, f"{db}.names", range(1000))


# -- txsink.foreach_batch -------------------------------------------------------------------


def run_stream(spark, tmp_path, name: str, fn, first: int, count: int) -> None:
    """One run of a stream over the JSON files of ``tmp_path/name`` (one file of ids
    ``first .. first+count-1`` added), until every file is processed."""
    source = tmp_path / f"{name}-in"
    source.mkdir(exist_ok=True)
    (source / f"{first}.json").write_text(
        "".join(f'{{"id": {i}, "day": "2026-01-{1 + i % 28:02d}", "name": "e{i}", '
                f'"value": {i / 2}}}\n' for i in range(first, first + count)))
    stream = (spark.readStream.schema("id long, day date, name string, value double")
              .json(str(source)).writeStream.foreachBatch(fn)
              .option("checkpointLocation", str(tmp_path / f"{name}-checkpoint")).start())
    try:
        stream.processAllAvailable()
    finally:
        stream.stop()


@every_spark
def test_foreach_batch_writes_each_micro_batch_once_across_a_restart(
        spark, server_url, options, target, tmp_path):
    fn = txsink.foreach_batch(table=target, **options)
    run_stream(spark, tmp_path, "s", fn, 0, 300)
    run_stream(spark, tmp_path, "s", fn, 1000, 300)  # restarted from its checkpoint
    assert_exactly_once(server_url, target, [*range(300), *range(1000, 1300)])


@every_spark
def test_foreach_batch_replay_of_a_committed_batch_writes_nothing(
        spark, server_url, options, target, tmp_path):
    """The run dies after the sink's commit of a batch, before Spark records it: the
    restart hands the same batch again."""
    fn = txsink.foreach_batch(table=target, **options)
    killed = threading.Event()

    def dies_after_first_commit(batch_df, batch_id):
        fn(batch_df, batch_id)
        if not killed.is_set():
            killed.set()
            raise RuntimeError("driver lost after the sink's commit")

    with pytest.raises(Exception, match="driver lost"):
        run_stream(spark, tmp_path, "r", dies_after_first_commit, 0, 300)
    run_stream(spark, tmp_path, "r", fn, 1000, 100)  # replays batch 0, then the new file
    assert_exactly_once(server_url, target, [*range(300), *range(1000, 1100)])


@every_spark
def test_write_with_txn_version_in_a_users_foreach_batch_is_exactly_once(
        spark, server_url, options, target, tmp_path):
    seen: list[int] = []

    def user_fn(batch_df, batch_id):
        txsink.write(batch_df, table=target, sink_id="users-stream", txn_version=batch_id,
                     **options)
        seen.append(batch_id)
        if len(seen) == 1:
            raise RuntimeError("driver lost after the write")

    with pytest.raises(Exception, match="driver lost"):
        run_stream(spark, tmp_path, "u", user_fn, 0, 200)
    run_stream(spark, tmp_path, "u", user_fn, 1000, 100)
    assert seen[:2] == [0, 0]  # the batch was handed again
    assert_exactly_once(server_url, target, [*range(200), *range(1000, 1100)])


def start_name_counts(spark, server_url: str, db: str, options: dict[str, str], tmp_path,
                      mode: str):
    """A query counting the names of ``tmp_path/<mode>-in``'s JSON files (two a, one b
    written), in output mode ``mode``, through ``txsink.foreach_batch`` into
    ``db.counts``: (the started query, its input folder, the table)."""
    counts = f"{db}.counts"
    run_sql(server_url, f"CREATE TABLE `{db}`.`counts` (name String, count Int64) "
                        "ENGINE = MergeTree() ORDER BY name")
    source = tmp_path / f"{mode}-in"
    source.mkdir()
    (source / "0.json").write_text('{"name": "a"}\n{"name": "b"}\n{"name": "a"}\n')
    stream = (spark.readStream.schema("name string").json(str(source))
              .groupBy("name").count().writeStream.outputMode(mode)
              .foreachBatch(txsink.foreach_batch(table=counts, **options))
              .option("checkpointLocation", str(tmp_path / f"{mode}-checkpoint")).start())
    return stream, source, counts


@every_spark
@on_18_16_only
def test_foreach_batch_of_a_complete_mode_query_is_refused_before_anything_is_written(
        spark, server_url, db, options, tmp_path):
    stream, _, counts = start_name_counts(spark, server_url, db, options, tmp_path,
                                          "complete")
    try:
        with pytest.raises(Exception, match=r"cannot run outputMode\('complete'\)"):
            stream.processAllAvailable()
    finally:
        stream.stop()
    assert count(server_url, counts) == 0


@every_spark
def test_foreach_batch_of_an_update_mode_query_appends_each_batchs_changed_rows(
        spark, server_url, db, options, tmp_path):
    stream, source, counts = start_name_counts(spark, server_url, db, options, tmp_path,
                                               "update")
    try:
        stream.processAllAvailable()
        (source / "1.json").write_text('{"name": "a"}\n')
        stream.processAllAvailable()
    finally:
        stream.stop()
    rows = run_sql(server_url, f"SELECT name, count FROM {counts} ORDER BY name, count "
                               "FORMAT TSV")
    assert rows.split() == ["a", "2", "a", "3", "b", "1"]


@every_spark
@on_18_16_only
def test_foreach_batch_outside_a_stream_is_refused(spark, options, target):
    fn = txsink.foreach_batch(table=target, **options)
    with pytest.raises(OptionError, match="foreachBatch"):
        fn(events_df(spark, 0, 10), 0)


# -- txsink.transaction ---------------------------------------------------------------------


@every_spark
def test_transaction_with_txn_version_writes_two_tables_once(spark, server_url, db,
                                                             options):
    facts, other = create_events(server_url, db), create_events(server_url, db, "other")
    for _ in range(2):
        with txsink.transaction(spark, sink_id="two-tables", txn_version="3",
                                **options) as tx:
            tx.write(events_df(spark, 0, 400), facts)
            tx.write(events_df(spark, 5000, 100), other)
    assert_exactly_once(server_url, facts, range(400))
    assert_exactly_once(server_url, other, range(5000, 5100))


@every_spark
def test_transaction_with_a_failed_write_leaves_nothing_visible(spark, server_url, db,
                                                                options):
    facts = create_events(server_url, db)
    with pytest.raises(Exception, match="extra"):
        with txsink.transaction(spark, sink_id="half", **options) as tx:
            tx.write(events_df(spark, 0, 400), facts)
            tx.write(events_df(spark, 0, 10).withColumn("extra", F.lit(1)), facts)
    assert count(server_url, facts) == 0


# -- the data source, where this PySpark has it ---------------------------------------------


@every_spark
def test_register_names_the_forms_that_work_without_the_data_source(spark):
    if has_data_source():
        txsink.register(spark)
        return
    with pytest.raises(RuntimeError, match=r"4\.0.*txsink\.write.*txsink\.foreach_batch"):
        txsink.register(spark)


@every_spark
def test_the_arrow_schema_is_the_one_the_tasks_receive(spark):
    df = spark.sql(
        "SELECT true b, CAST(1 AS TINYINT) i8, CAST(1 AS SMALLINT) i16, 1 i32, 1L i64, "
        "CAST(1 AS FLOAT) f, 1D d, 'x' s, CAST('y' AS BINARY) bin, DATE'2026-01-01' dt, "
        "TIMESTAMP'2026-01-01 00:00:00' ts, TIMESTAMP_NTZ'2026-01-01 00:00:00' ntz, "
        "CAST(1 AS DECIMAL(18, 4)) dec, array(1L) arr, map('a', 1L) m, "
        "named_struct('x', 1L, 'y', 'z') st, INTERVAL '1' SECOND dur")
    import pyarrow as pa

    def schema_of(batches):
        for batch in batches:
            yield pa.RecordBatch.from_pydict(
                {"s": [batch.schema.serialize().to_pybytes().hex()]})

    seen = {pa.ipc.read_schema(pa.py_buffer(bytes.fromhex(row[0])))
            for row in df.mapInArrow(schema_of, "s string").collect()}
    assert seen == {arrow_schema(df.schema)}


@every_spark
def test_stream_format_where_no_arrow_stream_writer_names_foreach_batch(
        spark, options, target, tmp_path):
    if not has_data_source() or has_stream_arrow_writer():
        pytest.skip("only PySpark 4.0 has the data source without an Arrow stream writer")
    txsink.register(spark)
    stream = (spark.readStream.format("rate").load().selectExpr("value AS id")
              .writeStream.format("clickhouse_tx").options(**options).option("table", target)
              .option("checkpointLocation", str(tmp_path / "c")).start())
    time.sleep(1)
    with pytest.raises(Exception, match="foreach_batch"):
        stream.processAllAvailable()
    stream.stop()
