"""A ``table`` option without a database writes to ``default`` and says so in the log."""

from __future__ import annotations

import logging

import pytest

from txsink.target_name import note_default_database


def test_a_bare_table_name_resolves_to_the_default_database(caplog):
    with caplog.at_level(logging.WARNING, logger="txsink.target_name"):
        assert note_default_database("events") == "`default`.`events`"


def test_a_bare_table_name_is_logged_with_the_table_it_resolves_to(caplog):
    with caplog.at_level(logging.WARNING, logger="txsink.target_name"):
        note_default_database("events")
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "table='events' names no database: writing to `default`.`events`" in caplog.text


@pytest.mark.parametrize("table", ["db.events", "`my.db`.events", "default.events"])
def test_a_name_with_a_database_is_not_logged(caplog, table):
    with caplog.at_level(logging.DEBUG, logger="txsink.target_name"):
        assert note_default_database(table) is None
    assert caplog.records == []


def test_a_malformed_name_is_left_to_the_describe_step(caplog):
    with caplog.at_level(logging.DEBUG, logger="txsink.target_name"):
        assert note_default_database("a.b.c") is None
    assert caplog.records == []
