"""HTTP client for ClickHouse: one place that knows how to talk to the server safely.

Why a client of our own: the official Python clients either cannot talk to the 18.16
servers this project supports (clickhouse-connect reads system columns 18.16 lacks) or use
the native TCP protocol, whose retries we could not control. Everything here is plain
HTTP on a reused ``requests.Session``.

Contract (what a caller may assume):
- Every call is one statement with its own ``query_id``; ``purpose`` names the step in any
  error ("create staging table failed: UNKNOWN_DATABASE (code 81): ...").
- A call either returns after the server finished the statement, or raises a
  ``ClickHouseError``. Statements are sent with ``wait_end_of_query=1`` so the status code
  is final, and an exception that the server appended to a 200 body is still detected.
- Retries are automatic but only where repeating is safe: a request that never reached the
  server (connection refused) is always retried; transient server conditions
  (``errors.is_transient``: read-only replica, keeper session, too many parts, ...) and 503 are
  retried when the caller says the statement may be repeated (``retry=True``, the default
  for ``execute`` and ``insert``; reads always may). A request whose outcome is unknown (a
  timeout or a connection lost after the body was sent) is retried only for reads and
  ``execute(retry=True)``, never for an insert: the insert may have landed.
- Credentials travel only in the ``X-ClickHouse-User`` / ``X-ClickHouse-Key`` headers.
  They never appear in ``url``, ``repr``, logs or error messages.
"""

from __future__ import annotations

import logging
import re
import ssl
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit, urlunsplit

import requests
import urllib3.exceptions
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

from server_ext.client.compression import compress
from server_ext.client.text_client import TextClient
from server_ext.errors import (
    ClickHouseError,
    ServerUnreachable,
    is_transient,
    parse_exception,
)
from server_ext.sql import column_list, strip_statement

log = logging.getLogger(__name__)

# The exception a server appends to a 200 body when a query fails after streaming began.
# 18.16 appends it straight after the last byte of data, without a newline.
_TRAILING_EXCEPTION_RE = re.compile(
    r"(Code: \d+[.,] (?:e\.displayText\(\) = )?DB::Exception[^\n]*)\n?\Z"
)
_REDACTED = "******"
DEFAULT_TIMEOUT = 30.0  # seconds per request
DEFAULT_RETRIES = 5  # tries of a statement that is safe to repeat


@dataclass
class _Attempt:
    """What one HTTP request is allowed to do when it fails."""

    purpose: str
    may_repeat: bool  # transient server errors may be retried
    outcome_unknown_ok: bool  # a request that may have run may be repeated


