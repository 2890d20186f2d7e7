"""The options of bad rows: ``bad_rows``, ``quarantine_table``, ``max_bad_rows``.

What a value that does not fit its column does: fail the write naming it (``fail``, the
default), or send its row to ``quarantine_table``, published exactly once with the good
rows under the same decision (``quarantine``; ``txsink/core/quarantine_share.py``).
``max_bad_rows``
bounds the rows one write (one xid) may quarantine: past it the write fails and nothing
of it becomes visible.
"""

from __future__ import annotations

from dataclasses import dataclass

from txsink.options.target_name import name_problem

BAD_ROWS_CHOICES = ("fail", "quarantine")
DEFAULT_MAX_BAD_ROWS = 100_000
OPTION_NAMES = ("bad_rows", "quarantine_table", "max_bad_rows")


@dataclass(frozen=True)
class BadRowsOptions:
    """What a value that does not fit its column does."""

    mode: str = BAD_ROWS_CHOICES[0]  # the option bad_rows: "fail" or "quarantine"
    quarantine_table: str | None = None  # database.table of the quarantined rows
    max_bad_rows: int = DEFAULT_MAX_BAD_ROWS  # per write (xid)


def parse(values: dict[str, object]) -> BadRowsOptions:
    """These options of ``values``, checked (:func:`check`), as a record."""
    check(values)
    return BadRowsOptions(mode=str(values["bad_rows"]),
                          quarantine_table=values.get("quarantine_table"),  # type: ignore[arg-type]
                          max_bad_rows=int(values.get(  # type: ignore[call-overload]
                              "max_bad_rows", DEFAULT_MAX_BAD_ROWS)))


def check(values: dict[str, object]) -> None:
    """Normalise ``values`` in place; raise ``ValueError`` naming the option.

    ``bad_rows`` is one of the choices; ``quarantine_table`` (``database.table``) is
    required with ``bad_rows=quarantine`` and refused without it; ``max_bad_rows`` is a
    count from 0 (0: no bad row is kept, the first fails the write), refused without
    ``bad_rows=quarantine`` too.
    """
    mode = str(values.get("bad_rows", "fail")).lower()
    if mode not in BAD_ROWS_CHOICES:
        raise ValueError(f"option bad_rows={mode!r} is not one of {', '.join(BAD_ROWS_CHOICES)}")
    values["bad_rows"] = mode
    table = str(values.get("quarantine_table") or "")
    if mode == "quarantine" and not table:
        raise ValueError("option bad_rows=quarantine needs quarantine_table (the "
                         "database.table that keeps the bad rows)")
    if table and mode != "quarantine":
        raise ValueError("option quarantine_table is only used with bad_rows=quarantine")
    problem = name_problem("quarantine_table", table) if table else None
    if problem:
        raise ValueError(problem)
    if "max_bad_rows" in values and mode != "quarantine":
        raise ValueError("option max_bad_rows is only used with bad_rows=quarantine (with "
                         "bad_rows=fail the first bad row fails the write)")
    if "max_bad_rows" in values:
        raw = str(values["max_bad_rows"])
        try:
            count = int(raw)
        except ValueError:
            raise ValueError(f"option max_bad_rows={raw!r} is not an int") from None
        if count < 0:
            raise ValueError(f"option max_bad_rows={raw!r} must be at least 0")
        values["max_bad_rows"] = count
