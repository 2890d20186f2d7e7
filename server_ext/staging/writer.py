"""Streams one branch's Arrow record batches into its staging table.

Contract (like Spark's ``DataWriter``: one writer per task attempt, used from one thread):
- ``write(batch)`` first checks the batch (schema once per distinct schema, then every
  value of the batch prepared for its columns: ``schema.check_arrow_schema`` /
  ``prepare.checked_batch``) and raises ``SchemaMismatch`` or ``InvalidValue`` before any
  row of that batch is buffered or sent; what it buffers is the prepared batch.
  It then buffers the batch; every full block of ``block_rows`` rows is handed to one
  background thread that sends it while the caller goes on producing batches (at most one
  INSERT in flight: ``write`` waits when the next block is full before the last is done).
- Rows are sent in INSERTs of at most ``block_rows`` rows. Each INSERT is all-or-nothing:
  the server squashes the INSERT's Native blocks (or Arrow batches) into one block before
  writing (``min_insert_block_size_rows = block_rows``, ``min_insert_block_size_bytes = 0``),
  so a failure anywhere in the body leaves no row of that INSERT in staging.
- ``flush()`` sends what is buffered and waits for every INSERT; it may be called any
  number of times (``send()`` only starts sending it). After it returns, ``rows_sent``
  rows are in staging. ``rows_sent`` counts only INSERTs the server acknowledged and is
  what ``seal(expected_rows=...)`` should be given.
- A failed INSERT is raised by the next ``write`` or by ``flush``; from then on the writer
  refuses further use: the branch must be rolled back. If the failure left the outcome
  unknown (a timeout after the body was sent) staging may or may not hold that block;
  sealing with ``expected_rows=rows_sent`` detects it.
- ``abort()`` drops what is buffered and waits for the INSERT in flight (Spark's
  ``DataWriter.abort``); the writer is unusable afterwards.
- A transient server error on an INSERT (too many parts, ...) is retried by the client:
  the body is re-encoded from the buffered Arrow data for each attempt.
- With ``dedup_token`` (servers with ``insert_deduplication_token``; the staging table
  then has a ``non_replicated_deduplication_window``), every INSERT carries the token
  ``<dedup_token>-<block number>``, and one whose answer was lost (timeout or connection
  lost after the body was sent) is sent again: the server drops the repeat if the first
  try was written. Without it such an INSERT fails the writer (see above).
- ``on_bad_rows`` (``bad_rows=quarantine``): instead of raising ``InvalidValue``, ``write``
  finds every bad row of the batch (``prepare.split_batch``), hands them with the batch
  as given to ``on_bad_rows`` (which keeps them or raises), and sends the others.
- ``repeat_inserts=False`` (a staging table that staging views read): no INSERT that may
  have written anything is sent again, neither after a lost answer nor after a transient
  server error; only one that never reached the server is. The server fires the views per
  block and commits the table's and each view's parts apart: measured on 26.x, a server
  killed inside an INSERT kept a view's part of a block whose table part it lost, and the
  repeat, deduplicated in the table or not, doubled (or, the other way round, would lose)
  that block in the view. A view's output has no count to seal against, so the writer
  fails instead and the task's next attempt stages afresh.
- Every INSERT is synchronous: where the server knows ``async_insert`` (detected in
  ``capabilities``; 18.16 has no such setting) it is sent with ``async_insert=0``. A modern
  server may default to asynchronous inserts (ClickHouse Cloud does, and the 26.x test
  server reports ``async_insert = 1``): the server would then buffer rows from several
  INSERTs, flush them later (or acknowledge before writing, without
  ``wait_for_async_insert``) and, with ``async_insert_deduplicate``, drop blocks that look
  repeated, while the seal counts the staged rows right after ``flush()`` and every
  INSERT must be all-or-nothing on its own.

Format: the one ``Capabilities.insert_format`` chooses, ArrowStream where the server reads
it (one IPC stream per INSERT, Arrow types cast to the column types first). The body is
streamed, and its encoding starts as soon as the block is complete, in its own thread: the
server parses one chunk while the next is encoded.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import copy_context
from queue import Full, Queue

import pyarrow as pa

from server_ext.capabilities import Capabilities
from server_ext.client.client_protocol import InsertClient
from server_ext.errors import ClickHouseError, SchemaMismatch
from server_ext.sql import shown_name
from server_ext.types.arrow_schema import check_arrow_schema
from server_ext.types.arrow_stream import InsertFormat, Piece
from server_ext.types.bad_values import BadRows
from server_ext.types.prepare import checked_batch, split_batch
from server_ext.types.target_table import Column, TargetTable

log = logging.getLogger(__name__)

DEFAULT_BLOCK_ROWS = 1_048_576
DEFAULT_CHUNK_ROWS = 131_072


class BranchWriter:
    """Writes Arrow record batches into one staging table (see the module contract).

    ``staging_table`` is qualified and quoted. ``target_columns`` are the columns to send,
    in that order (default: what ``check_arrow_schema`` gives for the first batch); every
    batch must carry exactly these columns. ``chunk_rows`` sizes the Native blocks (Arrow
    messages) inside one INSERT of at most ``block_rows`` rows.
    """

    def __init__(
        self,
        client: InsertClient,
        target: TargetTable,
        staging_table: str,
        caps: Capabilities,
        block_rows: int = DEFAULT_BLOCK_ROWS,
        target_columns: list[Column] | None = None,
        chunk_rows: int = DEFAULT_CHUNK_ROWS,
        extra_settings: Mapping[str, str] | None = None,
        dedup_token: str | None = None,
        encoding: str | None = None,
        repeat_inserts: bool = True,
        on_bad_rows: Callable[[pa.RecordBatch, BadRows], None] | None = None,
    ) -> None:
        if block_rows < 1 or chunk_rows < 1:
            raise ValueError("block_rows and chunk_rows must be positive")
        self.insert_format = caps.insert_format
        self.client = client
        self.target = target
        self.staging_table = staging_table
        self.encoding = encoding  # Content-Encoding of the bodies (server_ext.client.compression)
        self.format = self.insert_format.name
        self.insert_settings: dict[str, object] = {
            **(extra_settings or {}),  # the user's; the protocol's own below win
            "max_insert_block_size": block_rows,
            "min_insert_block_size_rows": block_rows,
            "min_insert_block_size_bytes": 0,
            **({"async_insert": 0} if caps.async_insert else {}),
        }
        if dedup_token is not None:
            self.insert_settings["insert_deduplicate"] = 1
        self.dedup_token = dedup_token
        self.repeat_inserts = repeat_inserts
        self.on_bad_rows = on_bad_rows
        self._blocks = 0
        self.value_ranges = caps.value_ranges  # Date/DateTime are checked against this server
        self.block_rows = block_rows
        self.chunk_rows = min(chunk_rows, block_rows)
        self.rows_sent = 0
        self.bytes_sent = 0
        self._columns = target_columns
        self._checked_schema: pa.Schema | None = None
        self._pending: deque[pa.RecordBatch] = deque()
        self._pending_rows = 0
        self._failed: BaseException | None = None
        self._sender: ThreadPoolExecutor | None = None
        self._in_flight: Future[None] | None = None

    @property
    def columns(self) -> list[Column] | None:
        """The target columns being sent (known after the first batch or when given)."""
        return self._columns

    def write(self, batch: pa.RecordBatch) -> None:
        """Check ``batch``, buffer it, and hand every full block to the sending thread."""
        self._ensure_usable()
        columns = self._columns_for(batch.schema)
        if self.on_bad_rows is None:
            batch = checked_batch(columns, batch, self.value_ranges)
        else:  # every bad row handed over (and kept elsewhere), the good ones sent
            good, bad = split_batch(columns, batch, self.value_ranges)
            if len(bad):
                self.on_bad_rows(batch, bad)
            batch = good
        if batch.num_rows == 0:
            return
        self._pending.append(batch)
        self._pending_rows += batch.num_rows
        while self._pending_rows >= self.block_rows:
            self._submit(self._take(self.block_rows))

    def send(self) -> None:
        """Hand every buffered row to the sending thread without waiting for the server
        (``flush`` waits): another writer's rows can be sent meanwhile. Safe to repeat."""
        self._ensure_usable()
        if self._pending_rows:
            self._submit(self._take(self._pending_rows))

    def flush(self) -> None:
        """Send every buffered row and wait until the server has it. Safe to repeat."""
        self.send()
        self._wait()
        if self._sender is not None:
            self._sender.shutdown()
            self._sender = None

    def abort(self) -> None:
        """Stop: drop the buffered rows and wait for the INSERT in flight to end, ignoring
        its outcome. For a branch about to be rolled back (its staging is dropped)."""
        self._pending.clear()
        self._pending_rows = 0
        if self._in_flight is not None:
            in_flight, self._in_flight = self._in_flight, None
            with contextlib.suppress(BaseException):
                in_flight.result()
        if self._sender is not None:
            self._sender.shutdown()
            self._sender = None
        self._failed = self._failed or ClickHouseError(
            "the writer was aborted", name="WRITER_ABORTED", purpose="write branch")

    # -- internals -------------------------------------------------------------------------

    def _ensure_usable(self) -> None:
        if self._failed is not None:
            raise ClickHouseError(
                f"an earlier insert into {self.staging_table} failed ({self._failed}); "
                "roll the branch back", name="WRITER_FAILED", purpose="write branch"
            ) from self._failed

    def _columns_for(self, schema: pa.Schema) -> list[Column]:
        if self._checked_schema is not None and schema.equals(self._checked_schema):
            return self._columns or []
        columns = check_arrow_schema(self.target, schema)
        problems = [f"column `{c.name}`: {problem}" for c in columns
                    if (problem := self.insert_format.column_problem(c.chtype))]
        if problems:
            raise SchemaMismatch(shown_name(self.target.database, self.target.name), problems)
        if self._columns is None:
            self._columns = columns
        elif {c.name for c in columns} != {c.name for c in self._columns}:
            raise ClickHouseError(
                "a batch has other columns than the first one of this branch",
                name="SCHEMA_CHANGED", purpose="write branch")
        self._checked_schema = schema
        return self._columns

    def _take(self, rows: int) -> list[pa.RecordBatch]:
        """Remove exactly ``rows`` rows from the front of the buffer (slicing a batch)."""
        taken: list[pa.RecordBatch] = []
        while rows:
            head = self._pending[0]
            if head.num_rows <= rows:
                taken.append(self._pending.popleft())
            else:
                taken.append(head.slice(0, rows))
                self._pending[0] = head.slice(rows)
            rows -= taken[-1].num_rows
            self._pending_rows -= taken[-1].num_rows
        return taken

    def _submit(self, batches: list[pa.RecordBatch]) -> None:
        """Start encoding ``batches`` now; send them once the previous INSERT is done."""
        body = _InsertBody(self._chunks(batches), self._columns or [], self.insert_format)
        body.prepare()
        try:
            self._wait()
        except BaseException:
            body.close()
            raise
        if self._sender is None:
            self._sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="txsink-insert")
        self._blocks += 1
        # in the caller's context, as every pool of the sink's (a caller may count the
        # statements its work sends)
        self._in_flight = self._sender.submit(copy_context().run, self._send, body,
                                              sum(b.num_rows for b in batches), self._blocks)

    def _wait(self) -> None:
        """Wait for the INSERT in flight; its failure is raised here."""
        if self._in_flight is None:
            return
        in_flight, self._in_flight = self._in_flight, None
        in_flight.result()

    def _send(self, body: _InsertBody, rows: int, block: int) -> None:
        settings = dict(self.insert_settings)
        if self.dedup_token is not None:
            settings["insert_deduplication_token"] = f"{self.dedup_token}-{block}"
        try:
            self.client.insert(
                self.staging_table, body, fmt=self.format,
                purpose=f"insert {rows} rows into staging table {self.staging_table}",
                columns=[c.name for c in self._columns or []],
                settings=settings, deduplicated=self.dedup_token is not None,
                retry=self.repeat_inserts, encoding=self.encoding,
            )
        except BaseException as exc:
            self._failed = exc
            raise
        finally:
            body.close()
        self.rows_sent += rows
        self.bytes_sent += body.bytes_sent
        log.debug("sent %d rows (%d bytes) to %s", rows, body.bytes_sent, self.staging_table)

    def _chunks(self, batches: list[pa.RecordBatch]) -> list[list[pa.RecordBatch]]:
        """Regroup ``batches`` into groups of about ``chunk_rows`` rows each.

        Each group becomes one Native block (or Arrow message). Small batches (Spark sends
        10k rows) are grouped so each block is large enough to be cheap per row; large ones
        are sliced so encoding one chunk overlaps with the server parsing the previous one.
        Slicing is zero-copy; the concatenation of a group happens while encoding.
        """
        groups: list[list[pa.RecordBatch]] = []
        group: list[pa.RecordBatch] = []
        group_rows = 0
        for batch in batches:
            start = 0
            while start < batch.num_rows:
                piece = batch.slice(start, self.chunk_rows - group_rows)
                start += piece.num_rows
                group.append(piece)
                group_rows += piece.num_rows
                if group_rows >= self.chunk_rows:
                    groups.append(group)
                    group, group_rows = [], 0
        if group:
            groups.append(group)
        return groups


