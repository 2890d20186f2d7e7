"""Operator commands behind ``txsink status | recover | resolve | gc | verify | reset``.

One module per command, each a mixin of :class:`~txsink.operations.session.Session` (one
ZooKeeper session and the ClickHouse clients of one command) with a ``render`` of its
result; :class:`Operations` is all of them. None of them fences a sink: ``recover`` (and
``gc``, first) finishes ``Committing`` xids and rolls back undecided xids that are
abandoned (``coordinator/liveness.py``: of an older generation, or whose writer's
liveness holders are all gone), so it is safe while a writer runs; a live writer's
in-flight xid is left alone. The write path imports none of this (an import-linter
contract).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from txsink.operations import gc, recover, reset, status, verify
from txsink.operations.gc import ONE_OFF_RETENTION, GcCommand
from txsink.operations.recover import RecoverCommands, RecoverRefused
from txsink.operations.reset import ResetCommand
from txsink.operations.session import CONNECT_SECONDS, UnknownSink, access_denied
from txsink.operations.status import StatusCommand
from txsink.operations.verify import VerifyCommand

__all__ = ["CONNECT_SECONDS", "ONE_OFF_RETENTION", "Operations", "RecoverRefused",
           "UnknownSink", "access_denied", "render"]


class Operations(StatusCommand, RecoverCommands, GcCommand, VerifyCommand, ResetCommand):
    """Every operator command over one session (see :class:`Session`)."""


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "status": status.render, "recover": recover.render, "resolve": recover.render,
    "gc": gc.render, "verify": verify.render, "reset": reset.render,
}


def render(command: str, result: dict[str, Any]) -> str:
    """Human-readable text for one command's result."""
    return RENDERERS[command](result)
