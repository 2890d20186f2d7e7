"""What one epoch costs, step by step: a driver-side harness around the real code.

The sink records per-epoch totals (stage, seal, commit), too coarse to see where the
fixed cost goes. This harness runs the sink's own functions — ``driver.open_sink``,
``branch.write_branch`` once per branch, ``driver.commit_epoch`` — in this process, with
timers wrapped around the coordinator and server_ext calls they make (patched for the
duration of the measurement only). Each step's figure is its *exclusive* time (a nested
probed call is subtracted from its caller), so the steps add up to the epoch:

- ``begin`` — fence + recovery scan (``open_sink``), allocate the epoch, begin the xid;
- ``stage`` — register the branch, describe the target, create the staging table;
- ``insert`` — the data transfer itself (``BranchWriter.write``/``flush``): not overhead;
- ``seal`` — check the row count, read the parts, record the manifest (``Prepared``);
- ``decision`` — the commit's compare-and-set ``Initialized → Committing``;
- ``publish`` — attach each staged partition to the target (ledger writes included);
- ``drop`` — drop the emptied staging tables;
- ``finish`` — mark everything ``Committed`` and record the epoch's metrics;
- ``other`` — what the harness did not attribute (Python, serialisation).

Branches run one after another here; in Spark the task steps (stage, insert, seal) run
on the executor cores in parallel while begin, decision, publish, drop and finish run on
the driver, one branch after another. So two figures: ``overhead_ms``, the sum of every
step but ``insert`` (an upper bound), and ``overhead_2cores_ms``, the driver steps plus
the task steps of ``ceil(branches / 2)`` branches (what a job on 2 cores waits for).
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import server_ext
from coordinator import Coordinator
from coordinator.protocol.transitions import Transitions
from sinkbench import workload
from sinkbench.environment import ARROW_BATCH_ROWS, Scratch, load
from txsink.core import driver
from txsink.core.attempt import write_branch
from txsink.core.write_plan import WritePlan
from txsink.options import parse_options

STEPS = ("begin", "stage", "insert", "seal", "decision", "publish", "drop", "finish",
         "other")
#: Steps a Spark task runs (in parallel on the executor cores); the rest run on the driver.
TASK_STEPS = ("stage", "insert", "seal")
CORES = 2

#: (owner, attribute, step): every call the harness times.
PROBES = (
    (Coordinator, "allocate_epoch", "begin"),
    (Coordinator, "begin", "begin"),
    (Coordinator, "register_branch", "stage"),
    (server_ext, "describe_table", "stage"),
    (server_ext, "detect_capabilities", "stage"),
    (server_ext, "create_staging_table", "stage"),
    (server_ext.BranchWriter, "write", "insert"),
    (server_ext.BranchWriter, "flush", "insert"),
    (server_ext, "seal", "seal"),
    (Coordinator, "prepare_branch", "seal"),
    (Coordinator, "is_committed", "decision"),
    (Transitions, "decide_commit", "decision"),
    (server_ext, "publish", "publish"),
    (server_ext, "rollback", "drop"),
    (Coordinator, "commit", "finish"),
    (Coordinator, "record_metrics", "finish"),
)


class Probe:
    """Exclusive wall time per step of the calls it wraps (nested calls subtracted)."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = dict.fromkeys(STEPS, 0.0)
        self._children: list[float] = []

    def call(self, step: str, function: Callable, *args, **kwargs):
        self._children.append(0.0)
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            elapsed = time.perf_counter() - started
            self.totals[step] += elapsed - self._children.pop()
            if self._children:
                self._children[-1] += elapsed

    def reset(self) -> None:
        self.totals = dict.fromkeys(STEPS, 0.0)

    @contextmanager
    def installed(self) -> Iterator[Probe]:
        """Wrap every ``PROBES`` entry for the duration of the block."""
        originals = [(owner, name, getattr(owner, name)) for owner, name, _ in PROBES]
        for (owner, name, original), (_, _, step) in zip(originals, PROBES, strict=True):
            setattr(owner, name, self._timed(step, original))
        try:
            yield self
        finally:
            for owner, name, original in originals:
                setattr(owner, name, original)

    def _timed(self, step: str, original: Callable) -> Callable:
        @functools.wraps(original)
        def timed(*args, **kwargs):
            return self.call(step, original, *args, **kwargs)
        return timed


@dataclass(frozen=True)
class EpochShape:
    branches: int
    target_partitions: int
    rows: int

    @property
    def label(self) -> str:
        return f"{self.branches} branch(es) x {self.target_partitions} partition(s)"


def _branch_batches(shape: EpochShape) -> list[list]:
    """Each branch's Arrow record batches (built before timing starts)."""
    per_branch = shape.rows // shape.branches
    out = []
    for b in range(shape.branches):
        batch = workload.arrow_rows(b * per_branch, per_branch, shape.target_partitions)
        out.append([batch.slice(i, ARROW_BATCH_ROWS)
                    for i in range(0, batch.num_rows, ARROW_BATCH_ROWS)])
    return out


