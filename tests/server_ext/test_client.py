"""ClickHouseClient against the real 18.16 server: typed errors, retries, credentials.

Only the retry tests use a scripted local HTTP server: the real server cannot be made to
answer "read-only replica" on demand without stopping the shared ZooKeeper.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from server_ext.client.http_client import ClickHouseClient
from server_ext.errors import ClickHouseError, ServerUnreachable
from server_ext.sql import qualified_name, quote_identifier, split_table_name
from tests.conftest import free_port, run_sql
from tests.harness.services import SECRET_PASSWORD, SECRET_USER

# -- answers --------------------------------------------------------------------------------


def test_query_rows_returns_one_dict_per_row(client: ClickHouseClient) -> None:
    rows = client.query_rows("SELECT number AS n, toString(number) AS s FROM system.numbers "
                             "LIMIT 2", purpose="read numbers")
    assert rows == [{"n": "0", "s": "0"}, {"n": "1", "s": "1"}]  # 18.16 quotes UInt64


def test_query_value_returns_the_first_column_unescaped(client: ClickHouseClient) -> None:
    assert client.query_value("SELECT 'a\\tb\\\\c', 2", purpose="read value") == "a\tb\\c"


def test_query_value_without_a_row_raises(client: ClickHouseClient) -> None:
    with pytest.raises(ClickHouseError, match="no row"):
        client.query_value("SELECT 1 FROM system.one WHERE 0", purpose="read nothing")


def test_insert_streams_an_iterator_body(client: ClickHouseClient, ch_db: str) -> None:
    table = qualified_name(ch_db, "t")
    client.execute(f"CREATE TABLE {table} (x UInt8) ENGINE = Memory", purpose="create table")
    client.insert(table, (line for line in [b"1\n", b"2\n", b"3\n"]), fmt="TabSeparated",
                  purpose="insert rows", columns=["x"])
    assert client.query_value(f"SELECT sum(x) FROM {table}", purpose="sum") == "6"


def test_insert_columns_longer_than_a_url_allows_land(client: ClickHouseClient,
                                                      ch_db: str) -> None:
    # 18.16 answers "Bad Request" to a request line over 16 KiB; the statement is in the body
    names = [f"c{i:03}_{'x' * 60}" for i in range(300)]  # a column list of ~20 KB
    table = qualified_name(ch_db, "t")
    columns = ", ".join(f"{quote_identifier(n)} UInt8" for n in names)
    client.execute(f"CREATE TABLE {table} ({columns}) ENGINE = Memory", purpose="create table")
    client.insert(table, ("\t".join("1" for _ in names) + "\n").encode(), fmt="TabSeparated",
                  purpose="insert a wide row", columns=names)
    assert client.query_value(f"SELECT {quote_identifier(names[-1])} FROM {table}",
                              purpose="read") == "1"


def test_insert_statement_longer_than_max_query_size_lands(client: ClickHouseClient,
                                                            ch_db: str) -> None:
    names = [f"c{i:04}_{'x' * 240}" for i in range(1100)]  # ~275 KB of columns > 256 KiB
    table = qualified_name(ch_db, "t")
    columns = ", ".join(f"{quote_identifier(n)} UInt8" for n in names)
    client.execute(f"CREATE TABLE {table} ({columns}) ENGINE = Memory", purpose="create table",
                   settings={"max_query_size": 10**6})
    client.insert(table, ("\t".join("1" for _ in names) + "\n").encode(), fmt="TabSeparated",
                  purpose="insert a wide row", columns=names)
    assert client.query_value(f"SELECT count() FROM {table}", purpose="count") == "1"


@pytest.mark.parametrize("encoding", [None, "gzip"])
def test_insert_data_starting_with_a_line_break_byte_keeps_it(
        client: ClickHouseClient, ch_db: str, encoding: str | None) -> None:
    # A Native block of 10 columns starts with the byte 10 ('\n'): only the statement's own
    # line break may be skipped
    table = qualified_name(ch_db, "t")
    names = [f"c{i}" for i in range(10)]
    client.execute(f"CREATE TABLE {table} ({', '.join(f'{n} UInt8' for n in names)}) "
                   "ENGINE = Memory", purpose="create table")
    block = bytes([10, 1]) + b"".join(bytes([len(n)]) + n.encode() + b"\x05UInt8" + bytes([i])
                                      for i, n in enumerate(names))
    client.insert(table, block, fmt="Native", purpose="insert a block", columns=names,
                  **({"encoding": encoding} if encoding else {}))
    assert client.query_value(f"SELECT c9 FROM {table}", purpose="read") == "9"


def test_every_request_gets_its_own_query_id(client: ClickHouseClient) -> None:
    ids = set()
    for _ in range(2):
        with pytest.raises(ClickHouseError) as caught:
            client.execute("SELEC 1", purpose="bad statement")
        ids.add(caught.value.query_id)
    assert len(ids) == 2 and all(i.startswith("txsink-") for i in ids)


# -- typed errors ---------------------------------------------------------------------------


def test_syntax_error_is_typed_with_code_name_and_purpose(client: ClickHouseClient) -> None:
    with pytest.raises(ClickHouseError) as caught:
        client.execute("SELEC 1", purpose="create staging table")
    error = caught.value
    assert (error.code, error.name, error.status, error.retryable) == (
        62, "SYNTAX_ERROR", 400, False)
    assert str(error).startswith("create staging table failed: SYNTAX_ERROR (code 62)")


def test_unknown_table_is_typed_and_named(client: ClickHouseClient, ch_db: str) -> None:
    with pytest.raises(ClickHouseError) as caught:
        client.query_rows(f"SELECT * FROM `{ch_db}`.missing", purpose="read target")
    assert caught.value.name == "UNKNOWN_TABLE" and "missing" in str(caught.value)


def test_unknown_database_is_typed_and_named(client: ClickHouseClient) -> None:
    with pytest.raises(ClickHouseError) as caught:
        client.query_rows("SELECT * FROM no_such_db.t", purpose="read target")
    assert caught.value.name == "UNKNOWN_DATABASE" and "no_such_db" in str(caught.value)


def test_unknown_column_is_typed(client: ClickHouseClient) -> None:
    with pytest.raises(ClickHouseError) as caught:
        client.query_rows("SELECT no_such_column FROM system.one", purpose="read column")
    assert caught.value.code in (16, 47) and not caught.value.retryable


def test_parse_error_in_data_is_not_retried(client: ClickHouseClient, ch_db: str) -> None:
    table = qualified_name(ch_db, "t")
    client.execute(f"CREATE TABLE {table} (x UInt8) ENGINE = Memory", purpose="create table")
    with pytest.raises(ClickHouseError) as caught:
        client.insert(table, b"1\nnot a number\n", fmt="TabSeparated", purpose="insert rows")
    assert caught.value.code == 27 and not caught.value.retryable


def test_exception_appended_to_a_200_body_is_detected(client: ClickHouseClient) -> None:
    # Without wait_end_of_query the server streams rows, fails, and appends the error.
    with pytest.raises(ClickHouseError) as caught:
        client.query_rows(
            "SELECT throwIf(number = 500000) FROM system.numbers LIMIT 1000000",
            purpose="stream rows", settings={"wait_end_of_query": 0, "max_block_size": 1000})
    assert caught.value.status == 200
    assert caught.value.code == 395


# -- credentials ----------------------------------------------------------------------------


def test_wrong_password_is_typed_and_never_shows_the_password(clickhouse_url: str) -> None:
    wrong = SECRET_PASSWORD + "-wrong"
    client = ClickHouseClient(clickhouse_url, user=SECRET_USER, password=wrong)
    with pytest.raises(ClickHouseError) as caught:
        client.execute("SELECT 1", purpose="check login")
    error = caught.value
    assert error.name in ("WRONG_PASSWORD", "AUTHENTICATION_FAILED")
    for text in (str(error), repr(error), error.server_message, repr(client)):
        assert wrong not in text and SECRET_PASSWORD not in text


def test_credentials_in_the_url_travel_as_headers(clickhouse_url: str) -> None:
    host = clickhouse_url.split("://", 1)[1]
    client = ClickHouseClient(f"http://{SECRET_USER}:{SECRET_PASSWORD}@{host}")
    assert client.query_value("SELECT 1", purpose="check login") == "1"
    assert SECRET_PASSWORD not in client.url and SECRET_PASSWORD not in repr(client)


# -- retries --------------------------------------------------------------------------------


def test_unreachable_server_raises_server_unreachable_after_retries(caplog) -> None:
    port = free_port()
    client = ClickHouseClient(f"http://127.0.0.1:{port}", user="u", password="pw-secret",
                              retries=2, timeout=1.0)
    started = time.monotonic()
    with pytest.raises(ServerUnreachable) as caught:
        client.execute("SELECT 1", purpose="ping server")
    assert time.monotonic() - started < 5
    assert f"127.0.0.1:{port}" in str(caught.value) and "3 attempts" in str(caught.value)
    assert "pw-secret" not in str(caught.value) + caplog.text
    assert caplog.text.count("retrying") == 2


class ScriptedServer:
    """Answers each POST with the next (status, body) of a script; counts requests."""

    def __init__(self, answers: list[tuple[int, bytes]]) -> None:
        self.answers = answers
        self.requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, body = outer.answers[min(outer.requests, len(outer.answers) - 1)]
                outer.requests += 1
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02},
                         daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def scripted() -> Iterator[type[ScriptedServer]]:
    servers: list[ScriptedServer] = []

    def make(answers: list[tuple[int, bytes]]) -> ScriptedServer:
        servers.append(ScriptedServer(answers))
        return servers[-1]

    yield make  # type: ignore[misc]
    for server in servers:
        server.close()


READ_ONLY = (500, b"Code: 242, e.displayText() = DB::Exception: Table is in readonly mode, "
                  b"e.what() = DB::Exception\n")


def test_read_only_replica_is_retried_until_it_succeeds(scripted) -> None:
    server = scripted([READ_ONLY, READ_ONLY, (200, b"")])
    ClickHouseClient(server.url, retries=3).execute("ALTER TABLE t DROP PARTITION 1",
                                                   purpose="drop partition")
    assert server.requests == 3


def test_read_only_replica_is_not_retried_for_a_statement_that_must_not_repeat(
        scripted) -> None:
    server = scripted([READ_ONLY, (200, b"")])
    with pytest.raises(ClickHouseError) as caught:
        ClickHouseClient(server.url, retries=3).execute(
            "ALTER TABLE t ATTACH PARTITION 1 FROM s", purpose="attach partition", retry=False)
    assert caught.value.code == 242 and server.requests == 1


def test_syntax_error_fails_at_once_without_retry(scripted) -> None:
    server = scripted([(400, b"Code: 62, e.displayText() = DB::Exception: Syntax error, "
                             b"e.what() = DB::Exception\n")])
    with pytest.raises(ClickHouseError):
        ClickHouseClient(server.url, retries=3).execute("SELEC 1", purpose="bad statement")
    assert server.requests == 1


def test_an_insert_block_beyond_the_servers_partition_limit_is_not_retried(scripted) -> None:
    """26.x refuses it with code 252, which also means "too many parts" (transient)."""
    server = scripted([(500, b"Code: 252. DB::Exception: Too many partitions for single INSERT "
                             b"block (more than 100). (TOO_MANY_PARTS) (version 26.9.2.1)\n")])
    with pytest.raises(ClickHouseError) as caught:
        ClickHouseClient(server.url, retries=3).insert("`d`.`t`", [b"1\n"],
                                                      fmt="TabSeparated", purpose="insert rows")
    assert caught.value.code == 252 and server.requests == 1


def test_a_list_body_is_resent_on_a_transient_error(scripted) -> None:
    server = scripted([READ_ONLY, (200, b"")])
    ClickHouseClient(server.url, retries=3).insert("`d`.`t`", [b"1\n", b"2\n"],
                                                  fmt="TabSeparated", purpose="insert rows")
    assert server.requests == 2


def test_a_generator_body_is_not_resent_once_consumed(scripted) -> None:
    server = scripted([READ_ONLY, (200, b"")])
    with pytest.raises(ClickHouseError) as caught:
        ClickHouseClient(server.url, retries=3).insert(
            "`d`.`t`", (c for c in [b"1\n", b"2\n"]), fmt="TabSeparated", purpose="insert rows")
    assert caught.value.code == 242 and server.requests == 1


# -- identifiers ----------------------------------------------------------------------------


def test_quote_identifier_escapes_backticks_and_backslashes() -> None:
    assert quote_identifier("a`b\\c") == "`a\\`b\\\\c`"


def test_a_table_name_with_a_backtick_works_on_the_server(
        client: ClickHouseClient, clickhouse_url: str, ch_db: str) -> None:
    table = qualified_name(ch_db, "odd`name")
    client.execute(f"CREATE TABLE {table} (x UInt8) ENGINE = Memory", purpose="create table")
    assert "odd`name" in run_sql(clickhouse_url, f"SHOW TABLES FROM `{ch_db}`")


@pytest.mark.parametrize(("text", "expected"), [
    ("db.t", ("db", "t")),
    ("t", ("default", "t")),
    ("`my.db`.`t`", ("my.db", "t")),
    ("`a\\`b`.c.d", ("a`b", "c.d")),
])
def test_split_table_name_reads_quoted_and_plain_parts(
        text: str, expected: tuple[str, str]) -> None:
    assert split_table_name(text) == expected


@pytest.mark.parametrize("text", ["db.", "`unterminated", "`a`x"])
def test_split_table_name_rejects_malformed_names(text: str) -> None:
    with pytest.raises(ValueError):
        split_table_name(text)
