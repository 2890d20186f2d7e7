"""Randomised fault schedules over a streaming run of many epochs, and the soak command.

    python -m tests.harness.chaos.schedule --minutes 30 --seed 7      # the soak
    python -m tests.harness.chaos.schedule --faults 8 --seed 7        # a short run

A run starts a private ClickHouse + ZooKeeper pair (its own ports and data, so killing it
disturbs nobody), puts a :class:`~tests.harness.chaos.proxy.TcpProxy` in front of each, and runs
the streaming pipeline of :mod:`tests.harness.chaos.pipeline` as its own process while a feeder
keeps adding one uniquely keyed input file per epoch. Faults are drawn from the seed:

- ``driver_kill``      kill -9 of the driver's process group at a random moment
- ``worker_kill``      kill -9 of one PySpark Python worker
- ``crash_point``      arm a random named crash point (fires the next time it is reached)
- ``clickhouse_kill``  kill -9 of ClickHouse, restarted after a random downtime
- ``clickhouse_kill_publish`` the same, the moment the sink's newest xid is
                       ``Committing`` (decided, publishing)
- ``zookeeper_kill``   kill -9 of ZooKeeper, restarted after a random downtime
- ``proxy_cut``        close every connection to ClickHouse or ZooKeeper
- ``proxy_delay``      add latency to every chunk for a few seconds
- ``proxy_blackhole``  accept connections, forward nothing, for a few seconds
- ``task_failure``     every task fails for a few seconds (the micro-batch is aborted)

Overlapping actors (:mod:`tests.harness.chaos.actors`), other processes on the same sink:

- ``operator_recover`` ``txsink recover --sink S`` run back to back for a few seconds
- ``second_driver``    a second driver of the same query (same checkpoint and sink) starts
                       while the first runs; the older one must fail (refused by the sink:
                       SinkTakenOver, Fenced or CheckpointReplaced; or Spark's
                       concurrent-checkpoint error) and is killed if it still runs when
                       the overlap ends, so one driver remains
- ``zombie_task``      a task attempt of a stale generation registers and prepares a
                       branch in the latest xid; both steps must be refused

A driver that dies (killed, crashed at a point, or failed) is restarted from its
checkpoint at once, as an operator's supervisor would. At the end every fault is
repaired, the pipeline drains every input file, and the independent checker counts each
id in the target. The seed fixes the sequence of faults, their targets, sizes and the
gaps between them; where in an epoch each one lands depends on the machine's speed.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import requests

from tests.harness.chaos import checker
from tests.harness.chaos.actors import (
    ActorTally,
    Overlap,
    RecoverLoop,
    ZombieRun,
    recover_argv,
    zombie_argv,
)
from tests.harness.chaos.faults import (
    CrashArming,
    kill_python_worker,
    kill_server,
    private_services,
    restart_server,
)
from tests.harness.chaos.launcher import DriverProcess, PipelineSpec
from tests.harness.chaos.pipeline import (
    check_with_view,
    create_events_table,
    create_fed_view,
    store_options,
    write_epoch_file,
)
from tests.harness.chaos.proxy import TcpProxy
from tests.harness.services import Services
from txsink.core.crashpoints import CRASH_POINTS
from txsink.options import KEEPERMAP

FAULT_KINDS = (
    "driver_kill", "worker_kill", "crash_point", "clickhouse_kill", "clickhouse_kill_publish",
    "zookeeper_kill", "proxy_cut", "proxy_delay", "proxy_blackhole", "task_failure",
    "operator_recover", "second_driver", "zombie_task",
)
FAULT_LABELS = {
    "driver_kill": "driver kill -9",
    "worker_kill": "python worker kill -9",
    "crash_point": "crash point armed",
    "clickhouse_kill": "clickhouse kill -9 + restart",
    "clickhouse_kill_publish": "clickhouse kill -9 while publishing + restart",
    "zookeeper_kill": "zookeeper kill -9 + restart",
    "proxy_cut": "proxy cut",
    "proxy_delay": "proxy delay",
    "proxy_blackhole": "proxy black-hole",
    "task_failure": "task failure (epoch aborted)",
    "operator_recover": "operator recover loop",
    "second_driver": "second driver (same query)",
    "zombie_task": "zombie task (stale generation)",
}
SERVER_FAULTS = ("clickhouse_kill", "clickhouse_kill_publish", "zookeeper_kill")
PUBLISH_WAIT = 3.0  # seconds one try of clickhouse_kill_publish watches for a publish
DEFAULT_OPTIONS = {"timeout": "10", "insert_block_rows": "2000"}
#: Engines for the target; ``{table}`` is filled in (it names the replica path).
MERGE_TREE = "MergeTree()"
REPLICATED = "ReplicatedMergeTree('/clickhouse/tables/{table}', '{{replica}}')"
ENGINES = {"merge_tree": MERGE_TREE, "replicated": REPLICATED}


@dataclass(frozen=True)
class Fault:
    """One planned fault; every random choice is made when the plan is drawn."""

    kind: str
    gap: float              # seconds after the previous fault
    target: str = ""        # proxy: clickhouse|zookeeper; crash_point: its name
    size: float = 0.0       # proxy_delay: seconds per chunk
    duration: float = 0.0   # downtime / how long the fault lasts
    pick: int = 0           # worker_kill: which worker

    def describe(self) -> str:
        parts = [FAULT_LABELS[self.kind]]
        if self.target:
            parts.append(self.target)
        if self.size:
            parts.append(f"{self.size * 1000:.0f} ms/chunk")
        if self.duration:
            parts.append(f"for {self.duration:.1f}s")
        return " ".join(parts)


def draw_fault(rng: random.Random, kind: str, gap: tuple[float, float]) -> Fault:
    """Draw every random choice of one fault of ``kind``."""
    wait = rng.uniform(*gap)
    target, size, duration = "", 0.0, 0.0
    if kind == "crash_point":
        target = rng.choice(CRASH_POINTS)
    elif kind.startswith("proxy_"):
        target = rng.choice(("clickhouse", "zookeeper"))
        if kind == "proxy_delay":
            size, duration = rng.uniform(0.05, 0.5), rng.uniform(2.0, 6.0)
        elif kind == "proxy_blackhole":
            duration = rng.uniform(1.0, 5.0)
    elif kind in SERVER_FAULTS:
        duration = rng.uniform(0.5, 4.0)
    elif kind == "task_failure":
        duration = rng.uniform(1.0, 4.0)
    elif kind == "operator_recover":
        duration = rng.uniform(2.0, 8.0)
    elif kind == "second_driver":
        # long enough for the newer driver to reach its first task (and claim the sink)
        duration = rng.uniform(15.0, 40.0)
    return Fault(kind, wait, target, size, duration, rng.randrange(1 << 30))


def plan_faults(seed: int, count: int, kinds: tuple[str, ...] = FAULT_KINDS,
                gap: tuple[float, float] = (3.0, 12.0)) -> list[Fault]:
    """The fault sequence of ``seed``: same seed, same faults in the same order."""
    rng = random.Random(seed)
    return [draw_fault(rng, rng.choice(kinds), gap) for _ in range(count)]


def plan_every_kind(seed: int, kinds: tuple[str, ...] = FAULT_KINDS,
                    gap: tuple[float, float] = (3.0, 12.0)) -> list[Fault]:
    """Each kind once, in the seed's order: the shortest schedule that covers them all."""
    rng = random.Random(seed)
    order = list(kinds)
    rng.shuffle(order)
    return [draw_fault(rng, kind, gap) for kind in order]


