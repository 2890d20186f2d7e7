"""Where a ``clickhouse_tx`` commit spends its time, traced inside Spark's Python workers.

Spark runs a Python data source's ``commit`` in a Python worker, not in the process that
called ``save()``, so the driver's log line (``commit_ms``) and the xid's metrics say how
long the commit took but not where. With tracing on (``bench_partitions.py
--trace-commit``), every Python worker of the benchmark's Spark session imports
``sinkbench/worker_trace/sitecustomize.py`` at start-up, which calls :func:`install`:

- a few functions of the commit path are wrapped with timers (``STEPS``; nothing else
  changes: arguments, results and exceptions pass through). Each step's figure is its
  *exclusive* time: nested traced steps are subtracted from it, so the steps of one
  commit add up to the commit (the remainder is ``other``);
- every ClickHouse statement (``ClickHouseClient.execute``/``query_rows``/``query_value``)
  is counted, with its time, against the innermost step it ran in (statements of worker
  threads, e.g. the parallel drops, are counted but their time is already in the step
  that waited for them), and by its ``purpose`` (the client's name for the step, e.g.
  "combine winners into one table"): that view does not depend on how the sink's
  functions are cut, and statements of threads running at once add up beyond wall time;
- INFO records of the loggers ``txsink``, ``server_ext`` and ``coordinator`` are kept with
  their time (``server_ext.publish.combined``'s "combined ..." line among them).

Everything goes, one JSON object per line, to ``<trace dir>/trace-<pid>.jsonl``;
:func:`commit_breakdown` reads back the commit of one sink id. The wrappers cost a few
microseconds per call against milliseconds per statement, but the recorded figures of
``docs/benchmarks.md`` are taken without them; traced runs only say where time goes.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time
from pathlib import Path

#: (module, attribute path, step name): the commit path, as ``txsink.core.driver`` calls it.
#: The sink changes: a name the running code does not have is skipped (and listed in the
#: trace file), so one list serves its versions before and after a refactoring.
STEPS = (
    ("txsink.core.driver", "commit_epoch", "other"),
    ("txsink.core.driver", "generation_of", "zk: before decision"),
    ("coordinator.coordinator", "Coordinator.begin", "zk: before decision"),
    ("coordinator.coordinator", "Coordinator.is_committed", "zk: is_committed (not in commit_ms)"),
    ("txsink.core.combine", "combined_branches", "combined branch: register, prepare"),
    ("coordinator.coordinator", "Coordinator.commit", "zk: decision, lease, reads"),
    ("coordinator.protocol.completion", "Completion._write_committed",
     "zk: Committed write (end multi)"),
    ("coordinator.protocol.completion", "Completion._clean_up",
     "cleanup after Committed: drop non-winners"),
    ("txsink.core.publisher", "BranchPublisher.publish", "publisher (python)"),
    ("server_ext.publish.combined", "combine", "combine: ledger record"),
    ("server_ext.publish.combined", "_build", "combine: ATTACH ... FROM sources"),
    ("server_ext.publish.combined", "_check_sources", "combine: check sources' parts"),
    ("server_ext.publish.combined", "require_sealed", "combine: check sources' parts"),
    ("server_ext.publish.combined", "describe_table", "combine: describe target"),
    ("server_ext.publish.combined", "create_staging", "combine: create combined table"),
    ("server_ext.publish.combined", "create_staging_table", "combine: create combined table"),
    ("server_ext.publish.combined", "alter_in_chunks", "combine: ATTACH ... FROM sources"),
    ("server_ext.publish.combined", "merge_partitions", "combine: OPTIMIZE FINAL"),
    ("server_ext.publish.combined", "seal", "combine: seal"),
    ("server_ext.publish.combined", "drop_tables", "combine: drop sources"),
    ("server_ext.publish.combined", "publish", "publish into target"),
    ("txsink.core.publisher", "BranchPublisher.rollback", "rollback / drop staging"),
    ("txsink.core.publisher", "BranchPublisher.drop_staging", "rollback / drop staging"),
    ("coordinator.coordinator", "Coordinator.record_metrics",
     "zk: record metrics (not in commit_ms)"),
)
SQL_METHODS = ("execute", "query_rows", "query_value")
#: Steps that run statements in a thread pool (counted under "(worker threads)").
POOLS = ("drop_tables", "_clean_up")
LOGGERS = ("txsink", "server_ext", "coordinator")
ROOT = "other"  # the exclusive time of commit_epoch itself

_state = threading.local()
_lock = threading.Lock()
_out = None


def _write(record: dict) -> None:
    with _lock:
        if _out is not None:
            _out.write(json.dumps(record, separators=(",", ":")) + "\n")
            _out.flush()


def _stack() -> list[dict]:
    if not hasattr(_state, "stack"):
        _state.stack = []
    return _state.stack


def _step_wrapper(function, step: str, root: bool):
    @functools.wraps(function)
    def traced(*args, **kwargs):
        stack = _stack()
        if not root and not stack:
            return function(*args, **kwargs)  # outside a traced commit: not ours
        frame = {"step": step, "children": 0.0, "sql": {}}
        if root:
            plan = args[0] if args else kwargs.get("plan")
            frame.update(sink_id=getattr(plan, "sink_id", None), epoch=args[1]
                         if len(args) > 1 else kwargs.get("epoch"), steps={}, statements={},
                         purposes={})
            _state.commit = frame
        stack.append(frame)
        started = time.perf_counter()
        error = None
        try:
            return function(*args, **kwargs)
        except BaseException as exc:
            error = repr(exc)[:300]
            raise
        finally:
            elapsed = time.perf_counter() - started
            stack.pop()
            commit = getattr(_state, "commit", None)
            if commit is not None:
                mine = elapsed - frame["children"]
                commit["steps"][step] = commit["steps"].get(step, 0.0) + mine
                if stack:
                    stack[-1]["children"] += elapsed
            if root:
                _state.commit = None
                _write({"kind": "commit", "pid": os.getpid(), "sink_id": frame["sink_id"],
                        "epoch": frame["epoch"], "end": time.time(), "ms": elapsed * 1000,
                        "steps_ms": {k: round(v * 1000, 2) for k, v in frame["steps"].items()},
                        "statements": frame["statements"], "purposes": frame["purposes"],
                        "error": error})
    return traced


def _sql_wrapper(function):
    @functools.wraps(function)
    def traced(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return function(self, *args, **kwargs)
        finally:
            elapsed = time.perf_counter() - started
            commit = getattr(_state, "commit", None)
            stack = _stack()
            step = stack[-1]["step"] if stack else None
            if commit is None and _pool_commit is not None:
                commit, step = _pool_commit, "(worker threads)"
            if commit is not None:
                entry = commit["statements"].setdefault(step, [0, 0.0])
                entry[0] += 1
                entry[1] = round(entry[1] + elapsed * 1000, 2)
                purpose = str(kwargs.get("purpose", "?"))
                with _lock:  # pool threads add to the same entries
                    entry = commit["purposes"].setdefault(purpose, [0, 0.0])
                    entry[0] += 1
                    entry[1] = round(entry[1] + elapsed * 1000, 2)
    return traced


# Statements run by a thread pool inside a traced commit (the parallel drops) have no
# stack of their own; they are counted against the one commit of the process. Their
# time is already in the step that waited for the pool.
_pool_commit = None


def _pool_aware(function):
    @functools.wraps(function)
    def traced(*args, **kwargs):
        global _pool_commit
        _pool_commit = getattr(_state, "commit", None)
        try:
            return function(*args, **kwargs)
        finally:
            _pool_commit = None
    return traced


class _Handler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            _write({"kind": "log", "pid": os.getpid(), "t": record.created,
                    "logger": record.name, "level": record.levelname,
                    "message": record.getMessage()[:500]})
        except Exception:  # noqa: BLE001 - tracing never breaks the sink
            pass


def install(directory: str) -> None:
    """Wrap the commit path and start writing ``<directory>/trace-<pid>.jsonl``."""
    global _out
    import importlib

    from server_ext.client import ClickHouseClient

    Path(directory).mkdir(parents=True, exist_ok=True)
    _out = open(Path(directory) / f"trace-{os.getpid()}.jsonl", "a", encoding="utf-8")  # noqa: SIM115
    os.register_at_fork(after_in_child=_reopen(directory))
    missing = []
    for module_name, path, step in STEPS:
        owner = importlib.import_module(module_name)
        *parents, attribute = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent, None)
        if owner is None or not hasattr(owner, attribute):
            missing.append(f"{module_name}.{path}")
            continue
        wrapped = _step_wrapper(getattr(owner, attribute), step, root=path == "commit_epoch")
        if attribute in POOLS:
            wrapped = _pool_aware(wrapped)
        setattr(owner, attribute, wrapped)
    _write({"kind": "install", "pid": os.getpid(), "t": time.time(), "missing": missing})
    for method in SQL_METHODS:
        setattr(ClickHouseClient, method, _sql_wrapper(getattr(ClickHouseClient, method)))
    handler = _Handler(logging.INFO)
    for name in LOGGERS:
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        if logger.level == logging.NOTSET or logger.level > logging.INFO:
            logger.setLevel(logging.INFO)


def _reopen(directory: str):
    """Spark's daemon forks its workers: each child writes its own file."""
    def reopen() -> None:
        global _out
        _out = open(Path(directory) / f"trace-{os.getpid()}.jsonl", "a", encoding="utf-8")  # noqa: SIM115
    return reopen


def read(directory: Path) -> list[dict]:
    records = []
    for path in sorted(Path(directory).glob("trace-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line being written right now
    return records


def commit_breakdown(directory: Path, sink_id: str) -> dict | None:
    """The traced commit of ``sink_id`` (its last one), with the INFO lines logged by the
    same process while it ran; None if no commit of that sink was traced."""
    records = read(directory)
    commits = [r for r in records if r.get("kind") == "commit" and r.get("sink_id") == sink_id]
    if not commits:
        return None
    commit = commits[-1]
    start = commit["end"] - commit["ms"] / 1000
    logs = [{"ms": round((r["t"] - start) * 1000, 1), "logger": r["logger"],
             "message": r["message"]} for r in records
            if r.get("kind") == "log" and r["pid"] == commit["pid"]
            and start - 0.001 <= r["t"] <= commit["end"] + 0.5]
    return {**commit, "log": logs}
