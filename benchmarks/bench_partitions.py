"""Cost vs the number of Spark partitions: ``clickhouse_tx`` against ``clickhouse_plain``.

Issue 14: the cost of exactly-once must not depend on how the user's DataFrame happens to
be partitioned, and a transactional sink that stages anyway should hand ClickHouse fewer
parts than plain inserts. What it measures, on the same rows, side by side in one run:

- **wall time** of one batch job (``save()``, for ``tx``: rows committed and visible) with
  ``clickhouse_plain`` (the at-least-once baseline: the same writer straight into the
  target) and ``clickhouse_tx``, and ``tx ÷ plain``: the median over rounds of the ratio of
  two jobs run seconds apart (paired), and the ratio of the medians;
- **tx commit_ms**: what the driver recorded on the xid (``Coordinator.xid(e).metrics``,
  the same figure as its "committed ... commit_ms=" log line), against the goal
  100 ms + 1 ms per branch; from the xid's history, when within it the decision
  (``Committing``) was written; and ``cleanup_ms``, the time the driver's commit spent
  after the ``Committed`` write dropping the non-winners' staging, where a sink records it
  (``txsink`` logs it instead: its metrics are written with the ``Committed`` record);
- **parts created** in the target by the job, ``tx`` vs ``plain`` (method below);
- the largest znode the sink left under its ZooKeeper subtree (ZooKeeper refuses records
  over 1 MB).

The workload: the rows of ``bench_sink.py`` (id, 20-character name, score, timestamp over
4 days), 200,000 per job, computed by Spark from ``range`` in 2 partitions and
``repartition(N)`` before ``.write`` (N = 2, 20, 200, 1000: a round-robin shuffle, so each
of the N tasks gets ~200,000 / N rows spread over all 4 days); one job = one xid. The
target is a plain ``MergeTree`` partitioned by day, recreated (untimed) before every job.
``spark.sql.shuffle.partitions`` stays at 2 (= cores): ``repartition(N)`` fixes N itself
and adaptive execution does not coalesce an explicit repartition; the benchmark checks
that the xid had N branches.

**Parts created, the method.** 18.16 has no ``system.part_log`` (not configured on the
test server, and the 26.x server has none either), and counting parts before/after
misses parts that merges replaced (26.x removes outdated parts at once:
``old_parts_lifetime`` is 0 there). What both servers do (checked on each): a
``MergeTree`` draws one block number from a table-wide counter, starting at 1, for every
part that *enters* the table — each part of an INSERT, each part an ``ATTACH PARTITION
... FROM`` or ``MOVE PARTITION ... TO TABLE`` brings — while a merge reuses the range of
its sources (``<partition>_<min block>_<max block>_<level>``). In a freshly created target,
``max(max_block_number)`` over its parts is therefore the number of parts that entered it,
whatever merges did meanwhile, and merges need not be stopped (stopping them would be
undone by ``attach_marked``'s own stop/start of the target's merges, and would change
what ``plain`` costs). On 18.16 the count of single-block parts still listed, active or
outdated (``old_parts_lifetime`` 480 s), must agree; the benchmark records both and says
so when they differ. Parts per target partition = parts created ÷ the 4 day partitions.

Servers: the 18.16 server (``--url``, strategy ``attach_marked``: plain MergeTree) and, if
one answers on ``--modern-url`` (26.x from the chdb wheel, ``./run services up
--modern``), the same jobs against it with strategy ``move``; otherwise the run says it
was skipped. Every (partitions, server, variant) runs once per round, variants' order
alternating between rounds; figures are medians. A failed job is recorded with its error
(the Spark error's first lines and the Python exception it carries) and left out of the
medians.

``--trace-commit`` also traces where each ``tx`` commit spends its time, inside Spark's
Python workers (``sinkbench/commit_trace.py``): steps of the commit path, ClickHouse
statements per step, and the INFO lines of ``txsink``, ``server_ext`` and ``coordinator``.
It costs a few microseconds per traced call (at 1000 partitions, ~5,000 statements per
commit: milliseconds against seconds); the JSON says whether a run was traced.

The sink's code is frozen for the run (``sinkbench/snapshot.py``): the program copies
``txsink``, ``server_ext`` and ``coordinator`` at the start and re-executes itself with the
copy first on ``PYTHONPATH``, so Spark's workers cannot pick up edits made to the
working tree meanwhile; the JSON records the revision, the uncommitted files and a digest
of the copy. ``--live-code`` measures the working tree as it changes.

Usage::

    python benchmarks/bench_partitions.py            # 3 rounds, 2/20/200/1000 partitions
    python benchmarks/bench_partitions.py --trace-commit   # the same, commits traced
    python benchmarks/bench_partitions.py --quick    # 1 round, 2/20/200 (results/quick)
    python benchmarks/bench_partitions.py --partitions 200 1000 --rounds 1 --trace-commit

Prints a line per job, the table and the goals; writes ``partitions.json`` into ``--out``
(``benchmarks/results``, ``benchmarks/results/quick`` with ``--quick``) and draws
``partitions.png`` there. Needs ZooKeeper and the 18.16 server of ``./run services up``;
creates its own database on every server it uses and its own ZooKeeper chroot
(``/bench_partitions_<id>``), and removes them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path

import plots
from kazoo.client import KazooClient
from sinkbench import commit_trace, environment, report, snapshot, workload
from sinkbench.environment import load, sql, staging_tables

from coordinator import Coordinator
from coordinator.sink_admin import SinkAdmin
from server_ext.sql import qualified_name, quote_identifier, sql_string
from server_ext.staging import STAGING_DATABASE

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
TRACE_HOOK = HERE / "sinkbench" / "worker_trace"
VARIANTS = ("plain", "tx")
#: Partitions of the generated rows before ``repartition(N)`` (= cores).
SOURCE_PARTITIONS = 2
GOAL_COMMIT_FIXED_MS = 100.0
GOAL_COMMIT_PER_BRANCH_MS = 1.0
GOAL_TX_VS_PLAIN = 1.15
GOAL_RATIO_PARTITIONS = 200
GOAL_WORKS_PARTITIONS = 1000
ZNODE_LIMIT = 1024 * 1024
METRIC_KEYS = ("rows", "branches", "partitions", "stage_ms", "seal_ms", "commit_ms",
               "cleanup_ms", "latency_ms")


def log(message: str) -> None:
    print(message, flush=True)


def goal_commit_ms(branches: int) -> float:
    return GOAL_COMMIT_FIXED_MS + GOAL_COMMIT_PER_BRANCH_MS * branches


@dataclass(frozen=True)
class Plan:
    rows: int = 200_000
    partitions: tuple[int, ...] = (2, 20, 200, 1000)
    rounds: int = 3


#: The smoke run leaves 1000 partitions out: one round of it alone takes ~5 minutes here
#: (``--partitions 2 20 200 1000`` puts it back).
QUICK = Plan(partitions=(2, 20, 200), rounds=1)


@dataclass(frozen=True)
class Server:
    """A ClickHouse server the jobs write to, and the publish strategy used there."""

    name: str
    url: str
    strategy: str
    version: str


@dataclass(frozen=True)
class Scratch:
    """The run's database on every server and its ZooKeeper chroot."""

    servers: tuple[Server, ...]
    zk_hosts: str
    run: str

    @property
    def database(self) -> str:
        return f"bench_partitions_{self.run}"

    @property
    def table(self) -> str:
        return f"{self.database}.target"

    @property
    def chroot(self) -> str:
        return f"/bench_partitions_{self.run}"

    @property
    def zookeeper(self) -> str:
        """The ``zookeeper`` option: the hosts and the run's chroot."""
        return self.zk_hosts + self.chroot

    zk_root = "/txsink"

    def create(self) -> None:
        client = KazooClient(hosts=self.zk_hosts)
        client.start(timeout=15)
        try:
            client.create(self.chroot)
        finally:
            client.stop()
            client.close()
        for server in self.servers:
            sql(server.url, f"CREATE DATABASE {quote_identifier(self.database)}")

    def remove(self, sink_ids: set[str]) -> list[str]:
        """Drop the database everywhere, the staging tables of the run's sinks (returned:
        the sink should have dropped them) and the ZooKeeper chroot."""
        leftovers = []
        for server in self.servers:
            try:
                sql(server.url, f"DROP DATABASE IF EXISTS {quote_identifier(self.database)}")
                for name in staging_tables(server.url, sink_ids):
                    staged = qualified_name(STAGING_DATABASE, name)
                    sql(server.url, f"DROP TABLE IF EXISTS {staged}")
                    leftovers.append(f"{server.name} {name}")
            except Exception as exc:  # noqa: BLE001 - clean up what can be cleaned
                log(f"cleanup on {server.name} failed: {exc!r}")
        environment.delete_zk_root(self.zk_hosts, self.chroot)
        return leftovers


