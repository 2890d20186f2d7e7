"""server_ext.sql: quoting, literals and statement fragments (pure text), and one check
against the 18.16 server that a quoted name and a string literal round-trip."""

from __future__ import annotations

import pytest

from server_ext import sql
from server_ext.client.http_client import ClickHouseClient


def test_string_literal_escapes_backslashes_then_quotes() -> None:
    assert sql.sql_string("it's") == "'it\\'s'"
    assert sql.sql_string("a\\'b") == "'a\\\\\\'b'"
    assert sql.sql_string("") == "''"


@pytest.mark.parametrize(("value", "text"), [
    (True, "1"), (False, "0"), (3, "3"), (0.5, "0.5"), ("x'y", "'x\\'y'"), (None, "'None'"),
])
def test_value_literal(value: object, text: str) -> None:
    assert sql.value_literal(value) == text


def test_identifier_text_quotes_only_what_needs_it() -> None:
    assert sql.identifier_text("events_1") == "events_1"
    assert sql.identifier_text("1events") == "`1events`"
    assert sql.identifier_text("a.b") == "`a.b`"
    assert sql.is_bare_identifier("_x9") and not sql.is_bare_identifier("x-y")


@pytest.mark.parametrize("name, parts", [
    ("db.events", ("db", "events")),
    ("`my.db`.`ev.ents`", ("my.db", "ev.ents")),
    ("`my db`.`ev``ents`", ("my db", "ev`ents")),  # a backtick written twice, as in SQL
    ("`my db`.`ev\\`ents`", ("my db", "ev`ents")),  # or after a backslash
    ("events", ("default", "events")),
])
def test_table_names_split_as_sql_quotes_them(name: str, parts: tuple[str, str]) -> None:
    assert sql.split_table_name(name) == parts


def test_statement_fragments() -> None:
    assert sql.column_list(None) == ""
    assert sql.column_list(["a", "b`c"]) == " (`a`, `b\\`c`)"
    assert sql.settings_clause(None) == sql.settings_clause({}) == ""
    assert sql.settings_clause({"a": True, "b": 2, "c": "x"}) == " SETTINGS a = 1, b = 2, c = 'x'"
    assert sql.setting_assignments({"a": "1", "b": "'x'"}) == "a = 1, b = 'x'"
    assert sql.table_filter("d'b", "t") == "database = 'd\\'b' AND table = 't'"
    assert sql.table_filter("db", "t", name_column="name") == "database = 'db' AND name = 't'"
    assert sql.strip_statement("  SELECT 1 ;; \n") == "SELECT 1"


def test_quoted_names_and_literals_round_trip_on_the_server(
        clickhouse_url: str, ch_db: str) -> None:
    ch = ClickHouseClient(clickhouse_url)
    table = "odd `name' \\ here"
    value = "quote ' backslash \\ backquote ` newline \n tab \t"
    ch.execute(f"CREATE TABLE {sql.qualified_name(ch_db, table)} (s String) "
               "ENGINE = MergeTree() ORDER BY s", purpose="test")
    ch.execute(f"INSERT INTO {sql.qualified_name(ch_db, table)} SELECT {sql.sql_string(value)}",
               purpose="test")
    rows = ch.query_rows(f"SELECT s FROM {sql.qualified_name(ch_db, table)}", purpose="test")
    assert rows == [{"s": value}]
    found = ch.query_rows("SELECT name FROM system.tables WHERE "
                          f"{sql.table_filter(ch_db, table, name_column='name')}", purpose="test")
    assert found == [{"name": table}]
    assert sql.split_table_name(sql.qualified_name(ch_db, table)) == (ch_db, table)