@dataclass
class RunReport:
    """What one chaos run did and what the checker found."""

    sink: str
    seed: int | None
    elapsed: float
    injected: Counter
    crash_points_fired: list[str]
    crash_points_unfired: list[str]
    driver_starts: int
    driver_exits: Counter
    watchdog_kills: int
    epochs_committed: int
    epochs_written: int
    drained: bool
    result: checker.CheckResult | None
    verifier: str
    staging_left: int
    last_error: str = ""
    blocked: bool = False
    engine: str = MERGE_TREE
    actors: ActorTally = field(default_factory=ActorTally)
    batches_committed: int = 0  # micro-batches; epochs_committed counts input files

    @property
    def exactly_once(self) -> bool:
        return bool(self.drained and self.result and self.result.exactly_once)


@dataclass
class ChaosRun:
    """One pipeline under faults: its services, proxies, driver process and feeder.

    Call :meth:`setup`, then :meth:`tick` often (it restarts a dead driver, feeds input
    and ends faults whose time is up) and :meth:`inject` when a fault is due; finally
    :meth:`drain` and :meth:`finish`. Everything runs in the caller's thread.
    """

    workdir: Path
    services: Services
    sink: str = "clickhouse_tx"
    way: str = "datasource"             # the pipeline's --way (foreach_batch: every PySpark)
    table: str = "chaos.events"
    rows_per_epoch: int = 2000
    epochs: int | None = None           # stop feeding after this many input files
    max_pending: int = 2                # input files written ahead of the pipeline
    stall_timeout: float = 120.0        # a driver without progress this long is killed
    options: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_OPTIONS))
    log: Callable[[str], None] = print
    seed: int | None = None
    standby: int = 1                    # drivers kept warm for restarts (see DriverProcess)
    engine: str = MERGE_TREE            # the target's engine: MERGE_TREE or REPLICATED
    max_failures: int = 5               # failed restarts in a row without progress: blocked

    def __post_init__(self) -> None:
        self.injected: Counter = Counter()
        self.driver_exits: Counter = Counter()
        self.armed: set[str] = set()
        self.fired: list[str] = []
        self.watchdog_kills = 0
        self.files = 0
        self.committed = 0                  # input files committed (see committed_files)
        self.batches = 0                    # micro-batches committed
        self.feeding = True
        self.started = time.monotonic()
        self.last_progress = self.started
        self.restart_at = 0.0
        self._running_seen = False
        self.failures_in_a_row = 0
        self.last_error = ""
        self._repairs: list[tuple[float, str, Callable[[], None]]] = []
        self.tally = ActorTally()
        self.recover_loop: RecoverLoop | None = None
        self.overlap: Overlap | None = None
        self.zombies: list[ZombieRun] = []

    # -- set-up --------------------------------------------------------------------------
    @property
    def sink_id(self) -> str:
        return f"chaos-{self.sink}"

    @property
    def checkpoint(self) -> Path:
        return self.workdir / "checkpoint"

    def setup(self) -> None:
        """Prepare (if not yet done) and start the driver."""
        if not hasattr(self, "driver"):
            self.prepare()
        self._feed()
        self.driver.start()
        self.started = self.last_progress = time.monotonic()

    def prepare(self) -> None:
        """Proxies, target and a booting standby driver; nothing runs yet.

        The servers must be up (``services.up()``): a run never starts them itself, so
        it cannot race a restart that a fault has scheduled.
        """
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.ch_proxy = TcpProxy("127.0.0.1", self.services.clickhouse.http_port).start()
        self.zk_proxy = TcpProxy("127.0.0.1", self.services.zookeeper.port).start()
        create_events_table(self.services.clickhouse.url, self.table,
                            self.engine.format(table=self.table))
        # the view's table of the target's engine: a plain MergeTree one would leave a
        # publish in doubt after a restart inside it, as a plain MergeTree target does
        create_fed_view(self.services.clickhouse.url, self.table, self.engine)
        self.arming = CrashArming(self.workdir / "crash-markers")
        self.arming.disarm_all()
        spec = PipelineSpec(
            source=self.workdir / "input", checkpoint=self.checkpoint, table=self.table,
            url=f"http://{self.ch_proxy.address}", zookeeper=self.zk_proxy.address,
            sink=self.sink, way=self.way, sink_id=self.sink_id,
            fail_flag=self.workdir / "fail.flag", options=self.options,
        )
        env = self.arming.env() if self.sink == "clickhouse_tx" else None
        self.driver = DriverProcess(spec, self.workdir / "logs", env, standby=self.standby)
        self.driver.prestart()
        self.actor_dir = self.workdir / "actors"

    @property
    def blocked(self) -> bool:
        """The driver keeps failing without committing anything: an operator must look.

        This is how an in-doubt publish shows: recovery refuses to guess and every
        restart fails on it, by design, until ``txsink recover`` resolves it.
        """
        return self.failures_in_a_row >= self.max_failures

    def expected_ids(self) -> range:
        return range(0, self.files * self.rows_per_epoch)

    def epoch_ids(self, epoch: int) -> range:
        return range(epoch * self.rows_per_epoch, (epoch + 1) * self.rows_per_epoch)

    # -- the loop ------------------------------------------------------------------------
    def tick(self) -> None:
        now = time.monotonic()
        self._repair_due(now)
        self._supervise(now)
        self._actors(now)
        self._feed()
        self._note_fired()

    def _actors(self, now: float) -> None:
        if self.recover_loop is not None and self.recover_loop.poll(now):
            self.recover_loop = None
            self.log("  operator recover loop ended")
        if self.overlap is not None and self.overlap.due(now):
            self.log(f"  second driver overlap ended: "
                     f"{self.overlap.end(self.tally, self.driver.proc)}")
            self.overlap = None
        self.zombies = [z for z in self.zombies if not z.poll(now)]

    def _repair_due(self, now: float) -> None:
        due = [r for r in self._repairs if r[0] <= now]
        self._repairs = [r for r in self._repairs if r[0] > now]
        for _, what, repair in due:
            try:
                repair()
            except Exception as exc:  # noqa: BLE001 - a repair that fails is retried
                self.log(f"  repair failed ({what}): {exc}; retrying in 1 s")
                self._repairs.append((now + 1.0, what, repair))
                continue
            self.log(f"  repaired: {what}")

    def _supervise(self, now: float) -> None:
        done = committed_files(self.checkpoint)
        if done is not None and done[0] > self.committed:
            (self.committed, self.batches), self.last_progress = done, now
            self.failures_in_a_row = 0
        code = self.driver.poll()
        if code is not None:
            self._driver_ended(code, now)
            return
        if not self._running_seen and self.driver.running():
            self._running_seen, self.last_progress = True, now  # boot time is not a stall
        if (self._running_seen and self.files > self.committed
                and now - self.last_progress > self.stall_timeout):
            self.log(f"  watchdog: no epoch committed for {self.stall_timeout:.0f}s; "
                     "killing the driver")
            self.watchdog_kills += 1
            self.driver.kill()
            self._driver_ended(self.driver.poll() or -9, now)

    def _driver_ended(self, code: int, now: float) -> None:
        if self.restart_at == 0.0:
            self.driver_exits["killed (SIGKILL)" if code < 0 else f"exit {code}"] += 1
            if code > 0:
                self.failures_in_a_row += 1
                self.last_error = self.driver.last_error()
                self.log(f"  driver exited {code}: {self.last_error[:200]}")
            # A failed query is restarted after a pause; a killed one at once.
            self.restart_at = now + (2.0 if code > 0 else 0.0)
        if now >= self.restart_at:
            self.restart_at = 0.0
            self.driver.start()
            self._running_seen = False

    def _feed(self) -> None:
        if not self.feeding or (self.epochs is not None and self.files >= self.epochs):
            return
        while self.files - self.committed < self.max_pending and (
                self.epochs is None or self.files < self.epochs):
            write_epoch_file(self.workdir / "input", self.files, self.epoch_ids(self.files))
            self.files += 1

    def _note_fired(self) -> None:
        for name in sorted(self.armed):
            if self.arming.fired(name):
                self.armed.discard(name)
                self.fired.append(name)
                self.log(f"  crash point fired: {name}")

    def warm_up(self, timeout: float = 300.0) -> None:
        """Wait for the first committed epoch: faults before it would only hit a JVM start."""
        deadline = time.monotonic() + timeout
        while self.committed == 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the pipeline committed nothing in {timeout:.0f}s: "
                                   f"{self.driver.last_error() or 'no error printed'}")
            self.tick()
            time.sleep(0.2)
        self.log(f"[{time.monotonic() - self.started:7.1f}s] pipeline running; "
                 "injecting faults")

    # -- faults --------------------------------------------------------------------------
    def server_down(self) -> bool:
        return any(what.endswith("restart") for _, what, _ in self._repairs)

    def inject(self, fault: Fault) -> bool:
        """Apply ``fault`` now; False if it cannot apply yet (the caller retries)."""
        now = time.monotonic()
        kind = fault.kind
        if kind == "driver_kill":
            if not self.driver.running() or not self.driver.kill():
                return False
        elif kind == "worker_kill":
            if not self.driver.running() or kill_python_worker(
                    self.driver.pid, random.Random(fault.pick)) is None:
                return False
        elif kind == "crash_point":
            if self.sink != "clickhouse_tx":
                return False
            self.arming.arm(fault.target)
            self.armed.add(fault.target)
        elif kind in SERVER_FAULTS:
            if self.server_down():
                return False
            if kind == "clickhouse_kill_publish" and not self._publishing(PUBLISH_WAIT):
                return False
            server = kind.split("_")[0]
            kill_server(self.services, server)
            self._repairs.append((now + fault.duration, f"{server} restart",
                                  lambda: restart_server(self.services, server)))
        elif kind.startswith("proxy_"):
            proxy = self.ch_proxy if fault.target == "clickhouse" else self.zk_proxy
            if any(what.startswith(f"{fault.target} proxy") for _, what, _ in self._repairs):
                return False  # one lasting fault per proxy: its repair would end ours
            if kind == "proxy_cut":
                proxy.cut()
            elif kind == "proxy_delay":
                proxy.delay(fault.size)
                self._repairs.append((now + fault.duration, f"{fault.target} proxy delay off",
                                      lambda: proxy.delay(0.0)))
            else:
                proxy.blackhole()
                self._repairs.append((now + fault.duration, f"{fault.target} proxy restored",
                                      proxy.restore))
        elif kind == "task_failure":
            flag = self.driver.spec.fail_flag
            flag.touch()
            self._repairs.append((now + fault.duration, "tasks succeed again",
                                  lambda: flag.unlink(missing_ok=True)))
        elif kind in ("operator_recover", "second_driver", "zombie_task"):
            return self._start_actor(fault, now)
        else:
            raise ValueError(f"unknown fault kind {kind!r}")
        self.injected[kind] += 1
        return True

    def _publishing(self, wait: float) -> bool:
        """Whether the sink's newest xid is ``Committing`` within ``wait`` seconds, read
        straight from ZooKeeper (not through its proxy) every few milliseconds: a
        publish lasts tens of milliseconds."""
        from kazoo.client import KazooClient

        from coordinator import Coordinator, SinkAdmin, XidState

        client = KazooClient(hosts=self.services.zookeeper.hosts, timeout=5)
        try:
            client.start(timeout=5)
            coord = Coordinator(client, self.sink_id, role="chaos watcher")
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                if SinkAdmin(coord).xids([XidState.COMMITTING]):
                    return True
                time.sleep(0.005)
            return False
        except Exception:  # noqa: BLE001 - ZooKeeper down (another fault): not now
            return False
        finally:
            client.stop()
            client.close()

    def _start_actor(self, fault: Fault, now: float) -> bool:
        """Start an overlapping actor on the sink (see :mod:`tests.harness.chaos.actors`)."""
        spec = self.driver.spec
        if fault.kind == "operator_recover":
            if self.recover_loop is not None:
                return False  # one operator at a time
            argv = recover_argv(self.sink_id, spec.zookeeper, spec.zk_root, spec.url)
            self.recover_loop = RecoverLoop(argv, now + fault.duration, self.actor_dir,
                                            self.tally)
        elif fault.kind == "second_driver":
            if (self.overlap is not None or self.restart_at or not self.driver.running()):
                return False
            old, old_log = self.driver.proc, self.driver.log_file
            self.driver.start()  # the warm standby: a fresh run of the same query
            self._running_seen = False
            self.overlap = Overlap(old, old_log, self.driver.proc, self.driver.log_file,
                                   now + fault.duration)
            self.log(f"  second driver pid {self.driver.pid} started beside pid {old.pid}")
        else:
            if self.sink != "clickhouse_tx":
                return False
            out = self.actor_dir / f"zombie-{self.tally.zombie_runs + 1:05d}.out"
            self.zombies.append(ZombieRun(zombie_argv(self.sink_id, spec.zookeeper,
                                                      spec.zk_root), out, self.tally))
        self.injected[fault.kind] += 1
        return True

    def _end_actors(self, timeout: float = 120.0) -> None:
        """Let the actors run their time out while the pipeline goes on (a recover loop
        for at most 8 s, an overlap for at most 40 s, a zombie until it answers)."""
        deadline = time.monotonic() + timeout
        while ((self.recover_loop or self.overlap or self.zombies)
               and time.monotonic() < deadline):
            self.tick()
            time.sleep(0.1)
        if self.recover_loop is not None:
            self.recover_loop.finish()
            self.recover_loop = None
        if self.overlap is not None:
            self.log(f"  second driver overlap ended: "
                     f"{self.overlap.end(self.tally, self.driver.proc)}")
            self.overlap = None
        for zombie in self.zombies:
            zombie.kill()
        self.zombies = [z for z in self.zombies if not z.poll(time.monotonic())]

    # -- the end -------------------------------------------------------------------------
    def drain(self, timeout: float = 300.0) -> bool:
        """Repair everything, let the actors finish, stop feeding, wait until every input
        file is committed."""
        # ZooKeeper before ClickHouse: ClickHouse needs it to start.
        for _, what, repair in sorted(self._repairs, key=lambda r: "zookeeper" not in r[1]):
            for attempt in range(10):
                try:
                    repair()
                    break
                except Exception as exc:  # noqa: BLE001 - retried, then reported
                    self.log(f"  repair failed ({what}, attempt {attempt + 1}): {exc}")
                    time.sleep(1.0)
        self._repairs.clear()
        self._note_fired()
        self.arming.disarm_all()
        self._end_actors()  # the pipeline is still fed meanwhile: the actors overlap commits
        self.feeding = False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.blocked:
            self.tick()
            if self.committed >= self.files and self.driver.alive():
                self.driver.stop()
                return True
            time.sleep(0.2)
        why = "blocked" if self.blocked else "timed out"
        self.log(f"  drain {why}: {self.committed} of {self.files} input files committed")
        self.driver.stop(timeout=5)
        return False

    def close(self) -> None:
        """Kill the drivers and stop the proxies; safe at any stage, and to repeat."""
        for actor in (self.recover_loop, self.overlap, *self.zombies):
            if actor is not None:
                actor.kill()
        if hasattr(self, "driver"):
            self.driver.close()
        for proxy in ("ch_proxy", "zk_proxy"):
            if hasattr(self, proxy):
                getattr(self, proxy).stop()

    def finish(self, drained: bool) -> RunReport:
        """Close the proxies, count every id, ask the audit verifier."""
        self.ch_proxy.stop()
        self.zk_proxy.stop()
        url = self.services.clickhouse.url
        result = None
        try:
            result = (check_with_view(url, self.table, self.expected_ids())
                      if self.sink == "clickhouse_tx" else
                      checker.check(url, self.table, self.expected_ids()))
        except checker.CheckerError as exc:
            self.log(f"  checker: {exc}")
        verifier = "not applicable (no transaction log)"
        if self.sink == "clickhouse_tx":
            verifier = self._verify()
        return RunReport(
            sink=self.sink, seed=self.seed, elapsed=time.monotonic() - self.started,
            injected=self.injected, crash_points_fired=self.fired,
            crash_points_unfired=sorted(self.armed), driver_starts=self.driver.starts,
            driver_exits=self.driver_exits, watchdog_kills=self.watchdog_kills,
            epochs_committed=self.committed, epochs_written=self.files,
            batches_committed=self.batches,
            drained=drained, result=result, verifier=verifier,
            staging_left=staging_tables(url), last_error=self.last_error,
            blocked=self.blocked, engine=self.engine.split("(")[0], actors=self.tally,
        )

    @property
    def store(self) -> dict[str, str]:
        """The coordinator's store of the run's options, as operator arguments
        (:func:`~tests.harness.chaos.pipeline.store_options`); KeeperMap records are read
        from the server itself, not through the run's proxy (stopped once it finishes)."""
        store = store_options(self.options)
        if store.get("coordinator") == KEEPERMAP:
            store.setdefault("records_url", self.services.clickhouse.url)
        return store

    def _verify(self) -> str:
        try:
            answer = checker.run_verifier(self.services.zookeeper.hosts, sink=self.sink_id,
                                          store=self.store)
        except (checker.CheckerError, OSError) as exc:
            return f"unavailable ({exc})"
        if not any(sink.get("sink_id") == self.sink_id for sink in answer.get("sinks", [])):
            # a store without the sink's records answers "no sinks", which has no anomaly
            return f"unavailable (the coordinator's store holds no records of {self.sink_id})"
        anomalies = checker.verifier_anomalies(answer)
        if not anomalies:
            return "no anomalies"
        return f"{len(anomalies)} anomalies: " + "; ".join(anomalies[:3])


