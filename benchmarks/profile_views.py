"""Where the time of a staged materialized view goes: every statement of one epoch, timed.

A driver-side profile, without Spark: the sink's own functions run in this process —
``txsink.core.plan.plan_write`` (check the target, discover its views, open the sink),
``branch.write_branch`` once per branch (one after another, not in parallel as Spark's
tasks run) and ``driver.commit_epoch`` — and for ``clickhouse_plain`` its task body,
``plain.insert_directly``, once per branch. The same four variants as
``bench_views.py`` (tx and plain, into a target with one rollup view and without),
turned each round, on the same rows (``sinkbench/breakdown.py``'s Arrow batches: 1M rows
in 2 branches over 4 days). Every ClickHouse statement (``ClickHouseClient``) and the
coordinator's main calls are timed and attributed to the phase they ran in (plan, task,
commit) and to their purpose (the client's name for the statement, table names elided).

Prints each variant's median phase times, then what ``tx`` with the view ran beyond ``tx``
without it: the extra statements per epoch and their extra milliseconds (medians over
rounds), and the inserts' times per round. ``zk: commit`` contains the publish
statements listed beside it (they run inside the coordinator's commit).

Usage: python benchmarks/profile_views.py [--url http://127.0.0.1:8123] [--rounds 10] [--rows N]
"""

from __future__ import annotations

import argparse
import collections
import re
import statistics
import time

from bench_views import JOB_VARIANTS, create_tree
from pyspark.sql.types import (
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)
from sinkbench.breakdown import EpochShape, _branch_batches
from sinkbench.environment import Scratch, load
from sinkbench.rounds import turned

from coordinator import Coordinator
from server_ext.client import ClickHouseClient
from txsink.core import driver
from txsink.core.attempt import write_branch
from txsink.core.plan import plan_write
from txsink.options import parse_options
from txsink.spark.plain import insert_directly

SCHEMA = StructType([StructField("id", LongType()), StructField("name", StringType()),
                     StructField("score", DoubleType()), StructField("ts", TimestampType())])
COLUMNS = ("id", "name", "score", "ts")
SQL_METHODS = ("execute", "query_rows", "query_value", "insert")
ZK_METHODS = ("allocate_epoch", "begin", "register_branch", "prepare_branch", "branches",
              "commit", "record_metrics", "is_committed", "fence")


