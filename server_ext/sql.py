"""SQL text: identifier quoting, literals and the statement pieces several modules share.

Every statement server_ext sends is built from these helpers, so escaping exists once:
- identifiers are backquoted with backslashes and backquotes escaped (``quote_identifier``,
  ``qualified_name``), or left bare where they are plain words (``identifier_text``);
  ``split_table_name`` reads ``db.table`` back;
- values are inlined as literals (``sql_string``, ``value_literal``). Not as query
  parameters (``{name:Type}`` with ``param_name=``): ClickHouse 18.16 refuses them
  ("Unknown setting param_x", code 115, measured over HTTP); they came with 19.x, and chdb
  (engine 26.9) has them. Once 18.16 is no longer supported, values can move to parameters
  here without touching the statements' callers;
- ``tokenize`` splits statement text into tokens (strings, quoted names, words), for the
  few places that read the server's own DDL text (a view's query, an engine's TTL);
- ``column_list``, ``settings_clause``, ``setting_assignments``, ``table_filter`` and
  ``strip_statement`` are the statement fragments several modules share (the HTTP and chdb
  clients, staging DDL, every query of a system table about one table).

Pure text: nothing here talks to a server.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: The database of the probes' throwaway tables (capabilities, the old-server wing's probes,
#: staging's preflight), each named uniquely and dropped afterwards.
SCRATCH_DATABASE = "txsink_scratch"

_BARE_IDENTIFIER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# -- identifiers ---------------------------------------------------------------------------


def quote_identifier(name: str) -> str:
    """Backtick-quote an identifier, escaping backslashes and backticks inside it."""
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def qualified_name(database: str, table: str) -> str:
    """``\\`db\\`.\\`table\\``` with both parts quoted."""
    return f"{quote_identifier(database)}.{quote_identifier(table)}"


def is_bare_identifier(name: str) -> bool:
    """True for a plain word (``[A-Za-z_][A-Za-z0-9_]*``) that needs no quotes."""
    return bool(_BARE_IDENTIFIER_RE.match(name))


def identifier_text(name: str) -> str:
    """``name`` as written in SQL: bare if it is a plain word, else backquoted."""
    return name if is_bare_identifier(name) else quote_identifier(name)


def shown_name(database: str, table: str) -> str:
    """``database.table`` as a message shows it: each part bare if it is a plain word, else
    backquoted, so a name holding dots, spaces or backticks reads unambiguously."""
    return f"{identifier_text(database)}.{identifier_text(table)}"


def split_table_name(name: str, default_database: str = "default") -> tuple[str, str]:
    """Split ``db.table`` (parts optionally backtick-quoted) into ``(db, table)``.

    A name without a database gets ``default_database``. Unquoted names split at the first
    dot; quote a part to keep a dot inside it. Inside a quoted part a backtick is written
    twice or after a backslash, as in SQL.
    """
    parts = _split_identifiers(name.strip())
    if len(parts) == 1:
        return default_database, parts[0]
    if len(parts) == 2:
        return parts[0], parts[1]
    raise ValueError(f"not a table name: {name!r}")


def _split_identifiers(text: str) -> list[str]:
    parts: list[str] = []
    i = 0
    while i <= len(text):
        if text.startswith("`", i):
            part, i = _read_quoted(text, i + 1)
        else:
            end = text.find(".", i)
            end = len(text) if end < 0 else end
            part, i = text[i:end], end
        if not part:
            raise ValueError(f"not a table name: {text!r}")
        parts.append(part)
        if i >= len(text):
            break
        if text[i] != ".":
            raise ValueError(f"not a table name: {text!r}")
        if len(parts) == 1 and not text.startswith("`", i + 1):
            parts.append(text[i + 1 :])  # unquoted table part keeps any further dots
            if not parts[-1]:
                raise ValueError(f"not a table name: {text!r}")
            break
        i += 1
    return parts


def _read_quoted(text: str, i: int) -> tuple[str, int]:
    out: list[str] = []
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            out.append(text[i + 1])
            i += 2
        elif text.startswith("``", i):  # a backtick written twice, as SQL writes it
            out.append("`")
            i += 2
        elif ch == "`":
            return "".join(out), i + 1
        else:
            out.append(ch)
            i += 1
    raise ValueError(f"unterminated quoted identifier in {text!r}")


# -- literals ------------------------------------------------------------------------------


def sql_string(value: str) -> str:
    """A single-quoted SQL string literal, backslashes and single quotes escaped."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def value_literal(value: object) -> str:
    """A Python value as SQL: bools as 1/0, numbers as written, anything else a string."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int | float):
        return str(value)
    return sql_string(str(value))


# -- statement fragments -------------------------------------------------------------------


def column_list(columns: Iterable[str] | None) -> str:
    """`` (`a`, `b`)`` for an INSERT's columns; empty when ``columns`` is None (all)."""
    if columns is None:
        return ""
    return " (" + ", ".join(quote_identifier(c) for c in columns) + ")"


