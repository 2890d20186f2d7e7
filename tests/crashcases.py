"""The cases and the pipeline of the crash-point suites (batch and streaming), per server.

A pipeline run per point costs 15-40 s on the 2-core CI machine (a restart waits for the
dead driver's ZooKeeper session to expire), too much to try every point in every mode on
every server. So:

- on ClickHouse 18.16 (plain target: strategy ``attach_marked``) the batch suite tries
  every point of ``CRASH_POINTS``, and the streaming suite one point per state the dead
  driver leaves its xid in (``STREAM_POINTS``);
- on the modern server (26.x, plain target: strategy ``move``) each suite tries one point
  of the publish path (``MOVE_POINTS``).

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
(``abort.after_decision``). Every step between them is tried in the batch suite.

With the coordinator's records in KeeperMap (``km26``: the modern server with a
``<zookeeper>`` section, ``coordinator=keepermap``, no ZooKeeper given to the sink) the
two suites together try each point of ``STREAM_POINTS`` once: one per state a killed
driver leaves its xid in, split between the modes. The store changes where the records
live and how a dead driver's session ends (its expiry, reaped by the next reader), not
the steps between the states; how the repeat starts depends on the mode and the state
only, and is tried for every state in both modes on 18.16.

Why the ``move`` subset is sound:

- Only publish depends on the strategy. ``branch.*`` (task side) and ``abort.*`` end in
  a rollback that drops staging, the same statement on every server; ``commit.*`` are
  ZooKeeper transitions around publish; ``consolidate.*`` builds the combined table with
  ``ATTACH PARTITION ... FROM`` whatever the strategy. ``publish.after_drop_staging_
  partition`` is never reached with ``move`` (a move leaves no staging partition to drop).
- ``move`` decides a repeat on its own evidence, the staging partitions: one that the
  intent names and staging no longer holds was moved already; one that staging still
  holds is moved now. The two points between which that evidence changes are
  ``publish.after_intent`` (intent written, nothing moved: the repeat must move it) and
  ``publish.after_attach`` (MOVE PARTITION done, not marked: the repeat must find staging
  empty and not take that for a loss). ``publish.before_partition`` and
  ``publish.after_mark`` leave no such question (nothing recorded / marked published).
- How the repeat is started is the mode's business (batch: ``txsink recover`` at the
  next job's start; streaming: the restarted query replays its micro-batch), is the same
  for every strategy, and is tried at every point on 18.16. So each suite takes one of
  the two points: batch the MOVE done (``after_attach``), streaming the MOVE not done
  (``after_intent``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from coordinator.steps import ABORT_AFTER_DECISION, COMMIT_AFTER_COMMITTED, COMMIT_AFTER_DECISION
from tests.conftest import RECORDS_DATABASE, run_sql
from tests.sinkutil import SHORT_SESSION
from txsink.crashpoints import BRANCH_AFTER_PREPARE, CRASH_POINTS
from txsink.harness.chaos.crashrun import CrashPointRun

#: The points tried on 18.16, per mode (see the module docstring).
STREAM_POINTS = (BRANCH_AFTER_PREPARE, COMMIT_AFTER_DECISION, "publish.after_attach",
                 COMMIT_AFTER_COMMITTED, ABORT_AFTER_DECISION)
CLASSIC_POINTS = {"batch": CRASH_POINTS, "stream": STREAM_POINTS}
#: The points tried on 26.x, per mode (see the module docstring).
MOVE_POINTS = {"batch": ("publish.after_attach",), "stream": ("publish.after_intent",)}


#: The points tried with the coordinator's records in KeeperMap (``km26``: the modern
#: server, strategy ``move``): each of ``STREAM_POINTS`` once over both modes (the store
#: changes where the records live, not the steps; see the module docstring).
KEEPERMAP_POINTS = {"batch": (BRANCH_AFTER_PREPARE, "publish.after_attach",
                              ABORT_AFTER_DECISION),
                    "stream": (COMMIT_AFTER_DECISION, COMMIT_AFTER_COMMITTED)}


def cases(mode: str) -> list:
    """``(server, point)`` for ``crash_run`` (the server, indirect) and ``point``; the ids
    name the server (``km26``: the modern server with ``coordinator=keepermap``)."""
    return ([pytest.param("ch18", p, id=f"ch18-{p}") for p in CLASSIC_POINTS[mode]]
            + [pytest.param("ch26", p, id=f"ch26-{p}") for p in MOVE_POINTS[mode]]
            + [pytest.param("km26", p, id=f"km26-{p}")
               for p in KEEPERMAP_POINTS.get(mode, ())])


def crash_point_run(request, tmp_path_factory, zk_hosts: str, mode: str
                    ) -> Iterator[CrashPointRun]:
    """One long-lived pipeline (``mode`` batch or stream) on the server ``request.param``
    names, in a fresh database and ZooKeeper chroot; both are removed afterwards."""
    url = request.getfixturevalue({"ch18": "clickhouse_url", "ch26": "modern_clickhouse_url",
                                   "km26": "keepermap_url"}[request.param])
    db, chroot = f"t_{uuid.uuid4().hex[:10]}", f"/tests/{uuid.uuid4().hex[:10]}"
    points = len({"ch18": CLASSIC_POINTS, "ch26": MOVE_POINTS,
                  "km26": KEEPERMAP_POINTS}[request.param][mode])
    options = dict(SHORT_SESSION)  # a restart waits for the dead driver's lease to expire
    if request.param == "km26":  # the records in KeeperMap, the sink given no ZooKeeper
        request.getfixturevalue("records_table")
        options |= {"coordinator": "keepermap", "records_table": f"{RECORDS_DATABASE}.records",
                    "zk_root": chroot}  # a root of its own in the shared records table
    run = CrashPointRun(tmp_path_factory.mktemp(f"crash-{mode}-{request.param}"), url,
                        zk_hosts + chroot, f"{db}.events", mode=mode,
                        standby=min(2, points),  # warm drivers to restart with
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
