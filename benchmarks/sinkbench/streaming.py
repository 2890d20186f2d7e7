"""A fixed streaming workload vs trigger interval: total time and visibility latency.

Alibaba's third experiment, for Spark. Spark's ``rate`` source emits ``rate`` rows per
second, each with its event time (the instant the source says it arrived; ids grow with
it). Each sink in turn writes the stream with ``processingTime`` triggers of several
intervals. Once the query has finished its first micro-batch with rows (start-up is no
part of a steady state), the workload is fixed as the ids of the next ``seconds``
seconds, and a poller queries the target every 100 ms:

- visibility latency of a row = when a reader first sees it − its event time. The mean
  is exact (from ``count`` and ``sum`` of event times). The maximum is that of the
  rows that were, at some poll, the lowest id not yet visible: any row seen later than
  its predecessors is one of them, so that maximum is exact too;
- total time = when the workload's last row became visible − its first row's event time.

Short triggers give low latency until the per-micro-batch cost no longer fits in the
interval; long ones add waiting: total time falls, then rises, as in Alibaba's
checkpoint-interval figure. For ``tx`` the per-epoch metrics the sink records in
ZooKeeper (``Coordinator.xid(epoch).metrics``) are summarised too.
"""

from __future__ import annotations

import math
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kazoo.client import KazooClient

from coordinator import Coordinator
from coordinator.sink_admin import SinkAdmin
from server_ext.sql import qualified_name
from sinkbench import workload
from sinkbench.client_baseline import foreach_batch_function
from sinkbench.environment import Scratch, load, sql
from sinkbench.variants import Sink

SINKS = ("tx", "plain", "client_driver")
#: ``clickhouse_tx`` variants and their ``publish`` option
TX_SINKS = {"tx": "inline", "tx_pipelined": "pipelined"}
POLL_SECONDS = 0.1
WINDOW_LEAD_SECONDS = 1.0
METRIC_KEYS = ("stage_ms", "seal_ms", "commit_ms", "latency_ms")


@dataclass(frozen=True)
class StreamCase:
    sink: str
    trigger_s: float
    rate: int
    seconds: int
    partitions: int | None = None  # repartition every micro-batch into this many tasks

    @property
    def rows(self) -> int:
        return self.rate * self.seconds


@dataclass(frozen=True)
class Window:
    """The workload: ids [first, end); ``start`` is the event time of id ``first``."""

    first: int
    end: int
    start: float


class VisibilityPoller:
    """Polls the target in a thread; turns newly visible rows into latency figures.

    Times are seconds since ``base`` (the same clock as the rows' event times).
    """

    def __init__(self, url: str, table: str, base: float, window: Window) -> None:
        self.url, self.table, self.base, self.window = url, table, base, window
        self.count = 0
        self.done_at: float | None = None
        self.weighted_latency = 0.0
        self.max_latency = 0.0
        self.low = window.first  # the lowest id not yet visible
        self._sum = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def expected(self) -> int:
        return self.window.end - self.window.first

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set() and self.done_at is None:
            try:
                self._poll()
            except Exception:  # noqa: BLE001 - a failed poll is retried at the next tick
                pass
            self._stop.wait(POLL_SECONDS)

    def _ids(self, low: int) -> str:
        return f"id >= {low} AND id < {self.window.end}"

    def _poll(self) -> None:
        sent = time.time()
        answer = sql(self.url, f"SELECT count(), sum(score) FROM {self.table} "
                               f"WHERE {self._ids(self.window.first)}")
        seen = (sent + time.time()) / 2 - self.base
        count, total = answer.split("\t")
        new = int(count) - self.count
        if new <= 0:
            return
        self.weighted_latency += new * seen - (float(total) - self._sum)
        self.count, self._sum = int(count), float(total)
        self._advance_low(seen)
        if self.count >= self.expected:
            self.done_at = seen

    def _advance_low(self, seen: float) -> None:
        event = sql(self.url, f"SELECT score FROM {self.table} WHERE id = {self.low}").strip()
        if not event:
            return  # the lowest missing row is still invisible
        self.max_latency = max(self.max_latency, seen - float(event))
        ids = self._ids(self.low)
        self.low = int(sql(self.url, f"SELECT min(id) + 1 FROM {self.table} WHERE {ids} AND "
                                     f"id + 1 NOT IN (SELECT id FROM {self.table} WHERE {ids})"
                           ).strip())


