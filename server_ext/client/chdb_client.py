"""The ClickHouse 26.9 engine of the ``chdb`` package, behind the ``ClickHouseClient`` API.

Why: no modern ClickHouse server can run on the machines this project is built on, but
``chdb`` embeds a current engine in-process. Speaking it through the same four methods as
the HTTP client lets the modern-server paths (``MOVE PARTITION``, ``ArrowStream`` input)
run through exactly the code that production uses against a real server.

Limits of the engine, enforced here so they fail with a clear message:
- one process opens at most one data path, for its whole life (the engine refuses a
  second path, and closing and reopening a path is not supported). Sessions are therefore
  kept per path in this module and shared by every ``ChdbClient`` of that path;
  ``ChdbClient.for_process()`` gives every caller in a process the same path.
- ``chdb`` is imported lazily: a process that forks after importing it hangs in the child.
- an INSERT body is spooled to a temporary file and loaded with ``INSERT ... FROM INFILE``:
  chdb's streaming inserter (``send_insert``) reports success and ``rows_written`` even
  when the INSERT fails on the server side (seen with chdb 4.4 / engine 26.9 on an
  exception in a MATERIALIZED column: no row landed, no error raised).
There is no network, so nothing is retried; ``retry`` is accepted for API compatibility.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from collections.abc import Iterable
from typing import Any

from server_ext.client.text_client import TextClient
from server_ext.errors import ClickHouseError, parse_exception
from server_ext.sql import column_list, settings_clause, sql_string, strip_statement

_SESSIONS: dict[str, Any] = {}
_LOCK = threading.RLock()
_SCRATCH_PATHS: list[str] = []  # paths made by for_process(), removed at exit


@atexit.register
def _remove_scratch_paths() -> None:
    for path in _SCRATCH_PATHS:
        session = _SESSIONS.pop(path, None)
        if session is not None:
            session.close()
        shutil.rmtree(path, ignore_errors=True)


def _session(path: str) -> Any:
    """The process-wide chdb session for ``path`` (opened on first use)."""
    with _LOCK:
        if path not in _SESSIONS:
            if _SESSIONS:
                opened = next(iter(_SESSIONS))
                raise ClickHouseError(
                    f"this process already opened chdb at {opened}; it cannot open {path}",
                    name="CHDB_PATH_IN_USE", purpose="open chdb",
                )
            from chdb import session  # lazy: see the module docstring

            _SESSIONS[path] = session.Session(path)
        return _SESSIONS[path]


class ChdbClient(TextClient):
    """In-process ClickHouse with the same methods as ``ClickHouseClient``."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self.url = f"chdb://{self.path}"
        self._session = _session(self.path)

    @classmethod
    def for_process(cls) -> ChdbClient:
        """A client on this process's one chdb path (a temp directory per process)."""
        with _LOCK:
            if _SESSIONS:
                return cls(next(iter(_SESSIONS)))
            path = tempfile.mkdtemp(prefix=f"txsink-chdb-{os.getpid()}-")
            _SCRATCH_PATHS.append(path)
            return cls(path)

    def __repr__(self) -> str:
        return f"ChdbClient(url={self.url!r})"

    def execute(
        self, sql: str, *, purpose: str, settings: dict | None = None, retry: bool = True
    ) -> None:
        """Run a statement that returns nothing. ``retry`` has no effect (no network)."""
        self._run(_with_settings(sql, settings), "TabSeparated", purpose)

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
        """INSERT ``body`` (encoded in ``fmt``) into ``table``, spooled through a temp file.

        ``retry``, ``deduplicated`` and ``encoding`` are the network client's: in-process,
        an insert has no lost answer to repeat and no compressed body."""
        chunks = [body] if isinstance(body, bytes | bytearray | memoryview) else body
        with tempfile.NamedTemporaryFile(prefix="txsink-insert-", delete=False) as spool:
            for chunk in chunks:
                spool.write(chunk)
        try:
            self._run(f"INSERT INTO {table}{column_list(columns)} FROM INFILE "
                      f"{sql_string(spool.name)}{settings_clause(settings)} FORMAT {fmt}",
                      "TabSeparated", purpose)
        finally:
            os.unlink(spool.name)

    def _answer(self, sql: str, fmt: str, purpose: str, settings: dict | None,
                encoding: str | None = None) -> str:
        """``encoding`` is the network client's: in-process, nothing is sent compressed."""
        return self._run(_with_settings(sql, settings), fmt, purpose)

    def _run(self, sql: str, fmt: str, purpose: str) -> str:
        with _LOCK:
            try:
                result = self._session.query(strip_statement(sql), fmt)
            except Exception as exc:
                raise _error(exc, purpose) from None
        return result.bytes().decode("utf-8") if result is not None else ""


def _with_settings(sql: str, settings: dict | None) -> str:
    return f"{strip_statement(sql)}{settings_clause(settings)}"


def _error(exc: Exception, purpose: str) -> ClickHouseError:
    text = str(exc)
    start = text.find("Code: ")
    parsed = parse_exception(text[start:]) if start >= 0 else None
    if parsed is None:
        return ClickHouseError(text, purpose=purpose)
    code, message, name = parsed
    return ClickHouseError(message, code=code, name=name, purpose=purpose)
