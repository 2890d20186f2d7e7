"""Arrow date and time values turned into the numbers ClickHouse stores.

Shared by the value checks (``row_checks``) and the encoder so that what is checked is exactly
what is sent. ClickHouse stores Date as days and DateTime as whole seconds since
1970-01-01 UTC; Arrow timestamps are instants in s/ms/us/ns (a time zone only changes how
they are displayed), so the conversion is an integer floor division. Nulls become 0: the
caller handles them through the validity bitmap.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from server_ext.types.chtypes import UTC_ZONES

MILLIS_PER_DAY = 86_400_000
SECONDS_PER_DAY = 86_400
_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
UNIT_DIGITS = {"s": 0, "ms": 3, "us": 6, "ns": 9}  # decimals of each Arrow timestamp unit


def _int64(array: pa.Array) -> np.ndarray:
    raw = array.cast(pa.int64()) if array.type != pa.int64() else array
    if raw.null_count:
        raw = pc.fill_null(raw, 0)
    return raw.to_numpy(zero_copy_only=False)


def to_days(array: pa.Array) -> np.ndarray:
    """Days since the epoch (int64) of a date32, date64 or timestamp array."""
    if pa.types.is_date32(array.type):
        return _int64(array.cast(pa.int32()))
    if pa.types.is_date64(array.type):
        return _int64(array) // MILLIS_PER_DAY
    return to_seconds(array) // SECONDS_PER_DAY


def to_seconds(array: pa.Array) -> np.ndarray:
    """Whole seconds since the epoch (int64, floor) of a timestamp or date array."""
    if pa.types.is_date32(array.type) or pa.types.is_date64(array.type):
        return to_days(array) * SECONDS_PER_DAY
    per_second = _PER_SECOND[array.type.unit]
    raw = _int64(array)
    return raw if per_second == 1 else raw // per_second


def to_ticks(array: pa.Array) -> np.ndarray:
    """The raw int64 values of a timestamp array, in its own unit (nulls as 0)."""
    return _int64(array)


def day_text(days: int) -> str:
    """``YYYY-MM-DD`` of a day number (days since 1970-01-01), for messages."""
    return (date(1970, 1, 1) + timedelta(days=days)).isoformat()


def instant_text(seconds: int) -> str:
    """``YYYY-MM-DD hh:mm:ss`` in UTC of seconds since the epoch, for messages."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S")



def wall_clock_instants(array: pa.Array, zone: str) -> tuple[pa.Array, np.ndarray]:
    """The instants at which a clock in ``zone`` shows the wall-clock times of ``array``
    (an Arrow timestamp without zone), as a UTC timestamp of the same unit, and a mask of
    the times that do not exist in ``zone`` (skipped by a daylight-saving change).

    A time shown twice (the hour repeated when clocks go back) gets the earlier instant,
    as Java's ``ZonedDateTime.of`` and so Spark give it. pandas does the localization:
    pyarrow's ``assume_timezone`` was measured to ignore daylight saving after 2037
    (it reads only the transitions listed in the zone file), which the server applies.
    """
    unit = array.type.unit
    wanted = pa.timestamp(unit, tz="UTC")
    if zone in UTC_ZONES:
        return array.cast(wanted), np.zeros(len(array), bool)
    import pandas as pd  # here only: its import costs every Spark worker ~0.3 s otherwise

    local = pd.Series(array.to_pandas(date_as_object=False), copy=False)
    if local.dtype != f"datetime64[{unit}]":
        local = local.astype(f"datetime64[{unit}]")
    placed = local.dt.tz_localize(ZoneInfo(zone), ambiguous=np.ones(len(local), bool),
                                  nonexistent="NaT")
    instants = pa.array(placed.dt.tz_convert("UTC"), wanted)
    missing = pc.and_(pc.is_null(instants), pc.is_valid(array))
    return instants, missing.to_numpy(zero_copy_only=False)
