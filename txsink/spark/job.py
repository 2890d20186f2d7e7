"""The ways in through ``mapInArrow``: ``txsink.write``, ``txsink.foreach_batch`` and the
writes of ``txsink.transaction``, on every PySpark from 3.5.

Who runs what. The caller's process (Spark's driver) plans the write
(:func:`txsink.core.plan.plan_write`: every check, the target created or evolved, the
sink fenced and the xid begun), then runs ONE Spark job, ``df.mapInArrow(task)
.collect()``. Each task attempt stages its partition's rows
(:func:`txsink.core.attempt.write_branch`) and returns one row: its message as text
(:func:`txsink.core.messages.to_text`). Spark keeps the result of exactly one successful
attempt per partition, so the collected rows are the winners; a failed, retried or
speculative attempt's branch is not among them, and the commit
(:func:`txsink.core.driver.commit_epoch`, which authorises only the messages' branches)
rolls it back. Any exception before the commit returns aborts the xid
(:func:`~txsink.core.driver.abort_epoch`) and is raised again. The result is collected
once: a second action on the same plan would run the tasks again and stage again.

``txsink.foreach_batch``'s function runs on the driver, on the thread Spark calls it
from, once per micro-batch, and again for a replayed one: its xid (sink, batch id) is
then ``Committed`` and its tasks write nothing.

These forms hand the tasks the same Arrow batches as the data source's Arrow writers (the
JVM converts the rows alike), and were measured no slower (docs/design.md, "The ways in").
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import pyarrow as pa

from txsink.core import driver
from txsink.core.attempt import QUERY_ID_PROPERTY, RUN_ID_PROPERTY, write_branch
from txsink.core.messages import from_text, to_text
from txsink.core.plan import plan_write
from txsink.core.write_plan import WritePlan
from txsink.options import TX_EPOCH, TX_GENERATION, TX_SINK_ID, OptionError, credentials_from
from txsink.options.sink_ids import stream_sink_id_of_query
from txsink.spark.refusal import complete_mode_refused

log = logging.getLogger(__name__)

#: What each task attempt returns: one row, its message (``txsink.core.messages``).
MESSAGE_SCHEMA = "message string"
_MESSAGE_ARROW = pa.schema([pa.field("message", pa.string())])

#: Options only ``txsink.transaction`` sets for its writes.
INTERNAL_OPTIONS = (TX_SINK_ID, TX_EPOCH, TX_GENERATION)

def overwrite_of(mode: str) -> bool:
    if mode not in ("append", "overwrite"):
        raise OptionError(f"mode must be 'append' or 'overwrite', got {mode!r}")
    return mode == "overwrite"


def option_text(value: object) -> str:
    """An option as Spark's ``.option()`` would pass it (``True`` -> ``"true"``)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def job_options(table: str, options: dict[str, object], *, internal: bool = False
                ) -> dict[str, str]:
    """The raw options of one write: ``options`` as text, ``table``, and the credential
    variables of this process (the tasks see only the options, not this environment)."""
    if not internal:
        for name in INTERNAL_OPTIONS:
            if name in options:
                raise OptionError(f"option {name} is txsink.transaction's own; use "
                                  "txsink.transaction(...) to write several tables at once")
    return {**credentials_from(os.environ),
            **{k: option_text(v) for k, v in options.items()}, "table": table}


ArrowTask = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


@dataclass(frozen=True)
class _Renamed:
    """``task`` over batches given back their columns' own names."""

    task: ArrowTask
    names: tuple[str, ...]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return self.task(batch.rename_columns(list(self.names)) for batch in batches)


def collect_arrow(df, task: ArrowTask, schema: str) -> list:
    """``df.mapInArrow(task, schema).collect()`` for any column names.

    ``mapInArrow`` resolves each column by its name, which fails for a name with a
    backtick or a dot in it (INVALID_ATTRIBUTE_NAME_SYNTAX, PySpark 3.5 to 4.3), so the
    job runs on the columns renamed by position, and ``task`` sees its batches under the
    columns' own names (types, nullability and metadata unchanged)."""
    names = tuple(df.columns)
    by_position = df.toDF(*(f"_{i}" for i in range(len(names))))
    return by_position.mapInArrow(_Renamed(task, names), schema).collect()


@dataclass(frozen=True)
class AttemptTask:
    """The function ``mapInArrow`` runs in every task attempt: stage, seal, prepare, and
    return the message as one row."""

    plan: WritePlan
    epoch: int

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        message = write_branch(self.plan, self.epoch, batches)
        yield pa.RecordBatch.from_pydict({"message": [to_text(message)]}, schema=_MESSAGE_ARROW)


def run_epoch(df, plan: WritePlan, epoch: int) -> None:
    """Stage ``df`` in one Spark job and commit (or, in a transaction, select) its winners;
    abort the xid on any exception before that returns."""
    try:
        rows = collect_arrow(df, AttemptTask(plan, epoch), MESSAGE_SCHEMA)
        driver.commit_epoch(plan, epoch, [from_text(row[0]) for row in rows])
    except BaseException:
        driver.abort_epoch(plan, epoch, [])
        raise