class Recorder:
    """(variant, round, phase, what, ms) of every timed call while a variant runs."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, str, str, float]] = []
        self.where: tuple[str, int, str] | None = None

    def wrap(self, owner, name: str, label) -> None:
        original = getattr(owner, name)

        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                if self.where is not None:
                    self.calls.append((*self.where, label(name, kwargs),
                                       (time.perf_counter() - started) * 1000))
        setattr(owner, name, timed)

    def install(self) -> None:
        for name in SQL_METHODS:
            self.wrap(ClickHouseClient, name,
                      lambda n, kw: f"{n}: {_elided(kw.get('purpose', '?'))}")
        for name in ZK_METHODS:
            if hasattr(Coordinator, name):
                self.wrap(Coordinator, name, lambda n, kw: f"zk: {n}")

    def per_round(self, variant: str, phase: str, what: str) -> dict[int, list[float]]:
        found: dict[int, list[float]] = collections.defaultdict(list)
        for v, number, p, w, ms in self.calls:
            if v == variant and p == phase and w == what and number:
                found[number].append(ms)
        return found


def _elided(purpose: str) -> str:
    purpose = re.sub(r"`?\w*txs_[\w-]*`?", "<staging>", purpose)
    purpose = re.sub(r"`?bench_sink_\w+`?\.`?\w+`?", "<table>", purpose)
    return re.sub(r"\d+", "N", purpose)[:70]


def one_epoch(recorder: Recorder, scratch: Scratch, variant: str, number: int,
              batches: list[list]) -> dict[str, float]:
    sink, shape = variant.split("_")
    table = scratch.table(variant)
    create_tree(scratch.url, table, 1 if shape == "view" else 0)  # untimed
    raw = {"url": scratch.url, "table": table, "zookeeper": scratch.zookeeper,
           "zk_root": scratch.zk_root, "sink_id": f"profile-{variant}"}
    phases: dict[str, float] = {}

    def phase(name: str, run) -> object:
        recorder.where = (variant, number, name)
        started = time.perf_counter()
        try:
            return run()
        finally:
            phases[name] = (time.perf_counter() - started) * 1000
            recorder.where = None

    if sink == "tx":
        plan = phase("plan", lambda: plan_write(raw, SCHEMA, False, streaming=False))
        messages = phase("task", lambda: [write_branch(plan, plan.epoch, iter(b))
                                          for b in batches])
        phase("commit", lambda: driver.commit_epoch(plan, plan.epoch, messages))
    else:
        options = parse_options(raw)
        phase("task", lambda: [insert_directly(options, COLUMNS, iter(b)) for b in batches])
    phases["total"] = sum(phases.values())
    return phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8123")
    parser.add_argument("--zookeeper", default="127.0.0.1:2181")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows per epoch")
    args = parser.parse_args()
    recorder = Recorder()
    recorder.install()
    batches = _branch_batches(EpochShape(2, 4, args.rows))
    scratch = Scratch.create(args.url, args.zookeeper)
    times: dict[str, list[dict]] = collections.defaultdict(list)
    loads = []
    try:
        for number in range(args.rounds + 1):  # round 0 warms up
            for variant in turned(JOB_VARIANTS, number):
                phases = one_epoch(recorder, scratch, variant, number, batches)
                if number:
                    times[variant].append(phases)
            loads.append(load())
    finally:
        scratch.remove()
    print(f"{args.url}, {args.rounds} rounds, load {min(loads):.1f}–{max(loads):.1f}\n"
          "median ms per phase (tasks one after another):")
    for variant in JOB_VARIANTS:
        rows = times[variant]
        print(f"  {variant:<13}" + "  ".join(
            f"{k} {statistics.median(r[k] for r in rows):.0f}" for k in rows[0]))
    print("\ntx_noview, every call per epoch (medians over rounds): phase, what, calls, ms")
    for phase, what in sorted({(p, w) for v, _, p, w, _ in recorder.calls
                               if v == "tx_noview"}):
        calls = recorder.per_round("tx_noview", phase, what)
        if not calls:  # the warm-up round's only
            continue
        print(f"  {phase:<7}{what:<72}{statistics.median(len(c) for c in calls.values()):5.0f}"
              f"{statistics.median(sum(c) for c in calls.values()):9.1f}")
    print("\ntx_view beyond tx_noview, per epoch (medians over rounds): "
          "phase, what, extra calls, extra ms")
    keys = sorted({(p, w) for v, _, p, w, _ in recorder.calls if v.startswith("tx")})
    totals: collections.Counter = collections.Counter()
    for phase, what in keys:
        view, none = (recorder.per_round(v, phase, what) for v in ("tx_view", "tx_noview"))
        count = (statistics.median(len(c) for c in view.values()) if view else 0) - (
            statistics.median(len(c) for c in none.values()) if none else 0)
        ms = (statistics.median(sum(c) for c in view.values()) if view else 0.0) - (
            statistics.median(sum(c) for c in none.values()) if none else 0.0)
        if count or abs(ms) > 3:
            print(f"  {phase:<7}{what:<72}{count:+5.0f}{ms:+9.1f}")
        if not what.startswith("zk: commit"):
            totals[phase] += ms
    print("  sum per phase (zk: commit left out):",
          {k: round(v, 1) for k, v in totals.items()})
    print("\ninserts, ms per round (both branches):")
    for variant in JOB_VARIANTS:
        per = collections.defaultdict(float)
        for v, number, _, what, ms in recorder.calls:
            if v == variant and what.startswith("insert:") and number:
                per[number] += ms
        print(f"  {variant:<13}{[round(per[n]) for n in sorted(per)]} "
              f"median {statistics.median(per.values()):.0f}")


if __name__ == "__main__":
    main()
