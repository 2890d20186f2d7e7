"""How the publisher answers the callback contract (``txsink.core.publisher.judged``):
a server error marked ``retryable`` asks for a retry, any other is a known failure."""

from __future__ import annotations

from coordinator import Failed, RetryLater
from server_ext import ClickHouseError, ServerUnreachable
from txsink.core.publisher import judged


def test_a_retryable_server_error_asks_for_a_retry() -> None:
    error = ClickHouseError("too many parts", code=252, retryable=True)
    assert judged(error) == RetryLater(str(error), error)


def test_any_other_server_error_is_a_known_failure() -> None:
    for error in (ClickHouseError("no such table", code=60),
                  ServerUnreachable("cannot connect", retryable=False)):
        assert judged(error) == Failed(str(error), error)
