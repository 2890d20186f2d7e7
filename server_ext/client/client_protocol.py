"""The one client protocol of ``server_ext``: what every module needs of a ClickHouse.

``ClickHouseClient`` (HTTP, ``server_ext/client/http_client.py``) and ``ChdbClient`` (in-process,
``server_ext/client/chdb_client.py``) both declare it, so every function of this package that
takes a client runs against either.

Contract: ``execute`` and ``insert`` with ``retry=True`` may be repeated by the client
after a lost answer, so callers pass it only for statements whose repeat is harmless;
``purpose`` names the step in every error the client raises.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol


class SqlClient(Protocol):
    """Statements and queries."""

    url: str

    def execute(self, sql: str, *, purpose: str, settings: dict | None = None,
                retry: bool = True) -> None: ...

    def query_rows(self, sql: str, *, purpose: str, settings: dict | None = None
                   ) -> list[dict]: ...

    def query_value(self, sql: str, *, purpose: str, encoding: str | None = None) -> str: ...


class InsertClient(Protocol):
    """Inserts of bodies already encoded in ``fmt`` (Native, ArrowStream)."""

    def insert(self, table: str, body: bytes | Iterable[bytes], *, fmt: str, purpose: str,
               columns: list[str] | None = None, settings: dict | None = None,
               retry: bool = True, deduplicated: bool = False,
               encoding: str | None = None) -> None: ...


class Client(SqlClient, InsertClient, Protocol):
    """Both: what ``ClickHouseClient`` and ``ChdbClient`` are."""
