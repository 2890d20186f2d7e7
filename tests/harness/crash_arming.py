"""Arming the sink's named steps as crash points: kill a process at an exact step.

The product names its steps (:mod:`txsink.core.crashpoints`) and calls the step hook its
environment names; this module is that hook for fault tests. A test arms points through
the environment of the process it starts (and of the Spark JVM with its Python workers,
which inherit it), built by :func:`arm_env`::

    TXSINK_STEP_HOOK=tests.harness.crash_arming:hit
    TXSINK_CRASH_AT=commit.after_decision   # one or more names, comma separated
    TXSINK_CRASH_MODE=group                 # group (default) | exit | raise
    TXSINK_CRASH_ONCE_DIR=/tmp/run-17       # fire each point once per directory

``group`` SIGKILLs the whole process group: a fault test starts the Spark driver in its
own session, so this is "the driver host died" (JVM, executors and Python workers all
at once). ``exit`` ends only the current process (a Python worker: Spark sees a failed
task). ``raise`` raises :class:`CrashPointReached` for in-process tests.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from pathlib import Path

from txsink.core.crashpoints import ALL_POINTS, HOOK_VARIABLE

HOOK = f"{__name__}:hit"


class CrashPointReached(RuntimeError):
    """Raised at an armed crash point in ``raise`` mode."""


def arm_env(points: Iterable[str], mode: str = "group", once_dir: Path | None = None
            ) -> dict[str, str]:
    """The environment variables that arm ``points`` in a process started with them."""
    names = list(points)
    unknown = set(names) - set(ALL_POINTS)
    if unknown:
        raise ValueError(f"unknown crash point(s): {', '.join(sorted(unknown))}")
    return {HOOK_VARIABLE: HOOK, "TXSINK_CRASH_AT": ",".join(names), "TXSINK_CRASH_MODE": mode,
            **({"TXSINK_CRASH_ONCE_DIR": str(once_dir)} if once_dir else {})}


def _armed() -> frozenset[str]:
    names = {n.strip() for n in os.environ.get("TXSINK_CRASH_AT", "").split(",") if n.strip()}
    unknown = names - set(ALL_POINTS)
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