def committed_files(checkpoint: Path) -> tuple[int, int] | None:
    """(input files, micro-batches) the query has committed, from its checkpoint; None
    while its newest offsets entry cannot be read.

    Counting ``commits/`` is not enough, for two reasons seen in a soak: Spark keeps only
    the newest ``spark.sql.streaming.minBatchesToRetain`` (100) entries, so past 100
    micro-batches the count stops growing; and one micro-batch may take two input files
    (after two runs of the query overlapped). The newest committed micro-batch's offsets
    entry holds the file source's log offset, and each source-log entry holds one file
    (``maxFilesPerTrigger=1``), so the files committed are that offset + 1.
    """
    try:
        batches = [int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit()]
    except FileNotFoundError:
        return 0, 0
    if not batches:
        return 0, 0
    last = max(batches)
    try:
        lines = (checkpoint / "offsets" / str(last)).read_text().splitlines()
        return int(json.loads(lines[-1])["logOffset"]) + 1, last + 1
    except (OSError, IndexError, ValueError, KeyError, TypeError):
        return None


def staging_tables(url: str) -> int:
    """Staging tables left on the server (plain HTTP; -1 if it cannot be read)."""
    sql = "SELECT count() FROM system.tables WHERE database = 'txsink_staging'"
    try:
        resp = requests.post(url, data=sql.encode(), timeout=10)
        return int(resp.content.decode("utf-8").strip()) if resp.status_code == 200 else -1
    except (requests.RequestException, ValueError):
        return -1