def _stream(spark, rate: int, base: float, partitions: int | None = None):
    """The rate source as benchmark columns; event time (seconds since ``base``) in score;
    with ``partitions``, every micro-batch is repartitioned into that many tasks."""
    source = (spark.readStream.format("rate").option("rowsPerSecond", rate)
              .option("numPartitions", 2).load())
    frame = source.selectExpr(
        "value AS id", "concat('user-', lpad(cast(value AS string), 15, '0')) AS name",
        f"unix_micros(timestamp) / 1e6 - {base} AS score", "timestamp AS ts")
    return frame.repartition(partitions) if partitions else frame


def _start(frame, case: StreamCase, sink: Sink, checkpoint: str):
    writer = (frame.writeStream.option("checkpointLocation", checkpoint)
              .trigger(processingTime=f"{case.trigger_s} seconds"))
    if case.sink in TX_SINKS:
        writer = (writer.format("clickhouse_tx").options(**sink.tx_options())
                  .option("publish", TX_SINKS[case.sink]))
    elif case.sink == "plain":
        writer = writer.format("clickhouse_plain").options(**sink.options())
    else:
        shape = case.sink.removeprefix("client_")
        writer = writer.foreachBatch(foreach_batch_function(shape, sink.client_target()))
    return writer.outputMode("append").start()


def _window_after_warm_up(query, table: str, url: str, case: StreamCase, base: float,
                          deadline: float) -> Window:
    """Wait for the first micro-batch with rows, then fix the workload's ids.

    The rate source gives id ``v`` the event time ``start + v / rate``; ``start`` is read
    back from the first visible row.
    """
    while not any(p.numInputRows for p in query.recentProgress):
        if time.time() > deadline or not query.isActive:
            raise RuntimeError(f"no micro-batch with rows before the deadline: "
                               f"{query.exception()}")
        time.sleep(0.2)
    first_id, first_event = sql(url, f"SELECT id, score FROM {table} ORDER BY id LIMIT 1"
                                ).split("\t")
    origin = float(first_event) - int(first_id) / case.rate
    begin = time.time() - base + WINDOW_LEAD_SECONDS
    first = math.ceil((begin - origin) * case.rate)
    return Window(first, first + case.rows, origin + first / case.rate)


def run_case(spark, scratch: Scratch, case: StreamCase, log: Callable[[str], None]) -> dict:
    sink = Sink(scratch.url, scratch.zookeeper, scratch.table("stream"), scratch.zk_root,
                f"stream-{case.sink}-{case.trigger_s:g}s-{time.time_ns()}")
    workload.create_target(sink.url, sink.table)
    table = qualified_name(*sink.table.split(".", 1))
    checkpoint = tempfile.mkdtemp(prefix="txsink-bench-ckpt-")
    base = float(int(time.time()))
    load_start, started = load(), time.time()
    deadline = started + 120 + 3 * case.trigger_s + case.seconds
    query = _start(_stream(spark, case.rate, base, case.partitions), case, sink, checkpoint)
    poller = None
    try:
        window = _window_after_warm_up(query, table, sink.url, case, base, deadline)
        poller = VisibilityPoller(sink.url, table, base, window)
        poller.start()
        while poller.done_at is None and time.time() < deadline and query.isActive:
            time.sleep(0.2)
        error = None if poller.done_at is not None else (
            f"{poller.count}/{case.rows} rows visible; query error: {query.exception()}")
    finally:
        if poller is not None:
            poller.stop()
        progress = list(query.recentProgress)
        _stop_between_batches(query, case.trigger_s)
        shutil.rmtree(checkpoint, ignore_errors=True)
    result = {
        "sink": case.sink, "trigger_s": case.trigger_s, "rate": case.rate,
        "partitions": case.partitions,
        "seconds": case.seconds, "rows": case.rows, "visible_rows": poller.count,
        "total_s": _round(poller.done_at - window.start if poller.done_at else None),
        "latency_mean_s": _round(poller.weighted_latency / poller.count
                                 if poller.count else None),
        "latency_max_s": _round(poller.max_latency),
        **_progress(progress, window, case.rate), "load_start": load_start,
        "load_end": load(), "error": error,
    }
    if case.sink in TX_SINKS:
        result["epoch_metrics"] = _epoch_metrics(scratch, sink, base + window.start,
                                                 base + (poller.done_at or time.time()))
    log(f"  streaming {case.sink:<14} trigger {case.trigger_s:>4g} s: total "
        f"{result['total_s']} s, latency mean {result['latency_mean_s']} s max "
        f"{result['latency_max_s']} s, {result['micro_batches']} micro-batches, load "
        f"{load_start:.1f}->{result['load_end']:.1f}" + (f"  ERROR {error}" if error else ""))
    return result


