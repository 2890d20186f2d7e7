"""The sink id a stream gets when it is given no ``sink_id``: one derivation per way in.

Both are stable across the query's restarts from its checkpoint and new for a new
checkpoint, and both read ``stream-<first 16 hex digits of a SHA-1>``; they hash
different inputs, so the same stream written through both ways would be two sinks.
"""

from __future__ import annotations

import hashlib


def stream_sink_id_of_checkpoint(checkpoint_location: str) -> str:
    """``writeStream.format("clickhouse_tx")``: from the checkpoint location (a trailing
    slash ignored), as docs/usage.md ("A stream's sink id") tells users to compute it."""
    return _stream_sink_id(checkpoint_location.rstrip("/"))


def stream_sink_id_of_query(query_id: str) -> str:
    """``txsink.foreach_batch``: from the streaming query's id, which the checkpoint keeps."""
    return _stream_sink_id(query_id)


def _stream_sink_id(key: str) -> str:
    return f"stream-{hashlib.sha1(key.encode()).hexdigest()[:16]}"
