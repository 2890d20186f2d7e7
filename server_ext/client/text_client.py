"""The body both clients share: queries answered as text and read here.

``ClickHouseClient`` (HTTP) and ``ChdbClient`` (in-process) differ only in how a
statement reaches the engine and comes back (:meth:`TextClient._answer`: the statement
with ``FORMAT fmt``, its settings, the answer's text); how a ``JSON`` answer becomes rows
and a ``TabSeparated`` one a value is written once, here.
"""

from __future__ import annotations

import json
import re

from server_ext.client.client_protocol import Client
from server_ext.errors import ClickHouseError


class TextClient(Client):
    """``query_rows`` and ``query_value`` over one method a client implements."""

    def query_rows(self, sql: str, *, purpose: str, settings: dict | None = None) -> list[dict]:
        """Rows of a SELECT as dicts, values typed as ClickHouse's JSON output gives them
        (64-bit integers arrive as strings on servers that quote them)."""
        body = self._answer(sql, "JSON", purpose, settings)
        if not body.strip():
            return []
        return list(json.loads(body)["data"])

    def query_value(self, sql: str, *, purpose: str, encoding: str | None = None) -> str:
        """First column of the first row, as text. Raises when the result has no row.
        ``encoding``: send the statement compressed so (to ask the server whether it reads
        that ``Content-Encoding``; in-process, nothing is sent compressed)."""
        body = self._answer(sql, "TabSeparated", purpose, None, encoding)
        if not body:
            raise ClickHouseError("the query returned no row", name="EMPTY_RESULT", purpose=purpose)
        return first_value(body)

    def _answer(self, sql: str, fmt: str, purpose: str, settings: dict | None,
                encoding: str | None = None) -> str:
        """The text of ``sql``'s result in ``fmt``, run with ``settings``; raises
        ``ClickHouseError`` naming ``purpose``."""
        raise NotImplementedError


_TSV_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "0": "\0", "\\": "\\", "'": "'", "b": "\b",
                "f": "\f"}


def first_value(text: str) -> str:
    """The first field of the first row of a TabSeparated result, unescaped."""
    return _unescape_tsv(text.split("\n", 1)[0].split("\t", 1)[0])


def _unescape_tsv(field: str) -> str:
    if "\\" not in field:
        return field
    return re.sub(r"\\(.)", lambda m: _TSV_ESCAPES.get(m.group(1), m.group(1)), field)
