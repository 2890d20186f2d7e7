"""Crash points and partition-level statements shared by every way of publishing.

Each strategy (``move``, ``attach_replicated``, ``attach_marked``) and the dynamic
overwrite (``overwrite``) pass the same named crash points, send their partition
commands in as few ``ALTER`` statements as the server accepts, and report what they did
in a ``PublishReport``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from server_ext.client.client_protocol import SqlClient
from server_ext.errors import UNKNOWN_DATABASE, UNKNOWN_TABLE, ClickHouseError
from server_ext.publish.strategy_choice import Strategy
from server_ext.sql import sql_string

log = logging.getLogger(__name__)

STEP_BEFORE_PARTITION = "publish.before_partition"  # checks done, nothing written yet
STEP_AFTER_INTENT = "publish.after_intent"
STEP_AFTER_ATTACH = "publish.after_attach"  # after the statement that makes rows visible
STEP_AFTER_MARK = "publish.after_mark"
STEP_AFTER_DROP = "publish.after_drop_staging_partition"
# attach_replicated, only where the server dropped staged parts as duplicates: their copy
STEP_AFTER_INSERT_INTENT = "publish.after_insert_intent"
STEP_AFTER_INSERT = "publish.after_insert"

# The crash points each way of publishing passes, in order.
PUBLISH_STEPS: dict[str, tuple[str, ...]] = {
    Strategy.MOVE: (STEP_BEFORE_PARTITION, STEP_AFTER_INTENT, STEP_AFTER_ATTACH),
    Strategy.ATTACH_REPLICATED: (STEP_BEFORE_PARTITION, STEP_AFTER_INTENT, STEP_AFTER_ATTACH,
                                 STEP_AFTER_MARK, STEP_AFTER_DROP),
    Strategy.ATTACH_MARKED: (STEP_BEFORE_PARTITION, STEP_AFTER_INTENT, STEP_AFTER_ATTACH,
                             STEP_AFTER_MARK, STEP_AFTER_DROP),
    "replace": (STEP_BEFORE_PARTITION, STEP_AFTER_ATTACH, STEP_AFTER_MARK, STEP_AFTER_DROP),
}

MAX_COMMANDS_PER_ALTER = 200  # keeps a statement far below the server's max_query_size

StepHook = Callable[[str], None]


@dataclass
class PublishReport:
    """What one ``publish`` call did."""

    strategy: str
    target: str
    published: list[str] = field(default_factory=list)  # partition ids made visible now
    already_published: list[str] = field(default_factory=list)
    rows: int = 0  # rows made visible by this call
    seconds: float = 0.0


def no_step(_: str) -> None:
    pass


def alter_in_chunks(client: SqlClient, table: str, commands: list[str], *, purpose: str,
                    retry: bool) -> None:
    """``ALTER TABLE table cmd, cmd, ...``, at most MAX_COMMANDS_PER_ALTER per statement."""
    for start in range(0, len(commands), MAX_COMMANDS_PER_ALTER):
        chunk = commands[start:start + MAX_COMMANDS_PER_ALTER]
        client.execute(f"ALTER TABLE {table} {', '.join(chunk)}", purpose=purpose, retry=retry)


def drop_partitions(client: SqlClient, table: str, partition_ids: Iterable[str]) -> None:
    """Drop partitions from a staging table; nothing to do if the table is gone.

    The caller drops a staging table after publish, and may then repeat publish.
    """
    commands = [f"DROP PARTITION ID {sql_string(pid)}" for pid in partition_ids]
    try:
        alter_in_chunks(client, table, commands, purpose="drop published partitions from "
                        "staging", retry=True)
    except ClickHouseError as exc:
        if exc.code not in (UNKNOWN_TABLE, UNKNOWN_DATABASE):
            raise