def find_servers(url: str, modern_url: str | None) -> tuple[list[Server], str | None]:
    """The 18.16 server, and the modern one if it answers; the reason it was skipped."""
    servers = [Server("ch18", url, "attach_marked", sql(url, "SELECT version()").strip())]
    if not modern_url:
        return servers, "--no-modern"
    try:
        version = sql(modern_url, "SELECT version()", timeout=5).strip()
    except Exception as exc:  # noqa: BLE001 - not running: skipped, and said so
        return servers, f"no server answered on {modern_url} ({type(exc).__name__})"
    servers.append(Server(f"ch{version.split('.')[0]}", modern_url, "move", version))
    return servers, None


def sink_code() -> dict:
    """The revision and working-tree state of the sink's code when the run started
    (``--live-code``: Spark's Python workers import the sink when they first need it, so
    a run measures the files as they are then, possibly more than one version)."""
    import subprocess

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=HERE.parent, capture_output=True,
                                  text=True, timeout=20).stdout
        except (OSError, subprocess.SubprocessError):
            return ""
    changed = git("status", "--porcelain", "--", "txsink", "server_ext", "coordinator")
    return {"revision": git("rev-parse", "--short", "HEAD").strip(),
            "uncommitted_sink_files": [line[3:] for line in changed.splitlines()]}


