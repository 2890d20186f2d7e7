"""The row hash's arguments for a ``cityHash64`` that takes few types (ClickHouse 18.16).

18.16's ``cityHash64`` refuses Nullable (also inside Array or Tuple), LowCardinality, UUID
and Decimal arguments: each is turned into a value it takes (``isNull`` with
``assumeNotNull``, a cast to the inner type, the UUID's 16 bytes, the Decimal's text),
element by element inside arrays. ``hashes_any_type`` asks a server whether it needs this;
``capabilities`` chooses between ``old_hash_argument`` and the modern
``digest.any_type_argument`` (the digest and its schemes: ``server_ext.types.digest``).
"""

from __future__ import annotations

from server_ext.client.client_protocol import SqlClient
from server_ext.errors import ClickHouseError, ServerUnreachable
from server_ext.types.chtypes import ChType
from server_ext.types.digest import hashed_as_is


def old_hash_argument(expr: str, t: ChType) -> str:
    """The argument of a column of type ``t`` for 18.16's ``cityHash64``."""
    return _old(expr, t, 1)


def _old(expr: str, t: ChType, depth: int) -> str:
    """An argument 18.16's cityHash64 takes, holding the value of ``expr`` of type ``t``."""
    if hashed_as_is(t):
        return expr
    if t.base == "Nullable" and t.inner is not None:
        inner = _old(f"assumeNotNull({expr})", t.inner, depth)
        return f"cityHash64(isNull({expr}), {inner})"
    if t.base == "LowCardinality" and t.inner is not None:
        return _old(f"CAST({expr} AS {t.inner})", t.inner, depth)
    if t.base == "UUID":
        return f"reinterpretAsString({expr})"
    if t.base == "Array" and t.inner is not None:
        x = f"x{depth}"
        return f"arrayMap({x} -> {_old(x, t.inner, depth + 1)}, {expr})"
    if t.base == "Tuple" and t.elements:
        parts = [_old(f"tupleElement({expr}, {i + 1})", e, depth)
                 for i, e in enumerate(t.elements)]
        return f"cityHash64({', '.join(parts)})"
    return f"toString({expr})"  # Decimal and anything else: its text


def hashes_any_type(client: SqlClient) -> bool:
    """Whether the server's ``cityHash64`` takes the types 18.16's refuses (one read-only
    query; ``Capabilities.hash_any_type`` caches it for writers)."""
    try:
        client.query_value(
            "SELECT cityHash64(toDecimal32(1, 2), [toNullable(1)], "
            "toUUID('00000000-0000-0000-0000-000000000000'))", purpose="probe hash types")
    except ClickHouseError as exc:
        if isinstance(exc, ServerUnreachable):
            raise
        return False
    return True
