"""``./run demo``: the same faulty streaming run through ``clickhouse_tx`` and a plain writer.

What it shows, in a few minutes:

1. A private ClickHouse + ZooKeeper pair starts on ports 28101..28104 (its own data
   folder, so the demo may kill it without touching anything else). With
   ``--server modern`` the ClickHouse is a modern 26.x server (from the chdb wheel,
   :mod:`tests.harness.modern_server`) on ports 28105/28106 instead of the 18.16 one;
   the sink picks its publish strategy by itself (``move`` there). With
   ``--coordinator keepermap`` (modern only) that ZooKeeper is the server's Keeper and
   ``clickhouse_tx`` keeps its coordinator's records in a KeeperMap table of the server
   (made as ``txsink records create`` makes it), with no ZooKeeper of its own; killing
   ZooKeeper then takes the records table away from under the sink.
2. A streaming pipeline (:mod:`tests.harness.chaos.pipeline`, its own driver process) reads
   uniquely keyed event files, one file per micro-batch, and writes them through
   ``clickhouse_tx`` into a plain MergeTree table. At seeded epochs, the moment that
   epoch's first rows reach the server (or become visible in the target), the chaos
   runner kills -9 the driver, the ClickHouse server or ZooKeeper; killed servers come
   back after a second and a half, a killed or failed driver is restarted from its
   checkpoint.
3. The same events, with the same faults at the same moments, go through
   ``clickhouse_plain``: the usual at-least-once writer (direct INSERTs, no commit
   protocol); ``--without-plain`` leaves this comparison out.
4. The independent checker counts every id in each target over plain HTTP and the
   audit verifier (``txsink verify``) reads the transaction history.

With ``--way foreach_batch`` both go through ``writeStream.foreachBatch`` instead of a
data source: ``txsink.foreach_batch`` against the plain insert of
``txsink.spark.plain_batches`` (at-least-once, as ``clickhouse_plain``). Nothing of
``pyspark.sql.datasource`` is then used, so the demo runs on every PySpark from 3.5 (the
default way where the PySpark has no Arrow stream writer, i.e. before 4.1).

Exit code 0 iff ``clickhouse_tx`` shows no duplicate and no loss.
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from tests.harness.chaos import jvm
from tests.harness.chaos.checker import CheckerError, count_in_range
from tests.harness.chaos.faults import private_services
from tests.harness.chaos.pipeline import DATASOURCE, FOREACH_BATCH
from tests.harness.chaos.schedule import ChaosRun, Fault, RunReport
from tests.harness.services import Services
from txsink.ops.cli import create_records_table
from txsink.options import DEFAULT_RECORDS_TABLE, KEEPERMAP, ZOOKEEPER

PORT_BASE = 28100
#: ``--server`` choices: the Debian ClickHouse 18.16, or the modern 26.x from chdb.
SERVER_LABELS = {"18.16": "ClickHouse 18.16", "modern": "the modern ClickHouse 26.x (chdb)"}
SINKS = ("clickhouse_tx", "clickhouse_plain")
#: ``--way`` choices: the stream reaches the sink through its data source (PySpark 4.1+)
#: or through ``writeStream.foreachBatch`` (every PySpark from 3.5).
WAYS = (DATASOURCE, FOREACH_BATCH)
#: What each sink's run is called in the demo's output, per way.
LABELS = {DATASOURCE: {"clickhouse_tx": "clickhouse_tx", "clickhouse_plain": "clickhouse_plain"},
          FOREACH_BATCH: {"clickhouse_tx": "txsink.foreach_batch",
                          "clickhouse_plain": "plain_foreach_batch"}}
WRITING, PUBLISHING = "writing", "publishing"
#: The demo's faults and the moment of their epoch at which each strikes:
#: ``writing``: the epoch's first rows have reached the server (``clickhouse_tx``:
#: staging; ``clickhouse_plain``: the target); ``publishing``: its first rows are visible
#: in the target. ClickHouse is killed while writing only: on a plain MergeTree target a
#: server restart inside ``clickhouse_tx``'s publish can leave that publish in doubt for
#: an operator (docs/reliability.md, "Limits"), which is not what a demo should stop on.
DEMO_FAULTS = (("driver_kill", WRITING), ("clickhouse_kill", WRITING),
               ("zookeeper_kill", PUBLISHING), ("driver_kill", PUBLISHING),
               ("clickhouse_kill", WRITING), ("driver_kill", WRITING))
#: Options of both sinks; ``clickhouse_tx`` adds its coordinator's (:func:`sink_options`).
OPTIONS = {"timeout": "10", "insert_block_rows": "1000"}
RECORDS_TABLE = DEFAULT_RECORDS_TABLE  # coordinator=keepermap: the records' table
STAGING_ROWS_SQL = (
    "SELECT sum(rows) FROM system.parts WHERE database = 'txsink_staging' AND active "
    "AND match(table, '_e{epoch}_')"
)


@dataclass(frozen=True)
class DemoFault:
    epoch: int
    moment: str
    fault: Fault

    def describe(self) -> str:
        return f"epoch {self.epoch} {self.moment} -> {self.fault.describe()}"


def plan_demo(epochs: int, seed: int) -> list[DemoFault]:
    """Which epoch gets which fault: spread over the run, order drawn from the seed."""
    rng = random.Random(seed)
    faults = list(DEMO_FAULTS)
    rng.shuffle(faults)
    usable = list(range(1, max(2, epochs - 1)))
    chosen = sorted(rng.sample(usable, min(len(faults), len(usable))))
    return [DemoFault(epoch, moment,
                      Fault(kind, 0.0, duration=0.0 if kind == "driver_kill" else 1.5))
            for epoch, (kind, moment) in zip(chosen, faults, strict=False)]


def sink_options(sink: str, coordinator: str = ZOOKEEPER) -> dict[str, str]:
    """The demo's options of ``sink``. With ``coordinator=keepermap``, ``clickhouse_tx``
    keeps its records in the KeeperMap table :data:`RECORDS_TABLE` of the server it
    writes to, and the pipeline gives it no ZooKeeper; ``clickhouse_plain`` has no
    coordinator."""
    options = dict(OPTIONS)
    if sink == "clickhouse_tx" and coordinator == KEEPERMAP:
        options.update(coordinator=KEEPERMAP, records_table=RECORDS_TABLE)
    return options


def prepare_store(services: Services, coordinator: str) -> str:
    """Make the store of ``clickhouse_tx``'s records ready; one line saying which it is.

    ZooKeeper needs nothing; the KeeperMap table is created the way an operator creates
    it (``txsink records create``), on the demo's server.
    """
    if coordinator != KEEPERMAP:
        return f"coordinator records: ZooKeeper {services.zookeeper.hosts}"
    create_records_table(services.clickhouse.url, RECORDS_TABLE)
    return (f"coordinator records: KeeperMap table {RECORDS_TABLE} on "
            f"{services.clickhouse.url} (its Keeper: the ZooKeeper "
            f"{services.zookeeper.hosts}; clickhouse_tx is given no ZooKeeper)")


def default_way() -> str:
    """The data source where this PySpark can stream through it (4.1+), else
    ``foreach_batch``."""
    from txsink.spark.versions import has_stream_arrow_writer

    return DATASOURCE if has_stream_arrow_writer() else FOREACH_BATCH


class _LineBar:
    """The few calls of ``tqdm`` the demo makes, as plain lines, where tqdm is missing
    (a PySpark virtualenv made for the tests has no tqdm)."""

    def __init__(self, total: int, unit: str, desc: str) -> None:
        self.n, self.total, self.unit, self.desc = 0, total, unit, desc

    def __enter__(self) -> _LineBar:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def refresh(self) -> None:
        print(f"{self.desc}: {self.n}/{self.total} {self.unit}s", flush=True)

    def write(self, line: str) -> None:
        print(line, flush=True)


def progress_bar(total: int):
    try:
        from tqdm import tqdm
    except ImportError:
        return _LineBar(total, "epoch", "epochs committed")
    return tqdm(total=total, unit="epoch", desc="epochs committed")


def _show(bar, value: int) -> None:
    if bar.n != value:
        bar.n = value
        bar.refresh()


def _rows_on_server(run: ChaosRun, epoch: int, moment: str) -> int:
    """Rows of ``epoch`` visible in the target, plus (while writing) in staging tables."""
    ids = run.epoch_ids(epoch)
    url = run.services.clickhouse.url
    rows = count_in_range(url, run.table, ids.start, ids.stop)
    if moment == WRITING and run.sink == "clickhouse_tx" and not rows:
        resp = requests.post(url, data=STAGING_ROWS_SQL.format(epoch=epoch).encode(),
                             timeout=5)
        text = resp.content.decode("utf-8").strip()
        rows = int(text) if resp.status_code == 200 and text.isdigit() else 0
    return rows


def _wait_for_moment(run: ChaosRun, planned: DemoFault, bar, offset: int) -> None:
    """Return as soon as the planned moment of the epoch has come (or the epoch is done).

    The server is polled every few milliseconds so that the fault lands inside the
    epoch's write or publish, not after Spark has recorded it.
    """
    next_tick = 0.0
    while not run.blocked:
        now = time.monotonic()
        if now >= next_tick:
            run.tick()
            _show(bar, offset + run.committed)
            next_tick = now + 0.25
            if run.committed > planned.epoch:
                return
        try:
            if _rows_on_server(run, planned.epoch, planned.moment):
                return
        except (CheckerError, requests.RequestException):
            time.sleep(0.2)  # the server is restarting
        time.sleep(0.003)


def run_one(run: ChaosRun, plan: list[DemoFault], bar, offset: int,
            next_run: ChaosRun | None = None) -> RunReport:
    """Feed ``run.epochs`` epochs through one sink with the demo's faults; check it.

    ``next_run`` is prepared (its driver starts booting) once this run is under way, so
    that its Spark start-up overlaps this run's waits.
    """
    run.setup()
    try:
        for planned in plan:
            if next_run is not None and run.committed and not run.server_down():
                next_run.prepare()
                next_run = None
            _wait_for_moment(run, planned, bar, offset)
            while not run.blocked and not run.inject(planned.fault):
                run.tick()
                time.sleep(0.05)
            if run.blocked:
                break
            bar.write(f"  [{time.monotonic() - run.started:5.0f}s] {LABELS[run.way][run.sink]}: "
                      f"{planned.describe()}")
        drained = _drain(run, bar, offset)
    except BaseException:
        run.close()
        raise
    _show(bar, offset + run.committed)
    return run.finish(drained)


def _drain(run: ChaosRun, bar, offset: int, timeout: float = 240.0) -> bool:
    deadline = time.monotonic() + timeout
    while run.files < (run.epochs or 0) or run.committed < run.files:
        if time.monotonic() > deadline or run.blocked:
            break
        run.tick()
        _show(bar, offset + run.committed)
        time.sleep(0.1)
    return run.drain(timeout=max(10.0, deadline - time.monotonic()))


def render(reports: dict[str, RunReport], way: str = DATASOURCE) -> str:
    """The table of both runs' figures (``clickhouse_tx``'s alone without the comparison),
    the verifier's finding and the verdict; the runs named as ``way`` wrote them."""
    tx, plain = reports["clickhouse_tx"], reports.get("clickhouse_plain")
    tx_name, plain_name = LABELS[way]["clickhouse_tx"], LABELS[way]["clickhouse_plain"]
    rows = [
        ("rows expected", lambda r: r.result.expected if r.result else "?"),
        ("rows found", lambda r: r.result.found_rows if r.result else "?"),
        ("duplicates", lambda r: r.result.duplicates if r.result else "?"),
        ("losses", lambda r: r.result.losses if r.result else "?"),
        ("faults injected", lambda r: sum(r.injected.values())),
        ("driver (re)starts", lambda r: r.driver_starts),
        ("epochs committed", lambda r: r.epochs_committed),
    ]
    lines = [f"{'':<20}{tx_name:>22}" + (f"{plain_name:>22}" if plain else ""),
             f"{'':<20}{'(exactly-once)':>22}" + (f"{'(at-least-once)':>22}" if plain else "")]
    for label, get in rows:
        lines.append(f"{label:<20}{get(tx)!s:>22}" + (f"{get(plain)!s:>22}" if plain else ""))
    lines.append("")
    lines.append(f"txsink verify ({tx_name} history): {tx.verifier}")
    verdict = "EXACTLY ONCE" if tx.exactly_once else "NOT EXACTLY ONCE"
    lines.append(f"{tx_name}: {verdict}")
    if plain and plain.result and plain.result.duplicates:
        lines.append(f"{plain_name}: {plain.result.duplicates} duplicated rows "
                     "from the same faults")
    if tx.blocked:
        lines.append(f"{tx_name} stopped: every restart failed on the same xid "
                     "(an in-doubt publish: see `txsink status`, resolve with `txsink recover`)")
    if not tx.exactly_once and tx.last_error:
        lines.append(f"last {tx_name} driver error: {tx.last_error[:300]}")
    return "\n".join(lines)


