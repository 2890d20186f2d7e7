"""Spark arrays of structs mapped onto a table's Nested sub-columns (``n.a``, ``n.b``).

Why: a server that flattens Nested (18.16 always; 26.x with ``flatten_nested = 1``, its
default) describes ``n Nested(a Int32, b String)`` as the Array columns ``n.a`` and
``n.b``, and 18.16 stores a top-level ``Array(Tuple(String, Float64))`` the same way, as
``c.1`` and ``c.2``. A Spark user has the column ``n`` as an array of structs. The server
treats the Array columns whose names have exactly one dot and share the part before it as
one Nested structure, whose arrays must have equal lengths in every row (measured on
18.16 and 26.9: ``p.q.r`` is no sub-column of ``p``). So:

- ``flatten_schema`` maps an Arrow field ``n`` (a list of structs) that names no column
  but such a group onto the group's sub-columns: struct fields by name, or by position
  where the sub-columns are ``1``, ``2``, ... (an unnamed ``Array(Tuple)``), as Tuples
  take structs (``schema.struct_fields_for``).
- ``flatten_batch`` splits the values: each sub-column is a list array on the same offsets
  over one struct field (zero copy), so lengths are equal by construction.
- ``check_sibling_lengths`` refuses sub-columns the DataFrame supplies as separate arrays
  (``n.a``, ``n.b``) whose lengths differ in a row, naming the row: the server would fail
  the whole INSERT without one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from server_ext.types.bad_values import Rows
from server_ext.types.chtypes import ChType


@dataclass(frozen=True)
class NestedGroup:
    """Array columns ``<name>.<sub>`` the server keeps as one Nested structure."""

    name: str
    columns: tuple[str, ...]  # full names, in the table's order
    elements: tuple[ChType, ...]  # each sub-column's element type (its Array's inner)

    @property
    def subnames(self) -> tuple[str, ...]:
        return tuple(column.split(".", 1)[1] for column in self.columns)

    @property
    def by_position(self) -> bool:
        """An unnamed ``Array(Tuple)`` flattened: sub-columns ``1``, ``2``, ... in order."""
        return self.subnames == tuple(str(i + 1) for i in range(len(self.columns)))


def nested_groups(columns: Iterable[tuple[str, ChType]]) -> dict[str, NestedGroup]:
    """The Nested structures among ``(name, type)`` columns, by the name before the dot."""
    found: dict[str, list[tuple[str, ChType]]] = {}
    for name, ch in columns:
        parts = name.split(".")
        if len(parts) == 2 and all(parts) and ch.base == "Array" and ch.inner is not None:
            found.setdefault(parts[0], []).append((name, ch.inner))
    return {prefix: NestedGroup(prefix, tuple(n for n, _ in members),
                                tuple(t for _, t in members))
            for prefix, members in found.items()}


def struct_order(group: NestedGroup, struct: pa.StructType) -> list[int] | None:
    """Which struct field (by index) fills each sub-column, or None if they do not match."""
    names = [struct.field(i).name for i in range(struct.num_fields)]
    if len(names) != len(group.columns):
        return None
    if group.by_position:
        return list(range(len(names)))
    if sorted(names) != sorted(group.subnames):
        return None
    return [names.index(sub) for sub in group.subnames]


def flatten_schema(columns: Sequence[tuple[str, ChType]], schema: pa.Schema
                   ) -> tuple[pa.Schema, list[str]]:
    """``schema`` with each field mapped onto Nested sub-columns replaced by them, and
    the problems of fields that name a Nested structure but do not fit it (left out)."""
    known = {name for name, _ in columns}
    groups = nested_groups(columns)
    fields: list[pa.Field] = []
    problems: list[str] = []
    for arrow_field in schema:
        group = groups.get(arrow_field.name)
        if group is None or arrow_field.name in known:
            fields.append(arrow_field)
            continue
        problem = _shape_problem(group, arrow_field.type, schema)
        if problem:
            problems.append(f"column `{group.name}`: {problem}")
            continue
        struct = arrow_field.type.value_type
        for column, index in zip(group.columns, struct_order(group, struct) or [], strict=True):
            fields.append(pa.field(column, pa.list_(struct.field(index).type)))
    return pa.schema(fields), problems


def _shape_problem(group: NestedGroup, arrow_type: pa.DataType, schema: pa.Schema
                   ) -> str | None:
    stored = ", ".join(group.columns)
    supplied = [c for c in group.columns if c in schema.names]
    if supplied:
        return (f"the table stores it as the Nested sub-columns {stored}, and the data "
                f"has both `{group.name}` and {', '.join(f'`{c}`' for c in supplied)}")
    if not (_is_list(arrow_type) and pa.types.is_struct(arrow_type.value_type)):
        return (f"the table stores it as the Nested sub-columns {stored} (Array columns), "
                f"which take an array of structs, not {arrow_type}")
    if struct_order(group, arrow_type.value_type) is None:
        fields = ", ".join(f.name for f in arrow_type.value_type)
        wanted = (f"{len(group.columns)} fields, by position" if group.by_position
                  else f"the fields {', '.join(group.subnames)}")
        return (f"the struct's fields ({fields}) do not match its Nested sub-columns "
                f"{stored}: it needs {wanted}")
    return None


def flatten_batch(columns: Sequence[tuple[str, ChType]], batch: pa.RecordBatch
                  ) -> pa.RecordBatch:
    """``batch`` with each array-of-structs field that ``flatten_schema`` maps split into
    its sub-columns; a batch with none is returned as it is."""
    groups = nested_groups(columns)
    known = {name for name, _ in columns}
    if not any(name in groups and name not in known for name in batch.schema.names):
        return batch
    names: list[str] = []
    arrays: list[pa.Array] = []
    for name, array in zip(batch.schema.names, batch.columns, strict=True):
        group = groups.get(name)
        order = (struct_order(group, array.type.value_type)
                 if group is not None and name not in known and _is_list(array.type)
                 and pa.types.is_struct(array.type.value_type) else None)
        if group is None or order is None:
            names.append(name)
            arrays.append(array)
            continue
        for column, values in zip(group.columns, _split(array, order), strict=True):
            names.append(column)
            arrays.append(values)
    return pa.RecordBatch.from_arrays(arrays, names=names)


def _split(array: pa.Array, order: list[int]) -> list[pa.Array]:
    """One list array per struct field, on ``array``'s offsets and validity."""
    if pa.types.is_large_list(array.type):
        array = array.cast(pa.list_(array.type.value_type))
    offsets = pc.subtract(array.offsets, array.offsets[0])
    start = array.offsets[0].as_py()
    children = array.values.slice(start, array.offsets[-1].as_py() - start).flatten()
    mask = pc.is_null(array) if array.null_count else None
    return [pa.ListArray.from_arrays(offsets, children[index], mask=mask) for index in order]


def check_sibling_lengths(columns: Sequence[tuple[str, ChType]], batch: pa.RecordBatch,
                          rows: Rows) -> None:
    """Report (``rows.report``) the rows where sub-columns of one Nested structure hold
    arrays of different lengths."""
    for group in nested_groups(columns).values():
        present = [c for c in group.columns if c in batch.schema.names]
        if len(present) < 2:
            continue
        first = _lengths(batch.column(present[0]))
        for other in present[1:]:
            lengths = _lengths(batch.column(other))
            differ = first != lengths
            if differ.any():
                reasons = [None] * len(differ)
                for row in np.flatnonzero(differ).tolist():
                    reasons[row] = (
                        f"an array of {int(lengths[row])} elements where `{present[0]}` has "
                        f"{int(first[row])}: the sub-columns of Nested `{group.name}` need "
                        "equal lengths in every row")
                rows.report(other, batch.column(other), differ, reasons)


def _lengths(array: pa.Array) -> np.ndarray:
    """Elements per row; a null row counts -1 (its null is refused on its own)."""
    return pc.fill_null(pc.list_value_length(array), -1).to_numpy(zero_copy_only=False)


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t)
