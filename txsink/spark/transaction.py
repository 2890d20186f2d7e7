"""``txsink.transaction()``: several DataFrame writes, one atomic commit.

Each ``tx.write`` runs an ordinary Spark job that stages its rows and *selects* its
winning branches in the shared xid without deciding it: the ``mapInArrow`` job of
``txsink.write`` (``txsink.spark.job``), on every PySpark from 3.5, planned in the
caller's process. Leaving
the ``with`` block normally commits every selected branch of every table as one xid;
an exception inside the block aborts all of them and re-raises. A write that failed
fails the transaction even when the caller caught its exception: the transaction can
then only abort (``TransactionFailed`` at its end, and for any later write or commit),
never commit without that write's rows.

Where it runs: in the caller's process (the driver), on the thread of the ``with`` block:
the xid is begun once at its start, each ``tx.write`` plans there and runs one Spark job
whose tasks are ``txsink.core.attempt``'s (one after another: a transaction is not
shared between threads), and the block's end decides once (``driver.decide``); a commit
repeated after that is a no-op.

Options the server must honour are checked before the xid begins: ``strategy`` against
the ``url`` server here (:func:`txsink.core.plan_checks.check_server_options`), everything that
depends on a table by each ``tx.write`` before it stages anything. A write refused for its
table raises inside the block, which aborts the transaction: nothing of it is published.

Usage::

    with txsink.transaction(spark, url=url, zookeeper=zk, sink_id="nightly") as tx:
        tx.write(facts, "db.facts")
        tx.write(daily, "db.daily", mode="overwrite")
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import DataFrame, SparkSession

from coordinator import XidRecord
from txsink.core import driver
from txsink.core.metrics import EpochMetrics
from txsink.core.payload import from_record, task_branches
from txsink.core.plan import plan_write
from txsink.core.plan_checks import check_server_options
from txsink.core.retention_step import retain_after_commit
from txsink.options import (
    TX_EPOCH,
    TX_GENERATION,
    TX_SINK_ID,
    credentials_from,
    parse_options,
)
from txsink.spark import job

log = logging.getLogger(__name__)


class TransactionFinished(RuntimeError):
    """A write into, or a commit of, a transaction that has been committed or aborted
    already: its xid is decided, so what it would stage could never become visible."""


class TransactionFailed(RuntimeError):
    """A write of the transaction failed: the transaction is aborted, nothing of it is
    visible, even if the caller caught the write's exception inside the block."""


