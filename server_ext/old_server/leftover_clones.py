"""Repeating a partition statement past the clones an interrupted one left (ClickHouse 18.16).

18.16 clones each source part of an ``ATTACH``/``REPLACE PARTITION ... FROM`` into a
temporary directory of the receiving table that a crash leaves behind, and a later
statement drawing the same name fails on it (:func:`leftover_clone`). The ``attach_marked``
strategy and the dynamic overwrite (``server_ext.publish.overwrite``) send their statements
through :func:`repeat_past_leftover_clones`; on a newer server it calls the statement once.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

from server_ext.errors import DIRECTORY_ALREADY_EXISTS, ClickHouseError

log = logging.getLogger(__name__)

_LEFTOVER_CLONE_RE = re.compile(r"(tmp_replace_from_[^/\s,]+) already exists")


def leftover_clone(exc: ClickHouseError) -> str | None:
    """The directory an interrupted ``ATTACH``/``REPLACE PARTITION ... FROM`` left behind,
    if ``exc`` is a later one failing on it; None for any other error.

    18.16 clones each source part into ``tmp_replace_from_<partition>_<n>_<n>_<level>`` in
    the receiving table's directory, ``n`` from a counter of the table that starts again at
    1 whenever the table is loaded (a server restart). A server killed inside such a
    statement leaves its clones there until ``temporary_directories_lifetime`` (a day) has
    passed, and a statement that draws the same ``n`` fails with code 84. Measured: the
    failing command has attached nothing and removed its own clones, the commands before it
    in the same ``ALTER`` took effect, and the failure used up its ``n``.
    """
    if exc.code != DIRECTORY_ALREADY_EXISTS:
        return None
    match = _LEFTOVER_CLONE_RE.search(str(exc))
    return match.group(1) if match else None


def repeat_past_leftover_clones(attempt: Callable[[bool], None], table: str) -> None:
    """Call ``attempt(repeat)`` until it does not fail on a leftover clone (see
    :func:`leftover_clone`); ``repeat`` is False on the first call only.

    Each failure uses up the number it drew, so the repeats pass the leftovers one by one;
    failing twice on the same one (the server restarted in between) is raised. ``attempt``
    is called again after a failure whose ``ALTER`` may have run some of its commands: it
    must be safe to repeat then (``REPLACE``), or find out what they did (``ATTACH``).
    """
    passed: set[str] = set()
    while True:
        try:
            attempt(bool(passed))
            return
        except ClickHouseError as exc:
            leftover = leftover_clone(exc)
            if leftover is None or leftover in passed:
                raise
            passed.add(leftover)
            log.warning("%s holds %s, left by an interrupted statement (the server removes it "
                        "after temporary_directories_lifetime): repeating past it",
                        table, leftover)