def setting_assignments(settings: Mapping[str, str]) -> str:
    """``name = value, ...`` with each value already SQL text."""
    return ", ".join(f"{name} = {value}" for name, value in settings.items())


def settings_clause(settings: Mapping[str, object] | None) -> str:
    """`` SETTINGS name = literal, ...`` for Python values; empty without settings."""
    if not settings:
        return ""
    literals = {name: value_literal(value) for name, value in settings.items()}
    return f" SETTINGS {setting_assignments(literals)}"


def table_filter(database: str, table: str, *, name_column: str = "table") -> str:
    """``database = 'db' AND table = 't'``: one table's rows of a system table.

    ``system.tables`` calls the table's column ``name`` (``name_column="name"``);
    ``system.parts``, ``system.replicas`` and ``system.columns`` call it ``table``.
    """
    return f"database = {sql_string(database)} AND {name_column} = {sql_string(table)}"


def strip_statement(sql: str) -> str:
    """``sql`` without surrounding whitespace and trailing semicolons, ready for a suffix."""
    return sql.strip().rstrip(";").rstrip()


# -- tokens --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Token:
    kind: str  # "word", "quoted" (an identifier in `` ` `` or ``"``), "string", "number", "punct"
    text: str  # for identifiers, the name unquoted
    start: int
    end: int


_TOKEN_RE = re.compile(r"""
    (?P<space>\s+|--[^\n]*|/\*.*?\*/)
  | (?P<string>'(?:[^'\\]|\\.|'')*')
  | (?P<quoted>`(?:[^`\\]|\\.|``)*`|"(?:[^"\\]|\\.|"")*")
  | (?P<word>[A-Za-z_][A-Za-z0-9_$]*)
  | (?P<number>[0-9][0-9A-Za-z_.]*)
  | (?P<punct>.)
""", re.VERBOSE | re.DOTALL)


def tokenize(text: str) -> list[Token]:
    """SQL tokens of ``text`` (whitespace and comments dropped)."""
    tokens = []
    for match in _TOKEN_RE.finditer(text):
        kind = match.lastgroup or "punct"
        if kind == "space":
            continue
        value = match.group()
        if kind == "quoted":
            value = re.sub(r"\\(.)", r"\1", value[1:-1]).replace(value[0] * 2, value[0])
        tokens.append(Token(kind, value, match.start(), match.end()))
    return tokens


def clause(text: str, keyword: str, ends: tuple[str, ...]) -> str:
    """The top-level clause of ``text`` that starts with the word ``keyword`` and runs to
    the next top-level word of ``ends`` (or the end), as written; "" if there is none."""
    depth, start = 0, None
    for token in tokenize(text):
        if token.kind == "punct" and token.text in "([":
            depth += 1
        elif token.kind == "punct" and token.text in ")]":
            depth -= 1
        elif depth == 0 and token.kind == "word":
            word = token.text.upper()
            if start is None and word == keyword:
                start = token.start
            elif start is not None and word in ends:
                return text[start:token.start].strip()
    return text[start:].strip() if start is not None else ""
