"""Content digests: the rows of a partition as the server stores them, in a few bytes.

Why: a row count cannot tell 7 rows deleted and 7 others duplicated from nothing at all,
nor a row changed in place. A branch records, at seal, a digest per partition of its
staging table; ``txsink verify`` computes the same digest of the target's partition and
compares it with the sum of the digests of the committed xids that wrote it.

A digest is (rows, sum of a 64-bit hash of every row, with wrap-around) and the *scheme*
that hashed them. A sum, not a XOR: XOR cancels a row that appears twice. The sum does
not depend on row order or on how rows are split into parts, so moving, attaching,
merging (plain MergeTree) or rewriting rows by ``INSERT ... SELECT`` keeps it, and the
digest of a partition filled by several branches is the sum of theirs (:func:`digest_union`).

The row hash is ``cityHash64`` of one argument per stored column (ALIAS and EPHEMERAL
columns store nothing), built from the column's type (:func:`row_hash`), because servers
differ in what ``cityHash64`` takes:
- current servers hash any type; a top-level NULL (``Nullable``, a ``Dynamic`` holding
  NULL) makes the whole hash NULL, which ``sum`` would skip, so such a column is hashed
  on its own and a NULL becomes a fixed value;
- ClickHouse 18.16 refuses Nullable, LowCardinality, UUID and Decimal arguments: the
  old-server wing turns each into a value it takes (``server_ext.old_server.hash_arguments``).
Which of the two a server gets is one ``HashArgument``, chosen in ``capabilities``.
The scheme is a fingerprint of the expression itself (so of every column's name and
type): a digest is only compared with one of the same scheme, and a table whose columns
changed since a branch was sealed is judged by its row count alone.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from server_ext.sql import qualified_name, quote_identifier, sql_string
from server_ext.types.chtypes import ChType, parse_type

if TYPE_CHECKING:
    from server_ext.client.client_protocol import SqlClient

DIGEST_VERSION = 1  # part of every scheme: a new hash rule never compares with an old one
MODULUS = 2**64
NULL_HASH = 0x9E3779B97F4A7C15  # the row hash's argument for a top-level NULL
STORELESS_KINDS = frozenset({"ALIAS", "EPHEMERAL"})
#: The row hash's argument for one column: (the column's expression, its type) -> SQL.
HashArgument = Callable[[str, ChType], str]
# Types every server's cityHash64 takes as they are (inside Array and Tuple too).
_PLAIN = frozenset({"UInt8", "UInt16", "UInt32", "UInt64", "Int8", "Int16", "Int32", "Int64",
                    "Float32", "Float64", "String", "FixedString", "Date", "DateTime",
                    "Enum8", "Enum16"})


@dataclass(frozen=True)
class ContentDigest:
    """The rows of one partition: how many, the sum of their hashes mod 2**64, and the
    scheme that hashed them."""

    rows: int
    sum: int
    scheme: str

    def to_json(self) -> dict[str, object]:
        """The recorded form (the sum as text: JSON readers lose integers above 2**53)."""
        return {"rows": self.rows, "sum": str(self.sum), "scheme": self.scheme}

    @classmethod
    def from_json(cls, raw: dict[str, object]) -> ContentDigest:
        return cls(int(raw["rows"]), int(raw["sum"]) % MODULUS,  # type: ignore[call-overload]
                   str(raw["scheme"]))


def digest_union(digests: Iterable[ContentDigest | None]) -> ContentDigest | None:
    """The digest of the union of the rows: None when one is unknown or the schemes differ."""
    rows = total = 0
    schemes = set()
    for digest in digests:
        if digest is None:
            return None
        rows += digest.rows
        total += digest.sum
        schemes.add(digest.scheme)
    if len(schemes) != 1:
        return None
    return ContentDigest(rows, total % MODULUS, schemes.pop())


def stored_columns(columns: Iterable[tuple[str, str, str]]) -> list[tuple[str, str]]:
    """(name, type) of the columns a part stores, from (name, type, default kind)."""
    return [(name, type_) for name, type_, kind in columns if kind not in STORELESS_KINDS]


def row_hash(columns: list[tuple[str, str]], argument: HashArgument) -> str:
    """The row hash expression over ``columns`` (name, type), each column made the hash's
    argument by ``argument`` (``Capabilities.hash_argument``: what the server's
    ``cityHash64`` takes)."""
    args = [argument(quote_identifier(name), parse_type(type_)) for name, type_ in columns]
    return f"cityHash64({', '.join(args)})" if args else "toUInt64(0)"


def scheme_of(expression: str) -> str:
    return hashlib.sha1(f"{DIGEST_VERSION}|{expression}".encode()).hexdigest()[:16]


def any_type_argument(expr: str, t: ChType) -> str:
    """The argument of a column of type ``t`` for a ``cityHash64`` that takes any type."""
    if hashed_as_is(t):
        return expr
    # may be NULL at the top (Nullable, Dynamic, ...): hashed alone, NULL a fixed value
    return f"ifNull(cityHash64({expr}), {NULL_HASH})"


def hashed_as_is(t: ChType) -> bool:
    """Whether every server's ``cityHash64`` takes a value of ``t`` as it is."""
    if t.base in _PLAIN:
        return True
    if t.base == "Array" and t.inner is not None:
        return hashed_as_is(t.inner)
    return t.base == "Tuple" and bool(t.elements) and all(hashed_as_is(e) for e in t.elements)


def partition_digests(client: SqlClient, database: str, table: str,
                      columns: list[tuple[str, str]], argument: HashArgument, *,
                      partition_ids: Iterable[str] | None = None,
                      purpose: str) -> dict[str, ContentDigest]:
    """The digest of each non-empty partition of ``database.table`` (one scan of it).

    Grouped by part (``_part`` exists on every server) and summed per partition id, the
    part name's prefix. ``partition_ids`` limits the scan to those partitions' parts.
    """
    expression = row_hash(columns, argument)
    scheme = scheme_of(expression)
    where = ""
    if partition_ids is not None:
        wanted = sorted(set(partition_ids))
        if not wanted:
            return {}
        where = "WHERE " + " OR ".join(f"startsWith(_part, {sql_string(pid + '_')})"
                                        for pid in wanted)
    rows = client.query_rows(
        f"SELECT _part AS part, toString(count()) AS rows, toString(sum({expression})) AS sum "
        f"FROM {qualified_name(database, table)} {where} GROUP BY _part",
        purpose=purpose,
    )
    found: dict[str, list[int]] = {}
    for row in rows:
        entry = found.setdefault(row["part"].split("_", 1)[0], [0, 0])
        entry[0] += int(row["rows"])
        entry[1] += int(row["sum"])
    return {pid: ContentDigest(n, total % MODULUS, scheme)
            for pid, (n, total) in found.items() if n}
