"""Counting the messages an epoch sends: coordinator store requests and ClickHouse statements.

The sink's clients (``txsink.core.connections``) call :func:`count_request` for each
ZooKeeper request (each KeeperMap statement with ``coordinator=keepermap``) and
:func:`count_statement` for each other ClickHouse statement they send, retries included;
outside a :func:`counting` scope these count nothing. A scope is the calling thread's
context: work it hands to a thread pool is counted when the pool runs it in a copy of
that context (``contextvars.copy_context().run``), as the sink's pools do. A scope's
counter may be bumped from several threads at once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True)
class MessageCount:
    """Messages sent: ``store_requests`` to the coordinator's store, ``statements`` to
    ClickHouse for the rows (the KeeperMap store's statements are store requests)."""

    store_requests: int = 0
    statements: int = 0

    def __add__(self, other: MessageCount) -> MessageCount:
        return MessageCount(self.store_requests + other.store_requests,
                            self.statements + other.statements)


class Meter:
    """The running count of one scope."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests = 0
        self._statements = 0

    def add(self, requests: int = 0, statements: int = 0) -> None:
        with self._lock:
            self._requests += requests
            self._statements += statements

    def read(self) -> MessageCount:
        with self._lock:
            return MessageCount(self._requests, self._statements)


_scope: ContextVar[Meter | None] = ContextVar("txsink_message_count", default=None)


def count_request() -> None:
    meter = _scope.get()
    if meter is not None:
        meter.add(requests=1)


def count_statement() -> None:
    meter = _scope.get()
    if meter is not None:
        meter.add(statements=1)


@contextmanager
def counting() -> Iterator[Meter]:
    """Count this context's messages (nested scopes count only into the innermost)."""
    meter = Meter()
    token = _scope.set(meter)
    try:
        yield meter
    finally:
        _scope.reset(token)
