"""Counting an epoch's messages (``txsink.core.message_count``): pure logic."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextvars import copy_context

from txsink.core.message_count import MessageCount, count_request, count_statement, counting


def test_a_scope_counts_the_requests_and_statements_sent_in_it():
    with counting() as meter:
        count_request()
        count_statement()
        count_statement()
    assert meter.read() == MessageCount(store_requests=1, statements=2)


def test_nothing_is_counted_outside_a_scope():
    count_request()
    with counting() as meter:
        pass
    count_statement()
    assert meter.read() == MessageCount()


def test_a_nested_scope_counts_only_into_itself():
    with counting() as outer:
        count_request()
        with counting() as inner:
            count_request()
        count_statement()
    assert (outer.read(), inner.read()) == (MessageCount(1, 1), MessageCount(1, 0))


def test_work_a_pool_runs_in_a_copy_of_the_context_is_counted_and_other_work_is_not():
    with counting() as meter, ThreadPoolExecutor(4) as pool:
        for future in [pool.submit(copy_context().run, count_statement) for _ in range(100)]:
            future.result()
        pool.submit(count_statement).result()
    assert meter.read() == MessageCount(statements=100)


def test_counts_add_up():
    assert MessageCount(1, 2) + MessageCount(3, 4) == MessageCount(4, 6)
