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

from coordinator import steps
from server_ext import consolidate, publish_steps

BRANCH_AFTER_REGISTER = "branch.after_register"  # task: branch recorded, nothing staged
BRANCH_AFTER_VIEWS = "branch.after_views"  # task: staging and its staging views made, no row
BRANCH_AFTER_STAGING_WRITE = "branch.after_staging_write"  # task: rows staged, not sealed
BRANCH_AFTER_SEAL = "branch.after_seal"  # task: manifest built, not recorded
BRANCH_AFTER_CONTRIBUTE = "branch.after_contribute"  # task: parts in pre-combined, not recorded
BRANCH_AFTER_PREPARE = "branch.after_prepare"  # task: branch Prepared, no message yet

#: Every crash point of the protocol, in the order an epoch passes them: the tasks' own,
#: then those the coordinator and ``server_ext`` declare (their modules say what each
#: means); ``publish.*`` are passed once per winner, the combined branch first.
CRASH_POINTS: tuple[str, ...] = (
    BRANCH_AFTER_REGISTER, BRANCH_AFTER_VIEWS, BRANCH_AFTER_STAGING_WRITE, BRANCH_AFTER_SEAL,
    BRANCH_AFTER_CONTRIBUTE, BRANCH_AFTER_PREPARE,
    steps.COMMIT_AFTER_DECISION,
    *consolidate.STEPS,
    *publish_steps.STEPS["attach_marked"],
    *steps.COMMIT_STEPS[1:],
    *steps.ABORT_STEPS,
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
