"""Reads of ``system.tables``, the one way every module asks the server about its tables.

ClickHouse 18.16 answers a query of ``system.tables`` filtered by database with
``UNKNOWN_TABLE`` (code 60) or ``FILE_DOESNT_EXIST`` (code 107, its metadata file), naming
some other table, when a table of that database is dropped while the query runs: it lists
the database's tables, then opens each, and the dropped one is gone. Measured on these
servers: about 1 such query in 100 fails while tables of the database are created and
dropped at full speed (the staging database, where every sink creates and drops its
tables), filtered by name or not; ``system.parts`` and ``system.columns`` are not affected,
nor is 26.x. A query of ``system.tables`` fails with these codes for no other reason than a
vanishing table, so :func:`catalog_rows` repeats it on them a few times; any other error,
or the same one repeating, is raised as the client raised it.
"""

from __future__ import annotations

from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_fixed

from server_ext.client.client_protocol import SqlClient
from server_ext.errors import FILE_DOESNT_EXIST, UNKNOWN_TABLE, ClickHouseError

_ATTEMPTS = 8


def _dropped_meanwhile(exc: BaseException) -> bool:
    return isinstance(exc, ClickHouseError) and exc.code in (UNKNOWN_TABLE, FILE_DOESNT_EXIST)


def catalog_rows(client: SqlClient, sql: str, *, purpose: str) -> list[dict]:
    """The rows of ``sql``, a query of ``system.tables``, repeated while a table of the
    database it filters on is dropped under it."""
    return _repeating()(client.query_rows, sql, purpose=purpose)


def catalog_value(client: SqlClient, sql: str, *, purpose: str) -> str:
    """``client.query_value`` of ``sql``, a query of ``system.tables``, repeated likewise."""
    return _repeating()(client.query_value, sql, purpose=purpose)


def _repeating() -> Retrying:
    return Retrying(stop=stop_after_attempt(_ATTEMPTS), wait=wait_fixed(0.02),
                    retry=retry_if_exception(_dropped_meanwhile), reraise=True)
