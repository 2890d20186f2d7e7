"""Peak resident memory of the Spark driver JVM, its Python workers and this process.

Sampled from ``/proc`` in a background thread (every 100 ms) while a measurement runs:
a sink that buffered a whole partition in a worker would show a worker RSS growing with
the rows written, one that streams shows a flat one. Python workers are the JVM's
descendant processes (``pyspark.daemon`` and its forks, reused across tasks). The JVM's
heap does not shrink between measurements, so its figure is a high-water mark of the run
so far, not of one variant alone.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


def rss_mb(pid: int) -> float:
    try:
        pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    return pages * PAGE_KB / 1024


def _parents() -> dict[int, int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def jvm_pid(spark) -> int | None:
    """The driver JVM's pid (the gateway's process, or its ``java`` descendant)."""
    proc = getattr(spark.sparkContext._gateway, "proc", None)
    if proc is None:
        return None
    if _comm(proc.pid) == "java":
        return proc.pid
    return next((p for p in descendants(proc.pid) if _comm(p) == "java"), proc.pid)


class PeakMemory:
    """Context manager: ``.peaks`` holds the highest RSS (MB) seen while it was open.

    Usage::

        with PeakMemory(jvm_pid(spark)) as memory:
            df.write...save()
        memory.peaks  # {"jvm_mb": ..., "workers_mb": ..., "worker_max_mb": ..., ...}
    """

    def __init__(self, jvm: int | None, interval: float = 0.1) -> None:
        self.jvm = jvm
        self.interval = interval
        self.peaks = {"jvm_mb": 0.0, "workers_mb": 0.0, "worker_max_mb": 0.0,
                      "driver_python_mb": 0.0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakMemory:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        self.peaks = {k: round(v, 1) for k, v in self.peaks.items()}

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self) -> None:
        workers = []
        if self.jvm is not None:
            self._peak("jvm_mb", rss_mb(self.jvm))
            workers = [rss_mb(p) for p in descendants(self.jvm) if _comm(p).startswith("python")]
        self._peak("workers_mb", sum(workers))
        self._peak("worker_max_mb", max(workers, default=0.0))
        self._peak("driver_python_mb", rss_mb(os.getpid()))

    def _peak(self, key: str, value: float) -> None:
        self.peaks[key] = max(self.peaks[key], value)
