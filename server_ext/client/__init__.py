"""Talking to a ClickHouse server: the HTTP client, the in-process chdb engine, the one
client protocol both declare, the body they share, and request compression."""

from server_ext.client.chdb_client import ChdbClient
from server_ext.client.client_protocol import Client, SqlClient
from server_ext.client.compression import ENCODINGS, compress, encoding_problem
from server_ext.client.http_client import (
    DEFAULT_RETRIES,
    DEFAULT_TIMEOUT,
    ClickHouseClient,
    header_problem,
)

__all__ = [
    "DEFAULT_RETRIES",
    "DEFAULT_TIMEOUT",
    "ClickHouseClient",
    "header_problem",
    "ChdbClient",
    "Client",
    "SqlClient",
    "ENCODINGS",
    "compress",
    "encoding_problem",
]