def error_text(exc: BaseException) -> str:
    """A Spark error's useful part: its first line and the Python exception it carries."""
    text = str(exc)
    lines = [line for line in text.splitlines() if line.strip()]
    carried = [line.strip() for line in lines
               if ("Error" in line or "Exception" in line or "error" in line)
               and not line.lstrip().startswith(("at ", "File "))]
    picked = list(dict.fromkeys([*lines[:2], *carried[-6:]]))
    return f"{type(exc).__name__}: " + " | ".join(picked)[:1500]


class PartitionBench:
    """Measures ``plain`` and ``tx`` jobs in one Spark session."""

    def __init__(self, spark, scratch: Scratch, plan: Plan, trace_dir: Path | None,
                 checkpoint: Path | None = None) -> None:
        self.spark = spark
        self.scratch = scratch
        self.plan = plan
        self.trace_dir = trace_dir
        self.checkpoint = checkpoint
        self.sink_ids: set[str] = set()

    def options(self, server: Server, variant: str, sink_id: str) -> dict[str, str]:
        options = {"url": server.url, "table": self.scratch.table}
        if variant == "tx":
            self.sink_ids.add(sink_id)
            options.update(zookeeper=self.scratch.zookeeper, zk_root=self.scratch.zk_root,
                           sink_id=sink_id, strategy=server.strategy)
        return options

    def measure(self, server: Server, variant: str, partitions: int, label: str,
                rows: int | None = None) -> dict:
        rows = rows or self.plan.rows
        sink_id = f"p{partitions}-{server.name}-{label}-{uuid.uuid4().hex[:6]}"
        url, table = server.url, self.scratch.table
        workload.create_target(url, table)  # untimed; fresh block numbers
        df = workload.rows_frame(self.spark, rows, SOURCE_PARTITIONS).repartition(partitions)
        sample: dict = {"round": label, "seconds": None, "load_start": load(), "error": None}
        try:
            started = time.perf_counter()
            (df.write.format(f"clickhouse_{variant}")
             .options(**self.options(server, variant, sink_id)).mode("append").save())
            sample["seconds"] = round(time.perf_counter() - started, 4)
            sample["load_end"] = load()
            landed = workload.count(url, table)
            if landed != rows:
                raise RuntimeError(f"{landed} rows landed, {rows} written")
            sample["parts"] = parts_created(url, table)
            if variant == "tx":
                sample.update(self.tx_details(server, sink_id, partitions))
        except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
            sample["load_end"] = load()
            sample["error"] = error_text(exc)
            sample["traceback"] = traceback.format_exc(limit=6)[-3000:]
            if variant == "tx":
                sample["znodes"] = self.largest_znode(sink_id)
                try:
                    sample["staging_left"] = staging_tables(url, {sink_id})
                except Exception as again:  # noqa: BLE001 - the server may be the problem
                    sample["staging_left"] = repr(again)[:200]
        finally:
            sql(url, f"DROP TABLE IF EXISTS {table}")
        self.report(server, variant, partitions, label, sample)
        return sample

    def tx_details(self, server: Server, sink_id: str, partitions: int) -> dict:
        details: dict = {"sink_id": sink_id, **self.xid_metrics(sink_id),
                         "znodes": self.largest_znode(sink_id),
                         "staging_left": staging_tables(server.url, {sink_id})}
        if details.get("branches") != partitions:
            details["warning"] = (f"{details.get('branches')} branches for {partitions} "
                                  "Spark partitions")
        if self.trace_dir is not None:
            details["trace"] = commit_trace.commit_breakdown(self.trace_dir, sink_id)
        return details

    def _zk(self) -> KazooClient:
        client = KazooClient(hosts=self.scratch.zookeeper)
        client.start(timeout=15)
        return client

    def xid_metrics(self, sink_id: str) -> dict:
        """The metrics the sink recorded on its one xid, and the commit split at the
        decision (from the xid's history)."""
        client = self._zk()
        try:
            records = SinkAdmin(Coordinator(client, sink_id, root=self.scratch.zk_root)).xids()
        finally:
            client.stop()
            client.close()
        done = [r for r in records if r.metrics.get("commit_ms") is not None]
        if len(done) != 1:
            return {"xids": len(records), "error_metrics": "no single committed xid"}
        record = done[0]
        metrics = {k: record.metrics.get(k) for k in METRIC_KEYS}
        # ``committed_at`` is when the driver's commit returned: after the clean-up of
        # the non-winners where the sink records a ``cleanup_ms``.
        spent = float(metrics["commit_ms"]) + float(metrics.get("cleanup_ms") or 0.0)
        began = record.metrics["committed_at"] - spent / 1000
        at = {h.get("state"): h.get("at") for h in record.history}
        split = {}
        if at.get("Committing"):
            split["until_decision_ms"] = round((at["Committing"] - began) * 1000, 1)
        if at.get("Committing") and at.get("Committed"):
            split["decision_to_committed_ms"] = round(
                (at["Committed"] - at["Committing"]) * 1000, 1)
        return {**metrics, **split, "winners": len(record.winners), "xid_state": record.state.value}

    def largest_znode(self, sink_id: str) -> dict:
        """The largest record under the sink's subtree (ZooKeeper's limit is 1 MB)."""
        client = self._zk()
        try:
            root = f"{self.scratch.zk_root}/sinks/{sink_id}"
            largest, path, count = 0, "", 0
            level = [root] if client.exists(root) else []
            while level:
                gets = [(p, client.get_async(p), client.get_children_async(p)) for p in level]
                level = []
                for node, data, children in gets:
                    size = len(data.get()[0] or b"")
                    count += 1
                    if size > largest:
                        largest, path = size, node
                    level += [f"{node}/{c}" for c in children.get()]
            return {"largest_bytes": largest, "path": path.removeprefix(root), "nodes": count}
        except Exception as exc:  # noqa: BLE001 - a figure, not a check of the sink
            return {"error": repr(exc)[:200]}
        finally:
            client.stop()
            client.close()

    def report(self, server: Server, variant: str, partitions: int, label: str,
               sample: dict) -> None:
        head = f"  {label:<7} {server.name} p{partitions:<5} {variant:<5}"
        loads = f"load {sample['load_start']:.1f}->{sample.get('load_end', 0):.1f}"
        if sample["error"]:
            log(f"{head} FAILED after {loads}: {sample['error'][:600]}")
            return
        parts = sample["parts"]
        line = (f"{head} {sample['seconds']:7.2f} s  parts created {parts['created']:>5} "
                f"(active {parts['active']:>4})")
        if variant == "tx":
            goal = goal_commit_ms(sample.get("branches") or partitions)
            cleanup = sample.get("cleanup_ms")
            line += (f"  commit {sample.get('commit_ms', 0):7.0f} ms (goal {goal:.0f}; "
                     f"decided at {sample.get('until_decision_ms', 0):.0f}"
                     + (f"; then clean-up {cleanup:.0f}" if cleanup is not None else "")
                     + f")  branches "
                     f"{sample.get('branches')}  largest znode "
                     f"{sample['znodes'].get('largest_bytes', 0) / 1024:.0f} kB")
            if sample.get("staging_left"):
                line += f"  STAGING LEFT {len(sample['staging_left'])}"
            if sample.get("warning"):
                line += f"  WARNING {sample['warning']}"
        log(f"{line}  {loads}")

    def warm_up(self, servers: list[Server]) -> None:
        """Worker start-up and imports, not measured."""
        for server in servers:
            for variant in VARIANTS:
                self.measure(server, variant, 2, "warm-up", rows=10_000)

    def rounds(self, servers: list[Server]) -> dict[tuple[str, int, str], list[dict]]:
        samples: dict[tuple[str, int, str], list[dict]] = {
            (s.name, p, v): [] for s in servers for p in self.plan.partitions for v in VARIANTS}
        for number in range(self.plan.rounds):
            log(f"round {number + 1}/{self.plan.rounds} (load {load():.1f})")
            order = VARIANTS if number % 2 == 0 else tuple(reversed(VARIANTS))
            for partitions in self.plan.partitions:
                for server in servers:
                    for variant in order:
                        samples[(server.name, partitions, variant)].append(
                            self.measure(server, variant, partitions, f"r{number + 1}"))
                        self.save_checkpoint(samples)
        return samples

    def save_checkpoint(self, samples: dict[tuple[str, int, str], list[dict]]) -> None:
        """Every job so far, in case the run is killed (the shared machine's other users
        have done so); removed once the results are written."""
        if self.checkpoint is None:
            return
        raw = {f"{s} p{p} {v}": runs for (s, p, v), runs in samples.items() if runs}
        self.checkpoint.parent.mkdir(parents=True, exist_ok=True)
        self.checkpoint.write_text(json.dumps(raw, indent=1) + "\n")


