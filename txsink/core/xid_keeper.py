"""The keeper: holds a batch job's xid alive for as long as its Spark driver lives.

Why a process of its own: Spark begins a batch job's xid in a Python *planner* worker,
which it stops after a minute idle, long before a big job decides. A liveness holder of
that worker's session (``coordinator/protocol/liveness.py``) would vanish mid-job and the job
would look abandoned. So the planner starts a keeper, detached in its own session (a
kill of the driver's process group leaves it), which joins the xid's holders and holds
until the xid is decided or the Spark driver process (the nearest ``java`` ancestor of
the planner, else its parent) is gone. Then it ends its session (ZooKeeper's, or the
KeeperMap store's), and with it the holder: ``txsink recover``/``gc`` see the writer gone.

Contract: :func:`start` returns once the keeper holds (True) or failed (False, logged);
the caller keeps its own holder until the keeper holds. :func:`hand_over` does that in a
background thread, so the job does not wait for the keeper's start (~1 s), and only for a
job still undecided after ``HAND_OVER_AFTER`` seconds: a short job needs no keeper. The keeper
never writes a record: it only joins and leaves the holders.

Usage (``python -m txsink.core.xid_keeper`` reads its settings as one JSON line on stdin, so
credentials never appear in a process listing)::

    coord.begin(epoch, generation, hold="batch driver")
    keeper.hand_over(options, coord, epoch)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from coordinator import Coordinator, XidState
from txsink.options import ConnectionOptions, SinkOptions, StoreOptions

log = logging.getLogger(__name__)

POLL_SECONDS = 0.5  # how often the keeper looks at the driver and the xid
START_SECONDS = 30.0  # how long the planner waits for the keeper to hold
HAND_OVER_AFTER = 15.0  # seconds a job runs before its planner starts a keeper


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (None: no such process)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw.rsplit(")", 1)[1].split()


def driver_pid(otherwise: int | None = None) -> int:
    """The Spark driver's process: the nearest ``java`` ancestor, else ``otherwise`` (by
    default the parent)."""
    pid = os.getppid()
    while pid > 1:
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "java":
                return pid
        except OSError:
            break
        fields = _stat(pid)
        if fields is None:
            break
        pid = int(fields[1])
    return os.getppid() if otherwise is None else otherwise


def _alive(pid: int, started: str | None) -> bool:
    """``pid`` still runs and is the process first seen (start time), not a zombie."""
    fields = _stat(pid)
    if fields is None:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True
    return fields[0] != "Z" and (started is None or fields[19] == started)


#: the options a keeper needs to reach the node store (credentials included: they travel
#: on the keeper's stdin, never on its command line)
CONNECTION_FIELDS = ("url", "user", "password", "timeout", "retries", "ca_file")


def store_settings(options: SinkOptions) -> dict[str, object]:
    return {"connection": {name: getattr(options.connection, name)
                           for name in CONNECTION_FIELDS},
            "store": dataclasses.asdict(options.store)}


def start(options: SinkOptions, sink_id: str, epoch: int) -> bool:
    """Start a keeper for xid ``(sink_id, epoch)``; True once it holds."""
    watched = driver_pid()
    fields = _stat(watched)
    settings = {"store": store_settings(options), "zk_root": options.store.zk_root,
                "sink_id": sink_id, "epoch": epoch, "pid": watched,
                "started": fields[19] if fields else None}
    try:
        proc = subprocess.Popen([sys.executable, "-m", "txsink.core.xid_keeper"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, start_new_session=True,
                                text=True)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(settings) + "\n")
        proc.stdin.close()
        line = _read_line(proc, START_SECONDS)
    except OSError as exc:
        log.warning("txsink sink=%s epoch=%d: no keeper (%s); the planner's session "
                    "holds the xid", sink_id, epoch, exc)
        return False
    if line != "held":
        log.warning("txsink sink=%s epoch=%d: the keeper did not hold (%r); the planner's "
                    "session holds the xid", sink_id, epoch, line)
        proc.kill()
    # reap it when it ends (with its xid's decision or the driver), leaving no zombie
    threading.Thread(target=proc.wait, name=f"txsink-keeper-reaper-{epoch}",
                     daemon=True).start()
    return line == "held"


def hand_over(options: SinkOptions, coord: Coordinator, epoch: int,
              delay: float = HAND_OVER_AFTER) -> threading.Thread:
    """In the background: after ``delay`` seconds, if the xid is still undecided, start a
    keeper; once it holds, release ``coord``'s holder.

    Why wait: most batch jobs decide within seconds, and a keeper is a Python process of
    its own (~1 s of CPU to start, on the cores the job's tasks run on). The planner's own
    holder lives until Spark stops the idle planner worker (about a minute), so a keeper
    that starts within ``HAND_OVER_AFTER`` is in time.
    """
    def run() -> None:
        time.sleep(delay)
        record = coord.xid(epoch)
        if record is None or record.state is not XidState.INITIALIZED:
            return  # decided (or gone) already: nothing to keep
        if start(options, coord.sink_id, epoch):
            coord.release(epoch)

    thread = threading.Thread(target=run, name=f"txsink-keeper-{epoch}", daemon=True)
    thread.start()
    return thread


def _read_line(proc: subprocess.Popen, timeout: float) -> str:
    import selectors

    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            proc.kill()
            return "timeout"
    return proc.stdout.readline().strip()


def keep(settings: dict) -> int:
    """The keeper's body: join the holders, hold until the xid is decided or the
    driver is gone."""
    from coordinator import XidState
    from txsink.core.connections import node_store

    store = settings["store"]
    client = node_store(SinkOptions(connection=ConnectionOptions(**store["connection"]),
                                    table="", store=StoreOptions(**store["store"])))
    coord = Coordinator(client, settings["sink_id"], root=settings["zk_root"])
    epoch = int(settings["epoch"])
    if not coord.hold(epoch, "batch keeper"):
        print("not held: the xid was decided or its holders are gone", flush=True)
        return 1
    print("held", flush=True)
    sys.stdout.close()
    try:
        while _alive(int(settings["pid"]), settings.get("started")):
            record = coord.xid(epoch)
            if record is None or record.state is not XidState.INITIALIZED:
                break
            time.sleep(POLL_SECONDS)
    finally:
        coord.release(epoch)
        client.stop()
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(keep(json.loads(sys.stdin.readline())))