def write(df, *, table: str, mode: str = "append", **options: object) -> None:
    """Write ``df`` into ``table`` exactly once (one xid), from any PySpark from 3.5.

    ``mode``: ``append``, or ``overwrite`` (the partitions the rows fall in are replaced,
    as the data source's ``mode("overwrite")``). ``options``: the data source's (``url``,
    ``zookeeper``, ``sink_id``, ``txn_version``, ``coordinator``, ...). With ``sink_id``
    and ``txn_version`` a rerun of a committed version writes nothing, also inside a
    ``foreachBatch`` function (``txn_version=batch_id``).
    """
    overwrite = overwrite_of(mode)
    plan = plan_write(job_options(table, options), df.schema, overwrite, streaming=False)
    if plan.epoch is None:  # covered by the sink's txn_version: write nothing
        driver.log_covered(plan.sink_id, plan.options.transaction.txn_version, plan.covered_by_txn)
        return
    run_epoch(df, plan, plan.epoch)


@dataclass(frozen=True)
class ForeachBatch:
    """``fn(batch_df, batch_id)`` for ``writeStream.foreachBatch``: each micro-batch is
    xid (sink, batch_id), written exactly once; made by :func:`foreach_batch`."""

    table: str
    options: dict[str, str]

    def __call__(self, batch_df, batch_id: int) -> None:
        query_id = foreach_batch_query_id(batch_df)
        if output_mode(query_id) == "Complete":
            raise OptionError(complete_mode_refused("txsink.foreach_batch"))
        raw = dict(self.options)
        raw.setdefault("sink_id", stream_sink_id_of_query(query_id))
        plan = replace(plan_write(raw, batch_df.schema, False, streaming=True),
                       stream_query=query_id)
        run_id = batch_df.sparkSession.sparkContext.getLocalProperty(RUN_ID_PROPERTY)
        if run_id:  # the run's id, as its tasks read it
            plan = driver.begin_micro_batch(plan, int(batch_id), run_id)
        run_epoch(batch_df, plan, int(batch_id))


def foreach_batch(*, table: str, **options: object) -> ForeachBatch:
    """The function to hand ``sdf.writeStream.foreachBatch``: every micro-batch appended
    exactly once, on every PySpark from 3.5 (the same stream record, replay and replaced
    checkpoint refusal as ``writeStream.format("clickhouse_tx")``).

    The sink id: ``sink_id``, else one derived from the streaming query's id (stable
    across restarts from the same checkpoint). Output modes: append and update (each
    batch's changed rows appended); complete mode, which would hand every batch the
    whole result to be appended again, is refused at the first batch
    (:func:`output_mode`).
    """
    if "txn_version" in options:
        raise OptionError("option txn_version is for batch jobs: foreach_batch's "
                          "micro-batches are idempotent by their batch id already")
    raw = job_options(table, options)
    return ForeachBatch(table, raw)


def output_mode(query_id: str) -> str | None:
    """The output mode (``Append``, ``Complete``, ``Update``) of the running streaming
    query ``query_id``, read from its JVM object; None where it cannot be read: a query
    started from another session than the default one, or a Spark that keeps it
    elsewhere. ``foreachBatch`` hands the function a frame of the query's own clone of
    the session, whose query manager lists no query, so the default session is asked
    (measured on PySpark 3.5.9, 4.0.5, 4.1.4, 4.3.0)."""
    from pyspark.sql import SparkSession

    try:
        session = SparkSession._instantiatedSession  # the default; never a new one
        query = session.streams.get(query_id)
        return None if query is None else str(query._jsq.streamingQuery().outputMode())
    except Exception:  # noqa: BLE001 - unknown: the sink appends as in append mode
        log.debug("the output mode of query %s could not be read", query_id, exc_info=True)
        return None


def foreach_batch_query_id(batch_df) -> str:
    """On the driver, the query id of the streaming query whose foreachBatch runs
    ``batch_df``: Spark sets it as a local property of the thread that calls the
    function (its tasks read it with :func:`txsink.core.attempt.task_query_id`; measured on
    PySpark 3.5.9, 4.0.5, 4.1.4, 4.3.0, the same after a restart from the checkpoint)."""
    try:
        query_id = batch_df.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
    except Exception:  # noqa: BLE001 - Spark Connect: no SparkContext
        query_id = None
    if not query_id:
        raise OptionError(
            "txsink.foreach_batch found no streaming query id: it must be the function "
            "given to writeStream.foreachBatch on a classic (not Spark Connect) session. "
            "Elsewhere write each micro-batch with txsink.write(batch_df, table=..., "
            "sink_id=<a name of the stream>, txn_version=batch_id, ...): a replayed "
            "batch then writes nothing. Nothing was written")
    return query_id
