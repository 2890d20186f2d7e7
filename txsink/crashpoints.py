"""Named crash points: kill the current process at an exact step of the protocol.

A fault test arms a point by name through the environment, before the process (and the
Spark JVM with its Python workers, which inherit the environment) starts::

    TXSINK_CRASH_AT=commit.after_decision   # one or more names, comma separated
    TXSINK_CRASH_MODE=group                 # group (default) | exit | raise
    TXSINK_CRASH_ONCE_DIR=/tmp/run-17       # fire each point once per directory

``group`` SIGKILLs the whole process group: a fault test starts the Spark driver in its
own session, so this is "the driver host died" (JVM, executors and Python workers all
at once). ``exit`` ends only the current process (a Python worker: Spark sees a failed
task). ``raise`` raises :class:`CrashPointReached` for in-process tests.

When nothing is armed, :func:`hit` is one set lookup: the production path pays nothing.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

#: Every crash point of the protocol, in the order an epoch passes them.
CRASH_POINTS: tuple[str, ...] = (
    "branch.after_register",          # task: branch recorded, nothing staged yet
    "branch.after_staging_write",     # task: rows in staging, not sealed
    "branch.after_seal",              # task: manifest built, not recorded
    "branch.after_prepare",           # task: branch Prepared, message not yet returned
    "commit.after_decision",          # driver: xid Committing, nothing published
    "consolidate.after_combine",      # driver: winners combined in one table, not recorded
    "consolidate.after_record",       # driver: combined table recorded, sources still there
    "publish.before_partition",       # driver: about to publish a branch's partitions
    "publish.after_intent",           # driver: publish intent recorded, nothing attached
    "publish.after_attach",           # driver: partitions visible, not yet marked
    "publish.after_mark",             # driver: partitions marked published
    "publish.after_drop_staging_partition",
    "commit.after_branch_published",  # driver: one winning branch fully published
    "commit.after_publish",           # driver: all published, xid not yet Committed
    "commit.after_committed",         # driver: xid Committed, Spark has not recorded it
    "abort.after_decision",           # driver: xid Aborting, staging not dropped
    "abort.after_rollback",           # driver: staging dropped, xid not yet Aborted
)


class CrashPointReached(RuntimeError):
    """Raised at an armed crash point in ``raise`` mode."""


def _armed() -> frozenset[str]:
    names = {n.strip() for n in os.environ.get("TXSINK_CRASH_AT", "").split(",") if n.strip()}
    unknown = names - set(CRASH_POINTS)
    if unknown:
        raise ValueError(f"unknown crash point(s) in TXSINK_CRASH_AT: {', '.join(sorted(unknown))}")
    return frozenset(names)


_ARMED = _armed()


def hit(name: str) -> None:
    """Crash here if ``name`` is armed; otherwise return at once."""
    if name not in _ARMED:
        return
    once_dir = os.environ.get("TXSINK_CRASH_ONCE_DIR")
    if once_dir:
        marker = Path(once_dir) / f"{name}.fired"
        marker.parent.mkdir(parents=True, exist_ok=True)
        try:
            marker.touch(exist_ok=False)
        except FileExistsError:
            return
    mode = os.environ.get("TXSINK_CRASH_MODE", "group")
    if mode == "raise":
        raise CrashPointReached(name)
    if mode == "exit":
        os._exit(86)
    os.killpg(os.getpgid(0), signal.SIGKILL)
