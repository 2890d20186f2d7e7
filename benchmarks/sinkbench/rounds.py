"""Interleaved repetitions of write variants, their medians and their ratios.

The machine is shared, so a figure alone says little: load from other processes comes and
goes within seconds. Every experiment therefore runs in rounds, and each round measures
every (case, variant) once, so a burst of load hits all variants alike. The variants'
order turns by one each round (A B C D, B C D A, ...): a write leaves the server busy
for a while after it returns (background merges, its dropped table), and in a fixed
order the same variant would always pay for the same predecessor. A variant is reported
as the median of its rounds and as a ratio to each baseline: the ratio of medians and the
median of per-round ratios (the paired ratio, which cancels load that changed between
rounds).

A measurement that fails (a shared server restarted by someone else's test) is recorded
with its error and left out of the medians; the run goes on.
"""

from __future__ import annotations

import statistics
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from types import ModuleType
from typing import TypeVar

from sinkbench import workload
from sinkbench.client_baseline import NATIVE_PORT
from sinkbench.environment import Scratch, load
from sinkbench.memory import PeakMemory
from sinkbench.variants import VARIANTS, WRITES_TABLE, Sink

T = TypeVar("T")
BASELINES = ("noop", "arrow_noop", "plain", "client_driver", "client_executor",
             "connect_driver", "connect_executor")


@dataclass(frozen=True)
class Case:
    """One configuration of an experiment: how many rows, in how many Spark partitions."""

    rows: int
    partitions: int
    insert_block_rows: int = 1_048_576

    @property
    def key(self) -> str:
        return f"r{self.rows}-p{self.partitions}-b{self.insert_block_rows}"


@dataclass
class Sample:
    """One timed write: wall seconds of ``save()`` and the load around it."""

    seconds: float | None
    load_start: float
    load_end: float
    memory: dict[str, float] = field(default_factory=dict)
    error: str | None = None


class Bench:
    """Runs variants on the same rows in one Spark session, into one scratch database."""

    def __init__(self, spark, scratch: Scratch, jvm: int | None, log: Callable[[str], None],
                 native_port: int = NATIVE_PORT, rows: ModuleType = workload) -> None:
        self.rows = rows  # the rows and their table: ``workload`` or ``wide_rows``
        self.spark = spark
        self.scratch = scratch
        self.jvm = jvm
        self.log = log
        self.native_port = native_port  # clickhouse-driver's port on the scratch's server

    def sink(self, experiment: str, case: Case) -> Sink:
        return Sink(self.scratch.url, self.scratch.zookeeper, self.scratch.table("target"),
                    self.scratch.zk_root, f"{experiment}-{case.key}", case.insert_block_rows,
                    self.native_port)

    def measure(self, experiment: str, case: Case, variant: str) -> Sample:
        sink = self.sink(experiment, case)
        if variant in WRITES_TABLE:
            self.rows.create_target(sink.url, sink.table)  # untimed: no merges left over
        df = self.rows.rows_frame(self.spark, case.rows, case.partitions)
        load_start = load()
        try:
            with PeakMemory(self.jvm) as memory:
                started = time.perf_counter()
                VARIANTS[variant](df, sink)
                seconds = time.perf_counter() - started
            if variant in WRITES_TABLE:
                landed = self.rows.count(sink.url, sink.table)
                if landed != case.rows:
                    raise RuntimeError(f"{variant}: {landed} rows landed, {case.rows} written")
        except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
            self.log(f"  {variant} {case.key} FAILED: {exc!r}"[:400])
            self.log(traceback.format_exc(limit=3))
            return Sample(None, load_start, load(), error=repr(exc)[:300])
        sample = Sample(round(seconds, 4), load_start, load(), memory.peaks)
        self.log(f"  {experiment:<12} {case.key:<26} {variant:<16} {seconds:7.2f} s  "
                 f"{case.rows / seconds / 1e6:6.3f} M rows/s  load {load_start:.1f}"
                 f"->{sample.load_end:.1f}")
        return sample

    def rounds(self, experiment: str, cases: Sequence[Case], variants: Sequence[str],
               rounds: int) -> list[dict]:
        """``rounds`` rounds over every (case, variant); one summary row per pair."""
        samples: dict[tuple[Case, str], list[Sample]] = {
            (c, v): [] for c in cases for v in variants}
        for number in range(rounds):
            self.log(f"{experiment}: round {number + 1}/{rounds}")
            for case in cases:
                for variant in turned(variants, number):
                    samples[(case, variant)].append(self.measure(experiment, case, variant))
        return [summarize(case, variant, samples[(case, variant)],
                          {b: samples[(case, b)] for b in BASELINES if b in variants})
                for case in cases for variant in variants]

    def warm_up(self, variants: Sequence[str]) -> None:
        """First saves of a session pay for worker start-up and imports: not measured."""
        for variant in variants:
            self.measure("warm-up", Case(10_000, 2), variant)


def turned(items: Sequence[T], number: int) -> list[T]:
    """``items`` in round ``number``'s order: turned left by one per round."""
    turn = number % len(items)
    return [*items[turn:], *items[:turn]]


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(case: Case, variant: str, samples: list[Sample],
              baselines: dict[str, list[Sample]]) -> dict:
    """Median seconds and rows/s of a variant, and its ratios to each baseline."""
    seconds = [s.seconds for s in samples if s.seconds]
    median = _median(seconds)
    row: dict = {
        "variant": variant, "rows": case.rows, "partitions": case.partitions,
        "insert_block_rows": case.insert_block_rows,
        "median_s": round(median, 4) if median else None,
        "rows_per_s": round(case.rows / median) if median else None,
        "runs": [asdict(s) for s in samples],
        "load_range": [min(s.load_start for s in samples), max(s.load_end for s in samples)],
        "memory_peak": {k: max(s.memory.get(k, 0.0) for s in samples)
                        for k in ("jvm_mb", "workers_mb", "worker_max_mb", "driver_python_mb")},
        "failures": sum(1 for s in samples if s.seconds is None),
        "ratio": {}, "paired_ratio": {},
    }
    for name, base in baselines.items():
        if name == variant:
            continue
        base_median = _median([s.seconds for s in base if s.seconds])
        if median and base_median:
            row["ratio"][name] = round(base_median / median, 3)  # rows/s over rows/s
        paired = [b.seconds / s.seconds for s, b in zip(samples, base, strict=True)
                  if s.seconds and b.seconds]
        if paired:
            row["paired_ratio"][name] = round(statistics.median(paired), 3)
    return row
