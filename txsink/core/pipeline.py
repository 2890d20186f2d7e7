"""Pipelined publish: a streaming epoch's publish runs while the next micro-batch runs.

Contract. With ``publish=pipelined`` the commit of epoch N takes N's publish lease, writes
the decision (``Committing``, durable) and hands the held lease and the rest of the
commit (publish, ``Committed`` with its metrics, clean-up) to this process's :class:`Pipeline` of
the sink, then returns: Spark records the micro-batch and starts N+1's tasks while one
background thread finishes N. Before N+1's decision the writer calls :func:`settle`: it
waits for this process's in-flight publish and then makes sure N is ``Committed``
whichever process published it; a ``Committing`` N is finished by
``Coordinator.commit``, which waits for a live lease holder (a background publish in
another worker) and rolls forward an xid whose holder is gone. So epochs become visible
in order, at most one is in flight per sink, and a publish that died with its process
is done by the next decision, a restarted driver's recovery (``open_stream``) or
``txsink recover`` — all finishing the recorded decision, never undoing it.

Who runs what concurrently: the committing thread and at most one background thread per
sink and process share the sink's coordinator clients (kazoo's and the ClickHouse
clients are thread-safe). Where the thread lives is the caller's: a driver-resident
adapter's process (``foreachBatch``), or the data source's commit worker, which Spark
reuses between micro-batches only with ``spark.python.worker.reuse`` (the default);
:func:`worker_mode` publishes inline in a worker that exits after each commit.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from collections.abc import Callable
from contextvars import copy_context

from coordinator import Coordinator, XidState
from txsink.core import crashpoints
from txsink.core.xid_keeper import driver_pid
from txsink.options import INLINE, PIPELINED, SinkOptions

log = logging.getLogger(__name__)

#: The role a pipelined commit holds its leases under (``coordinator.protocol.publish_lease``):
#: a restarted driver's recovery waits for any other holder, not for this process's own.
ROLE = "pipelined publisher"

#: Set by Spark in a Python worker that goes back to the pool after its call: a thread
#: started in a worker without it dies when the call returns.
REUSE_VARIABLE = "SPARK_REUSE_WORKER"


def role() -> str:
    """This process's lease role for a pipelined publish (its host and driver)."""
    # the Spark worker's driver (its nearest java ancestor), else this process: a
    # driver-resident adapter's
    return f"{ROLE} {socket.gethostname()}/{driver_pid(otherwise=os.getpid())}"


def is_own(holder: str | None) -> bool:
    """Whether a lease holder's identity is a pipelined publish of this driver: one whose
    next decision waits for it, so recovery need not (None: nobody holds it now)."""
    try:
        return str(json.loads(holder or "").get("role")) == role()
    except (ValueError, AttributeError):
        return False


def worker_mode(options: SinkOptions) -> str:
    """The publish mode of a commit that runs in a Spark Python worker: ``inline`` when
    the worker exits after the call (``spark.python.worker.reuse=false``), where a
    background thread would die with it (logged once)."""
    if options.publish.mode == PIPELINED and os.environ.get(REUSE_VARIABLE) != "1":
        if not _warned.is_set():
            _warned.set()
            log.warning("txsink: publish=pipelined needs spark.python.worker.reuse=true (the "
                        "commit's worker must outlive the call); publishing inline")
        return INLINE
    return options.publish.mode


_warned = threading.Event()


class Pipeline:
    """The background publish of one sink in this process: at most one epoch in flight.

    Usage (``txsink.core.driver.commit_epoch``)::

        pipeline = pipeline_for(options, sink_id)
        pipeline.wait()                           # the previous epoch's publish
        ...decide epoch N under its held lease...
        pipeline.start(N, finish)                 # finish() publishes and releases
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._epoch: int | None = None

    @property
    def in_flight(self) -> int | None:
        """The epoch being published in the background (None: none)."""
        with self._lock:
            alive = self._thread is not None and self._thread.is_alive()
            return self._epoch if alive else None

    def start(self, epoch: int, finish: Callable[[], None]) -> None:
        """Run ``finish`` (epoch's publish) in the background; the previous one must have
        ended (:meth:`wait`). A failure is logged: the epoch stays ``Committing`` and
        the next :func:`settle` (or recovery) finishes it."""
        def run() -> None:
            try:
                crashpoints.hit(crashpoints.PIPELINE_BEFORE_PUBLISH)
                finish()
            except Exception as exc:  # noqa: BLE001 - the next decision finishes it
                log.warning("txsink %s epoch=%d: background publish failed (the next "
                            "commit or txsink recover finishes it): %s: %s",
                            self.name, epoch, type(exc).__name__, exc)

        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                raise RuntimeError(f"txsink {self.name}: epoch {self._epoch} is still "
                                   f"being published; wait() before starting {epoch}")
            # not a daemon thread: an interpreter that exits normally finishes the publish
            # in the caller's context: the epoch's message count goes on in the thread
            self._thread = threading.Thread(target=copy_context().run, args=(run,),
                                            name=f"txsink-publish-{epoch}")
            self._epoch = epoch
            self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the in-flight publish; True once none is in flight."""
        with self._lock:
            thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()


_pipelines: dict[tuple[str, str], Pipeline] = {}
_pipelines_lock = threading.Lock()


def pipeline_for(options: SinkOptions, sink_id: str) -> Pipeline:
    """This process's pipeline of the sink (one per sink and records root)."""
    key = (options.store.root_identity, sink_id)
    with _pipelines_lock:
        if key not in _pipelines:
            _pipelines[key] = Pipeline(f"sink={sink_id}")
        return _pipelines[key]


def wait_all(timeout: float | None = None) -> bool:
    """Wait for every sink's in-flight publish of this process; True once none is."""
    with _pipelines_lock:
        pipelines = list(_pipelines.values())
    return all(p.wait(timeout) for p in pipelines)


def settle(options: SinkOptions, coord: Coordinator, epoch: int,
           finish: Callable[[int], None]) -> None:
    """Before ``epoch``'s decision: the previous epoch ``Committed``.

    Waits for this process's in-flight publish, then reads the previous xid: a
    ``Committing`` one (published elsewhere, or its publish failed or died) is passed to
    ``finish(previous epoch)``, which finishes the recorded decision
    (``Coordinator.commit`` waits for a live holder of its lease)."""
    crashpoints.hit(crashpoints.PIPELINE_BEFORE_SETTLE)
    pipeline_for(options, coord.sink_id).wait()
    if epoch <= 0:
        return
    record = coord.xid(epoch - 1)
    if record is None or record.state is not XidState.COMMITTING:
        return
    log.info("txsink sink=%s epoch=%d: finishing epoch %d before the decision",
             coord.sink_id, epoch, epoch - 1)
    finish(epoch - 1)