class _ReplayGuard:
    """Wraps a streamed body to tell whether any of it has been handed to the socket."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = chunks
        self.started = False

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._chunks:
            self.started = True
            yield chunk


def _read_environment_once(session: requests.Session, url: str, ca_file: str | None
                           ) -> str | bool:
    """Apply what requests takes from the environment for ``url`` (proxies, the CA bundle
    variables, ``.netrc``) to ``session`` now, and stop it reading them per request.

    requests otherwise scans every environment variable for proxy settings on each
    request: 0.2 ms with 40 variables, 0.6 ms with 150 (a Spark worker has many), several
    per task and a dozen per commit. Returns what to verify https:// servers against.
    """
    found = session.merge_environment_settings(url, {}, None, ca_file, None)
    session.proxies.update(found["proxies"])
    session.auth = requests.utils.get_netrc_auth(url)
    session.trust_env = False
    return found["verify"]


class ClickHouseClient(TextClient):
    """Talks to one ClickHouse server over HTTP (see the module contract)."""

    #: Statements may run from several threads at once: each is its own request, and the
    #: requests session only pools connections.
    concurrent = True

    def __init__(
        self,
        url: str,
        user: str | None = None,
        password: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        retries: int = DEFAULT_RETRIES,
        session: requests.Session | None = None,
        ca_file: str | None = None,
        on_statement: Callable[[], None] | None = None,
    ) -> None:
        self.url, url_user, url_password = _strip_credentials(url)
        self.user = user if user is not None else url_user
        self._password = password if password is not None else url_password
        for what, value in (("user", self.user), ("password", self._password)):
            problem = header_problem(value)
            if problem:
                raise ValueError(f"the ClickHouse {what} cannot be sent: {problem}")
        self.timeout = timeout
        self.retries = retries
        # https:// servers are verified against ca_file instead of requests' default
        # bundle; passed with every request, as requests lets REQUESTS_CA_BUNDLE
        # override a session's own setting.
        self._verify: str | bool = ca_file or True
        if session is None:
            session = requests.Session()
            self._verify = _read_environment_once(session, self.url, ca_file)
        self._session = session
        parts = urlsplit(self.url)
        default_port = 443 if parts.scheme == "https" else 8123
        self.address = f"{parts.hostname}:{parts.port or default_port}"
        self._on_statement = on_statement  # called as each request is sent (a count)

    def __repr__(self) -> str:
        return f"ClickHouseClient(url={self.url!r}, user={self.user!r})"

    # -- public statements -------------------------------------------------------------

    def execute(
        self, sql: str, *, purpose: str, settings: dict | None = None, retry: bool = True
    ) -> None:
        """Run a statement that returns nothing (DDL, ALTER, INSERT ... SELECT).

        ``retry=True`` declares the statement idempotent: it may be repeated after a
        transient failure or a lost answer. Pass ``retry=False`` for statements that must
        not run twice (e.g. ``ATTACH PARTITION`` into a plain MergeTree).
        """
        attempt = _Attempt(purpose, may_repeat=retry, outcome_unknown_ok=retry)
        self._send(self._params(settings), sql.encode("utf-8"), attempt)

    def insert(
        self,
        table: str,
        body: bytes | Iterable[bytes],
        *,
        fmt: str,
        purpose: str,
        columns: list[str] | None = None,
        settings: dict | None = None,
        retry: bool = True,
        deduplicated: bool = False,
        encoding: str | None = None,
    ) -> None:
        """INSERT ``body`` (already encoded in ``fmt``) into ``table`` (qualified, quoted).

        The statement, with its column list, opens the body (:func:`insert_statement`), so
        a wide table's columns meet no URL limit; one longer than the server's default
        ``max_query_size`` raises that setting for this INSERT.

        ``encoding`` (``server_ext.client.compression.ENCODINGS``): send the body, statement
        included, compressed with that ``Content-Encoding`` (both servers decompress it
        before reading the statement); it is compressed once, before the first attempt,
        so it is retried like bytes.

        A non-bytes body is streamed with chunked transfer encoding. An iterator (e.g. a
        generator) is retried only if the failure came before its first chunk was
        consumed; a re-iterable body (a list, or an object whose ``__iter__`` starts over)
        is iterated afresh for each attempt, so it is retried like bytes. A failed insert
        whose outcome is unknown (timeout after sending) is retried only when the caller
        says the server deduplicates it (``deduplicated``: a table with a deduplication
        window and an ``insert_deduplication_token`` in ``settings``); otherwise the
        caller must check.
        """
        params = self._params(settings, wait=False)
        query = insert_statement(table, columns, fmt)
        if len(query) > DEFAULT_MAX_QUERY_SIZE:  # the server parses the text up to this
            params["max_query_size"] = str(max(len(query) + 1,
                                               int(params.get("max_query_size", 0))))
        attempt = _Attempt(purpose, may_repeat=retry, outcome_unknown_ok=retry and deduplicated)
        if encoding:
            self._send(params, compress(_prefixed(query, body), encoding), attempt, encoding)
        elif isinstance(body, bytes | bytearray | memoryview):
            self._send(params, query + bytes(body), attempt)
        else:
            self._send_stream(params, body, attempt, prefix=query)

    # -- request plumbing ----------------------------------------------------------------

    def _answer(self, sql: str, fmt: str, purpose: str, settings: dict | None,
                encoding: str | None = None) -> str:
        attempt = _Attempt(purpose, may_repeat=True, outcome_unknown_ok=True)
        data = f"{strip_statement(sql)}\nFORMAT {fmt}".encode()
        resp = self._send(self._params(settings), compress(data, encoding) if encoding else data,
                          attempt, encoding)
        return resp.content.decode("utf-8")

    def _params(self, settings: dict | None, wait: bool = True) -> dict[str, str]:
        params = {"wait_end_of_query": "1"} if wait else {}
        for key, value in (settings or {}).items():
            params[key] = _setting_text(value)
        return params

    def _headers(self, encoding: str | None = None) -> dict[str, str]:
        headers = {"Content-Encoding": encoding} if encoding else {}
        if self.user is not None:
            headers["X-ClickHouse-User"] = self.user
        if self._password:
            headers["X-ClickHouse-Key"] = self._password
        return headers

    def _send(self, params: dict[str, str], data: bytes, attempt: _Attempt,
              encoding: str | None = None) -> requests.Response:
        return self._with_retries(attempt,
                                  lambda: self._post_once(params, data, attempt, encoding))

    def _send_stream(
        self, params: dict[str, str], chunks: Iterable[bytes], attempt: _Attempt,
        prefix: bytes = b"",
    ) -> None:
        replayable = not isinstance(chunks, Iterator)  # a list or a re-iterable object

        def once() -> requests.Response:
            guard = _ReplayGuard(chunks)  # watches the caller's chunks, not the prefix
            try:
                return self._post_once(params, _prefixed(prefix, guard), attempt)
            except ClickHouseError as exc:
                if guard.started and not replayable:  # the consumed part cannot be resent
                    exc.retryable = False
                raise

        self._with_retries(attempt, once)

    def _with_retries(
        self, attempt: _Attempt, call: Callable[[], requests.Response]
    ) -> requests.Response:
        def log_retry(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            log.warning("%s: attempt %d failed, retrying: %s", attempt.purpose,
                        state.attempt_number, exc)

        retrying = Retrying(
            stop=stop_after_attempt(self.retries + 1),
            wait=wait_exponential(multiplier=0.1, min=0.05, max=5.0),
            retry=retry_if_exception(lambda e: isinstance(e, ClickHouseError) and e.retryable),
            before_sleep=log_retry,
            reraise=True,
        )
        try:
            return retrying(call)
        except ServerUnreachable as exc:
            attempts = retrying.statistics.get("attempt_number", 1)
            raise ServerUnreachable(
                f"cannot connect to {self.address} (gave up after {attempts} attempts)",
                name=exc.name, purpose=attempt.purpose, query_id=exc.query_id,
            ) from None

    def _post_once(
        self, params: dict[str, str], data: bytes | Iterator[bytes], attempt: _Attempt,
        encoding: str | None = None,
    ) -> requests.Response:
        query_id = f"txsink-{uuid.uuid4().hex}"
        params = {**params, "query_id": query_id}
        if self._on_statement is not None:
            self._on_statement()
        try:
            resp = self._session.post(
                self.url,
                params=params,
                data=data,
                headers=self._headers(encoding),
                verify=self._verify,
                timeout=(min(self.timeout, 10.0), self.timeout),
            )
        except requests.RequestException as exc:
            raise self._transport_error(exc, attempt, query_id) from None
        self._raise_for_answer(resp, attempt, query_id)
        return resp

    def _transport_error(
        self, exc: requests.RequestException, attempt: _Attempt, query_id: str
    ) -> ClickHouseError:
        if isinstance(exc, requests.exceptions.SSLError):  # no request was sent; a retry
            return ClickHouseError(                          # would fail the same way
                f"TLS with {self.address} failed (check the server's certificate and the "
                f"ca_file option): {_tls_reason(exc)}", name="TLS_ERROR",
                purpose=attempt.purpose, retryable=False, query_id=query_id)
        if _never_sent(exc):
            return ServerUnreachable(
                f"cannot connect to {self.address}", name="SERVER_UNREACHABLE",
                purpose=attempt.purpose, retryable=True, query_id=query_id,
            )
        kind = "TIMEOUT" if isinstance(exc, requests.Timeout) else "CONNECTION_LOST"
        return ClickHouseError(
            f"no answer from {self.address} ({type(exc).__name__}); the statement may or may "
            "not have run",
            name=kind, purpose=attempt.purpose, retryable=attempt.outcome_unknown_ok,
            query_id=query_id,
        )

    def _raise_for_answer(self, resp: requests.Response, attempt: _Attempt, query_id: str) -> None:
        if resp.status_code == 200:
            tail = resp.content[-4096:].decode("utf-8", errors="replace")
            match = _TRAILING_EXCEPTION_RE.search(tail)
            if match is None:
                return
            text = match.group(1)
        else:
            text = resp.content.decode("utf-8", errors="replace")
        raise self._server_error(text, resp, attempt, query_id)

    def _server_error(
        self, text: str, resp: requests.Response, attempt: _Attempt, query_id: str
    ) -> ClickHouseError:
        text = self._redact(text.strip())
        parsed = parse_exception(text)
        header_code = resp.headers.get("X-ClickHouse-Exception-Code")
        code, message, name = parsed if parsed else (None, text or resp.reason or "", None)
        if code is None and header_code and header_code.isdigit():
            code = int(header_code)
        transient = is_transient(code, message) or (code is None and resp.status_code == 503)
        return ClickHouseError(
            message[:2000], code=code, name=name, purpose=attempt.purpose,
            retryable=transient and attempt.may_repeat, status=resp.status_code,
            query_id=query_id,
        )

    def _redact(self, text: str) -> str:
        if self._password:
            text = text.replace(self._password, _REDACTED)
        return text


# The server's default max_query_size (both servers): an INSERT whose text is longer
# raises it for itself, as the text is parsed from the body only up to that many bytes.
DEFAULT_MAX_QUERY_SIZE = 262_144


def insert_statement(table: str, columns: list[str] | None, fmt: str) -> bytes:
    """The text that opens an INSERT's body: ``INSERT INTO t (cols) FORMAT f`` and one
    newline.

    Why in the body and not in the URL's ``query`` parameter: a URL is limited (18.16
    answers "Bad Request" to a request line over 16 KiB; 26.x takes a parameter of at most
    ``http_max_field_value_size``, 128 KiB), and a wide table's column list exceeds that.
    Without a ``query`` parameter the server reads the statement from the start of the
    (decompressed) body, up to ``max_query_size`` bytes, and the data right after the one
    newline that ends it: it skips only that newline, so binary data that starts with a
    whitespace byte stays intact.
    """
    return f"INSERT INTO {table}{column_list(columns)} FORMAT {fmt}\n".encode()


def _prefixed(prefix: bytes, body: bytes | Iterable[bytes]) -> Iterator[bytes]:
    """``prefix`` followed by ``body``'s chunks, as one stream."""
    if prefix:
        yield prefix
    if isinstance(body, bytes | bytearray | memoryview):
        yield bytes(body)
    else:
        yield from body