def parts_created(url: str, table: str) -> dict:
    """Parts that entered the (freshly created) target: see the module docstring."""
    database, name = table.split(".", 1)
    where = f"database = {sql_string(database)} AND table = {sql_string(name)}"
    created, single, active, partitions = (int(v) for v in sql(
        url, f"SELECT max(max_block_number), countIf(min_block_number = max_block_number), "
             f"countIf(active), uniqExactIf(partition_id, active) FROM system.parts "
             f"WHERE {where}").split())
    busiest = sql(url, f"SELECT max(c) FROM (SELECT count() AS c FROM system.parts WHERE "
                       f"{where} AND active GROUP BY partition_id)").strip()
    return {"created": created, "single_block_parts_listed": single, "active": active,
            "target_partitions": partitions, "active_max_per_partition": int(busiest or 0)}


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def summarize(servers: list[Server], plan: Plan,
              samples: dict[tuple[str, int, str], list[dict]]) -> list[dict]:
    rows = []
    for server in servers:
        for partitions in plan.partitions:
            plain = samples[(server.name, partitions, "plain")]
            tx = samples[(server.name, partitions, "tx")]
            ok_plain = [s for s in plain if not s["error"]]
            ok_tx = [s for s in tx if not s["error"]]
            paired = [t["seconds"] / p["seconds"] for t, p in zip(tx, plain, strict=True)
                      if not t["error"] and not p["error"]]
            plain_s = _median([s["seconds"] for s in ok_plain])
            tx_s = _median([s["seconds"] for s in ok_tx])
            branches = _median([s["branches"] for s in ok_tx if s.get("branches")])
            commit = _median([s["commit_ms"] for s in ok_tx if s.get("commit_ms") is not None])
            parts_plain = _median([s["parts"]["created"] for s in ok_plain])
            parts_tx = _median([s["parts"]["created"] for s in ok_tx])
            target_partitions = max((s["parts"]["target_partitions"] for s in ok_plain + ok_tx),
                                    default=None)
            everything = plain + tx
            row = {
                "server": server.name, "version": server.version, "strategy": server.strategy,
                "rows": plan.rows, "partitions": partitions,
                "plain_s": plain_s, "tx_s": tx_s,
                "tx_over_plain_paired": _median(paired),
                "tx_over_plain_medians": round(tx_s / plain_s, 4) if tx_s and plain_s else None,
                "tx_over_plain_rounds": [round(r, 4) for r in paired],
                "branches": branches,
                "commit_ms": commit,
                "commit_ms_rounds": [s.get("commit_ms") for s in ok_tx],
                "goal_commit_ms": goal_commit_ms(branches or partitions),
                "until_decision_ms": _median([s["until_decision_ms"] for s in ok_tx
                                              if s.get("until_decision_ms") is not None]),
                "cleanup_ms": _median([s["cleanup_ms"] for s in ok_tx
                                       if s.get("cleanup_ms") is not None]),
                "stage_ms": _median([s["stage_ms"] for s in ok_tx if s.get("stage_ms")]),
                "seal_ms": _median([s["seal_ms"] for s in ok_tx if s.get("seal_ms")]),
                "parts_plain": parts_plain, "parts_tx": parts_tx,
                "target_partitions": target_partitions,
                "parts_plain_per_partition": (round(parts_plain / target_partitions, 2)
                                              if parts_plain and target_partitions else None),
                "parts_tx_per_partition": (round(parts_tx / target_partitions, 2)
                                           if parts_tx and target_partitions else None),
                "parts_counts_agree": all(
                    s["parts"]["created"] == s["parts"]["single_block_parts_listed"]
                    for s in ok_plain + ok_tx) if server.name == "ch18" else None,
                "largest_znode_bytes": max((s["znodes"].get("largest_bytes", 0)
                                            for s in tx if s.get("znodes")), default=None),
                "failures": {"plain": len(plain) - len(ok_plain), "tx": len(tx) - len(ok_tx)},
                "errors": [f"{s['round']} {v}: {s['error']}" for v, runs in
                           (("plain", plain), ("tx", tx)) for s in runs if s["error"]],
                "load_range": [min(s["load_start"] for s in everything),
                               max(s.get("load_end", s["load_start"]) for s in everything)],
                "runs": {"plain": plain, "tx": tx},
            }
            traced = [s["trace"] for s in ok_tx if s.get("trace")]
            if traced:
                row["commit_trace_ms"] = {
                    step: _median([t["steps_ms"].get(step, 0.0) for t in traced])
                    for step in dict.fromkeys(k for t in traced for k in t["steps_ms"])}
                purposes = dict.fromkeys(k for t in traced for k in t.get("purposes", {}))
                row["commit_statements"] = {
                    purpose: [_median([t["purposes"].get(purpose, [0, 0.0])[0]
                                       for t in traced]),
                              _median([t["purposes"].get(purpose, [0, 0.0])[1]
                                       for t in traced])]
                    for purpose in purposes}
            rows.append(row)
    return rows


