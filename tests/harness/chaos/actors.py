"""Overlapping actors of the chaos schedule: other processes that reach the same sink.

The schedule (:mod:`tests.harness.chaos.schedule`) starts these beside the pipeline's
driver, while it commits; each is a real process with its own ZooKeeper session:

- :class:`RecoverLoop` is an operator running ``txsink recover --sink S`` again and again
  for a few seconds (the command line, as a subprocess, with the run's options). Every
  run's exit code is counted; a non-zero one is counted with its reason (the exception
  the command printed, or the failed action it reported).
- :class:`Overlap` is a second streaming driver of the same query (same checkpoint, same
  sink id) started while the first one runs, as when an orchestrator restarts a job
  whose old driver is still alive. The newer run claims the sink (generation fencing) and
  the old one must fail: refused by the sink (``SinkTakenOver``, also when its next task
  claims with its superseded run id; ``CheckpointReplaced`` when the stream check,
  which runs before the claim, finds that the newer run already committed past the old
  one's micro-batch) or by Spark (``CONCURRENT_STREAM_LOG_UPDATE``). When the overlap
  ends the old driver, if still alive, is killed, so exactly one
  driver (the newer one, or its restart) remains; what each of the two ended with is
  counted (:func:`driver_outcome`).
- :class:`ZombieRun` runs ``python -m tests.harness.chaos.actors zombie``: a task attempt
  of an older generation. It registers a branch in the sink's latest open xid (else its
  latest xid) under the generation before the current one, then prepares that branch,
  through the coordinator API. Both steps must be refused (:class:`coordinator.Fenced` for
  the stale generation, :class:`coordinator.XidDecided` after the decision,
  :class:`coordinator.UnknownBranch` for the prepare of a branch that was never
  registered); anything accepted is counted as such and shown in the report. Its branch
  names no staging table, so even an accepted one could only ever be rolled back.

:class:`ActorTally` holds the counts the report prints (:meth:`ActorTally.lines`).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from coordinator.sink_admin import SinkAdmin
from tests.harness.chaos.faults import kill_session

RUN_TIMEOUT = 60.0  # an actor process still running after this long is killed (and counted)
KILLED = "killed (SIGKILL)"
#: (outcome, pattern in the driver's "pipeline failed:" line), first match wins.
DRIVER_FAILURES = (
    ("SinkTakenOver", re.compile(r"SinkTakenOver|was taken over by another writer")),
    ("Fenced (run superseded)", re.compile(r"\bFenced\b|was superseded by a newer writer")),
    ("concurrent checkpoint", re.compile(
        r"CONCURRENT_STREAM_LOG_UPDATE|Concurrent update to the|Multiple streaming "
        r"(jobs|queries)|ConcurrentModificationException|CONCURRENT_QUERY")),
    ("CheckpointReplaced", re.compile(r"CheckpointReplaced")),
    ("SinkStateLost", re.compile(r"SinkStateLost")),
)


def failure_line(log_file: Path | None) -> str:
    """A pipeline driver's one-line failure (``pipeline failed: ...``), if it printed one."""
    try:
        lines = log_file.read_text(errors="replace").splitlines() if log_file else []
    except FileNotFoundError:
        return ""
    failures = [line for line in lines if line.startswith("pipeline failed:")]
    return failures[-1] if failures else ""


#: Other causes a driver of a chaos run fails with (the faults it runs under).
OTHER_CAUSES = (
    ("Python worker crashed", re.compile(r"Python worker exited unexpectedly")),
    ("injected task failure", re.compile(r"injected task failure")),
    # a server or its connection failed the write: the sink's codes, wherever Spark's
    # wrapping puts them in the line
    *((code, re.compile(rf"\b{code}\b")) for code in
      ("CONNECTION_LOST", "SERVER_UNREACHABLE", "ZooKeeperUnreachable")),
)
#: A Python exception line in a driver's log (not the JVM's lines, not the wrappers).
EXCEPTION_LINE = re.compile(r"^(?!java\.|org\.|py4j|pyspark\.|pipeline failed)"
                            r"([A-Za-z_][\w.]*(?:Error|Exception)\w*): (.*)$", re.MULTILINE)
SPARK_WRAPPER = re.compile(r"^StreamingQueryException: \[STREAM_FAILED\] Query \[[^]]*\] "
                           r"terminated with exception: ")