def run_schedule(run: ChaosRun, plan: list[Fault], minutes: float | None = None,
                 drain_timeout: float = 300.0) -> RunReport:
    """Inject ``plan`` into ``run`` (until ``minutes`` pass, if given), drain, check."""
    run.services.up()
    run.setup()
    try:
        run.warm_up()
        deadline = time.monotonic() + minutes * 60 if minutes else None
        for index, fault in enumerate(plan, 1):
            due = time.monotonic() + fault.gap
            while time.monotonic() < due:
                run.tick()
                time.sleep(0.1)
            if (deadline and time.monotonic() >= deadline) or run.blocked:
                break
            if not _inject_when_possible(run, fault, deadline):
                run.log(f"  fault {index} ({fault.describe()}) could not apply; skipped")
                continue
            run.log(f"[{time.monotonic() - run.started:7.1f}s] fault {index}: "
                    f"{fault.describe()} (input files committed {run.committed})")
        drained = run.drain(drain_timeout)
    except BaseException:
        run.close()
        raise
    return run.finish(drained)


def _inject_when_possible(run: ChaosRun, fault: Fault, deadline: float | None,
                          patience: float = 180.0) -> bool:
    """Retry ``fault`` until it applies (a driver kill needs a running driver)."""
    give_up = time.monotonic() + patience
    while not run.inject(fault):
        now = time.monotonic()
        if now > give_up or (deadline and now > deadline) or run.blocked:
            return False
        run.tick()
        time.sleep(0.2)
    return True


