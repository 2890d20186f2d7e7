"""The ``table`` option: a name without a database writes to ``default`` and says so in the
log; a value that is no table name is refused naming the form."""

from __future__ import annotations

import logging

import pytest

from txsink.options.target_name import note_default_database


def test_a_bare_table_name_resolves_to_the_default_database(caplog):
    with caplog.at_level(logging.WARNING, logger="txsink.options.target_name"):
        assert note_default_database("events") == "`default`.`events`"


def test_a_bare_table_name_is_logged_with_the_table_it_resolves_to(caplog):
    with caplog.at_level(logging.WARNING, logger="txsink.options.target_name"):
        note_default_database("events")
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "table='events' names no database: writing to `default`.`events`" in caplog.text


@pytest.mark.parametrize("table", ["db.events", "`my.db`.events", "default.events"])
def test_a_name_with_a_database_is_not_logged(caplog, table):
    with caplog.at_level(logging.DEBUG, logger="txsink.options.target_name"):
        assert note_default_database(table) is None
    assert caplog.records == []


def test_a_malformed_name_is_left_to_the_describe_step(caplog):
    with caplog.at_level(logging.DEBUG, logger="txsink.options.target_name"):
        assert note_default_database("a.b.c") is None
    assert caplog.records == []


@pytest.mark.parametrize("table", ["`db`.`unterminated", "db.", "`a`.`b`.`c`"])
def test_a_table_option_that_is_not_a_table_name_is_refused_naming_the_form(table):
    from txsink.options import OptionError, parse_options

    with pytest.raises(OptionError, match=r"must be \[database\.\]table: quote a part"):
        parse_options({"url": "http://127.0.0.1:8123", "zookeeper": "127.0.0.1:2181",
                       "table": table}, env={})