def classify_failure(line: str, log_text: str = "") -> str:
    """Name a driver's failure line: takeover, concurrent checkpoint, ... or its cause.

    For another failure the cause is looked up in the whole log (``log_text``): the
    failure line is cut at 1,500 characters, often before the Python exception."""
    for name, pattern in DRIVER_FAILURES:
        if pattern.search(line):
            return name
    for name, pattern in OTHER_CAUSES:
        if pattern.search(line):
            return f"other: {name}"
    causes = EXCEPTION_LINE.findall(log_text)
    if causes:
        kind, message = causes[-1]
        message = re.sub(r"\d+\.\d+\.\d+\.\d+:\d+", "<server>", message)
        return f"other: {kind.rsplit('.', 1)[-1]}: {message[:80]}"
    for name, pattern in OTHER_CAUSES:
        if pattern.search(log_text):
            return f"other: {name}"
    text = SPARK_WRAPPER.sub("", line.removeprefix("pipeline failed:").strip())
    return f"other: {text[:100]}" if text else "no failure printed"


def refusal_seen(log_file: Path | None) -> str:
    """The first refusal named anywhere in a driver's log (a task's error, Spark's retry),
    for a driver that had not ended yet: "" if none."""
    try:
        text = log_file.read_text(errors="replace") if log_file else ""
    except FileNotFoundError:
        return ""
    found = [(m.start(), name) for name, pattern in DRIVER_FAILURES
             if (m := pattern.search(text))]
    return min(found)[1] if found else ""


def driver_outcome(proc: subprocess.Popen, log_file: Path | None) -> str:
    """What a pipeline driver ended with: running, killed, stopped or its failure."""
    code = proc.poll()
    if code is None:
        return "running"
    if code < 0:
        return KILLED
    if code == 0:
        return "exit 0 (stopped)"
    try:
        text = log_file.read_text(errors="replace") if log_file else ""
    except FileNotFoundError:
        text = ""
    return f"exit {code}: {classify_failure(failure_line(log_file), text)}"


@dataclass
class ActorTally:
    """What the overlapping actors did over a run."""

    recover_loops: int = 0
    recover_runs: int = 0
    recover_exits: Counter = field(default_factory=Counter)    # exit code -> runs
    recover_reasons: Counter = field(default_factory=Counter)  # why a run exited non-zero
    recover_actions: Counter = field(default_factory=Counter)  # rolled_forward, in_progress
    overlaps: int = 0
    old_driver: Counter = field(default_factory=Counter)       # what the older driver did
    new_driver: Counter = field(default_factory=Counter)       # ... and the newer one
    drivers_left: Counter = field(default_factory=Counter)     # live drivers after overlap
    zombie_runs: int = 0
    zombie_register: Counter = field(default_factory=Counter)  # refused: Fenced, ...
    zombie_prepare: Counter = field(default_factory=Counter)
    zombie_errors: Counter = field(default_factory=Counter)    # could not reach the sink

    @property
    def zombie_accepted(self) -> int:
        return sum(v for k, v in (self.zombie_register + self.zombie_prepare).items()
                   if k.startswith("accepted"))

    def lines(self) -> list[str]:
        """The report's lines about the actors (none if no actor ran)."""
        out = []
        if self.recover_loops:
            exits = ", ".join(f"exit {k}: {v}" for k, v in sorted(self.recover_exits.items()))
            out.append(f"operator recover: {self.recover_runs} runs in {self.recover_loops} "
                       f"loops ({exits or 'none finished'})")
            if self.recover_actions:
                out.append("  actions: " + _counts(self.recover_actions))
            for reason, n in sorted(self.recover_reasons.items()):
                out.append(f"  {n} x {reason}")
        if self.overlaps:
            out.append(f"second driver: {self.overlaps} overlaps; live drivers when each "
                       f"ended: {_counts(self.drivers_left)}")
            out.append("  older driver: " + _counts(self.old_driver))
            out.append("  newer driver: " + _counts(self.new_driver))
        if self.zombie_runs:
            out.append(f"zombie task: {self.zombie_runs} attempts, "
                       f"{self.zombie_accepted} steps accepted")
            out.append("  register: " + (_counts(self.zombie_register) or "none"))
            out.append("  prepare: " + (_counts(self.zombie_prepare) or "none"))
            if self.zombie_errors:
                out.append("  did not reach the sink: " + _counts(self.zombie_errors))
        return out


def _counts(counter: Counter) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(counter.items(), key=lambda kv: str(kv[0])))


