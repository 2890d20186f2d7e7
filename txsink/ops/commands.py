"""Every operator command over one session, and the text each renders."""


from __future__ import annotations

from collections.abc import Callable
from typing import Any

from txsink.ops import gc, recover, reset, status, verify
from txsink.ops.gc import ONE_OFF_RETENTION, GcCommand
from txsink.ops.recover import RecoverCommands, RecoverRefused
from txsink.ops.reset import ResetCommand
from txsink.ops.session import CONNECT_SECONDS, UnknownSink, access_denied
from txsink.ops.status import StatusCommand
from txsink.ops.verify import VerifyCommand

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