class Transaction:
    """One xid spanning several writes; created by :func:`transaction`.

    ``write`` may be called any number of times until the transaction commits or aborts
    (leaving the ``with`` block does either); after that it raises
    :class:`TransactionFinished`. ``commit`` repeated after it succeeded does nothing.
    """

    def __init__(self, spark: SparkSession, options: dict[str, str], sink_id: str) -> None:
        self.spark = spark
        self.options = options
        self.sink_id = sink_id
        parsed = parse_options({**options, TX_SINK_ID: sink_id}, require_table=False)
        check_server_options(parsed)  # before the sink is fenced and the xid begun
        self._parsed = parsed
        self.tables: list[str] = []
        # watched by this process's session: a caller killed before the decision leaves
        # an xid that txsink recover / gc roll back (coordinator/protocol/liveness.py)
        opened = driver.open_xid(parsed, sink_id, hold="transaction")
        self.coord, self.generation = opened.coord, opened.generation
        #: None when the sink's txn_version covers this transaction's: nothing is written
        self.epoch = opened.epoch
        self.covered_by_txn = opened.covered_by_txn
        self.finished: str | None = None  # "committing", "committed" or "aborted"
        self.failed: str = ""  # the first write that failed: the transaction only aborts

    def _require_open(self, action: str) -> None:
        if self.finished is not None:
            raise TransactionFinished(
                f"transaction {self.sink_id}/{self.epoch} is {self.finished}: {action} must "
                "come inside its `with` block, before it commits; open a new transaction "
                "for more writes")

    def write(self, df: DataFrame, table: str, mode: str = "append") -> None:
        """Stage ``df`` for ``table``; visible only when the whole transaction commits."""
        if mode not in ("append", "overwrite"):
            raise ValueError(f"mode must be append or overwrite, got {mode!r}")
        self._require_open("tx.write")
        self._require_no_failure("tx.write")
        if self.epoch is None:
            return
        try:
            raw = job.job_options(table, {**self.options, TX_SINK_ID: self.sink_id,
                                          TX_EPOCH: self.epoch,
                                          TX_GENERATION: self.generation}, internal=True)
            plan = plan_write(raw, df.schema, job.overwrite_of(mode), streaming=False)
            job.run_epoch(df, plan, self.epoch)
        except BaseException as exc:
            self.failed = f"its write to {table} failed ({type(exc).__name__})"
            raise
        self.tables.append(table)

    def _require_no_failure(self, action: str) -> None:
        """After a failed write the transaction can only abort: ``action`` aborts it."""
        if self.failed:
            self.abort()
            raise TransactionFailed(
                f"transaction {self.sink_id}/{self.epoch}: {self.failed}, so {action} "
                "aborted it and nothing of it is visible; run the transaction again")

    def commit(self) -> None:
        if self.finished == "committed":
            return
        if self.finished == "aborted":
            self._require_open("tx.commit")
        self._require_no_failure("its commit")
        self.finished = "committing"  # from here on a write could not be in the decision
        if self.epoch is None:
            driver.log_covered(self.sink_id, self._parsed.transaction.txn_version,
                               self.covered_by_txn)
            self.finished = "committed"
            return
        started = time.time()
        try:
            with driver.publisher_for(self._parsed, self.coord) as publisher:
                final = driver.decide(self.coord, self.epoch, self.generation, None, publisher,
                                      self._parsed.transaction.txn_version)
        finally:
            self.coord.release(self.epoch)
        driver.batch_committed(self._parsed, self.sink_id, self.generation)
        self.finished = "committed"
        metrics = self._metrics(self.epoch, final, started)
        self.coord.record_metrics(self.epoch, metrics.to_dict())
        log.info("txsink sink=%s epoch=%d committed tables=%s rows=%d branches=%d "
                 "commit_ms=%.0f cleanup_ms=%.0f latency_ms=%.0f", self.sink_id, self.epoch,
                 ",".join(self.tables), metrics.rows, metrics.branches,
                 metrics.commit_ms, metrics.cleanup_ms, metrics.latency_ms)
        retain_after_commit(self._parsed, self.coord)  # after Committed, bounded

    def _metrics(self, epoch: int, final: XidRecord, started: float) -> EpochMetrics:
        """The epoch's figures, as a batch job records them (``driver.epoch_metrics``):
        the writes' messages stayed in their own Spark jobs, so rows and branches come
        from the winners' records, and latency runs from the xid's begin."""
        winners = [from_record(b.manifest)
                   for b in self.coord.branches(epoch, final.winners)]
        return EpochMetrics.timed(
            started, final.updated, final.created,
            rows=sum(p.rows for p in winners if p is not None),
            branches=sum(task_branches(p) for p in winners if p is not None),
            tables=len(self.tables))

    def abort(self) -> None:
        if self.finished == "committed":  # an exception after tx.commit() in the block
            log.warning("txsink sink=%s epoch=%s committed already: not aborted",
                        self.sink_id, self.epoch)
            return
        if self.finished == "aborted":
            return
        self.finished = "aborted"
        if self.epoch is None:
            return
        try:
            with driver.publisher_for(self._parsed, self.coord) as publisher:
                self.coord.abort(self.epoch, self.generation, rollback=publisher.rollback)
        finally:
            self.coord.release(self.epoch)
        log.warning("txsink sink=%s epoch=%d aborted", self.sink_id, self.epoch)


@contextmanager
def transaction(spark: SparkSession, *, url: str, sink_id: str, zookeeper: str | None = None,
                **options: str) -> Iterator[Transaction]:
    """Group DataFrame writes into one xid: all become visible together, or none.

    ``zookeeper`` names the coordinator's ensemble; with ``coordinator="keepermap"`` there
    is none (the records live in ClickHouse: docs/usage.md).

    With ``txn_version="N"`` (see docs/usage.md) a transaction whose version the sink
    has committed already writes nothing: its ``write`` calls return at once.

    Credentials from ``TXSINK_CLICKHOUSE_USER`` / ``TXSINK_CLICKHOUSE_PASSWORD`` are read
    here, in the caller's process, and passed to every write as options: Spark's workers
    only see the environment the session started with.
    """
    store = {"zookeeper": zookeeper} if zookeeper else {}  # none: coordinator=keepermap
    opts = {"url": url, **store, **credentials_from(os.environ),
            **{k: str(v) for k, v in options.items()}}
    tx = Transaction(spark, opts, sink_id)
    try:
        yield tx
    except BaseException:
        tx.abort()
        raise
    tx.commit()
