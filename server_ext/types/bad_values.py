"""Where a check's bad values go: raised at the first (``bad_rows=fail``) or every bad row
of a batch collected (``bad_rows=quarantine``).

Every value check (``row_checks``, ``nested``, ``prepare``) finds its bad values as a mask
over the array it checks and hands it to :meth:`Rows.report`, with that array's
:class:`Rows`: the map from the checked array's index to the batch row. A list, map or
Nested element's ``Rows`` is its parent's repeated by the list lengths, so an inner bad
value is charged to its outer row. The one ``Rows`` of a batch carries the collector:

- :class:`FailFast` raises ``InvalidValue`` for the first bad value, naming the column,
  the row and the value: the sink's behaviour with ``bad_rows=fail``;
- :class:`Collect` records, for each bad row, the first problem the checks found (check
  order = column order) and goes on; :meth:`Collect.result` is the row mask and, per bad
  row, the column, reason and offending value.

Why a mask and no loop: a batch of a million rows with thousands of bad ones costs a few
vectorised passes, never one Python call per row. The row map of a nested element is
built only when a bad value is found in it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from server_ext.errors import InvalidValue

#: Why values are bad: one reason for all, or one per value of the checked array.
Reason = str | Sequence[str | None]


class FailFast:
    """``bad_rows=fail``: the first bad value raises ``InvalidValue``."""

    def report(self, name: str, shown: pa.Array, mask: np.ndarray, rows: Rows,
               reason: Reason) -> None:
        index = int(np.argmax(mask))
        raise InvalidValue(name, rows(index), shown_value(shown, index),
                           reason if isinstance(reason, str) else str(reason[index]))


class Collect:
    """``bad_rows=quarantine``: every bad row of a batch of ``num_rows`` rows, with the
    first problem found in it."""

    def __init__(self, num_rows: int) -> None:
        self.num_rows = num_rows
        self._finding = np.full(num_rows, -1, np.int32)  # per row: index into _found
        self._element = np.zeros(num_rows, np.int64)  # per row: the bad value's index
        self._found: list[tuple[str, Reason, pa.Array]] = []  # (column, reason, checked)

    def report(self, name: str, shown: pa.Array, mask: np.ndarray, rows: Rows,
               reason: Reason) -> None:
        elements = np.flatnonzero(mask)
        if not elements.size:
            return
        batch_rows, first = np.unique(rows.of(elements), return_index=True)
        fresh = self._finding[batch_rows] == -1
        batch_rows, elements = batch_rows[fresh], elements[first[fresh]]
        if not batch_rows.size:
            return
        self._finding[batch_rows] = len(self._found)
        self._element[batch_rows] = elements
        self._found.append((name, reason, shown))

    def result(self) -> BadRows:
        """The bad rows found so far, in row order."""
        rows = np.flatnonzero(self._finding >= 0)
        columns: list[str] = [""] * len(rows)
        reasons: list[str] = [""] * len(rows)
        found = []
        for index, (name, reason, shown) in enumerate(self._found):
            at = np.flatnonzero(self._finding[rows] == index)
            elements = self._element[rows[at]]
            found.append((shown.take(pa.array(elements)), at))
            for position, element in zip(at.tolist(), elements.tolist(), strict=True):
                columns[position] = name
                reasons[position] = reason if isinstance(reason, str) else str(reason[element])
        return BadRows(rows, tuple(columns), tuple(reasons), tuple(found))


@dataclass(frozen=True)
class BadRows:
    """The bad rows of one batch: their indices (ascending) and, for each, the column
    (``col (value)``, ``col.element`` inside a Map or Tuple), reason and offending value
    of the first problem found in it.

    The offending values stay Arrow arrays, one per check that found some (``found``:
    the values and their positions among ``rows``), so that they can be turned into text
    a column at a time; ``values`` gives them as Python objects."""

    rows: np.ndarray
    columns: tuple[str, ...]
    reasons: tuple[str, ...]
    found: tuple[tuple[pa.Array, np.ndarray], ...]

    @property
    def values(self) -> tuple[object, ...]:
        """The offending value of each bad row, as Arrow's ``to_pylist`` gives it."""
        values: list[object] = [None] * len(self.rows)
        for taken, at in self.found:
            for position, value in zip(at.tolist(), python_values(taken), strict=True):
                values[position] = value
        return tuple(values)

    def __len__(self) -> int:
        return len(self.rows)


class Rows:
    """Index in a checked array → row of the batch, and where bad values are reported.

    Callable (``rows(index)``) like the row maps the checks always took; ``of`` maps many
    indices at once. The root is the batch itself (identity); :meth:`elements` gives the
    map of a list's elements.
    """

    def __init__(self, sink: FailFast | Collect, parent: Rows | None = None,
                 ends: np.ndarray | None = None) -> None:
        self.sink = sink
        self._parent = parent
        self._ends = ends  # the list's zero-based offsets: element i is in row searchsorted
        self._map: np.ndarray | None = None

    @classmethod
    def fail_fast(cls) -> Rows:
        return cls(FailFast())

    def __call__(self, index: int) -> int:
        if self._parent is None or self._ends is None:
            return int(index)
        return self._parent(int(np.searchsorted(self._ends, index, side="right")) - 1)

    def of(self, indices: np.ndarray) -> np.ndarray:
        """The batch rows of many indices (linear: the element map is built once)."""
        if self._parent is None or self._ends is None:
            return indices
        if self._map is None:
            lengths = np.diff(self._ends)
            outer = self._parent.of(np.arange(len(lengths), dtype=np.int64))
            self._map = np.repeat(outer, lengths)
        return self._map[indices]

    def elements(self, ends: np.ndarray) -> Rows:
        """The map of the elements of a list whose rows end at ``ends`` (offsets from 0)."""
        return Rows(self.sink, self, ends)

    def report(self, name: str, shown: pa.Array, mask: pa.Array | np.ndarray,
               reason: Reason) -> None:
        """Hand the values ``mask`` marks (a null mask entry is no fault) to the sink."""
        if isinstance(mask, np.ndarray):
            flags = mask.astype(bool, copy=False)
        else:
            flags = pc.fill_null(mask, False).to_numpy(zero_copy_only=False)
        if flags.any():
            self.sink.report(name, shown, flags, self, reason)


def python_values(array: pa.Array) -> list[object]:
    """``array.to_pylist()``, except that a value Python cannot hold comes as Arrow's text
    of it: a zoned timestamp whose wall-clock time falls outside years 1..9999 (a far
    instant read in another zone) raises ``OverflowError`` in ``to_pylist``."""
    try:
        return array.to_pylist()
    except (OverflowError, ValueError):
        return [python_value(array, index) for index in range(len(array))]


def python_value(array: pa.Array, index: int) -> object:
    """``array[index].as_py()``, or Arrow's text of a value Python cannot hold."""
    try:
        return array[index].as_py()
    except (OverflowError, ValueError):
        return pc.cast(array.slice(index, 1), pa.string())[0].as_py()


def shown_value(array: pa.Array, index: int) -> object:
    """The value at ``index`` as an error shows it (long texts cut)."""
    value = python_value(array, index)
    if isinstance(value, str | bytes) and len(value) > 60:
        return value[:60] + (b"..." if isinstance(value, bytes) else "...")
    return value