def one_epoch(probe: Probe, raw_options: dict[str, str], shape: EpochShape,
              batches: list[list]) -> dict[str, float]:
    """One batch-job epoch through the sink's own functions; milliseconds per step."""
    options = parse_options(raw_options)
    client = server_ext.ClickHouseClient(options.connection.url)
    target = server_ext.describe_table(client, options.table)
    strategy = server_ext.choose_strategy(server_ext.detect_capabilities(client), target)
    columns = tuple(c.name for c in target.columns)
    probe.reset()
    started = time.perf_counter()
    coord, generation = probe.call("begin", driver.open_sink, options, options.transaction.sink_id)
    epoch = coord.allocate_epoch()
    coord.begin(epoch, generation)
    plan = WritePlan(options=options, sink_id=options.transaction.sink_id, generation=generation,
                     strategy=strategy, overwrite=False, columns=columns, epoch=epoch)
    messages = [write_branch(plan, epoch, iter(branch)) for branch in batches]
    driver.commit_epoch(plan, epoch, messages)
    total = (time.perf_counter() - started) * 1000
    steps = {step: ms * 1000 for step, ms in probe.totals.items()}
    steps["other"] = max(0.0, total - sum(steps.values()))
    landed = sum(m.rows for m in messages)
    if landed != shape.rows // shape.branches * shape.branches:
        raise RuntimeError(f"harness epoch staged {landed} rows")
    waves = math.ceil(shape.branches / CORES) / shape.branches
    task_overhead = sum(steps[s] for s in TASK_STEPS if s != "insert")
    driver_side = sum(v for s, v in steps.items() if s not in TASK_STEPS)
    return {**steps, "total": total, "overhead": total - steps["insert"],
            "overhead_2cores": driver_side + task_overhead * waves}


def open_stream_ms(raw_options: dict[str, str]) -> float:
    """One ``open_stream`` (Spark calls it twice per micro-batch): the streaming extra."""
    options = parse_options(raw_options)
    started = time.perf_counter()
    driver.open_stream(options, options.transaction.sink_id)
    return (time.perf_counter() - started) * 1000


def run(scratch: Scratch, branch_counts: Sequence[int], partition_counts: Sequence[int],
        rows: int, epochs: int, log: Callable[[str], None]) -> list[dict]:
    """Every shape for ``epochs`` rounds (shapes interleaved) after one warm-up round."""
    shapes = [EpochShape(b, p, rows) for p in partition_counts for b in branch_counts]
    prepared = {}
    for shape in shapes:
        table = scratch.table(f"breakdown_{shape.branches}_{shape.target_partitions}")
        workload.create_target(scratch.url, table)
        options = {"url": scratch.url, "table": table, "zookeeper": scratch.zookeeper,
                   "zk_root": scratch.zk_root,
                   "sink_id": f"breakdown-{shape.branches}-{shape.target_partitions}"}
        prepared[shape] = (options, _branch_batches(shape))
    probe = Probe()
    samples: dict[EpochShape, list[dict]] = {s: [] for s in shapes}
    loads: dict[EpochShape, list[float]] = {s: [] for s in shapes}
    streams: list[float] = []
    with probe.installed():
        for number in range(epochs + 1):
            for shape in shapes:
                options, batches = prepared[shape]
                loads[shape].append(load())
                sample = one_epoch(probe, options, shape, batches)
                if number:
                    samples[shape].append(sample)
            streams.append(open_stream_ms(prepared[shapes[0]][0]))
        log(f"breakdown: {epochs} epochs per shape, load {load():.1f}")
    results = [_summary(shape, samples[shape], loads[shape]) for shape in shapes]
    for row in results:
        row["open_stream_ms"] = round(statistics.median(streams[1:] or streams), 1)
        log(f"  {row['shape']:<30} overhead {row['overhead_ms']:7.1f} ms (on 2 cores "
            f"{row['overhead_2cores_ms']:.1f})  insert "
            f"{row['steps_ms']['insert']:7.1f} ms  " + "  ".join(
                f"{k} {v:.1f}" for k, v in row["steps_ms"].items() if k != "insert"))
    return results


def _summary(shape: EpochShape, samples: list[dict], loads: list[float]) -> dict:
    def median(key: str) -> float:
        return round(statistics.median(s[key] for s in samples), 1)
    return {
        "shape": shape.label, "branches": shape.branches,
        "target_partitions": shape.target_partitions, "rows": shape.rows,
        "epochs": len(samples), "steps_ms": {step: median(step) for step in STEPS},
        "total_ms": median("total"), "overhead_ms": median("overhead"),
        "overhead_2cores_ms": median("overhead_2cores"),
        "overhead_p90_ms": round(sorted(s["overhead"] for s in samples)[
            max(0, int(len(samples) * 0.9) - 1)], 1),
        "load_range": [min(loads), max(loads)],
    }
