"""The cases and the pipeline of the crash-point suites (batch and streaming), per server.

A pipeline run per point costs 10-30 s on the 2-core CI machine, and each pipeline's
first epoch another 30-40 s (its driver boots cold), too much to try every point in
every mode on every server and store. So:

- on ClickHouse 18.16 (plain target: strategy ``attach_marked``, records in ZooKeeper)
  the batch suite tries every point of ``CRASH_POINTS``, and the streaming suite one
  point per state the dead driver leaves its xid in (``STREAM_POINTS``);
- on the modern server (26.x, plain target: strategy ``move``) the records live in
  KeeperMap (``km26``: the server has a ``<zookeeper>`` section, ``coordinator=
  keepermap``, no ZooKeeper given to the sink), and the two suites together try one
  point per state of ``STREAM_POINTS``, among them the two points of ``move``'s publish
  path (``MODERN_POINTS``).

A batch job writes 3 tasks per epoch, published through the combined table (two
sources attached from their own staging, one from the pre-combined table: ``combine.*``
is passed); a micro-batch writes 2, published directly one after the other (``publish.*``
twice, ``commit.after_branch_published`` between them). The publish points are the same
code either way (a combined table is published as a task branch is), so each suite
tries them on the path its mode takes.

Why the streaming subset is sound: what a mode adds is how the repeat starts (batch:
``txsink recover`` at the next job's start, then a rerun if nothing is visible;
streaming: the restarted query replays its micro-batch under the same epoch), and that
depends only on the state of the xid, not on the step inside it. Recovery and replay
then run the same coordinator and publish code. The states and their points:
``Initialized`` (``branch.*``; ``branch.after_prepare``, the latest, leaves the most
behind: prepared branches of a generation the replay must not commit), ``Committing``
with nothing published (``commit.after_decision``), ``Committing`` with rows visible but
not marked published (``publish.after_attach``), ``Committed`` before its clean-up
(``commit.after_committed``: the replay must not write again) and ``Aborting``
(``abort.after_decision``). Every step between them is tried in the batch suite, the
retention's (``retain.*``, after ``Committed``: the pipelines run with a retention of 1 s,
so each commit removes the epochs before it) among them.

Why the modern subset is sound. The store, the strategy and the mode are separate
layers, and each is tried where it can differ:

- The KeeperMap store changes where the records live and how a dead driver's session
  ends (its expiry, reaped by the next reader), not the steps between the states: one
  point per state suffices, split between the modes (each mode's restart runs over the
  store). ``publish.after_intent`` stands for ``Committing`` with nothing visible
  (``commit.after_decision`` is the same state without the intent).
- Only publish depends on the strategy. ``branch.*`` (task side) and ``abort.*`` end in
  a rollback that drops staging, the same statement on every server; ``commit.*`` are
  coordinator transitions around publish; ``combine.*`` builds the combined table
  with ``ATTACH PARTITION ... FROM`` whatever the strategy. ``publish.after_drop_
  staging_partition`` is never reached with ``move`` (a move leaves no staging partition
  to drop).
- ``move`` decides a repeat on its own evidence, the staging partitions: one that the
  intent names and staging no longer holds was moved already; one that staging still
  holds is moved now. The two points between which that evidence changes are
  ``publish.after_intent`` (intent written, nothing moved: the repeat must move it) and
  ``publish.after_attach`` (MOVE PARTITION done, not marked: the repeat must find staging
  empty and not take that for a loss). ``publish.before_partition`` and
  ``publish.after_mark`` leave no such question (nothing recorded / marked published).
  Each suite takes one of the two: batch the MOVE done, streaming the MOVE not done.
- The ZooKeeper store is tried at every point on 18.16; the store is not a party to the
  strategy's evidence (staging partitions on the server), so ``move`` over ZooKeeper
  needs no pipeline of its own.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from coordinator.formats.steps import (
    ABORT_AFTER_DECISION,
    COMMIT_AFTER_COMMITTED,
    COMMIT_AFTER_DECISION,
)
from tests.conftest import RECORDS_DATABASE, run_sql
from tests.harness.chaos.crashrun import CrashPointRun
from tests.sinkutil import SHORT_SESSION
from txsink.core.crashpoints import BRANCH_AFTER_PREPARE, CRASH_POINTS

#: The points tried on 18.16, per mode (see the module docstring).
STREAM_POINTS = (BRANCH_AFTER_PREPARE, COMMIT_AFTER_DECISION, "publish.after_attach",
                 COMMIT_AFTER_COMMITTED, ABORT_AFTER_DECISION)
CLASSIC_POINTS = {"batch": CRASH_POINTS, "stream": STREAM_POINTS}
#: The points tried on the modern server with the records in KeeperMap, per mode: one
#: per state of ``STREAM_POINTS`` over both modes, ``move``'s two evidence points among
#: them (see the module docstring).
MODERN_POINTS = {"batch": (BRANCH_AFTER_PREPARE, "publish.after_attach", ABORT_AFTER_DECISION),
                 "stream": ("publish.after_intent", COMMIT_AFTER_COMMITTED)}
#: Per server id: its points per mode, and the fixture of its URL.
POINTS = {"ch18": CLASSIC_POINTS, "km26": MODERN_POINTS}
URL_FIXTURES = {"ch18": "clickhouse_url", "km26": "keepermap_url"}


def cases(mode: str) -> list:
    """``(server, point)`` for ``crash_run`` (the server, indirect) and ``point``; the ids
    name the server (``km26``: the modern server with ``coordinator=keepermap``)."""
    return [pytest.param(server, p, id=f"{server}-{p}")
            for server, points in POINTS.items() for p in points[mode]]


def crash_point_run(request, tmp_path_factory, zk_hosts: str, mode: str,
                    way: str = "datasource", points: int | None = None,
                    options_given: dict[str, str] | None = None) -> Iterator[CrashPointRun]:
    """One long-lived pipeline (``mode`` batch or stream, written the pipeline's ``way``)
    on the server ``request.param`` names, in a fresh database and ZooKeeper chroot; both
    are removed afterwards. ``points``: how many points it will run (default: the
    server's of ``mode``); ``options_given``: the sink's, beside the suites' own."""
    url = request.getfixturevalue(URL_FIXTURES[request.param])
    db, chroot = f"t_{uuid.uuid4().hex[:10]}", f"/tests/{uuid.uuid4().hex[:10]}"
    points = points if points is not None else len(POINTS[request.param][mode])
    options = dict(SHORT_SESSION)  # a restart waits for the dead driver's lease to expire
    options["retention"] = "1"  # every commit's retention pass removes the earlier epochs
    options |= options_given or {}
    if request.param == "km26":  # the records in KeeperMap, the sink given no ZooKeeper
        request.getfixturevalue("records_table")
        options |= {"coordinator": "keepermap", "records_table": f"{RECORDS_DATABASE}.records",
                    "zk_root": chroot}  # a root of its own in the shared records table
    run = CrashPointRun(tmp_path_factory.mktemp(f"crash-{mode}-{request.param}"), url,
                        zk_hosts + chroot, f"{db}.events", mode=mode, way=way,
                        points=points,  # no more warm standbys booted than restarts left
                        options=options)
    admin = KazooClient(hosts=zk_hosts)
    admin.start(timeout=15)
    admin.ensure_path(chroot)
    try:
        run.setup()
        yield run
    finally:
        run.close()
        run_sql(url, f"DROP DATABASE IF EXISTS `{db}`")
        admin.delete(chroot, recursive=True)
        admin.stop()
        admin.close()


def assert_exactly_once_after(outcome, point: str, what: str = "the pipeline") -> None:
    """The crash at ``point`` happened (a SIGKILL), left no duplicate or stray row, and the
    restart or rerun ended with every id exactly once."""
    assert outcome.fired, f"{what} never reached {point}: {outcome.explain()}"
    assert outcome.exit_code == -9, outcome.explain()
    assert outcome.after_crash is not None, outcome.explain()
    assert outcome.after_crash.duplicates == 0, outcome.explain()
    assert outcome.after_crash.unexpected == 0, outcome.explain()
    assert outcome.after_restart is not None, outcome.explain()
    assert outcome.after_restart.exactly_once, outcome.explain()
