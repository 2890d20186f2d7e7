"""What the old server lacks, probed on the server itself: ``MOVE PARTITION`` and views
fired by a view's output (ClickHouse 18.16 has neither; 26.x both).

Each probe uses scratch tables of its own in ``SCRATCH_DATABASE``, dropped afterwards, so
it is safe from several processes at once. ``capabilities`` asks them (``move_partition``
of ``detect_capabilities``; ``fires_view_chains``, only for a target whose views feed
views) and chooses from the answers: ``attach_marked`` where MOVE is missing
(``strategy_choice``), no view fired on a view's rows where chains do not fire
(``ddl.views``).
"""

from __future__ import annotations

import threading
import uuid

from server_ext.client.client_protocol import SqlClient
from server_ext.errors import ClickHouseError
from server_ext.sql import SCRATCH_DATABASE, qualified_name, quote_identifier

_LOCK = threading.Lock()
_CHAINS_CACHE: dict[str, bool] = {}


def view_chains_fire(client: SqlClient) -> bool:
    """Whether the server fires a materialized view on the rows another view writes (a
    chain of views). Measured: 18.16 does not (neither through a ``TO`` table nor an inner
    table), 26.x does. Asked of the server itself, once per process and url, with scratch
    tables and two views, and only for a target whose views feed views."""
    with _LOCK:
        cached = _CHAINS_CACHE.get(client.url)
    if cached is not None:
        return cached
    suffix = uuid.uuid4().hex[:12]
    source, middle, end, first, second = (
        qualified_name(SCRATCH_DATABASE, f"chain_{suffix}_{name}")
        for name in ("source", "middle", "end", "first_mv", "second_mv"))
    client.execute(f"CREATE DATABASE IF NOT EXISTS {quote_identifier(SCRATCH_DATABASE)}",
                   purpose="create scratch database")
    try:
        for ddl in (f"CREATE TABLE {source} (k UInt8) ENGINE = Null",
                    f"CREATE TABLE {middle} (k UInt8) ENGINE = Memory",
                    f"CREATE TABLE {end} (k UInt8) ENGINE = Memory",
                    f"CREATE MATERIALIZED VIEW {first} TO {middle} AS SELECT k FROM {source}",
                    f"CREATE MATERIALIZED VIEW {second} TO {end} AS SELECT k FROM {middle}",
                    f"INSERT INTO {source} VALUES (1)"):
            client.execute(ddl, purpose="check whether views fire on a view's output")
        fires = int(client.query_value(f"SELECT count() FROM {end}",
                                       purpose="check whether views fire on a view's output")) > 0
    finally:
        for name in (second, first, end, middle, source):
            client.execute(f"DROP TABLE IF EXISTS {name}", purpose="drop scratch table")
    with _LOCK:
        _CHAINS_CACHE[client.url] = fires
    return fires


def moves_partitions(client: SqlClient) -> bool:
    """Try MOVE PARTITION between two empty throwaway tables; a syntax error means no."""
    suffix = uuid.uuid4().hex[:12]
    source = qualified_name(SCRATCH_DATABASE, f"probe_move_src_{suffix}")
    dest = qualified_name(SCRATCH_DATABASE, f"probe_move_dst_{suffix}")
    client.execute(f"CREATE DATABASE IF NOT EXISTS {quote_identifier(SCRATCH_DATABASE)}",
                   purpose="create scratch database")
    try:
        for table in (source, dest):
            client.execute(
                f"CREATE TABLE {table} (x UInt8) ENGINE = MergeTree() ORDER BY x",
                purpose="create probe table",
            )
        client.execute(f"ALTER TABLE {source} MOVE PARTITION ID 'all' TO TABLE {dest}",
                       purpose="probe MOVE PARTITION", retry=False)
        return True
    except ClickHouseError as exc:
        if exc.code in (62, 48, 36):  # syntax error / not implemented / bad arguments
            return False
        raise
    finally:
        for table in (source, dest):
            client.execute(f"DROP TABLE IF EXISTS {table}", purpose="drop probe table")