def render(rows: list[dict]) -> str:
    return report.table(
        ("server", "partitions", "plain s", "tx s", "tx ÷ plain (paired)",
         "tx ÷ plain (medians)", "tx commit ms", "goal ms", "commit ÷ goal",
         "decided at ms", "clean-up ms", "parts plain", "parts tx", "plain ÷ tx parts",
         "tx parts per target partition", "failures", "load"),
        [(r["server"], r["partitions"], r["plain_s"], r["tx_s"], r["tx_over_plain_paired"],
          r["tx_over_plain_medians"], r["commit_ms"], r["goal_commit_ms"],
          r["commit_ms"] / r["goal_commit_ms"] if r["commit_ms"] is not None else None,
          r["until_decision_ms"], r["cleanup_ms"], r["parts_plain"], r["parts_tx"],
          r["parts_plain"] / r["parts_tx"] if r["parts_plain"] and r["parts_tx"] else None,
          r["parts_tx_per_partition"],
          f"{r['failures']['plain']}/{r['failures']['tx']}" if any(r["failures"].values())
          else "", f"{r['load_range'][0]:.1f}–{r['load_range'][1]:.1f}") for r in rows])


def render_trace(rows: list[dict]) -> str | None:
    traced = [r for r in rows if r.get("commit_trace_ms")]
    if not traced:
        return None
    steps = list(dict.fromkeys(s for r in traced for s in r["commit_trace_ms"]))
    return report.table(("step (exclusive ms, median)", *(f"{r['server']} p{r['partitions']}"
                                                          for r in traced)),
                        [(step, *(r["commit_trace_ms"].get(step) for r in traced))
                         for step in steps])