def render(report: RunReport, command: str = "") -> str:
    """The soak's table: faults by kind, epochs, rows, duplicates, losses."""
    r = report.result
    lines = []
    if command:
        lines.append(f"command: {command}")
    lines.append(f"sink: {report.sink}   target: {report.engine}   seed: {report.seed}   "
                 f"elapsed: {report.elapsed / 60:.1f} min")
    lines.append(f"{'fault':<34}{'injected':>9}")
    for kind in FAULT_KINDS:
        if report.injected[kind]:
            lines.append(f"  {FAULT_LABELS[kind]:<32}{report.injected[kind]:>9}")
    lines.append(f"  {'total':<32}{sum(report.injected.values()):>9}")
    if report.injected["crash_point"]:
        lines.append(f"crash points fired: {len(report.crash_points_fired)} "
                     f"(armed, never reached: {len(report.crash_points_unfired)})")
    exits = ", ".join(f"{k}: {v}" for k, v in sorted(report.driver_exits.items())) or "none"
    lines.append(f"driver starts: {report.driver_starts}   exits: {exits}   "
                 f"watchdog kills: {report.watchdog_kills}")
    lines += report.actors.lines()
    lines.append(f"input files committed: {report.epochs_committed} of "
                 f"{report.epochs_written} (in {report.batches_committed} micro-batches)"
                 + ("" if report.drained else "   (NOT DRAINED)")
                 + ("   BLOCKED: the driver fails on every restart" if report.blocked else ""))
    if r is None:
        lines.append("checker: target unreadable")
    else:
        lines += [
            f"rows expected: {r.expected}   rows found: {r.found_rows}",
            f"duplicates: {r.duplicates}   losses: {r.losses}   unexpected: {r.unexpected}",
        ]
    lines.append(f"audit verifier: {report.verifier}")
    lines.append(f"staging tables left: {report.staging_left}")
    if report.last_error:
        lines.append(f"last driver error: {report.last_error[:300]}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.harness.chaos.schedule",
                                description="seeded random faults over a streaming run")
    p.add_argument("--seed", type=int, default=None, help="default: random, printed")
    p.add_argument("--minutes", type=float, default=None, help="inject faults this long")
    p.add_argument("--faults", type=int, default=None, help="or inject this many faults")
    p.add_argument("--sink", choices=("clickhouse_tx", "clickhouse_plain"),
                   default="clickhouse_tx")
    p.add_argument("--rows-per-epoch", type=int, default=2000)
    p.add_argument("--engine", choices=sorted(ENGINES), default="replicated",
                   help="target engine: replicated (publish strategy attach_replicated) "
                        "or merge_tree (attach_marked)")
    p.add_argument("--kinds", default=",".join(FAULT_KINDS), help="comma-separated")
    p.add_argument("--gap", default="3,12", help="min,max seconds between faults")
    p.add_argument("--standby", type=int, default=1,
                   help="warm standby drivers kept booted for restarts and second drivers")
    p.add_argument("--port-base", type=int, default=28300,
                   help="private servers on port-base+1 .. +4")
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--keep", action="store_true",
                   help="keep the work folder (driver logs, checkpoint, server data)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    unknown = set(kinds) - set(FAULT_KINDS)
    if unknown:
        raise SystemExit(f"unknown fault kinds: {', '.join(sorted(unknown))}")
    gap = tuple(float(x) for x in args.gap.split(","))
    if args.minutes is None and args.faults is None:
        args.faults = 10
    count = args.faults if args.faults is not None else int(args.minutes * 60 / gap[0]) + 1
    plan = plan_faults(seed, count, kinds, (gap[0], gap[1]))
    command = (f"python -m tests.harness.chaos.schedule --seed {seed} --engine {args.engine} "
               f"--gap {args.gap} "
               + (f"--kinds {','.join(kinds)} " if kinds != FAULT_KINDS else "")
               + (f"--standby {args.standby} " if args.standby != 1 else "")
               + (f"--minutes {args.minutes:g}" if args.minutes else f"--faults {args.faults}"))
    print(f"seed {seed}: {command}", flush=True)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="txsink-chaos-"))
    services = private_services(workdir / "services", args.port_base)
    run = ChaosRun(workdir / args.sink, services, sink=args.sink, engine=ENGINES[args.engine],
                   rows_per_epoch=args.rows_per_epoch, seed=seed, standby=args.standby,
                   log=lambda line: print(line, flush=True))
    try:
        report = run_schedule(run, plan, minutes=args.minutes)
    finally:
        services.down()
    print(render(report, command), flush=True)
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if report.exactly_once else 1


if __name__ == "__main__":
    sys.exit(main())
