"""CPU seconds of the processes a benchmark counts (``/proc``): a server found by its port,
Spark's tree of processes."""

from __future__ import annotations

import os

TICKS = os.sysconf("SC_CLK_TCK")


def listening_pid(port: int) -> int | None:
    """The process listening on TCP ``port`` (``/proc/net/tcp*`` → socket inode → fd)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as lines:
                for line in list(lines)[1:]:
                    fields = line.split()
                    if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(fields[9])
        except OSError:
            continue
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return int(pid)
        except OSError:
            continue
    return None


def _stat(pid: int) -> tuple[int, float]:
    """(parent pid, CPU seconds of the process and of its children it waited for)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[1]), sum(int(v) for v in fields[11:15]) / TICKS


def tree_cpu(root: int) -> float:
    """CPU seconds of ``root`` and every live descendant (each with its waited-for
    children: a Python worker that exited counts in its parent's)."""
    parents: dict[int, tuple[int, float]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            parents[int(pid)] = _stat(int(pid))
        except OSError:
            continue
    total, frontier = 0.0, [root]
    while frontier:
        pid = frontier.pop()
        total += parents.get(pid, (0, 0.0))[1]
        frontier += [child for child, (parent, _) in parents.items() if parent == pid]
    return total


def process_cpu(pid: int | None) -> float:
    return tree_cpu(pid) if pid else 0.0