def render_statements(rows: list[dict]) -> str | None:
    """ClickHouse statements of the commit by purpose: count and ms (medians)."""
    traced = [r for r in rows if r.get("commit_statements")]
    if not traced:
        return None
    purposes = sorted(dict.fromkeys(p for r in traced for p in r["commit_statements"]),
                      key=lambda p: -max(r["commit_statements"].get(p, [0, 0.0])[1]
                                         for r in traced))
    def cell(row: dict, purpose: str) -> str:
        count, ms = row["commit_statements"].get(purpose, [0, 0.0])
        return f"{count:g} / {ms:,.0f}" if count else ""
    return report.table(("statement purpose (count / ms, median)",
                         *(f"{r['server']} p{r['partitions']}" for r in traced)),
                        [(purpose, *(cell(r, purpose) for r in traced)) for purpose in purposes])


def goals(rows: list[dict], partitions: tuple[int, ...]) -> list[dict]:
    """Where each goal of issue 14 stands, from this run's figures."""
    out = []
    for server in dict.fromkeys(r["server"] for r in rows):
        mine = [r for r in rows if r["server"] == server]
        commits = [(r["partitions"], r["commit_ms"], r["goal_commit_ms"]) for r in mine
                   if r["commit_ms"] is not None]
        out.append({
            "server": server, "goal": "driver commit ≤ 100 ms + 1 ms per branch",
            "met": bool(commits) and all(c <= g for _, c, g in commits),
            "detail": ", ".join(f"{p}: {c:.0f} / {g:.0f} ms" for p, c, g in commits)})
        at = next((r for r in mine if r["partitions"] == GOAL_RATIO_PARTITIONS), None)
        if at is not None:
            ratio = at["tx_over_plain_paired"]
            out.append({
                "server": server,
                "goal": f"{GOAL_RATIO_PARTITIONS}-partition job: tx ≤ {GOAL_TX_VS_PLAIN}× plain",
                "met": ratio is not None and ratio <= GOAL_TX_VS_PLAIN,
                "detail": f"paired {ratio}, medians {at['tx_over_plain_medians']}"})
        big = next((r for r in mine if r["partitions"] == GOAL_WORKS_PARTITIONS), None)
        if big is not None:
            znode = big["largest_znode_bytes"]
            works = (not big["failures"]["tx"] and big["commit_ms"] is not None
                     and (znode or 0) < ZNODE_LIMIT)
            out.append({
                "server": server, "goal": f"{GOAL_WORKS_PARTITIONS} partitions work "
                                          "(no failure, no znode ≥ 1 MB, commit within formula)",
                "met": works and big["commit_ms"] <= big["goal_commit_ms"],
                "detail": (f"{big['failures']['tx']} failed job(s); commit "
                           f"{big['commit_ms']} ms / goal {big['goal_commit_ms']:.0f}; largest "
                           f"znode {znode} bytes" + (f"; errors: {big['errors']}"
                                                     if big["errors"] else ""))})
        parts = [(r["partitions"], r["parts_tx_per_partition"], r["parts_plain_per_partition"])
                 for r in mine if r["parts_tx_per_partition"] is not None]
        out.append({
            "server": server, "goal": "≤ 1 part per target partition per epoch (small branches)",
            "met": bool(parts) and all(t <= 1 for _, t, _ in parts),
            "detail": ", ".join(f"{p}: tx {t:g} vs plain {pl:g}" if pl is not None
                                else f"{p}: tx {t:g}" for p, t, pl in parts)})
    missing = [p for p in (GOAL_RATIO_PARTITIONS, GOAL_WORKS_PARTITIONS) if p not in partitions]
    if missing:
        out.append({"server": "-", "goal": f"partitions {missing} not measured in this run",
                    "met": None, "detail": ""})
    return out