def _stop_between_batches(query, trigger_s: float) -> None:
    """Stop when no micro-batch is running: stopping one mid-way makes Spark abort it
    noisily (the rows were counted already; the abort is harmless, the noise is not)."""
    deadline = time.time() + trigger_s + 10
    while query.isActive and query.status.get("isTriggerActive") and time.time() < deadline:
        time.sleep(0.05)
    query.stop()


def _progress(progress: list, window: Window, rate: int) -> dict:
    """Spark's own durations of the micro-batches that read the workload's seconds.

    The rate source's offsets are whole seconds since the query started.
    """
    low, high = window.first / rate, window.end / rate
    busy = [p for p in progress if p.numInputRows and _overlaps(p, low, high)]
    def median(key: str) -> float | None:
        values = [p.durationMs.get(key) for p in busy if p.durationMs.get(key) is not None]
        return round(statistics.median(values), 1) if values else None
    return {"micro_batches": len(busy),
            "trigger_ms_median": median("triggerExecution"),
            "add_batch_ms_median": median("addBatch")}


def _overlaps(progress, low: float, high: float) -> bool:
    try:
        source = progress.sources[0]
        start, end = int(source.startOffset or 0), int(source.endOffset)
    except (IndexError, TypeError, ValueError):
        return True  # offsets not in the expected form: count the batch
    return start < high and end > low


def _epoch_metrics(scratch: Scratch, sink: Sink, since: float, until: float) -> dict:
    """Medians of what the sink recorded for the epochs committed during the workload."""
    client = KazooClient(hosts=scratch.zookeeper)
    client.start(timeout=15)
    try:
        records = SinkAdmin(Coordinator(client, sink.sink_id, root=scratch.zk_root)).xids()
    finally:
        client.stop()
        client.close()
    metrics = [r.metrics for r in records if r.metrics.get("rows")
               and since <= r.metrics.get("committed_at", 0) <= until + 1]
    summary: dict = {"epochs": len(metrics)}
    for key in METRIC_KEYS:
        values = [m[key] for m in metrics if key in m]
        summary[f"{key}_median"] = round(statistics.median(values), 1) if values else None
    return summary


def _round(value: float | None) -> float | None:
    return round(value, 3) if value is not None else None


def trigger_sweep(spark, scratch: Scratch, triggers: Sequence[float], sinks: Sequence[str],
                  rate: int, seconds: int, log: Callable[[str], None]) -> list[dict]:
    """Every sink at every trigger interval, interleaved (sinks inner), one run each."""
    results = []
    for trigger in triggers:
        for sink in sinks:
            try:
                results.append(run_case(spark, scratch, StreamCase(sink, trigger, rate, seconds),
                                        log))
            except Exception as exc:  # noqa: BLE001 - recorded, the sweep goes on
                log(f"  streaming {sink} trigger {trigger:g} s FAILED: {exc!r}"[:400])
                results.append({"sink": sink, "trigger_s": trigger, "error": repr(exc)[:300]})
    return results
