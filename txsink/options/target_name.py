"""A ``table`` option without a database: it means ``default``, and the write says so.

ClickHouse resolves a bare table name in the session's current database, but the sink
qualifies every statement it sends, so a bare ``events`` is always ``default.events``
(``server_ext.sql.split_table_name``), whatever database the user or the URL prefers.
Refusing bare names would break the jobs that rely on this; writing there without a word
lets a forgotten database send rows to a table of the same name in ``default``. So the
write goes on and logs a WARNING naming the table it resolved to: the planner runs in a
Spark Python worker, whose logging shows WARNING and above unless configured otherwise.
"""

from __future__ import annotations

import logging

from server_ext.sql import qualified_name, split_table_name

log = logging.getLogger(__name__)

#: The database of a ``table`` option that names none (as ``split_table_name`` resolves).
DEFAULT_DATABASE = "default"


def name_problem(option: str, value: str, *, database: bool = True) -> str | None:
    """Why option ``option``'s ``value`` is not a table name (``database.table``, or with
    ``database=False`` a bare table too), or None."""
    try:
        found, table = split_table_name(value, default_database="")
    except ValueError:
        found = table = ""
    if table and (found or not database):
        return None
    form = "database.table" if database else "[database.]table"
    return (f"option {option}={value!r} must be {form}: quote a part that holds dots or "
            "spaces with backticks (`my.db`.`events`); inside one, write a backtick twice")


def note_default_database(table: str) -> str | None:
    """Log that ``table`` names no database, with the table it resolves to, and return
    that name (``None`` for a name with a database). A malformed name is refused by the
    options (:func:`name_problem`), not here."""
    try:
        database, name = split_table_name(table, default_database="")
    except ValueError:
        return None
    if database:
        return None
    resolved = qualified_name(DEFAULT_DATABASE, name)
    log.warning("txsink table=%r names no database: writing to %s. Give database.table "
                "to choose the database", table, resolved)
    return resolved