def render_goals(found: list[dict]) -> str:
    verdict = {True: "MET", False: "MISSED", None: "n/a"}
    return "\n".join(f"- [{g['server']}] {g['goal']}: {verdict[g['met']]} ({g['detail']})"
                     for g in found)


def run(plan: Plan, args: argparse.Namespace, checkpoint: Path | None = None) -> dict:
    started, load_start = time.time(), load()
    code = snapshot.info() if not args.live_code else {"frozen": False, **sink_code()}
    servers, skipped = find_servers(args.url, None if args.no_modern else args.modern_url)
    log("servers: " + ", ".join(f"{s.name} {s.version} at {s.url} ({s.strategy})"
                                for s in servers))
    if skipped:
        log(f"modern server skipped: {skipped}")
    staging_at_start = {s.name: staging_table_count(s.url) for s in servers}
    log(f"tables in {STAGING_DATABASE} at the start: {staging_at_start} (leftovers of other "
        "sinks slow every system.parts read on 18.16: run txsink gc first)")
    trace_dir = None
    if args.trace_commit:
        trace_dir = Path(tempfile.mkdtemp(prefix="txsink-bench-trace-"))
        os.environ["TXSINK_BENCH_TRACE"] = str(trace_dir)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [str(TRACE_HOOK), *filter(None, os.environ.get("PYTHONPATH", "").split(":"))])
        log(f"tracing commits in the Spark workers into {trace_dir}")
    scratch = Scratch(tuple(servers), args.zookeeper, uuid.uuid4().hex[:8])
    scratch.create()
    log(f"database {scratch.database}, ZooKeeper {scratch.zookeeper}{scratch.zk_root}")
    spark, bench, leftovers = None, None, []
    try:
        spark = environment.start_spark(cores=2, arrow_batch_rows=args.arrow_batch_rows)
        settings = environment.spark_settings(spark)
        settings["spark.sql.shuffle.partitions"] = spark.conf.get("spark.sql.shuffle.partitions")
        settings["spark.sql.adaptive.enabled"] = spark.conf.get("spark.sql.adaptive.enabled")
        import txsink

        txsink.register(spark)
        code["worker_paths"] = snapshot.worker_paths(spark)
        if code["frozen"] and not all(p.startswith(code["dir"]) for p in code["worker_paths"]):
            log(f"WARNING: Spark workers import the sink from {code['worker_paths']}, "
                "not from the frozen copy")
        bench = PartitionBench(spark, scratch, plan, trace_dir, checkpoint)
        bench.warm_up(servers)
        samples = bench.rounds(servers)
    finally:
        if spark is not None:
            spark.stop()
        leftovers = scratch.remove(bench.sink_ids if bench else set())
        snapshot.remove()
        if trace_dir is not None:
            shutil.rmtree(trace_dir, ignore_errors=True)  # what matters is in the JSON
    rows = summarize(servers, plan, samples)
    return {
        "benchmark": "clickhouse_tx vs clickhouse_plain by Spark partitions (issue 14)",
        "command": " ".join(["python", *sys.argv]),
        "started_at": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(started)),
        "duration_s": round(time.time() - started, 1),
        "machine": environment.machine(),
        "servers": [s.__dict__ for s in servers],
        "sink_code": code,
        "modern_skipped": skipped,
        "spark": settings,
        "load": {"start": load_start, "end": load()},
        "plan": plan.__dict__,
        "traced": trace_dir is not None,
        "method": {"parts_created": "max(max_block_number) of the freshly created target",
                   "ratio": "tx seconds ÷ plain seconds; paired = median over rounds"},
        "results": rows,
        "goals": goals(rows, plan.partitions),
        "staging_tables_at_start": staging_at_start,
        "staging_left_at_end": leftovers,
    }


