"""Messages of a run: ClickHouse statements from ``system.query_log``, their kinds, and
the ZooKeeper requests of :mod:`tests.harness.wire` put into the same shape.

A statement is a row of ``system.query_log`` (any type but ``QueryStart``) whose client
port is that of an upstream connection of the run's :class:`~tests.harness.wire.ClickHouseProxy`
while it was open; its kind is the statement's first word(s) and the class of the table
it names (``target``, ``staging``, ``records``, a ``system.`` table), so that a reader
sees where the statements go.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from sinkbench.environment import sql
from tests.harness.wire import PROCESSES, Connection, Request

#: query_log's type codes (18.16 has a UInt8, later servers an Enum8 of these)
QUERY_TYPES = {1: "QueryStart", 2: "QueryFinish", 3: "ExceptionBeforeStart",
               4: "ExceptionWhileProcessing"}
_COMMENT = re.compile(r"^\s*(/\*.*?\*/|--[^\n]*\n)\s*", re.S)
_NAME = r"((?:`[^`]+`|\"[^\"]+\"|[\w.]+)(?:\.(?:`[^`]+`|[\w]+))?)"
_STAGING = re.compile(r"txs_\w+")
_HEX = re.compile(r"[0-9a-f]{8,}")
_DIGITS = re.compile(r"\d+")


@dataclass(frozen=True)
class Statement:
    at: float
    pid: int | None
    type: str
    query: str


def statements(url: str, connections: list[Connection], requests: list[Request],
               since: float) -> list[Statement]:
    """The run's statements: query_log rows from the proxy's upstream ports (logs flushed),
    each within a second of a request the proxy relayed on that connection."""
    if not connections:
        return []
    sql(url, "SYSTEM FLUSH LOGS")
    columns = {line.strip() for line in sql(
        url, "SELECT name FROM system.columns WHERE database = 'system' "
             "AND table = 'query_log'").splitlines()}
    start = ("toFloat64(query_start_time_microseconds)"
             if "query_start_time_microseconds" in columns else "toFloat64(query_start_time)")
    ports = ", ".join(str(p) for p in sorted({c.port for c in connections}))
    rows = sql(url, f"SELECT {start}, port, toUInt8(type), replaceAll(replaceAll(query, "
                    f"'\\n', ' '), '\\t', ' ') FROM system.query_log "
                    f"WHERE event_date >= yesterday() AND event_time >= "
                    f"toDateTime({int(since) - 2}) AND port IN ({ports}) "
                    f"AND toUInt8(type) != 1 FORMAT TabSeparatedRaw")
    sent: dict[int, list[float]] = {}
    for request in requests:
        sent.setdefault(request.connection, []).append(request.at)
    found = []
    for line in rows.splitlines():
        at, port, kind, query = line.split("\t", 3)
        owner = _owner(connections, int(port), float(at))
        if owner is not None and _sent(sent, owner.number, float(at)):
            found.append(Statement(float(at), owner.pid, QUERY_TYPES.get(int(kind), kind),
                                   query))
    return sorted(found, key=lambda s: s.at)


def _sent(sent: dict[int, list[float]], connection: int, at: float) -> bool:
    """Whether a request went out on ``connection`` when a statement started at ``at``
    (18.16 logs whole seconds: ``at`` may be up to a second early)."""
    return any(at - 1 <= t <= at + 1.5 for t in sent.get(connection, ()))


def _owner(connections: list[Connection], port: int, at: float) -> Connection | None:
    for connection in connections:
        closed = connection.closed if connection.closed is not None else float("inf")
        if connection.port == port and connection.opened - 1 <= at <= closed + 1:
            return connection
    return None


def statement_kind(query: str, target: str, records: str | None) -> str:
    """``CREATE TABLE staging``, ``SYSTEM STOP MERGES staging``, ``SELECT system.parts``,
    ``ALTER staging MOVE PARTITION``, ``INSERT target``, ... of one statement."""
    text = query
    while match := _COMMENT.match(text):
        text = text[match.end():]
    words = text.split()
    if not words:
        return "(empty)"
    head = words[0].upper()
    upper = [w.upper() for w in words]

    def named(after: int) -> str:
        rest = [w for w in words[after:] if w.upper() not in ("IF", "NOT", "EXISTS")]
        return table_class(rest[0] if rest else "", target, records)

    if head == "SYSTEM":
        return " ".join(upper[:3]) + (f" {named(3)}" if len(words) > 3 else "")
    if head == "ALTER" and len(words) > 3:
        verb = " ".join(upper[3:5]) if upper[3] in ("MOVE", "ATTACH", "REPLACE", "DROP",
                                                     "DETACH", "FREEZE") else upper[3]
        return f"ALTER {named(2)} {verb}"
    if head == "INSERT":
        return f"INSERT {named(2)}"
    if head in ("SELECT", "WITH"):
        match = re.search(r"\bFROM\s+" + _NAME, text, re.I)
        return f"SELECT {table_class(match.group(1), target, records) if match else '(no table)'}"
    if head in ("CREATE", "DROP", "ATTACH", "DETACH", "TRUNCATE", "RENAME", "OPTIMIZE",
                "EXISTS", "DESCRIBE", "DESC", "SHOW", "CHECK"):
        if len(words) > 1 and upper[1] in ("TABLE", "DATABASE", "VIEW", "DICTIONARY",
                                           "TEMPORARY"):
            return f"{head} {upper[1]} {named(2)}"
        return f"{head} {named(1)}"
    return head


def table_class(name: str, target: str, records: str | None) -> str:
    """What a table name in a statement is: the target, a staging table, the records
    table, a ``system.`` table (by name) or another one."""
    bare = name.replace("`", "").replace('"', "").strip("(),;").lower()
    if bare.startswith("system."):
        return bare
    if records and bare == records.lower():
        return "records"
    if bare == target.lower() or bare.endswith("." + target.lower().split(".")[-1]):
        return "target"
    if "txs_" in bare:
        return "staging"
    return "other" if bare else "(no table)"


def zk_kind(kind: str, root: str, sink_id: str) -> str:
    """A ZooKeeper request's kind with the run's root, sink id, ids and numbers generalised."""
    text = kind.replace(root, "").replace(f"/txsink/sinks/{sink_id}", "…")
    text = _STAGING.sub("<staging>", text)
    return _DIGITS.sub("N", _HEX.sub("<id>", text))


def by_pid(items: list[Request] | list[Statement]) -> dict[str, int]:
    """Counts per process, named ``<what>:<pid>`` (see :data:`tests.harness.wire.PROCESSES`)."""
    counts = Counter("?" if i.pid is None else f"{PROCESSES.get(i.pid, '?')}:{i.pid}"
                     for i in items)
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))
