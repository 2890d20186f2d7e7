"""``settings.<name>`` options: ClickHouse settings for the sink's own INSERTs.

What a user may pass, and where it goes: every option ``settings.<name>`` is sent with
each INSERT the sink makes (``clickhouse_tx``: the staging INSERTs of its tasks;
``clickhouse_plain``: its INSERTs into the target), never with the publish's ALTERs, the
DDL or the checks, which are the protocol's own. Refused by name, before anything is
staged:

- settings that would break the guarantee (``REFUSED``: asynchronous or deduplicated
  inserts, and the block sizes that make each INSERT one all-or-nothing block);
- a name the server in hand does not know, or a value it does not accept (asked of the
  server itself with ``SELECT 1 SETTINGS ...``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from server_ext.capabilities import known_settings
from server_ext.client import SqlClient
from server_ext.errors import ClickHouseError

PREFIX = "settings."
_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")

_ASYNC = ("staging INSERTs must be synchronous: the seal counts the rows right after them, "
          "and an asynchronous insert may be acknowledged before it is written")
_DEDUP = ("the server would drop staged blocks that look repeated, losing rows; the sink's "
          "own protocol already keeps every row once")
_BLOCKS = ("the sink sets it so that each INSERT is one all-or-nothing block; use the "
           "insert_block_rows option")
REFUSED: dict[str, str] = {
    "async_insert": _ASYNC, "wait_for_async_insert": _ASYNC,
    "async_insert_deduplicate": _DEDUP, "insert_deduplicate": _DEDUP,
    "insert_deduplication_token": _DEDUP,
    "deduplicate_blocks_in_dependent_materialized_views": _DEDUP,
    "max_insert_block_size": _BLOCKS, "min_insert_block_size_rows": _BLOCKS,
    "min_insert_block_size_bytes": _BLOCKS,
}


class SettingRefused(ValueError):
    """A ``settings.<name>`` option the sink or the server cannot honour."""


def parse(given: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The ``settings.<name>`` options of a (lower-cased) option map, checked by name."""
    found = []
    for key, value in sorted(given.items()):
        if not key.startswith(PREFIX):
            continue
        name = key[len(PREFIX):]
        if not _NAME.match(name):
            raise SettingRefused(f"option {key!r}: {name!r} is not a ClickHouse setting name")
        if name in REFUSED:
            raise SettingRefused(f"option {key} cannot be passed: {REFUSED[name]}")
        found.append((name, value))
    return tuple(found)


def check_on_server(client: SqlClient, settings: tuple[tuple[str, str], ...],
                    server: str) -> None:
    """Refuse a setting ``server`` does not know, or a value it does not take."""
    if not settings:
        return
    known = known_settings(client, tuple(name for name, _ in settings))
    unknown = [name for name, _ in settings if name not in known]
    if unknown:
        version = client.query_value("SELECT version()", purpose="read server version")
        raise SettingRefused(f"option(s) {', '.join(PREFIX + n for n in unknown)}: ClickHouse "
                             f"{version} at {server} has no such setting")
    try:
        client.query_rows("SELECT 1 AS ok", purpose="check settings options",
                          settings=dict(settings))
    except ClickHouseError as exc:
        raise SettingRefused(f"settings options refused by {server}: {exc}") from None
