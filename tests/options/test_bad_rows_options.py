"""The options of bad rows, refused by name before any server is asked (no server)."""

from __future__ import annotations

import pytest

from txsink.options import OptionError, parse_options

BASE = {"url": "http://127.0.0.1:8123", "table": "db.t", "zookeeper": "127.0.0.1:2181"}


def parsed(**given: str):
    return parse_options({**BASE, **given}, env={})


def test_bad_rows_fail_is_the_default_with_no_quarantine_table():
    options = parsed()
    bad = options.bad_rows
    assert (bad.mode, bad.quarantine_table, bad.max_bad_rows) == (
        "fail", None, 100_000)


def test_quarantine_without_a_quarantine_table_is_refused_naming_it():
    with pytest.raises(OptionError, match="bad_rows=quarantine needs quarantine_table"):
        parsed(bad_rows="quarantine")


def test_a_quarantine_table_without_quarantine_is_refused():
    with pytest.raises(OptionError, match="quarantine_table is only used with "
                                          "bad_rows=quarantine"):
        parsed(quarantine_table="db.bad")


def test_a_bound_on_bad_rows_without_quarantine_is_refused():
    with pytest.raises(OptionError, match="max_bad_rows is only used with bad_rows=quarantine"):
        parsed(max_bad_rows="10")


@pytest.mark.parametrize("given, message", [
    ({"bad_rows": "skip"}, "bad_rows='skip' is not one of fail, quarantine"),
    ({"bad_rows": "quarantine", "quarantine_table": "bad"}, "must be database.table"),
    ({"bad_rows": "quarantine", "quarantine_table": "db.bad", "max_bad_rows": "-1"},
     "max_bad_rows='-1' must be at least 0"),
    ({"bad_rows": "quarantine", "quarantine_table": "db.bad", "max_bad_rows": "many"},
     "max_bad_rows='many' is not an int"),
], ids=["unknown_mode", "unqualified_table", "negative_bound", "non_integer_bound"])
def test_a_malformed_bad_rows_option_is_refused_naming_it(given, message):
    with pytest.raises(OptionError, match=message):
        parsed(**given)


def test_a_quarantine_table_whose_quoted_names_hold_dots_is_accepted():
    options = parsed(bad_rows="quarantine", quarantine_table="`my.db`.`bad rows.q`")
    assert options.bad_rows.quarantine_table == "`my.db`.`bad rows.q`"


def test_quarantine_options_are_parsed():
    options = parsed(bad_rows="QUARANTINE", quarantine_table="db.bad", max_bad_rows="5")
    bad = options.bad_rows
    assert (bad.mode, bad.quarantine_table, bad.max_bad_rows) == (
        "quarantine", "db.bad", 5)