def server_version(url: str) -> str:
    """``SELECT version()`` over plain HTTP, or ``?`` when the server does not answer."""
    try:
        resp = requests.post(url, data=b"SELECT version()", timeout=5)
    except requests.RequestException:
        return "?"
    return resp.content.decode("utf-8").strip() if resp.status_code == 200 else "?"


def main(args: argparse.Namespace) -> int:
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    epochs, rows = args.epochs, args.rows_per_epoch
    server = getattr(args, "server", "18.16")
    coordinator = getattr(args, "coordinator", ZOOKEEPER)
    sinks = SINKS[:1] if getattr(args, "without_plain", False) else SINKS
    way = getattr(args, "way", None) or default_way()
    names = LABELS[way]
    workdir = Path(tempfile.mkdtemp(prefix="txsink-demo-"))
    services = private_services(workdir / "services", PORT_BASE, server,
                                keeper=coordinator == KEEPERMAP)
    through = (f"{names['clickhouse_tx']} and then {names['clickhouse_plain']} under the same "
               "faults" if len(sinks) > 1 else
               f"{names['clickhouse_tx']} under injected faults (no at-least-once comparison)")
    print(f"demo (seed {seed}) against {SERVER_LABELS[server]}: {epochs} epochs x "
          f"{rows} rows, through {through}")
    print(f"starting a private ClickHouse ({services.clickhouse.url}) and ZooKeeper "
          f"({services.zookeeper.hosts}) that the demo may kill")
    plan = plan_demo(epochs, seed)
    reports: dict[str, RunReport] = {}
    runs: list[ChaosRun] = []
    try:
        services.up()
        print(f"ClickHouse {server_version(services.clickhouse.url)} "
              f"({services.clickhouse.url}) and ZooKeeper ready")
        print(prepare_store(services, coordinator))
        if jvm.ensure_archive(quiet=False) is None:
            print("fast Spark driver start-up unavailable: drivers start the slow way")
        with progress_bar(epochs * len(sinks)) as bar:
            runs = [ChaosRun(workdir / sink, services, sink=sink, way=way,
                             table=f"demo.events_{sink.split('_')[1]}",
                             rows_per_epoch=rows, epochs=epochs, seed=seed,
                             options=sink_options(sink, coordinator),
                             stall_timeout=90.0, log=bar.write)
                    for sink in sinks]
            for index, run in enumerate(runs):
                following = runs[index + 1] if index + 1 < len(runs) else None
                reports[run.sink] = run_one(run, plan, bar, index * epochs, following)
    finally:
        for run in runs:
            run.close()
        services.down()
        shutil.rmtree(workdir, ignore_errors=True)
    print()
    print(render(reports, way))
    return 0 if reports["clickhouse_tx"].exactly_once else 1
