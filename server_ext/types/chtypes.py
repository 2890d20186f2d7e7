"""ClickHouse type names parsed into a small tree, with the facts the writer needs.

Why: the schema check, the per-batch value checks and the Native encoder all need to know,
for a type such as ``Nullable(Decimal(38, 4))``, its wrappers, its storage width and its
value range. Parsing the server's type text once, here, keeps those three in agreement.
``Decimal32(S)``/``Decimal64(S)``/``Decimal128(S)`` are normalised to ``Decimal(P, S)``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

# name -> (numpy dtype of the Native layout, min, max)
INTEGER_TYPES: dict[str, tuple[str, int, int]] = {
    "UInt8": ("<u1", 0, 2**8 - 1),
    "UInt16": ("<u2", 0, 2**16 - 1),
    "UInt32": ("<u4", 0, 2**32 - 1),
    "UInt64": ("<u8", 0, 2**64 - 1),
    "Int8": ("<i1", -(2**7), 2**7 - 1),
    "Int16": ("<i2", -(2**15), 2**15 - 1),
    "Int32": ("<i4", -(2**31), 2**31 - 1),
    "Int64": ("<i8", -(2**63), 2**63 - 1),
}
# Integers wider than numpy: the server converts into them from Arrow int64 or decimal
# (ArrowStream); none of them exists on 18.16.
WIDE_INTEGER_TYPES: dict[str, tuple[int, int]] = {
    "UInt128": (0, 2**128 - 1),
    "UInt256": (0, 2**256 - 1),
    "Int128": (-(2**127), 2**127 - 1),
    "Int256": (-(2**255), 2**255 - 1),
}
FLOAT_TYPES: dict[str, str] = {"Float32": "<f4", "Float64": "<f8"}
WRAPPERS = ("Nullable", "Array", "LowCardinality")
# Types whose arguments are types (``Tuple(a Int32, String)``, ``Map(K, V)``).
COMPOSITES = ("Tuple", "Map", "Nested", "Variant")
# Date is stored as UInt16 days and DateTime as UInt32 seconds since 1970-01-01 on every
# server version; which of those values a server reads back is narrower (``ValueRanges``).
DATE_MAX_DAYS = 2**16 - 1
DATETIME_MAX_SECONDS = 2**32 - 1
# Date32 and DateTime64 as 26.x reads them back (measured: ``capabilities``), which is
# also the range of Spark's dates and timestamps: 0001-01-01 .. 9999-12-31 (UTC).
DATE32_CALENDAR = (-719_162, 2_932_896)
DATETIME64_CALENDAR = (-62_135_596_800, 253_402_300_799)
_DECIMAL_ALIASES = {"Decimal32": 9, "Decimal64": 18, "Decimal128": 38, "Decimal256": 76}


@dataclass(frozen=True)
class ChType:
    """One ClickHouse type: ``base`` name, literal ``params`` and the wrapped ``inner`` type.

    ``Nullable(String)`` is ``ChType("Nullable", inner=ChType("String"))``;
    ``Decimal(10, 2)`` is ``ChType("Decimal", params=(10, 2))``;
    ``DateTime('UTC')`` is ``ChType("DateTime", params=("UTC",))``.
    """

    base: str
    params: tuple[int | str, ...] = ()
    inner: ChType | None = None
    text: str = field(default="", compare=False)
    # Tuple/Nested elements and Map's (key, value); ``names`` of a named Tuple or Nested
    elements: tuple[ChType, ...] = ()
    names: tuple[str, ...] = ()
    # Enum8/Enum16: (label, code) pairs
    labels: tuple[tuple[str, int], ...] = ()

    def __str__(self) -> str:
        """The type as the server printed it, on one line: newer servers print a Tuple's
        elements one per line, which would break messages (a newline never occurs in the
        text otherwise: a label's is escaped)."""
        return _ONE_LINE_RE.sub(_one_line, self.text) if self.text else self.base

    @property
    def is_nullable(self) -> bool:
        return self.base == "Nullable"

    def unwrap_low_cardinality(self) -> ChType:
        """The type with a LowCardinality wrapper removed (it changes storage, not values)."""
        return self.inner if self.base == "LowCardinality" and self.inner else self

    def value_type(self) -> ChType:
        """The type of the non-null values: LowCardinality and Nullable removed."""
        t = self.unwrap_low_cardinality()
        if t.is_nullable and t.inner is not None:
            t = t.inner.unwrap_low_cardinality()
        return t

    @property
    def tuple_names(self) -> tuple[str, ...]:
        """Element names of a Tuple: its own, or "1", "2", ... as the server names them."""
        return self.names or tuple(str(i + 1) for i in range(len(self.elements)))

    @property
    def precision(self) -> int:
        return int(self.params[0])

    @property
    def scale(self) -> int:
        return int(self.params[1])

    @property
    def decimal_width(self) -> int:
        """Bytes per value of a Decimal: 4, 8, 16 (or 32) by precision."""
        p = self.precision
        return 4 if p <= 9 else 8 if p <= 18 else 16 if p <= 38 else 32


@dataclass(frozen=True)
class ValueRanges:
    """The Date and DateTime values one server stores *and reads back unchanged*.

    Why per server: storage is the same on every version, but a server shows and parses
    dates through its calendar, and a stored value outside that calendar reads back as
    another value (ClickHouse 18.16 shows a Date after 2106-02-07 as 1970-01-01, and cannot
    parse its own text of any day after 2105-12-31). ``capabilities`` measures these
    bounds on the server itself by round trips of boundary values; nothing here is assumed
    from a version number. The default instance holds the storage limits alone.

    - ``date_days``: first and last Date, as days since 1970-01-01.
    - ``datetime_wall``: first and last wall-clock time the server's DateTime calendar
      holds, as seconds since 1970-01-01 00:00:00 *in the column's time zone*; None where
      the calendar reaches past storage in every zone (UTC-12 .. UTC+14). A column's
      range in instants therefore depends on its zone (``datetime_seconds``).
    - ``timezone``: the server's default zone, that of a ``DateTime`` without one.
    - ``server``: how messages name the server ("" when no server was asked).
    - ``date32_days``: first and last Date32 (days since 1970-01-01, may be negative).
    - ``datetime64_seconds``: first and last whole second of a DateTime64 in UTC (a
      column in another zone gets 15 h less at each end: ``datetime64_bounds``). Both
      default to the widest calendar of any server, 0001-01-01 .. 9999-12-31; 18.16
      has neither type, so its values never apply there.
    """

    server: str = ""
    date_days: tuple[int, int] = (0, DATE_MAX_DAYS)
    datetime_wall: tuple[int | None, int | None] = (None, None)
    timezone: str = "UTC"
    date32_days: tuple[int, int] = DATE32_CALENDAR
    datetime64_seconds: tuple[int, int] = DATETIME64_CALENDAR

    def datetime_seconds(self, ch: ChType) -> tuple[int, int]:
        """First and last instant (seconds since the epoch) a DateTime column ``ch`` holds."""
        zone = str(ch.params[0]) if ch.params else self.timezone
        return _instant_bounds(self.datetime_wall, zone)


    def datetime64_bounds(self, ch: ChType) -> tuple[int, int]:
        """First and last instant (seconds) DateTime64(p[, tz]) column ``ch`` holds.

        The calendar bounds wall-clock text; an instant near a bound shown in a zone
        other than UTC could leave it, so such columns lose ``_MAX_OFFSET`` at each end.
        DateTime64 stores Int64 ticks of 10^-p s, which bounds p = 9 (1677 .. 2262).
        """
        low, high = self.datetime64_seconds
        zone = str(ch.params[1]) if len(ch.params) > 1 else self.timezone
        if zone not in UTC_ZONES:
            low, high = low + _MAX_OFFSET, high - _MAX_OFFSET
        ticks = 10 ** int(ch.params[0]) if ch.params else 1_000
        return max(low, -(2**63) // ticks + 1), min(high, (2**63 - 1) // ticks - 1)


STORAGE_RANGES = ValueRanges()
# Zone names that are UTC at every instant: no offset to allow for, nothing to convert.
UTC_ZONES = frozenset({"UTC", "Etc/UTC", "UTC0", "Zulu", "Etc/Zulu", "GMT", "Etc/GMT"})
# UTC offsets lie within -12 h .. +14 h: a wall-clock bound is within this of its instant.
_MAX_OFFSET = 15 * 3600


@functools.lru_cache(maxsize=256)
def _instant_bounds(wall: tuple[int | None, int | None], zone: str) -> tuple[int, int]:
    """The instants in storage whose wall-clock time in ``zone`` lies within ``wall``.

    An unknown zone gets the narrowest range any offset allows, so it is never too wide.
    """
    low_wall, high_wall = wall
    try:
        tz = ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        tz = None

    def wall_of(instant: int) -> int:
        offset = datetime.fromtimestamp(instant, tz).utcoffset() if tz else None
        return instant + int(offset.total_seconds()) if offset is not None else instant

    low, high = 0, DATETIME_MAX_SECONDS
    if low_wall is not None:
        low = (low_wall + _MAX_OFFSET if tz is None else
               _first_true(lambda x: wall_of(x) >= low_wall, low_wall - _MAX_OFFSET,
                           low_wall + _MAX_OFFSET))
    if high_wall is not None:
        high = (high_wall - _MAX_OFFSET if tz is None else
                _first_true(lambda x: wall_of(x) > high_wall, high_wall - _MAX_OFFSET,
                            high_wall + _MAX_OFFSET) - 1)
    return max(low, 0), min(high, DATETIME_MAX_SECONDS)


def _first_true(predicate: Callable[[int], bool], low: int, high: int) -> int:
    """Smallest x in low..high with ``predicate`` (false then true across the range)."""
    while low < high:
        middle = (low + high) // 2
        if predicate(middle):
            high = middle
        else:
            low = middle + 1
    return low


_ONE_LINE_RE = re.compile(r"(\(?)\s*\n\s*(\)?)")


def _one_line(match: re.Match[str]) -> str:
    opened, closed = match.group(1), match.group(2)
    return opened + closed if opened or closed else " "


def parse_type(text: str) -> ChType:
    """Parse a ClickHouse type name as the server prints it in DESCRIBE / system.columns."""
    parsed, rest = _parse(text.strip())
    if rest.strip():
        raise ValueError(f"cannot parse ClickHouse type {text!r}")
    return parsed


_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _parse(text: str) -> tuple[ChType, str]:
    match = _NAME_RE.match(text)
    if match is None:
        raise ValueError(f"cannot parse ClickHouse type {text!r}")
    name, rest = match.group(0), text[match.end():].lstrip()
    if not rest.startswith("("):
        return ChType(name, text=name), rest
    if name == "SimpleAggregateFunction":  # stored and sent as its argument type
        args_text, rest = _balanced(rest)
        return parse_type(_split_args(args_text)[-1]), rest
    if name in WRAPPERS:
        inner, rest = _parse(rest[1:].lstrip())
        rest = _expect(rest, ")")
        return ChType(name, inner=inner, text=f"{name}({inner})"), rest
    args_text, rest = _balanced(rest)
    text = f"{name}({args_text})"
    if name in COMPOSITES:
        named = [_element(arg) for arg in _split_args(args_text)]
        elements = tuple(t for _, t in named)
        names = tuple(n for n, _ in named) if all(n for n, _ in named) else ()
        if name == "Nested":  # unflattened (flatten_nested = 0): an Array of named Tuples
            inner = ChType("Tuple", elements=elements, names=names, text=f"Tuple({args_text})")
            return ChType("Array", inner=inner, text=text), rest
        return ChType(name, elements=elements, names=names, text=text), rest
    if name in ("Enum8", "Enum16"):
        labels = tuple(_enum_pair(arg) for arg in _split_args(args_text))
        return ChType(name, labels=labels, text=text), rest
    params = tuple(_literal(arg) for arg in _split_args(args_text))
    if name in _DECIMAL_ALIASES:
        name, params = "Decimal", (_DECIMAL_ALIASES[name], params[0])
    return ChType(name, params=params, text=f"{match.group(0)}({args_text})"), rest


def _element(arg: str) -> tuple[str, ChType]:
    """``a Int32`` -> ("a", Int32); ``Int32`` -> ("", Int32); names may be back-quoted."""
    quoted = re.match(r"`((?:[^`\\]|\\.)*)`\s+", arg)
    if quoted:
        return re.sub(r"\\(.)", r"\1", quoted.group(1)), parse_type(arg[quoted.end():])
    parsed, rest = _parse(arg)
    if rest.strip():  # the first word was a name, not a type
        return parsed.base, parse_type(rest)
    return "", parsed


def _enum_pair(arg: str) -> tuple[str, int]:
    match = re.fullmatch(r"'((?:[^'\\]|\\.)*)'\s*=\s*(-?\d+)", arg.strip())
    if match is None:
        raise ValueError(f"cannot parse Enum element {arg!r}")
    return re.sub(r"\\(.)", r"\1", match.group(1)), int(match.group(2))


def _expect(text: str, token: str) -> str:
    text = text.lstrip()
    if not text.startswith(token):
        raise ValueError(f"expected {token!r} in ClickHouse type near {text!r}")
    return text[len(token):]


def _balanced(text: str) -> tuple[str, str]:
    """Split ``(a, b)rest`` into ``a, b`` and ``rest``, honouring quotes and nesting."""
    depth, quoted, i = 0, False, 0
    while i < len(text):
        ch = text[i]
        if quoted:
            if ch == "\\":
                i += 1
            elif ch == "'":
                quoted = False
        elif ch == "'":
            quoted = True
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return text[1:i], text[i + 1:]
        i += 1
    raise ValueError(f"unbalanced parentheses in ClickHouse type {text!r}")


def _split_args(text: str) -> list[str]:
    args, depth, quoted, start = [], 0, False, 0
    for i, ch in enumerate(text):
        if quoted:
            quoted = not (ch == "'" and text[i - 1] != "\\")
        elif ch == "'":
            quoted = True
        elif ch in "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            args.append(text[start:i])
            start = i + 1
    args.append(text[start:])
    return [a.strip() for a in args if a.strip()]


def _literal(arg: str) -> int | str:
    if arg.startswith("'") and arg.endswith("'"):
        return re.sub(r"\\(.)", r"\1", arg[1:-1])
    if re.fullmatch(r"-?\d+", arg):
        return int(arg)
    return arg