def header_problem(credential: str | None) -> str | None:
    """Why a credential cannot travel in an HTTP header (None: it can).

    ``requests`` sends header values as Latin-1 and refuses line breaks; failing here
    says so once, instead of a ``UnicodeEncodeError`` or a retry loop on every request.
    The value itself is never part of the answer.
    """
    if not credential:
        return None
    if any(ch in credential for ch in "\r\n\0"):
        return "it contains a line break or NUL, which an HTTP header cannot carry"
    try:
        credential.encode("latin-1")
    except UnicodeEncodeError:
        return ("it contains characters outside Latin-1, which an HTTP header cannot "
                "carry; choose a password of ASCII characters")
    return None


def _tls_reason(exc: requests.exceptions.SSLError) -> str:
    """The innermost reason of a TLS failure (e.g. "certificate verify failed:
    self-signed certificate"), without the wrappers' reprs and OpenSSL's source line."""
    found = _ssl_error(exc)
    if isinstance(found, ssl.SSLCertVerificationError) and found.verify_message:
        return f"certificate verify failed: {found.verify_message}"[:300]
    text = str(found) if found is not None else str(exc)
    match = re.search(r"\((?:Caused by )?SSLError\((?:SSLCertVerificationError\()?(.*)", text)
    text = match.group(1) if match else text
    return re.sub(r"\s*\(_ssl\.c:\d+\)", "", text).rstrip(")'\" ")[:300]


def _ssl_error(exc: BaseException) -> ssl.SSLError | None:
    """The ``ssl.SSLError`` inside requests' and urllib3's wrappers, if any."""
    seen: set[int] = set()
    todo: list[object] = [exc]
    while todo:
        item = todo.pop(0)
        if not isinstance(item, BaseException) or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, ssl.SSLError):
            return item
        todo.extend([*item.args, getattr(item, "reason", None), item.__cause__,
                     item.__context__])
    return None


def _never_sent(exc: requests.RequestException) -> bool:
    """True when the request provably never reached the server (no connection made)."""
    if isinstance(exc, requests.ConnectTimeout):
        return True
    reason = getattr(exc.args[0], "reason", None) if exc.args else None
    return isinstance(reason, urllib3.exceptions.NewConnectionError)


def _strip_credentials(url: str) -> tuple[str, str | None, str | None]:
    parts = urlsplit(url)
    user = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, "")), user, password


def _setting_text(value: object) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)