def staging_table_count(url: str) -> int:
    """Tables in the staging database: on 18.16 a ``system.parts`` read of one table
    costs more the more tables its database holds (1.7 ms with none, 10 ms with 4,000
    leftovers, measured), and the commit reads it three times."""
    return int(sql(url, "SELECT count() FROM system.tables WHERE database = "
                        f"{sql_string(STAGING_DATABASE)}").strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 round")
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--partitions", type=int, nargs="+", default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--url", default="http://127.0.0.1:8123", help="the 18.16 server")
    parser.add_argument("--modern-url", default="http://127.0.0.1:8124",
                        help="a modern server (strategy move), used if it answers")
    parser.add_argument("--no-modern", action="store_true")
    parser.add_argument("--zookeeper", default="127.0.0.1:2181")
    parser.add_argument("--arrow-batch-rows", type=int, default=environment.ARROW_BATCH_ROWS)
    parser.add_argument("--trace-commit", action="store_true",
                        help="trace where each tx commit spends its time (separate run)")
    parser.add_argument("--live-code", action="store_true",
                        help="import the sink from the working tree as it changes, instead "
                             "of a copy frozen at the start (sinkbench/snapshot.py)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not args.live_code:
        snapshot.run_frozen(HERE.parent)  # re-executes this program on a frozen copy
    plan = QUICK if args.quick else Plan()
    plan = Plan(rows=args.rows or plan.rows,
                partitions=tuple(args.partitions or plan.partitions),
                rounds=args.rounds or plan.rounds)
    logging.getLogger("txsink").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning)  # pyspark on pandas 3
    out = args.out or (RESULTS / "quick" if args.quick else RESULTS)
    checkpoint = out / "partitions.json.tmp"
    log(f"every job is also written to {checkpoint} as the run goes")
    results = run(plan, args, checkpoint)
    results["quick"] = args.quick
    rows = results["results"]
    print(f"\n### clickhouse_tx vs clickhouse_plain by Spark partitions ({plan.rows:,} rows, "
          f"{plan.rounds} round(s), local[2], load {results['load']['start']:.1f} -> "
          f"{results['load']['end']:.1f})\n\n{render(rows)}\n")
    if results["modern_skipped"]:
        print(f"modern server skipped: {results['modern_skipped']}\n")
    code = results["sink_code"]
    print(f"sink code: revision {code.get('revision')} with uncommitted changes to "
          f"{', '.join(code.get('uncommitted_sink_files', [])) or 'no file'}; "
          + (f"frozen copy {code['sha256']} at the start" if code["frozen"]
             else "imported from the working tree as it was (--live-code)") + "\n")
    traced = render_trace(rows)
    if traced:
        print(f"where the tx commit's time goes (traced):\n\n{traced}\n")
    statements = render_statements(rows)
    if statements:
        print("ClickHouse statements of the tx commit, by purpose (statements of "
              f"parallel drops add up beyond wall time):\n\n{statements}\n")
    print("goals (issue 14):\n" + render_goals(results["goals"]))
    for row in rows:
        for error in row["errors"]:
            print(f"FAILED {row['server']} p{row['partitions']} {error}")
        if row["parts_counts_agree"] is False:
            print(f"note: {row['server']} p{row['partitions']}: parts created (block numbers) "
                  "and single-block parts listed differ; see partitions.json")
    if results["staging_left_at_end"]:
        print(f"staging tables the sink left (dropped now): {results['staging_left_at_end']}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "partitions.json").write_text(json.dumps(results, indent=1) + "\n")
    checkpoint.unlink(missing_ok=True)
    picture = plots.partitions(results, out)
    print(f"written {out / 'partitions.json'}" + (f" and {picture}" if picture else "")
          + f" in {results['duration_s']:.0f} s (load {results['load']['start']:.1f} -> "
          f"{results['load']['end']:.1f})")
    failures = sum(sum(r["failures"].values()) for r in rows)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