def _concat(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    if len(batches) == 1:
        return batches[0]
    return pa.concat_batches(batches)


class _InsertBody:
    """An INSERT body encoded in a helper thread; each iteration encodes it anew, so the
    client can resend it after a transient error."""

    def __init__(self, chunks: list[list[pa.RecordBatch]], columns: list[Column],
                 fmt: InsertFormat) -> None:
        self._chunks = chunks
        self._columns = columns
        self._format = fmt
        self._prepared: _ReadAhead | None = None
        self.bytes_sent = 0

    def prepare(self) -> None:
        """Start encoding before the body is asked for (the server may still be busy)."""
        self._prepared = _ReadAhead(self._pieces())

    def close(self) -> None:
        if self._prepared is not None:
            self._prepared.close()
            self._prepared = None

    def __iter__(self) -> Iterator[Piece]:
        pieces, self._prepared = self._prepared or _ReadAhead(self._pieces()), None
        self.bytes_sent = 0
        try:
            for piece in pieces:
                self.bytes_sent += len(piece)
                yield piece
        finally:
            pieces.close()

    def _pieces(self) -> Iterator[Piece]:
        yield from self._format.body((_concat(c) for c in self._chunks), self._columns)


_DONE = object()


class _ReadAhead:
    """Produces ``pieces`` in a helper thread, up to ``depth`` ahead of the consumer.

    Encoding (numpy/pyarrow) and sending (socket) both release the GIL, so the next chunk
    is encoded while the previous one is on its way. An error in the producer is raised in
    the consumer; ``close`` (also when the consumer stops early) stops the producer.
    """

    def __init__(self, pieces: Iterator[Piece], depth: int = 8) -> None:
        self._queue: Queue = Queue(maxsize=depth)
        self._stop = threading.Event()
        self._worker = threading.Thread(target=self._produce, args=(pieces,),
                                        name="txsink-encode", daemon=True)
        self._worker.start()

    def _produce(self, pieces: Iterator[Piece]) -> None:
        try:
            for piece in pieces:
                if not _put(self._queue, piece, self._stop):
                    return
            _put(self._queue, _DONE, self._stop)
        except BaseException as exc:  # handed to the consumer, raised there
            _put(self._queue, exc, self._stop)

    def __iter__(self) -> Iterator[Piece]:
        while True:
            item = self._queue.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        self._stop.set()
        self._worker.join()


def _put(queue: Queue, item: object, stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            queue.put(item, timeout=0.1)
            return True
        except Full:
            continue
    return False

