"""Request compression for INSERT bodies (HTTP ``Content-Encoding``).

What each server reads, asked on these machines: 18.16 decompresses ``gzip`` and
``deflate`` request bodies and refuses ``zstd``/``lz4`` (``Unknown Content-Encoding``,
code 89); 26.x reads all four. Whether a server reads an encoding is asked from the server
itself (:func:`encoding_problem` sends it a compressed ``SELECT 1``), never guessed from
its version.

Compression costs CPU on the Spark worker and saves bytes on the wire, so it pays only
where the network, not the CPU, is the limit: ``benchmarks/bench_compression.py`` prints
both and the link speed below which each encoding wins. The sink's default is no
compression.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

import pyarrow as pa

from server_ext.client.client_protocol import SqlClient
from server_ext.errors import ClickHouseError

ENCODINGS = ("gzip", "deflate", "zstd", "lz4")
GZIP_LEVEL = 1  # the fast end: a sink compresses to save the wire, not the disk


def compress(body: bytes | Iterable[bytes], encoding: str) -> bytes:
    """``body`` (bytes or chunks) compressed as HTTP ``Content-Encoding: encoding``."""
    chunks = (body,) if isinstance(body, bytes | bytearray | memoryview) else body
    if encoding in ("gzip", "deflate"):
        # wbits 31: a gzip member; 15: a zlib stream (what HTTP calls "deflate")
        compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31 if encoding == "gzip" else 15)
        out = [compressor.compress(bytes(chunk)) for chunk in chunks]
        out.append(compressor.flush())
        return b"".join(out)
    if encoding in ("zstd", "lz4"):  # lz4: the LZ4 frame format, as the server reads it
        sink = pa.BufferOutputStream()
        with pa.CompressedOutputStream(sink, encoding) as stream:
            for chunk in chunks:
                stream.write(chunk)
        return sink.getvalue().to_pybytes()
    raise ValueError(_unknown(encoding))


def _unknown(encoding: str) -> str:
    return f"unknown request encoding {encoding!r}; one of {', '.join(ENCODINGS)}"


_READS: dict[tuple[str, str], bool] = {}  # (server, encoding) -> the server reads it


def encoding_problem(client: SqlClient, encoding: str) -> str | None:
    """Why ``client``'s server cannot read request bodies in ``encoding`` (None: it can),
    asked once per server and process with a compressed ``SELECT 1``."""
    if encoding not in ENCODINGS:
        return _unknown(encoding)
    key = (client.url, encoding)
    if key not in _READS:
        try:
            client.query_value("SELECT 1", purpose=f"check that the server reads {encoding}",
                               encoding=encoding)
            _READS[key] = True
        except ClickHouseError as exc:
            if exc.code != UNKNOWN_ENCODING:
                raise
            _READS[key] = False
    return None if _READS[key] else (
        f"the server does not read {encoding}-compressed requests (Unknown Content-Encoding)")


UNKNOWN_ENCODING = 89