@dataclass
class _Process:
    """One actor subprocess with its output in files (no pipe to fill up)."""

    proc: subprocess.Popen
    out: Path
    err: Path
    started: float

    @classmethod
    def start(cls, argv: list[str], out: Path) -> _Process:
        out.parent.mkdir(parents=True, exist_ok=True)
        err = out.with_suffix(".err")
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            proc = subprocess.Popen(argv, stdout=stdout, stderr=stderr,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        return cls(proc, out, err, time.monotonic())

    def poll(self, now: float) -> int | None:
        """The exit code once ended; an actor past :data:`RUN_TIMEOUT` is killed (-9)."""
        code = self.proc.poll()
        if code is None and now - self.started > RUN_TIMEOUT:
            self.kill()
            code = self.proc.poll()
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            kill_session(self.proc.pid)
            self.proc.wait()

    def output(self) -> tuple[str, str]:
        return (self.out.read_text(errors="replace") if self.out.exists() else "",
                self.err.read_text(errors="replace") if self.err.exists() else "")

    def discard(self) -> None:
        self.out.unlink(missing_ok=True)
        self.err.unlink(missing_ok=True)


def recover_argv(sink_id: str, zookeeper: str, zk_root: str, url: str) -> list[str]:
    """``txsink recover --sink S`` with the pipeline's ZooKeeper, root and ClickHouse URL."""
    return [sys.executable, "-m", "txsink", "recover", "--json", "--sink", sink_id,
            "--zookeeper", zookeeper, "--zk-root", zk_root, "--url", url]


class RecoverLoop:
    """``txsink recover`` run back to back until ``until`` (one run at a time)."""

    def __init__(self, argv: list[str], until: float, log_dir: Path, tally: ActorTally) -> None:
        self.argv = argv
        self.until = until
        self.log_dir = log_dir
        self.tally = tally
        self.current: _Process | None = None
        tally.recover_loops += 1

    def poll(self, now: float) -> bool:
        """Collect a finished run, start the next while time is left; True when done."""
        if self.current is not None:
            code = self.current.poll(now)
            if code is None:
                return False
            self._record(self.current, code)
            self.current = None
        if now < self.until:
            self.tally.recover_runs += 1
            out = self.log_dir / f"recover-{self.tally.recover_runs:05d}.out"
            self.current = _Process.start(self.argv, out)
            return False
        return True

    def finish(self) -> None:
        """Stop starting runs; wait for the current one (killed after RUN_TIMEOUT)."""
        self.until = 0.0
        while not self.poll(time.monotonic()):
            time.sleep(0.1)

    def kill(self) -> None:
        if self.current is not None:
            self.current.kill()

    def _record(self, run: _Process, code: int) -> None:
        self.tally.recover_exits[code] += 1
        stdout, stderr = run.output()
        failed: list[str] = []
        try:
            for sink in json.loads(stdout)["sinks"]:
                for action in sink["actions"]:
                    self.tally.recover_actions[_action_name(action)] += 1
                failed += sink["failed"]
        except (ValueError, KeyError, TypeError):
            pass
        if code == 0:
            run.discard()
            return
        self.tally.recover_reasons[f"exit {code}: {recover_reason(code, stderr, failed)}"] += 1


def _action_name(action: str) -> str:
    """``sink/7 Committing -> rolled_forward (...)`` -> ``Committing -> rolled_forward``."""
    parts = action.split(" (", 1)[0].split()
    return " ".join(parts[1:]) if len(parts) > 1 else action


def recover_reason(code: int, stderr: str, failed: list[str]) -> str:
    """Why ``txsink recover`` exited non-zero, in a form that counts well."""
    if code < 0:
        return f"killed after {RUN_TIMEOUT:.0f} s without an answer"
    if failed:  # exit 3: an xid it could not finish; the detail names the error type
        detail = failed[0].split(" (", 1)[1] if " (" in failed[0] else failed[0]
        return "failed action: " + detail.split(":", 1)[0]
    line = next((ln for ln in stderr.splitlines() if ln.startswith("txsink recover:")), "")
    if line:  # exit 2: "txsink recover: Type: message"
        return line.split(":", 2)[1].strip()
    return (stderr.strip().splitlines() or ["no message"])[-1][:120]


@dataclass
class Overlap:
    """Two drivers of one query at once: the older (``old``) and the newer (``new``)."""

    old: subprocess.Popen
    old_log: Path | None
    new: subprocess.Popen
    new_log: Path | None
    until: float

    def due(self, now: float) -> bool:
        """Time is up, or both drivers have ended already."""
        return now >= self.until or (self.old.poll() is not None
                                     and self.new.poll() is not None)

    def end(self, tally: ActorTally, current: subprocess.Popen | None) -> str:
        """Record what both drivers ended with; kill the older one if it still runs."""
        old = driver_outcome(self.old, self.old_log)
        if old == "running":
            kill_session(self.old.pid)
            self.old.wait()
            refused = refusal_seen(self.old_log)
            old = (f"refused ({refused}), still failing when the overlap ended: killed"
                   if refused else "still running when the overlap ended: killed")
        new = driver_outcome(self.new, self.new_log)
        if new == "running":
            new = "running (kept as the primary)"
        elif current is not None and current is not self.new:
            new += " (restarted by the supervisor)"
        left = sum(1 for p in {id(self.old): self.old, id(self.new): self.new,
                               id(current): current}.values()
                   if p is not None and p.poll() is None)
        tally.overlaps += 1
        tally.old_driver[old] += 1
        tally.new_driver[new] += 1
        tally.drivers_left[left] += 1
        return f"older driver: {old}; newer driver: {new}"

    def kill(self) -> None:
        if self.old.poll() is None:
            kill_session(self.old.pid)
            self.old.wait()


def zombie_argv(sink_id: str, zookeeper: str, zk_root: str) -> list[str]:
    return [sys.executable, "-m", "tests.harness.chaos.actors", "zombie", "--sink", sink_id,
            "--zookeeper", zookeeper, "--zk-root", zk_root]


class ZombieRun:
    """One zombie task attempt as a subprocess; its JSON answer is counted when it ends."""

    def __init__(self, argv: list[str], out: Path, tally: ActorTally) -> None:
        self.tally = tally
        self.run = _Process.start(argv, out)
        tally.zombie_runs += 1

    def poll(self, now: float) -> bool:
        code = self.run.poll(now)
        if code is None:
            return False
        stdout, stderr = self.run.output()
        try:
            answer = json.loads(stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            answer = {"error": f"exit {code}: " + ((stderr.strip().splitlines() or
                                                    ["no answer"])[-1][:120])}
        if "error" in answer:
            self.tally.zombie_errors[answer["error"]] += 1
        else:
            self.tally.zombie_register[answer["register"]] += 1
            self.tally.zombie_prepare[answer["prepare"]] += 1
        if code == 0 and "error" not in answer:
            self.run.discard()
        return True

    def kill(self) -> None:
        self.run.kill()


# -- the zombie task itself (runs in its own process) ------------------------------------

def _step(call) -> str:
    from coordinator import CoordinatorError

    try:
        call()
    except CoordinatorError as exc:
        return f"refused: {type(exc).__name__}"
    return "accepted"


def zombie_task(zookeeper: str, zk_root: str, sink_id: str) -> dict:
    """Register, then prepare, a branch of a stale generation in the latest xid."""
    from kazoo.client import KazooClient
    from kazoo.retry import KazooRetry

    from coordinator import Coordinator, XidState

    client = KazooClient(hosts=zookeeper, timeout=10.0,
                         connection_retry=KazooRetry(max_tries=3, delay=0.2, max_delay=1.0))
    try:
        client.start(timeout=8.0)
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        client.close()
        return {"error": f"ZooKeeper: {type(exc).__name__}"}
    try:
        retry = KazooRetry(max_tries=5, delay=0.2, max_delay=2.0, deadline=20.0)
        coord = Coordinator(client, sink_id, root=zk_root, retry=retry, role="zombie task")
        current = coord.generation()
        open_xids = SinkAdmin(coord).xids(states=(XidState.INITIALIZED,))
        epochs = ([x.epoch for x in open_xids]
                  or coord.store.run(coord.store.epochs, False))
        if not epochs:
            return {"error": "no xid yet"}
        epoch, stale = max(epochs), max(current - 1, 0)
        branch_id = f"zombie-{uuid.uuid4().hex[:12]}"
        owner = {"host": "zombie", "role": "zombie task", "generation": stale}
        register = _step(lambda: coord.register_branch(epoch, branch_id, stale, owner))
        prepare = _step(lambda: coord.prepare_branch(
            epoch, branch_id, {"zombie": True, "rows": 0}))
        return {"epoch": epoch, "generation": stale, "current": current,
                "register": register, "prepare": prepare}
    except Exception as exc:  # noqa: BLE001 - ZooKeeper lost mid-way: reported
        return {"error": f"ZooKeeper: {type(exc).__name__}"}
    finally:
        client.stop()
        client.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.harness.chaos.actors",
                                description="an overlapping actor of the chaos schedule")
    sub = p.add_subparsers(dest="actor", required=True)
    zombie = sub.add_parser("zombie", help="a task attempt of a stale generation")
    zombie.add_argument("--sink", required=True)
    zombie.add_argument("--zookeeper", required=True)
    zombie.add_argument("--zk-root", default="/txsink")
    args = p.parse_args(argv)
    print(json.dumps(zombie_task(args.zookeeper, args.zk_root, args.sink)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
